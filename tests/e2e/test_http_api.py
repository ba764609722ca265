"""Nomad's HTTP API served by the gateway of a `corral dev -acl` cluster,
driven by `python-nomad` (a Nomad client nobody here wrote) and, for the
headers and error shapes it hides, by plain HTTP: register a job from a
dict, list and read jobs, allocations, evaluations and nodes, read task
logs, scale, stop an alloc, stop and purge the job; a blocking query
answers when the index moves; ACL tokens decide; errors have Nomad's
status codes and one-line bodies, never a traceback."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import grpc
import nomad
import pytest

from corral.testing import mock
from corral.v1 import node_pb2
from services.gateway.backend import Backend, token_metadata
from tests.devprocess import DevProcess, start_dev, stop_dev
from tests.wait import wait_for

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.slow]


LOOP = "while true; do echo hello-$NOMAD_ALLOC_ID; sleep 1; done"


def web_job(job_id: str, count: int = 1) -> dict[str, Any]:
    """A raw_exec service printing a line a second, as Nomad's API JSON."""
    return {
        "Job": {
            "ID": job_id,
            "Name": job_id,
            "Type": "service",
            "Datacenters": ["dc1"],
            "TaskGroups": [
                {
                    "Name": "web",
                    "Count": count,
                    "Tasks": [
                        {
                            "Name": "server",
                            "Driver": "raw_exec",
                            "Config": {
                                "command": "/bin/sh",
                                "args": ["-c", LOOP],
                            },
                            "Resources": {"CPU": 20, "MemoryMB": 16},
                        }
                    ],
                }
            ],
        }
    }  # fmt: skip


@pytest.fixture(scope="module")
def dev(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevProcess]:
    started = start_dev(tmp_path_factory.mktemp("corral-http"), "-acl")
    try:
        yield started
    finally:
        stop_dev(started)


def client(dev: DevProcess, token: str | None = None) -> nomad.Nomad:
    url = urlparse(dev.http_addr)
    return nomad.Nomad(
        host=url.hostname,
        port=url.port,
        token=dev.token if token is None else token,
        timeout=30,
    )


def http(
    dev: DevProcess,
    method: str,
    path: str,
    body: bytes | None = None,
    token: str | None = None,
    timeout: float = 30,
) -> tuple[int, dict[str, str], str]:
    """One raw request: status, headers (lower-case names), body text."""
    req = urllib.request.Request(dev.http_addr + path, data=body, method=method)
    tok = dev.token if token is None else token
    if tok:
        req.add_header("X-Nomad-Token", tok)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            headers = {k.lower(): v for k, v in resp.headers.items()}
            return resp.status, headers, resp.read().decode()
    except urllib.error.HTTPError as exc:
        headers = {k.lower(): v for k, v in exc.headers.items()}
        return exc.code, headers, exc.read().decode()


def no_traceback(text: str) -> None:
    assert "Traceback" not in text and 'File "' not in text, text


def running_allocs(n: nomad.Nomad, job_id: str, count: int) -> list[dict[str, Any]] | None:
    allocs = [
        a
        for a in n.job.get_allocations(job_id)
        if a["ClientStatus"] == "running" and a["DesiredStatus"] == "run"
    ]
    return allocs if len(allocs) == count else None


def test_register_list_read_and_logs(dev: DevProcess) -> None:
    n = client(dev)
    resp = n.jobs.register_job(web_job("web"))
    assert resp["EvalID"] and resp["JobModifyIndex"] > 0

    assert "web" in [j["ID"] for j in n.jobs.get_jobs()]
    assert [j["ID"] for j in n.jobs.get_jobs(prefix="we")] == ["web"]
    job = n.job.get_job("web")
    assert job["ID"] == "web" and job["Type"] == "service" and job["Namespace"] == "default"
    group = job["TaskGroups"][0]
    assert group["Name"] == "web" and group["Count"] == 1
    assert group["Tasks"][0]["Resources"]["MemoryMB"] == 16
    # Nomad's defaults were applied, durations in nanoseconds
    assert group["RestartPolicy"]["Delay"] == 15 * 1_000_000_000

    allocs = wait_for("web's alloc running", lambda: running_allocs(n, "web", 1), 90)
    alloc = n.allocation.get_allocation(allocs[0]["ID"])
    assert alloc["JobID"] == "web" and alloc["TaskGroup"] == "web"
    assert alloc["TaskStates"]["server"]["State"] == "running"
    assert alloc["Job"]["ID"] == "web"
    assert any(a["ID"] == alloc["ID"] for a in n.allocations.get_allocations())

    evals = n.job.get_evaluations("web")
    assert resp["EvalID"] in [e["ID"] for e in evals]
    ev = n.evaluation.get_evaluation(resp["EvalID"])
    assert ev["JobID"] == "web" and ev["TriggeredBy"] == "job-register"
    assert ev["Status"] == "complete"
    assert any(e["ID"] == ev["ID"] for e in n.evaluations.get_evaluations())
    assert any(a["ID"] == alloc["ID"] for a in n.evaluation.get_allocations(ev["ID"]))

    summary = n.job.get_summary("web")
    assert summary["Summary"]["web"]["Running"] == 1

    nodes = n.nodes.get_nodes()
    assert len(nodes) == 1 and nodes[0]["Status"] == "ready"
    node = n.node.get_node(nodes[0]["ID"])
    assert node["ID"] == nodes[0]["ID"] and "SecretID" not in node
    assert any(a["ID"] == alloc["ID"] for a in n.node.get_allocations(node["ID"]))

    # the task's output, plain and as Nomad's JSON frames
    path = f"/v1/client/fs/logs/{alloc['ID']}?task=server&type=stdout&plain=true"
    logs = wait_for(
        "the task's first line",
        lambda: (r := http(dev, "GET", path))[0] == 200 and "hello-" in r[2] and r[2],
    )
    assert f"hello-{alloc['ID']}" in logs
    status, _, framed = http(dev, "GET", path.replace("&plain=true", ""))
    assert status == 200 and json.loads(framed.split("}{")[0].rstrip("}") + "}")["Data"]


