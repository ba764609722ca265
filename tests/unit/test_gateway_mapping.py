"""The gateway's translation between our protos and Nomad's HTTP API JSON
(services/gateway/mapping/), and its HTTP conventions (services/gateway/
http.py): Nomad's field names, nanosecond durations and Go times, secrets
kept out, submitted jobs through the CLI's Nomad JSON parser with named
errors, query parameters and Nomad's error codes."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import grpc
import pytest
from starlette.requests import Request

from corral.domain.errors import FIELD_METADATA_KEY
from corral.v1 import job_pb2, node_pb2
from corral.v1 import structs_pb2 as pb
from services.gateway import http
from services.gateway.mapping import allocs, evals, jobs, nodes, operator
from services.gateway.mapping.common import ZERO_TIME, pascal, rfc3339, to_nomad

SECOND = 1_000_000_000

NOMAD_JOB: dict[str, Any] = {
    "ID": "web",
    "Name": "web",
    "Type": "service",
    "Datacenters": ["dc1"],
    "Region": "global",  # accepted and ignored, as Nomad's JSON lists it
    "Status": "",
    "TaskGroups": [
        {
            "Name": "g",
            "Count": 3,
            "Constraints": [{"LTarget": "${attr.kernel.name}", "RTarget": "linux", "Operand": "="}],
            "Tasks": [
                {
                    "Name": "t",
                    "Driver": "docker",
                    "Config": {"command": "/bin/sleep", "args": ["60"], "port": 8080},
                    "Resources": {"CPU": 100, "MemoryMB": 64},
                    "KillTimeout": 7 * SECOND,
                }
            ],
        }
    ],
}


def _request(query: str = "", headers: dict[str, str] | None = None) -> Request:
    scope = {
        "type": "http",
        "method": "GET",
        "path": "/v1/jobs",
        "query_string": query.encode(),
        "headers": [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()],
    }
    return Request(scope)


# -- names and times --------------------------------------------------------


@pytest.mark.parametrize(
    ("ours", "nomads"),
    [
        ("id", "ID"),
        ("eval_id", "EvalID"),
        ("memory_mb", "MemoryMB"),
        ("memory_max_mb", "MemoryMaxMB"),
        ("cpu", "CPU"),
        ("http_addr", "HTTPAddr"),
        ("desired_tg_updates", "DesiredTGUpdates"),
        ("l_target", "LTarget"),
        ("parameterized", "ParameterizedJob"),
        ("crons", "Specs"),
        ("preempted_allocations", "PreemptedAllocations"),
        ("mbits", "MBits"),
    ],
)
def test_field_names_are_nomads(ours: str, nomads: str) -> None:
    assert pascal(ours) == nomads


def test_times_are_go_times_and_zero_is_gos_zero() -> None:
    assert rfc3339(0) == ZERO_TIME
    assert rfc3339(1_700_000_000 * SECOND) == "2023-11-14T22:13:20Z"
    assert rfc3339(1_700_000_000 * SECOND + 5) == "2023-11-14T22:13:20.000000005Z"


def test_unset_messages_lists_and_maps_are_null_like_gos_nil() -> None:
    out = to_nomad(pb.TaskGroup(name="g"))
    assert out["Name"] == "g" and out["Count"] == 0
    assert out["Tasks"] is None and out["Meta"] is None and out["Update"] is None
    # an optional scalar left unset is null, set to 0 is 0
    assert out["MaxClientDisconnect"] is None
    assert to_nomad(pb.TaskGroup(max_client_disconnect=0))["MaxClientDisconnect"] == 0


# -- jobs -------------------------------------------------------------------


def test_a_nomad_job_round_trips_with_defaults_applied() -> None:
    job = jobs.from_nomad(json.loads(json.dumps(NOMAD_JOB)))
    assert job.id == "web" and job.task_groups[0].count == 3
    out = jobs.job(job)
    assert out["ID"] == "web" and out["Region"] == "global" and out["Type"] == "service"
    group = out["TaskGroups"][0]
    assert group["Count"] == 3
    assert group["Constraints"] == [
        {"LTarget": "${attr.kernel.name}", "RTarget": "linux", "Operand": "="}
    ]
    task = group["Tasks"][0]
    # a config's numbers read back whole, as Nomad shows them
    assert task["Config"] == {"command": "/bin/sleep", "args": ["60"], "port": 8080}
    assert isinstance(task["Config"]["port"], int)
    assert task["Resources"]["CPU"] == 100 and task["Resources"]["MemoryMB"] == 64
    assert task["KillTimeout"] == 7 * SECOND
    # Nomad's service defaults, durations in nanoseconds
    assert group["RestartPolicy"]["Delay"] == 15 * SECOND
    assert group["RestartPolicy"]["Mode"] == "fail"


def test_periodic_jobs_show_nomads_periodic_block() -> None:
    job = pb.Job(id="cron", periodic=pb.PeriodicConfig(enabled=True, spec="*/5 * * * *"))
    out = jobs.job(job)
    assert out["Periodic"]["Spec"] == "*/5 * * * *" and out["Periodic"]["SpecType"] == "cron"
    assert jobs.job(pb.Job(id="plain"))["Periodic"] is None


@pytest.mark.parametrize(
    ("change", "names"),
    [
        (lambda j: j.update({"Vault": {"Policies": ["x"]}}), "Vault"),
        (lambda j: j["TaskGroups"][0].update({"Count": "three"}), "count"),
        (lambda j: j["TaskGroups"][0].update({"Count": 1e30}), "out of range"),
        (lambda j: j.update({"Priority": 2**40}), "priority"),
        (lambda j: j["TaskGroups"][0]["Tasks"][0]["Resources"].update({"MemoryMB": -1}), "memory"),
    ],
)
def test_a_bad_submitted_job_names_the_field(change: Any, names: str) -> None:
    data = json.loads(json.dumps(NOMAD_JOB))
    change(data)
    with pytest.raises(jobs.JobInputError) as err:
        jobs.from_nomad(data)
    assert names.lower() in str(err.value).lower()


def test_a_submitted_job_must_be_an_object() -> None:
    with pytest.raises(jobs.JobInputError):
        jobs.from_nomad(["not", "a", "job"])


def test_job_list_stub_has_nomads_fields() -> None:
    stub = job_pb2.JobListStub(
        id="web", namespace="default", name="web", type="service", priority=50, status="running",
        summary={"g": pb.TaskGroupSummary(running=2, queued=1)}, job_modify_index=7,
        periodic=True, datacenters=["dc1"], meta={"team": "web"},
    )  # fmt: skip
    out = jobs.stub(stub)
    assert out["Periodic"] is True and out["ParameterizedJob"] is False
    assert out["Datacenters"] == ["dc1"] and out["Meta"] == {"team": "web"}
    assert out["ID"] == "web" and out["Status"] == "running" and out["JobModifyIndex"] == 7
    assert out["JobSummary"]["Summary"]["g"]["Running"] == 2
    assert out["JobSummary"]["Summary"]["g"]["Queued"] == 1


def test_scale_status_counts_live_allocs_per_group() -> None:
    job = pb.Job(id="web", namespace="default", task_groups=[pb.TaskGroup(name="g", count=3)])
    healthy = pb.AllocDeploymentStatus(healthy=True)
    live = [
        pb.Allocation(task_group="g", desired_status="run", client_status="running",
                      deployment_status=healthy),
        pb.Allocation(task_group="g", desired_status="run", client_status="pending"),
        pb.Allocation(task_group="g", desired_status="stop", client_status="running"),
    ]  # fmt: skip
    status = jobs.scale_status(job, live)["TaskGroups"]["g"]
    assert status == {
        "Desired": 3, "Placed": 2, "Running": 1, "Healthy": 1, "Unhealthy": 0, "Events": None,
    }  # fmt: skip


# -- allocations, evaluations, nodes ------------------------------------------


def test_alloc_task_states_use_go_times_and_events_nanoseconds() -> None:
    started = 1_700_000_000 * SECOND
    alloc = pb.Allocation(
        id="a1", job_id="web", task_group="g", client_status="running",
        task_states={
            "t": pb.TaskState(state="running", started_at=started,
                              events=[pb.TaskEvent(type="Started", time=started)])
        },
        task_resources={"t": pb.Resources(cpu=100, memory_mb=64)},
    )  # fmt: skip
    out = allocs.alloc(alloc)
    state = out["TaskStates"]["t"]
    assert state["StartedAt"] == "2023-11-14T22:13:20Z" and state["FinishedAt"] == ZERO_TIME
    assert state["Events"][0] == {**state["Events"][0], "Type": "Started", "Time": started}
    assert out["AllocatedResources"]["Tasks"]["t"]["Cpu"]["CpuShares"] == 100
    assert out["DeploymentStatus"] is None and out["Job"] is None
    stub = allocs.stub(alloc)
    assert stub["ID"] == "a1" and stub["TaskStates"]["t"]["State"] == "running"


def test_alloc_health_unset_is_null_not_false() -> None:
    unset = pb.Allocation(deployment_status=pb.AllocDeploymentStatus(canary=True))
    assert allocs.alloc(unset)["DeploymentStatus"]["Healthy"] is None
    set_false = pb.Allocation(deployment_status=pb.AllocDeploymentStatus(healthy=False))
    assert allocs.alloc(set_false)["DeploymentStatus"]["Healthy"] is False


def test_evaluation_fields() -> None:
    ev = pb.Evaluation(
        id="e1", type="service", triggered_by="job-register", job_id="web", status="complete",
        queued_allocations={"g": 0}, create_time=5,
    )  # fmt: skip
    out = evals.evaluation(ev)
    assert out["ID"] == "e1" and out["TriggeredBy"] == "job-register"
    assert out["QueuedAllocations"] == {"g": 0} and out["CreateTime"] == 5
    assert evals.stub(ev)["Status"] == "complete"


def test_evaluation_keeps_nomads_shape_without_the_journey_times() -> None:
    ev = pb.Evaluation(id="e1", enqueue_time=1, dequeue_time=2, plan_submit_time=3)
    out = evals.evaluation(ev)
    assert not set(evals.JOURNEY_FIELDS) & set(out)


def test_nodes_never_show_their_secret() -> None:
    node = pb.Node(
        id="n1", secret_id="s3cret", secret_hash="h", name="vm", status="ready",
        scheduling_eligibility="eligible", http_addr="10.0.0.5:4650",
        node_resources=pb.NodeResources(cpu=4000, memory_mb=8192),
    )  # fmt: skip
    out = nodes.node(node)
    assert "SecretID" not in out and "SecretHash" not in out
    assert "s3cret" not in json.dumps(out)
    assert out["NodeResources"]["Memory"]["MemoryMB"] == 8192 and out["HTTPAddr"] == "10.0.0.5:4650"
    stub = nodes.stub(node_pb2.NodeListStub(id="n1", address="10.0.0.5:4650", status="ready"))
    assert stub["Address"] == "10.0.0.5" and stub["Status"] == "ready"


def test_scheduler_configuration_both_ways() -> None:
    cfg = pb.SchedulerConfiguration(
        scheduler_algorithm="spread",
        preemption_config=pb.PreemptionConfig(sysbatch_scheduler_enabled=True),
    )
    out = operator.scheduler_config(cfg)
    assert out["SchedulerAlgorithm"] == "spread"
    assert out["PreemptionConfig"]["SysBatchSchedulerEnabled"] is True
    back = operator.scheduler_config_from_nomad(out)
    assert (
        back.scheduler_algorithm == "spread" and back.preemption_config.sysbatch_scheduler_enabled
    )
    with pytest.raises(operator.ConfigInputError, match="PauseEvalBroker"):
        operator.scheduler_config_from_nomad({"PauseEvalBroker": "yes"})


# -- HTTP conventions --------------------------------------------------------


def test_query_options_read_nomads_parameters() -> None:
    q = http.QueryOptions.from_request(
        _request("index=42&wait=5m&namespace=*&prefix=we&per_page=10&next_token=x&stale")
    )
    assert (q.index, q.wait_ms, q.namespace, q.prefix, q.per_page, q.next_token, q.stale) == (
        42, 300_000, "*", "we", 10, "x", True,
    )  # fmt: skip
    proto = q.proto()
    assert (proto.min_index, proto.wait_ms, proto.namespace) == (42, 300_000, "*")
    # Nomad's cap on a wait: ten minutes
    assert http.QueryOptions.from_request(_request("index=1&wait=1h")).wait_ms == 600_000
    assert http.QueryOptions.from_request(_request()).namespace == "default"


@pytest.mark.parametrize(
    "query",
    ["wait=soon", "index=-1", "index=x", f"index={2**64}", "per_page=many", "stale=maybe"],
)
def test_bad_query_parameters_are_400(query: str) -> None:
    with pytest.raises(http.NomadError) as err:
        http.QueryOptions.from_request(_request(query))
    assert err.value.status == 400


def test_tokens_from_nomads_places() -> None:
    assert http.token_of(_request(headers={"X-Nomad-Token": "a"})) == "a"
    assert http.token_of(_request(headers={"Authorization": "Bearer b"})) == "b"
    assert http.token_of(_request("token=c")) == "c"
    assert http.token_of(_request()) == ""
    q = http.QueryOptions.from_request(_request(headers={"X-Nomad-Token": "a"}))
    assert q.metadata == [("x-corral-token", "a")]


@pytest.mark.parametrize(
    ("code", "status", "body"),
    [
        (grpc.StatusCode.NOT_FOUND, 404, "job 'x' not found"),
        (grpc.StatusCode.INVALID_ARGUMENT, 400, "job 'x' not found"),
        (grpc.StatusCode.PERMISSION_DENIED, 403, "Permission denied"),
        (grpc.StatusCode.UNAUTHENTICATED, 403, "Permission denied"),
        (grpc.StatusCode.FAILED_PRECONDITION, 400, "job 'x' not found"),
        (grpc.StatusCode.ABORTED, 409, "job 'x' not found"),
    ],
)
def test_grpc_errors_become_nomads(code: grpc.StatusCode, status: int, body: str) -> None:
    exc = grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(), "job 'x' not found")
    resp = http.grpc_error_response(exc)
    assert resp.status_code == status and bytes(resp.body).decode() == body


def test_unexpected_failures_are_one_line_500s() -> None:
    exc = grpc.aio.AioRpcError(
        grpc.StatusCode.INTERNAL, grpc.aio.Metadata(), grpc.aio.Metadata(), "boom\n  at line 3"
    )
    resp = http.grpc_error_response(exc)
    text = bytes(resp.body).decode()
    # the status's details may be a server's exception text: logged, not shown
    assert resp.status_code == 500 and "\n" not in text and "boom" not in text
    assert text == "internal error (internal; details in the gateway's log)"
    other = asyncio.run(http.handle_unexpected(_request(), RecursionError("secret detail")))
    assert other.status_code == 500
    body = bytes(other.body).decode()
    assert "Error" not in body and "secret" not in body
    assert body == "internal error (details in the gateway's log)"


def test_local_pages_follow_the_next_token() -> None:
    items = [{"ID": i} for i in ("c", "a", "b")]
    q = http.QueryOptions(per_page=2)
    page, token = http.local_page(q, items)
    assert [i["ID"] for i in page] == ["a", "b"] and token == "c"
    page, token = http.local_page(http.QueryOptions(per_page=2, next_token="c"), items)
    assert [i["ID"] for i in page] == ["c"] and token == ""


def _body_request(chunks: list[bytes], headers: dict[str, str] | None = None) -> Request:
    pending = list(chunks)

    async def receive() -> dict[str, Any]:
        body = pending.pop(0) if pending else b""
        return {"type": "http.request", "body": body, "more_body": bool(pending)}

    scope = {
        "type": "http",
        "method": "PUT",
        "path": "/v1/jobs",
        "query_string": b"",
        "headers": [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()],
    }
    return Request(scope, receive)


async def test_json_bodies_bad_or_too_large_are_refused() -> None:
    assert await http.json_body(_body_request([b'{"Job": ', b"{}}"])) == {"Job": {}}
    with pytest.raises(http.NomadError) as bad:
        await http.json_body(_body_request([b'{"Job": ']))
    assert bad.value.status == 400 and bad.value.message.startswith("Failed to decode")
    mib = b"x" * (1024 * 1024)
    with pytest.raises(http.NomadError) as big:
        await http.json_body(_body_request([mib] * 17))
    assert big.value.status == 413
    declared = {"content-length": str(64 * 1024 * 1024)}
    with pytest.raises(http.NomadError) as big:
        await http.json_body(_body_request([], declared))
    assert big.value.status == 413


@pytest.mark.parametrize(
    ("value", "ok"),
    [
        (None, 0),
        (5, 5),
        (5.0, 5),
        (-1, None),
        (2**64, None),
        (1.5, None),
        ("7", None),
        (True, None),
    ],
)
def test_whole_numbers_from_bodies_stay_in_their_field_range(value: Any, ok: int | None) -> None:
    if ok is not None:
        assert http.whole(value, "JobModifyIndex") == ok
        return
    with pytest.raises(http.NomadError) as err:
        http.whole(value, "JobModifyIndex")
    assert err.value.status == 400 and "JobModifyIndex" in err.value.message


def test_job_submission_round_trip_as_nomads_client_sends_it() -> None:
    """Nomad's api client query-escapes each variable flag; its agent
    unescapes them on GET. Corral keeps what the user wrote."""
    from services.gateway.mapping import jobs as job_map

    sub = job_map.submission_from_nomad(
        {
            "Source": 'job "x" {}',
            "Format": "hcl2",
            "VariableFlags": {"motd": "hello+world%21%0Abye", "n": "3"},
            "Variables": 'x = "1"',
        }
    )
    assert sub is not None and dict(sub.variable_flags) == {"motd": "hello world!\nbye", "n": "3"}
    sub.namespace, sub.job_id, sub.version, sub.job_modify_index = "default", "x", 2, 40
    out = job_map.submission(sub)
    assert out == {
        "Source": 'job "x" {}',
        "Format": "hcl2",
        "VariableFlags": {"motd": "hello world!\nbye", "n": "3"},
        "Variables": 'x = "1"',
        "Namespace": "default",
        "JobID": "x",
        "Version": 2,
        "JobModifyIndex": 40,
    }
    assert job_map.submission_from_nomad(None) is None
    bad_inputs: list[Any] = [
        "text",
        {"Source": 3},
        {"VariableFlags": {"a": 1}},
        {"VariableFlags": []},
    ]
    for bad in bad_inputs:
        with pytest.raises(job_map.JobInputError):
            job_map.submission_from_nomad(bad)


def _refusal(field: str, problem: str, code: grpc.StatusCode) -> grpc.aio.AioRpcError:
    trailing = grpc.aio.Metadata((FIELD_METADATA_KEY, field))
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), trailing, f"{field}: {problem}")


@pytest.mark.parametrize(
    ("field", "strip", "said"),
    [
        ("roles[0].policies", "roles[0]", "Policies: cannot find policy x"),
        ("roles[0].name", "roles[0]", "Name: cannot find policy x"),
        ("roles[1].id", "", "Roles[1].ID: cannot find policy x"),
        ("policies[0].rules", "policies[0]", "Rules: cannot find policy x"),
        ("expiration_ttl", "", "ExpirationTTL: cannot find policy x"),
    ],
)
def test_body_fields_name_nomads_json(field: str, strip: str, said: str) -> None:
    with pytest.raises(http.NomadError) as err, http.body_fields(strip):
        raise _refusal(field, "cannot find policy x", grpc.StatusCode.INVALID_ARGUMENT)
    assert err.value.status == 400 and err.value.message == said


def test_body_fields_leave_other_refusals_alone() -> None:
    for exc in (
        _refusal("roles[0].name", "x", grpc.StatusCode.NOT_FOUND),
        _refusal("roles[0]", "x", grpc.StatusCode.INVALID_ARGUMENT),  # nothing left: as sent
        _refusal("names[0]", "x", grpc.StatusCode.INVALID_ARGUMENT),  # not under `strip`
    ):
        with pytest.raises(grpc.aio.AioRpcError), http.body_fields("roles[0]"):
            raise exc