def test_headers_pagination_and_blocking_query(dev: DevProcess) -> None:
    n = client(dev)
    for job_id in ("page-a", "page-b", "page-c"):
        n.jobs.register_job(web_job(job_id))
    status, headers, body = http(dev, "GET", "/v1/jobs?prefix=page-&per_page=2")
    assert status == 200, body
    assert headers["x-nomad-knownleader"] == "true" and headers["x-nomad-lastcontact"] == "0"
    assert [j["ID"] for j in json.loads(body)] == ["page-a", "page-b"]
    token = headers["x-nomad-nexttoken"]
    status, headers, body = http(dev, "GET", f"/v1/jobs?prefix=page-&per_page=2&next_token={token}")
    assert [j["ID"] for j in json.loads(body)] == ["page-c"]
    assert "x-nomad-nexttoken" not in headers

    # nothing changes (the scheduler configuration): answered when the wait
    # ends, at the same index
    config = "/v1/operator/scheduler/configuration"
    index = int(http(dev, "GET", config)[1]["x-nomad-index"])
    started = time.monotonic()
    status, headers, _ = http(dev, "GET", f"{config}?index={index}&wait=1s")
    assert status == 200 and int(headers["x-nomad-index"]) == index
    assert time.monotonic() - started >= 0.9

    # a write moves the index: the waiting query answers long before its wait
    answer: list[tuple[int, dict[str, str], str]] = []
    blocking = f"{config}?index={index}&wait=60s"
    waiter = threading.Thread(target=lambda: answer.append(http(dev, "GET", blocking, timeout=90)))
    started = time.monotonic()
    waiter.start()
    current = json.loads(http(dev, "GET", config)[2])["SchedulerConfig"]
    status, _, body = http(
        dev, "PUT", config, json.dumps({**current, "SchedulerAlgorithm": "spread"}).encode()
    )
    assert status == 200 and json.loads(body)["Updated"] is True, body
    waiter.join(90)
    assert answer, "the blocking query never answered"
    status, headers, body = answer[0]
    assert status == 200 and int(headers["x-nomad-index"]) > index
    assert json.loads(body)["SchedulerConfig"]["SchedulerAlgorithm"] == "spread"
    assert time.monotonic() - started < 30

    # a client following the job list with blocking queries sees a new job
    index = int(http(dev, "GET", "/v1/jobs")[1]["x-nomad-index"])
    n.jobs.register_job(web_job("blocker"))
    deadline = time.monotonic() + 30
    while True:
        status, headers, body = http(dev, "GET", f"/v1/jobs?index={index}&wait=20s")
        assert status == 200 and int(headers["x-nomad-index"]) > index, headers
        index = int(headers["x-nomad-index"])
        if "blocker" in [j["ID"] for j in json.loads(body)]:
            break
        assert time.monotonic() < deadline, "the new job never showed"


def test_scale_stop_alloc_stop_and_purge(dev: DevProcess) -> None:
    n = client(dev)
    n.jobs.register_job(web_job("scaled"))
    wait_for("one alloc running", lambda: running_allocs(n, "scaled", 1), 90)

    resp = n.job.request(
        "scaled", "scale", method="post",
        json={"Count": 2, "Target": {"Group": "web"}, "Message": "more"},
    ).json()  # fmt: skip
    assert resp["EvalID"]
    assert n.job.get_job("scaled")["TaskGroups"][0]["Count"] == 2
    allocs = wait_for("two allocs running", lambda: running_allocs(n, "scaled", 2), 90)
    scale = n.job.request("scaled", "scale", method="get").json()
    assert scale["TaskGroups"]["web"]["Desired"] == 2 and scale["TaskGroups"]["web"]["Running"] == 2

    stopped = allocs[0]["ID"]
    assert n.allocation.stop_allocation(stopped)["EvalID"]
    wait_for(
        "a replacement for the stopped alloc",
        lambda: (
            (found := running_allocs(n, "scaled", 2)) and stopped not in [a["ID"] for a in found]
        ),
        90,
    )

    n.job.deregister_job("scaled")
    assert n.job.get_job("scaled")["Stop"] is True
    wait_for("no alloc running", lambda: running_allocs(n, "scaled", 0) is not None, 90)
    n.job.deregister_job("scaled", purge=True)
    with pytest.raises(nomad.api.exceptions.URLNotFoundNomadException):
        n.job.get_job("scaled")


def test_errors_have_nomads_shape(dev: DevProcess) -> None:
    status, _, body = http(dev, "PUT", "/v1/jobs", b'{"Job": {"ID": ')
    assert status == 400 and body.startswith("Failed to decode request body"), body
    status, _, body = http(dev, "PUT", "/v1/jobs", b'{"NotAJob": 1}')
    assert (status, body) == (400, "Job must be specified")
    bad = web_job("bad")
    bad["Job"]["TaskGroups"][0]["Tasks"][0]["Resources"]["MemoryMB"] = -5
    status, _, body = http(dev, "PUT", "/v1/jobs", json.dumps(bad).encode())
    assert status == 400 and "memory" in body.lower(), body
    # errors name the fields as the caller sent them (Nomad's JSON), whether
    # the gateway's parse refuses them or the state's checks
    three = web_job("three")
    three["Job"]["TaskGroups"][0]["Count"] = "three"
    status, _, body = http(dev, "PUT", "/v1/jobs", json.dumps(three).encode())
    assert (status, body) == (400, "Job.TaskGroups[0].Count: expected a whole number, got 'three'")
    crowded = web_job("crowded")
    crowded["Job"]["TaskGroups"][0]["Meta"] = {f"k{i}": "v" for i in range(1001)}
    status, _, body = http(dev, "PUT", "/v1/jobs", json.dumps(crowded).encode())
    assert status == 400 and body.startswith("Job.TaskGroups[0].Meta: "), body
    status, _, body = http(dev, "GET", "/v1/job/no-such-job")
    assert status == 404, body
    # values out of their field's range are the caller's mistake, not a 500
    negative = {**web_job("neg"), "EnforceIndex": True, "JobModifyIndex": -1}
    status, _, body = http(dev, "PUT", "/v1/jobs", json.dumps(negative).encode())
    assert status == 400 and "JobModifyIndex" in body, body
    status, _, body = http(
        dev, "POST", "/v1/job/neg/scale", b'{"Count": "x", "Target": {"Group": "web"}}'
    )
    assert status == 400 and "Count" in body, body
    status, _, body = http(dev, "POST", "/v1/node/x/drain", b'{"DrainSpec": "soon"}')
    assert status == 400, body
    status, _, body = http(dev, "GET", "/v1/no/such/endpoint")
    assert (status, body) == (404, "Invalid URL path: /v1/no/such/endpoint")
    status, _, body = http(dev, "DELETE", "/v1/jobs")
    assert (status, body) == (405, "Invalid method")
    status, _, body = http(dev, "GET", "/v1/volumes")
    assert status == 501 and "docs/http-api.md" in body
    status, _, body = http(dev, "POST", "/v1/node/some-node/meta")
    assert status == 501, body
    status, _, body = http(dev, "GET", "/v1/node/some-node/drain")
    assert (status, body) == (405, "Invalid method")
    status, _, body = http(dev, "DELETE", "/v1/job/some-job/summary")
    assert (status, body) == (405, "Invalid method")
    status, _, body = http(dev, "POST", "/v1/job/some-job/actions")  # served: GET only
    assert (status, body) == (405, "Invalid method")
    status, _, body = http(dev, "GET", "/v1/acl/auth-methods")
    assert status == 501, body
    status, _, body = http(dev, "GET", "/v1/jobs?index=1&wait=soon")
    assert status == 400 and "wait" in body
    for text in (body,):
        no_traceback(text)
    with pytest.raises(nomad.api.exceptions.BadRequestNomadException):
        client(dev).jobs.register_job({"Job": {"ID": "x", "TaskGroups": "nope"}})


def test_acl_tokens_decide(dev: DevProcess) -> None:
    status, _, body = http(dev, "GET", "/v1/jobs", token="")
    assert (status, body) == (403, "Permission denied")
    status, _, body = http(dev, "GET", "/v1/jobs", token="not-a-real-token")
    assert (status, body) == (403, "Permission denied")
    # what clients probe before anything else answers without a token, as Nomad's
    for probe in ("/v1/status/leader", "/v1/agent/health", "/v1/regions"):
        status, _, body = http(dev, "GET", probe, token="")
        assert status == 200 and json.loads(body), (probe, body)
    # the agent's configuration needs agent:read, as Nomad's (issue 26)
    assert http(dev, "GET", "/v1/agent/self", token="")[0] == 403
    status, _, body = http(dev, "GET", "/v1/agent/self")
    assert status == 200 and json.loads(body)["config"]["ACL"]["Enabled"] is True
    # a read-only token (made with the CLI) reads but cannot submit
    env = {**os.environ, "CORRAL_ADDR": dev.info["address"], "CORRAL_TOKEN": dev.token}

    def corral(*args: str, stdin: str = "") -> str:
        proc = subprocess.run(
            [sys.executable, "-m", "cli", *args], cwd=ROOT, env=env, input=stdin,
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        return proc.stdout

    corral(
        "acl", "policy", "apply", "readers", "-", stdin='namespace "default" { policy = "read" }'
    )
    made = json.loads(corral("acl", "token", "create", "-policy", "readers", "-json"))
    reader = made["secret_id"]
    status, _, body = http(dev, "GET", "/v1/jobs", token=reader)
    assert status == 200, body
    with pytest.raises(nomad.api.exceptions.URLNotAuthorizedNomadException):
        client(dev, reader).jobs.register_job(web_job("forbidden"))
    # Authorization: Bearer works as X-Nomad-Token does
    req = urllib.request.Request(dev.http_addr + "/v1/jobs")
    req.add_header("Authorization", f"Bearer {reader}")
    with urllib.request.urlopen(req, timeout=30) as resp:
        assert resp.status == 200


async def test_queue_statistics_follow_the_leaders_with_the_callers_token(dev: DevProcess) -> None:
    """What the UI's overview reads: Eval.Stats and Plan.Stats, from the
    leaders the state names (no broker or planner address configured), with
    the caller's token: operator:read is needed, the gateway adds nothing."""
    backend = Backend(dev.info["address"])
    stranger = Backend(dev.info["address"])
    try:
        md = token_metadata(dev.token)
        broker = await backend.broker_stats(md)
        planner = await backend.plan_stats(md)
        assert broker is not None and broker.enabled
        assert planner is not None and planner.enabled and planner.plans_applied > 0
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await stranger.broker_stats(token_metadata(""))
        assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
    finally:
        await backend.close()
        await stranger.close()


def test_plan_versions_revert_dispatch_and_periodic_force(dev: DevProcess) -> None:
    n = client(dev)
    n.jobs.register_job(web_job("planned"))
    wait_for("planned's alloc running", lambda: running_allocs(n, "planned", 1), 90)
    plan = n.job.plan_job("planned", web_job("planned", count=2), diff=True)
    assert plan["Annotations"]["DesiredTGUpdates"]["web"]["Place"] == 1
    assert plan["Diff"]["Type"] == "Edited" and plan["JobModifyIndex"] > 0
    n.jobs.register_job(web_job("planned", count=2))
    versions = n.job.get_versions("planned")["Versions"]
    assert [v["Version"] for v in versions] == [1, 0]
    status, _, body = http(dev, "GET", "/v1/job/planned/versions?diffs=true")
    assert status == 200 and json.loads(body)["Diffs"][0]["Type"] == "Edited"
    assert n.job.revert_job("planned", 0)["EvalID"]
    job = n.job.get_job("planned")
    assert job["Version"] == 2 and job["TaskGroups"][0]["Count"] == 1

    mock_task = {"Name": "t", "Driver": "mock", "Config": {"run_for": "1s"}}
    param = {
        "Job": {
            "ID": "param",
            "Type": "batch",
            "ParameterizedJob": {"Payload": "optional", "MetaOptional": ["who"]},
            "TaskGroups": [{"Name": "g", "Tasks": [mock_task]}],
        }
    }
    assert n.jobs.register_job(param)["EvalID"] == ""  # parameterized: no evaluation
    payload = base64.b64encode(b"hi").decode()
    dispatched = n.job.dispatch_job("param", payload=payload, meta={"who": "me"})
    child = dispatched["DispatchedJobID"]
    assert child.startswith("param/dispatch-") and dispatched["EvalID"]
    # a job id with a slash, in the path as Nomad's clients send it
    got = n.job.get_job(child)
    assert got["ID"] == child and got["ParentID"] == "param" and got["Meta"] == {"who": "me"}

    cron = {
        "Job": {
            "ID": "cron",
            "Type": "batch",
            "Periodic": {"Enabled": True, "Spec": "0 0 1 1 *", "SpecType": "cron"},
            "TaskGroups": [{"Name": "g", "Tasks": [mock_task]}],
        }
    }
    n.jobs.register_job(cron)
    assert n.job.get_job("cron")["Periodic"]["Spec"] == "0 0 1 1 *"
    listed = {j["ID"]: j for j in n.jobs.get_jobs()}
    assert listed["cron"]["Periodic"] is True and listed["param"]["ParameterizedJob"] is True
    assert listed["planned"]["Datacenters"] == ["dc1"]
    forced = n.job.periodic_job("cron")
    assert forced["EvalID"]
    children = wait_for("the forced child", lambda: list(n.jobs.get_jobs(prefix="cron/periodic-")))
    assert children[0]["ParentID"] == "cron"


def test_the_gateway_counts_requests_by_route_template(dev: DevProcess) -> None:
    http(dev, "GET", "/v1/jobs")
    http(dev, "GET", "/v1/job/no-such-job")
    http(dev, "GET", "/v1/no/such/endpoint")
    address = dev.info["roles"]["gateway"]["metrics"]
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    assert 'corral_http_requests_total{code="200",method="GET",route="/v1/jobs"}' in text
    assert 'code="404",method="GET",route="/v1/job/{job_id:path}"' in text
    assert 'route="/v1/{rest:path}"' in text
    assert "no-such-job" not in text  # ids never become label values
    assert "grpc_client_handled_total{" in text


def test_validate_job(dev: DevProcess) -> None:
    n = client(dev)
    # python-nomad answers this one as the `requests` response, unparsed
    good = n.validate.validate_job(web_job("checked")).json()
    assert good["ValidationErrors"] is None and good["Error"] == "", good
    assert good["DriverConfigValidated"] is True
    bad = web_job("checked")
    bad["Job"]["TaskGroups"][0]["Count"] = -1
    answer = n.validate.validate_job(bad).json()
    assert answer["ValidationErrors"] == ["Job.TaskGroups[0].Count: must not be negative"]
    assert answer["Error"] == answer["ValidationErrors"][0]
    # nothing was written
    with pytest.raises(nomad.api.exceptions.URLNotFoundNomadException):
        n.job.get_job("checked")
    status, _, body = http(dev, "PUT", "/v1/validate/job", b"{}")
    assert (status, body) == (400, "Job must be specified")
    # read-job in the job's namespace, as Nomad's Job.Validate
    status, _, _ = http(dev, "PUT", "/v1/validate/job", json.dumps(web_job("c")).encode(), "")
    assert status == 403


def test_agent_members_are_the_state_servers(dev: DevProcess) -> None:
    """Nomad's server members: here the state servers of every region the
    state knows (one region: its own), as api.AgentMember."""
    members = client(dev).agent.get_members()
    assert members["ServerRegion"] == "global", members
    assert members["Members"], members
    for m in members["Members"]:
        assert m["Status"] == "alive" and m["Addr"] and 0 < m["Port"] < 2**16, m
        assert m["Tags"]["region"] == "global", m
    assert any(m["Tags"]["leader"] == "true" for m in members["Members"]), members
    status, _, _ = http(dev, "GET", "/v1/agent/members", token="")
    assert status == 403


def test_metrics_in_json_and_for_prometheus(dev: DevProcess) -> None:
    http(dev, "GET", "/v1/regions")
    summary = client(dev).metrics.get_metrics()
    routes = {c["Labels"].get("route") for c in summary["Counters"]}
    assert "/v1/regions" in routes, summary["Counters"]
    assert isinstance(summary["Gauges"], list) and summary["Timestamp"]
    status, headers, text = http(dev, "GET", "/v1/metrics?format=prometheus", token="")
    assert status == 200 and headers["content-type"].startswith("text/plain"), headers
    assert 'corral_http_requests_total{code="200",method="GET",route="/v1/regions"}' in text


def test_prefix_search(dev: DevProcess) -> None:
    n = client(dev)
    for job_id in ("srch-a", "srch-b"):
        n.jobs.register_job(web_job(job_id))
    found = n.search.search("srch-", "jobs")
    assert found["Matches"] == {"jobs": ["srch-a", "srch-b"]}, found
    assert found["Truncations"] == {"jobs": False}
    evals = n.job.get_evaluations("srch-a")
    everything = n.search.search(evals[0]["ID"][:7], "all")
    assert evals[0]["ID"] in everything["Matches"]["evals"], everything
    assert {"jobs", "allocs", "nodes", "evals", "deployment", "namespaces"} <= set(
        everything["Matches"]
    )
    nodes = n.nodes.get_nodes()
    assert n.search.search(nodes[0]["ID"][:4], "nodes")["Matches"]["nodes"] == [nodes[0]["ID"]]
    # tokens: a node reader's `all` leaves out what it may not list; alone, 403
    rules = {"Name": "node-reader", "Rules": 'node { policy = "read" }'}
    assert http(dev, "PUT", "/v1/acl/policy/node-reader", json.dumps(rules).encode())[0] == 200
    status, _, body = http(
        dev, "PUT", "/v1/acl/token", json.dumps({"Name": "n", "Policies": ["node-reader"]}).encode()
    )
    reader = json.loads(body)["SecretID"]
    status, _, body = http(dev, "PUT", "/v1/search", b'{"Prefix": "", "Context": "all"}', reader)
    matches = json.loads(body)["Matches"]
    assert status == 200 and matches["nodes"] == [nodes[0]["ID"]], body
    assert not {"jobs", "allocs", "evals", "deployment", "scaling_policy"} & set(matches)
    # the listings that filter (namespaces, pools, variables) show nothing it may not see
    assert not any(matches[c] for c in set(matches) - {"nodes"}), body
    query = b'{"Prefix": "srch", "Context": "jobs"}'
    assert http(dev, "PUT", "/v1/search", query, reader)[0] == 403
    assert http(dev, "PUT", "/v1/search", query, "")[0] == 403
    status, _, body = http(dev, "PUT", "/v1/search", b'{"Prefix": "s", "Context": "volumes"}')
    assert status == 400 and "volumes" in body, body
    for job_id in ("srch-a", "srch-b"):
        n.job.deregister_job(job_id, purge=True)


def test_fuzzy_search(dev: DevProcess) -> None:
    n = client(dev)
    n.jobs.register_job(web_job("fz-alpha"))
    ns = json.dumps({"Name": "fz-other"}).encode()
    assert http(dev, "PUT", "/v1/namespace", ns)[0] == 200
    other = web_job("fz-beta")
    other["Job"]["Namespace"] = "fz-other"
    assert http(dev, "PUT", "/v1/jobs?namespace=fz-other", json.dumps(other).encode())[0] == 200
    # case-insensitive substring, with the scope from the namespace down
    found = n.search.fuzzy_search("Z-AL", "jobs")
    assert found["Matches"]["jobs"] == [{"ID": "fz-alpha", "Scope": ["default", "fz-alpha"]}]
    assert found["Truncations"]["jobs"] is False, found
    # inside the job: groups, tasks and the raw_exec command
    inside = n.search.fuzzy_search("fz-al", "jobs")
    assert "groups" not in inside["Matches"], inside
    tasks = n.search.fuzzy_search("erve", "jobs")["Matches"]["tasks"]
    assert {"ID": "server", "Scope": ["default", "fz-alpha", "web"]} in tasks, tasks
    commands = n.search.fuzzy_search("bin/s", "jobs")["Matches"]["commands"]
    assert {"ID": "/bin/sh", "Scope": ["default", "fz-alpha", "web", "server"]} in commands
    # every namespace; a match at the start sorts before one further in
    status, _, body = http(
        dev, "PUT", "/v1/search/fuzzy?namespace=*", b'{"Text": "fz-", "Context": "jobs"}'
    )
    jobs = [m["ID"] for m in json.loads(body)["Matches"]["jobs"]]
    assert status == 200 and jobs == ["fz-beta", "fz-alpha"], body
    node = n.nodes.get_nodes()[0]
    nodes = n.search.fuzzy_search(node["Name"].upper(), "all")["Matches"]["nodes"]
    assert {"ID": node["Name"], "Scope": [node["ID"]]} in nodes, nodes
    # a token reading one namespace finds only its jobs
    rules = {"Name": "fz-reader", "Rules": 'namespace "fz-other" { policy = "read" }'}
    assert http(dev, "PUT", "/v1/acl/policy/fz-reader", json.dumps(rules).encode())[0] == 200
    status, _, body = http(
        dev, "PUT", "/v1/acl/token", json.dumps({"Name": "f", "Policies": ["fz-reader"]}).encode()
    )
    reader = json.loads(body)["SecretID"]
    query = b'{"Text": "fz-", "Context": "all"}'
    status, _, body = http(dev, "PUT", "/v1/search/fuzzy?namespace=*", query, reader)
    matches = json.loads(body)["Matches"]
    assert status == 200 and [m["ID"] for m in matches["jobs"]] == ["fz-beta"], body
    assert "nodes" not in matches, body
    alone = b'{"Text": "fz-", "Context": "jobs"}'
    assert http(dev, "PUT", "/v1/search/fuzzy", alone, reader)[0] == 403  # in default
    # Nomad's min_term_length: 2
    status, _, body = http(dev, "POST", "/v1/search/fuzzy", b'{"Text": "f", "Context": "all"}')
    assert status == 400 and "at least 2 characters" in body, body
    n.job.deregister_job("fz-alpha", purge=True)
    assert http(dev, "DELETE", "/v1/job/fz-beta?purge=true&namespace=fz-other")[0] == 200


def test_force_evaluate_and_stability(dev: DevProcess) -> None:
    n = client(dev)
    n.jobs.register_job(web_job("evaluated"))
    before = {e["ID"] for e in n.job.get_evaluations("evaluated")}
    answer = n.job.evaluate_job("evaluated")
    assert answer["EvalID"] and answer["EvalID"] not in before, answer
    evals = {e["ID"]: e for e in n.job.get_evaluations("evaluated")}
    assert evals[answer["EvalID"]]["TriggeredBy"] == "job-register"
    status, _, body = http(dev, "GET", '/v1/evaluations/count?filter=JobID%20%3D%3D%20"evaluated"')
    assert status == 200 and json.loads(body)["Count"] == len(evals), body
    forced = {"JobID": "evaluated", "EvalOptions": {"ForceReschedule": True}}
    status, _, body = http(dev, "PUT", "/v1/job/evaluated/evaluate", json.dumps(forced).encode())
    assert status == 200 and json.loads(body)["EvalID"], body
    status, _, body = http(dev, "PUT", "/v1/job/evaluated/evaluate", b'{"JobID": "other"}')
    assert (status, body) == (400, "JobID not same as job name")
    # stability: python-nomad's stable_job, then the version reads stable
    marked = n.job.stable_job("evaluated", 0, True)
    assert marked["Index"] > 0, marked
    assert n.job.get_job("evaluated")["Stable"] is True
    n.job.stable_job("evaluated", 0, False)
    assert n.job.get_job("evaluated")["Stable"] is False
    status, _, body = http(
        dev, "PUT", "/v1/job/evaluated/stable", b'{"JobID": "evaluated", "JobVersion": 9}'
    )
    assert status == 404 and "at version 9 not found" in body, body
    # a token that may read but not submit
    rules = {"Name": "job-reader", "Rules": 'namespace "default" { policy = "read" }'}
    http(dev, "PUT", "/v1/acl/policy/job-reader", json.dumps(rules).encode())
    _, _, made = http(
        dev, "PUT", "/v1/acl/token", json.dumps({"Name": "r", "Policies": ["job-reader"]}).encode()
    )
    reader = json.loads(made)["SecretID"]
    assert http(dev, "PUT", "/v1/job/evaluated/evaluate", None, reader)[0] == 403
    n.job.deregister_job("evaluated", purge=True)


async def test_node_purge(dev: DevProcess) -> None:
    """A node registered beside the cluster's own (in a datacenter no job
    here asks for), purged with python-nomad."""
    backend = Backend(dev.info["address"])
    try:
        fake = mock.node(datacenter="dc-purge")
        await backend.nodes.Register(
            node_pb2.NodeRegisterRequest(node=fake), metadata=token_metadata(dev.token)
        )
    finally:
        await backend.close()
    n = client(dev)
    assert n.node.get_node(fake.id)["Datacenter"] == "dc-purge"
    answer = n.node.purge_node(fake.id)
    assert answer["NodeModifyIndex"] > 0 and answer["Index"] >= answer["NodeModifyIndex"], answer
    with pytest.raises(nomad.api.exceptions.URLNotFoundNomadException):
        n.node.get_node(fake.id)
    status, _, _ = http(dev, "PUT", f"/v1/node/{fake.id}/purge")
    assert status == 404
    # node:write, as Nomad's
    rules = {"Name": "node-reader", "Rules": 'node { policy = "read" }'}
    http(dev, "PUT", "/v1/acl/policy/node-reader", json.dumps(rules).encode())
    reader = json.loads(
        http(dev, "PUT", "/v1/acl/token", b'{"Name": "p", "Policies": ["node-reader"]}')[2]
    )["SecretID"]
    assert http(dev, "PUT", f"/v1/node/{fake.id}/purge", None, reader)[0] == 403


def test_acl_token_update(dev: DevProcess) -> None:
    n = client(dev)
    for name, rules in (
        ("upd-read", 'namespace "default" { policy = "read" }'),
        ("upd-nodes", 'node { policy = "read" }'),
    ):
        n.acl.create_policy(name, {"Name": name, "Rules": rules})
    made = n.acl.create_token({"Name": "before", "Type": "client", "Policies": ["upd-read"]})
    secret = made["SecretID"]
    assert http(dev, "GET", "/v1/nodes", token=secret)[0] == 403
    token = n.acl.get_token(made["AccessorID"])
    updated = n.acl.update_token(
        made["AccessorID"], {**token, "Name": "after", "Policies": ["upd-read", "upd-nodes"]}
    )
    assert updated["Name"] == "after" and updated["Policies"] == ["upd-read", "upd-nodes"]
    assert updated["ModifyIndex"] > token["ModifyIndex"]
    # the same secret, the new rules (the gateway's token cache holds 30 s)
    wait_for(
        "the new rules", lambda: http(dev, "GET", "/v1/nodes", token=secret)[0] == 200, timeout=60
    )
    status, _, body = http(
        dev,
        "PUT",
        f"/v1/acl/token/{made['AccessorID']}",
        json.dumps({**token, "Global": True}).encode(),
    )
    assert (status, body) == (400, "cannot toggle global mode"), body
    status, _, body = http(
        dev, "PUT", f"/v1/acl/token/{made['AccessorID']}", json.dumps({"Name": "x"}).encode()
    )
    assert (status, body) == (400, "ACL token accessor does not match request path")
    # a management token's, as Nomad's ACL.UpsertTokens
    own = json.dumps({**token, "Type": "management", "Policies": None}).encode()
    assert http(dev, "PUT", f"/v1/acl/token/{made['AccessorID']}", own, secret)[0] == 403


def test_force_gc(dev: DevProcess) -> None:
    n = client(dev)
    n.jobs.register_job(web_job("collected"))
    wait_for("the job's alloc", lambda: running_allocs(n, "collected", 1))
    n.job.deregister_job("collected")  # stopped, not purged: the collector's
    wait_for(
        "its allocs to stop",
        lambda: all(
            a["ClientStatus"] in ("complete", "failed", "lost")
            for a in n.job.get_allocations("collected")
        ),
        timeout=60,
    )
    # Nomad collects a job whose evaluations are terminal too: the stop's
    # eval may still be running when its allocs have stopped (a forced GC
    # before it ended found the job in use, and nothing collects it again)
    wait_for(
        "its evaluations to end",
        lambda: all(
            e["Status"] in ("complete", "failed", "canceled")
            for e in n.job.get_evaluations("collected")
        ),
        timeout=60,
    )
    status, _, body = http(dev, "PUT", "/v1/system/gc")
    assert (status, body) == (200, ""), body
    wait_for(
        "the stopped job to be collected",
        lambda: http(dev, "GET", "/v1/job/collected")[0] == 404,
        timeout=60,
    )
    assert http(dev, "PUT", "/v1/system/gc", token="")[0] == 403


def test_node_evaluate(dev: DevProcess) -> None:
    n = client(dev)
    n.jobs.register_job(web_job("on-node"))
    allocs = wait_for("the job's alloc", lambda: running_allocs(n, "on-node", 1))
    node_id = allocs[0]["NodeID"]
    answer = n.node.evaluate_node(node_id)
    assert answer["EvalID"] == answer["EvalIDs"][0] and answer["EvalCreateIndex"] > 0, answer
    created = {e["ID"]: e for e in n.job.get_evaluations("on-node")}
    ours = [created[i] for i in answer["EvalIDs"] if i in created]
    assert ours and ours[0]["TriggeredBy"] == "node-update" and ours[0]["NodeID"] == node_id
    assert http(dev, "PUT", f"/v1/node/{uuid.uuid4()}/evaluate")[0] == 404
    assert http(dev, "PUT", f"/v1/node/{node_id}/evaluate", token="")[0] == 403
    n.job.deregister_job("on-node", purge=True)


def test_zz_node_eligibility_and_drain(dev: DevProcess) -> None:
    """Last: it drains the cluster's one node."""
    n = client(dev)
    node_id = n.nodes.get_nodes()[0]["ID"]
    resp = n.node.eligible_node(node_id, ineligible=True)
    assert resp["NodeModifyIndex"] > 0
    assert n.node.get_node(node_id)["SchedulingEligibility"] == "ineligible"
    n.node.eligible_node(node_id, eligible=True)
    assert n.node.get_node(node_id)["SchedulingEligibility"] == "eligible"

    spec = {"Deadline": 60 * 1_000_000_000, "IgnoreSystemJobs": False}
    n.node.drain_node_with_spec(node_id, spec)
    node = n.node.get_node(node_id)
    assert node["DrainStrategy"]["Deadline"] == spec["Deadline"]
    assert node["SchedulingEligibility"] == "ineligible"
    n.node.drain_node_with_spec(node_id, None, mark_eligible=True)
    wait_for(
        "the drain to end",
        lambda: (
            (got := n.node.get_node(node_id))["DrainStrategy"] is None
            and got["SchedulingEligibility"] == "eligible"
        ),
    )
    # Nomad's pre-0.8 form, as python-nomad's drain_node sends it
    n.node.drain_node(node_id, enable=True)
    assert n.node.get_node(node_id)["DrainStrategy"] is not None
    n.node.drain_node(node_id, enable=False)
    wait_for("the drain to end", lambda: n.node.get_node(node_id)["DrainStrategy"] is None)
