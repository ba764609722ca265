"""The gateway's mapping checked against the shapes of Nomad's Go `api`
package (tests/apitypes/) on objects richer than an e2e cluster makes
cheaply: a job using most of the job language (networks, services and
checks, scaling policies, spreads, affinities, devices, periodic and
parameterized blocks, identities), allocs with restarts, placement metrics
and devices, a draining node with devices and events, a blocked eval with
its failed placements. And the round trip Nomad's tools make: a job read
through the API registers back unchanged."""

from __future__ import annotations

from typing import Any

import grpc
import pytest

from corral.domain.errors import FIELD_METADATA_KEY, InvalidArgument
from corral.domain.jobspec import json as jobspec_json
from corral.domain.jobspec.load import parse_job
from corral.domain.structs import SECOND
from corral.runtime.server import _status_for as server_status_for
from corral.testing import mock
from corral.v1 import job_pb2
from corral.v1 import structs_pb2 as pb
from services.gateway.http import grpc_error_response
from services.gateway.mapping import allocs, deployments, evals, jobs, nodes
from tests.apitypes.check import check

RICH = """
job "rich" {
  datacenters = ["dc1", "dc2"]
  priority    = 70
  meta { team = "a" }

  constraint {
    attribute = "${attr.kernel.name}"
    value     = "linux"
  }
  affinity {
    attribute = "${node.datacenter}"
    value     = "dc1"
    weight    = 50
  }
  spread {
    attribute = "${node.datacenter}"
    target "dc1" { percent = 70 }
  }

  update {
    max_parallel = 2
    canary       = 1
    auto_revert  = true
  }

  group "web" {
    count = 3

    network {
      mode = "host"
      port "http" {}
      port "admin" { static = 9090 }
    }

    scaling {
      min = 1
      max = 10
      policy { cooldown = "1m" }
    }

    restart {
      attempts = 2
      delay    = "5s"
    }

    reschedule {
      attempts  = 3
      interval  = "1h"
      unlimited = false
    }

    migrate { max_parallel = 1 }

    ephemeral_disk { size = 200 }

    service {
      name     = "web"
      port     = "http"
      provider = "nomad"
      tags     = ["a", "b"]
      meta { v = "1" }

      check {
        type     = "http"
        path     = "/health"
        interval = "5s"
        timeout  = "2s"
        header { X-A = ["1", "2"] }
        check_restart {
          limit = 3
          grace = "10s"
        }
      }
    }

    task "server" {
      driver       = "mock"
      kill_timeout = "10s"
      leader       = true

      config { run_for = "1h" }
      env { A = "1" }

      resources {
        cpu    = 100
        memory = 64
        memory_max = 128
        device "nvidia/gpu" { count = 1 }
      }

      scaling "cpu" {
        min = 50
        max = 500
        policy { cooldown = "5m" }
      }

      identity {
        env = true
      }
    }
  }
}
"""


def rich_job() -> pb.Job:
    job = parse_job(RICH, "rich.nomad.hcl")
    job.region = "global"  # as the state stores it: registration sets its region
    job.create_index, job.modify_index, job.job_modify_index = 10, 12, 12
    job.submit_time = 1_700_000_000 * SECOND
    return job


def problems(value: Any, type_expr: str) -> list[str]:
    return [str(p) for p in check(value, type_expr)]


def test_a_rich_job_has_nomads_shape() -> None:
    job = rich_job()
    assert problems(jobs.job(job), "Job") == []
    summary = pb.JobSummary(job_id="rich", namespace="default")
    summary.summary["web"].CopyFrom(pb.TaskGroupSummary(running=2, queued=1))
    assert problems(jobs.summary(summary), "JobSummary") == []
    stub = job_pb2.JobListStub(id="rich", name="rich", datacenters=["dc1"], type="service")
    stub.summary["web"].CopyFrom(pb.TaskGroupSummary(running=2))
    assert problems(jobs.stub(stub), "JobListStub") == []


def test_a_periodic_and_a_parameterized_job_have_nomads_shape() -> None:
    periodic = mock.batch_job()
    periodic.periodic.CopyFrom(pb.PeriodicConfig(enabled=True, spec="0 * * * *"))
    assert problems(jobs.job(periodic), "Job") == []
    dispatcher = mock.batch_job()
    dispatcher.parameterized.CopyFrom(pb.ParameterizedConfig(payload="required"))
    dispatcher.payload = b"hello"
    assert problems(jobs.job(dispatcher), "Job") == []


def test_a_job_read_through_the_api_registers_back_unchanged() -> None:
    job = rich_job()
    again = jobs.from_nomad(jobs.job(job))
    for field in ("create_index", "modify_index", "job_modify_index", "submit_time", "status"):
        again.ClearField(field)  # type: ignore[arg-type]
        job.ClearField(field)  # type: ignore[arg-type]
    assert again == job


def test_allocations_have_nomads_shape() -> None:
    job = rich_job()
    node = mock.node()
    alloc = mock.alloc(job, node)
    alloc.task_resources["server"].allocated_devices.add(
        vendor="nvidia", type="gpu", name="t4", device_ids=["GPU-1"]
    )
    alloc.resources.networks.add(mode="host", dynamic_ports=[pb.Port(label="http", value=23456)])
    alloc.task_states["server"].CopyFrom(
        pb.TaskState(
            state="running",
            restarts=1,
            last_restart=5 * SECOND,
            started_at=6 * SECOND,
            events=[
                pb.TaskEvent(type="Started", time=1),
                pb.TaskEvent(type="Restarting", time=2, restart_reason_delay=5 * SECOND),
            ],
        )
    )
    alloc.metrics.CopyFrom(
        pb.AllocMetric(
            nodes_evaluated=3,
            nodes_available={"dc1": 2},
            score_meta_data=[pb.NodeScoreMeta(node_id=node.id, scores={"binpack": 0.5})],
        )
    )
    alloc.reschedule_tracker.events.add(reschedule_time=1, prev_alloc_id="a", prev_node_id="n")
    alloc.deployment_status.CopyFrom(pb.AllocDeploymentStatus(healthy=True, canary=True))
    alloc.desired_transition.migrate = True
    alloc.alloc_states.add(field="client_status", value="running", time=3)
    full = allocs.alloc(alloc, jobs.job(job))
    assert problems(full, "Allocation") == []
    assert full["TaskStates"]["server"]["Events"][1]["StartDelay"] == 5 * SECOND
    assert full["DesiredTransition"]["Migrate"] is True
    assert problems(allocs.stub(alloc), "AllocationListStub") == []
    for internal in ("JobType", "JobPriority", "JobModifyIndex", "Traceparent"):
        assert internal not in full


def test_nodes_have_nomads_shape() -> None:
    node = mock.node()
    node.node_resources.devices.add(
        vendor="nvidia",
        type="gpu",
        name="t4",
        instance_ids=["GPU-1", "GPU-2"],
        attributes={"memory": "16384", "cuda": "12.1", "ecc": "true", "arch": "turing"},
    )
    node.node_resources.max_allocs = 50
    node.drain_strategy.CopyFrom(
        pb.DrainStrategy(deadline=3600 * SECOND, force_deadline=7200 * SECOND, started_at=1)
    )
    node.drain = True
    node.events.add(message="Node registered", subsystem="Cluster", timestamp=SECOND)
    shown = nodes.node(node)
    assert problems(shown, "Node") == []
    assert shown["NodeMaxAllocs"] == 50
    attrs = shown["NodeResources"]["Devices"][0]["Attributes"]
    assert attrs["memory"]["Int"] == 16384 and attrs["cuda"]["Float"] == 12.1
    assert attrs["ecc"]["Bool"] is True and attrs["arch"]["String"] == "turing"
    assert "SecretID" not in shown


def test_evaluations_and_deployments_have_nomads_shape() -> None:
    job = mock.job()
    ev = mock.eval_for(job, status="blocked")
    ev.wait_until = 5 * SECOND
    ev.failed_tg_allocs["web"].CopyFrom(
        pb.AllocMetric(nodes_evaluated=1, nodes_exhausted=1, dimension_exhausted={"memory": 1})
    )
    ev.queued_allocations["web"] = 3
    ev.quota_limit_reached = True  # a bool of ours: Nomad's is a quota's name
    shown = evals.evaluation(ev)
    assert problems(shown, "Evaluation") == []
    assert shown["QuotaLimitReached"] == ""
    assert problems(evals.stub(ev), "EvaluationStub") == []
    assert evals.stub(pb.Evaluation())["WaitUntil"] == "0001-01-01T00:00:00Z"
    d = pb.Deployment(id="d", job_id=job.id, status="running")
    d.task_groups["web"].CopyFrom(
        pb.DeploymentState(desired_total=3, desired_canaries=1, placed_canaries=["a"])
    )
    assert problems(deployments.deployment(d), "Deployment") == []


@pytest.mark.parametrize(
    ("value", "type_expr", "expected"),
    [
        (False, "string", "expected a string"),
        (None, "string", "never sends null"),
        (1.5, "int", "a whole number"),
        ("1h", "duration", "a whole number of nanoseconds"),
        ("yesterday", "time", "RFC 3339"),
        ({"ID": "x"}, "EvaluationStub", "missing"),
        ("x", "[]string", "an array"),
    ],
)
def test_the_checker_finds_what_breaks_nomads_go_client(
    value: Any, type_expr: str, expected: str
) -> None:
    found = problems(value, type_expr)
    assert found and expected in found[0]


def test_the_checker_accepts_what_nomad_sends() -> None:
    assert problems(None, "*Job") == []
    assert problems(None, "[]string") == []
    assert problems("", "durstring") == [] and problems("1h30m", "durstring") == []
    assert problems("2024-01-02T03:04:05.123456789Z", "time") == []
    # a field Nomad's server sends beyond the api struct (structs.JobRegisterResponse)
    assert problems({"EvalID": "", "EvalCreateIndex": 0, "JobModifyIndex": 0, "Warnings": "",
                     "Index": 3}, "JobRegisterResponse") == []  # fmt: skip


# -- errors in the caller's vocabulary ------------------------------------


@pytest.mark.parametrize(
    ("proto", "nomad"),
    [
        ("job", "Job"),
        ("job.task_groups[0].count", "Job.TaskGroups[0].Count"),
        (
            "job.task_groups[0].tasks[1].resources.memory_mb",
            "Job.TaskGroups[0].Tasks[1].Resources.MemoryMB",
        ),
        ("job.meta[a.b]", "Job.Meta[a.b]"),
        (
            "job.task_groups[0].tasks[0].config.port_map.http",
            "Job.TaskGroups[0].Tasks[0].Config.port_map.http",
        ),
        (
            "job.task_groups[0].services[0].checks[0].tls_skip_verify",
            "Job.TaskGroups[0].Services[0].Checks[0].TLSSkipVerify",
        ),
        ("job.periodic.crons[0]", "Job.Periodic.Specs[0]"),
        (
            "job.task_groups[0].spreads[0].spread_target[1].percent",
            "Job.TaskGroups[0].Spreads[0].SpreadTarget[1].Percent",
        ),
    ],
)
def test_a_proto_path_reads_as_nomads_json_path(proto: str, nomad: str) -> None:
    assert jobspec_json.nomad_path(proto) == nomad


def test_the_gateways_parse_names_nomads_fields() -> None:
    data = jobs.job(rich_job())
    data["TaskGroups"][0]["Count"] = "three"
    with pytest.raises(jobs.JobInputError) as caught:
        jobs.from_nomad(data)
    assert str(caught.value) == "Job.TaskGroups[0].Count: expected a whole number, got 'three'"


def _refusal(message: str, field: str | None) -> grpc.aio.AioRpcError:
    trailing = grpc.aio.Metadata()
    if field is not None:
        trailing.add(FIELD_METADATA_KEY, field)
    return grpc.aio.AioRpcError(
        grpc.StatusCode.INVALID_ARGUMENT, grpc.aio.Metadata(), trailing, message
    )


def test_the_states_refusal_of_a_job_names_nomads_fields() -> None:
    # the state names the field in its trailing metadata (corral.runtime.server)
    code, message, md = server_status_for(
        InvalidArgument("job.task_groups[0].meta", "has 1001 entries, more than 1000")
    )
    assert md == ((FIELD_METADATA_KEY, "job.task_groups[0].meta"),)
    answer = grpc_error_response(_refusal(message, dict(md)[FIELD_METADATA_KEY]))
    assert answer.status_code == 400
    assert answer.body == b"Job.TaskGroups[0].Meta: has 1001 entries, more than 1000"
    # other objects' fields, and refusals without a field, are left as sent
    for message, field in (("job_id: is required", "job_id"), ("no such thing", None)):
        assert grpc_error_response(_refusal(message, field)).body == message.encode()
    # a field gRPC cannot carry as text metadata is not sent (the message still is)
    assert server_status_for(InvalidArgument("job.meta[é]", "x"))[2] == ()


def test_the_gateways_metrics_have_the_shape_of_nomads_summary() -> None:
    from services.gateway.metrics import REQUESTS, SECONDS
    from services.gateway.routes.metrics import summary

    REQUESTS.labels("GET", "/v1/probe", "200").inc(2)
    SECONDS.labels("/v1/probe").observe(0.5)
    SECONDS.labels("/v1/probe").observe(1.5)
    shown = summary()
    assert problems(shown, "MetricsSummary") == []
    (counted,) = [c for c in shown["Counters"] if c["Labels"].get("route") == "/v1/probe"]
    assert counted["Name"] == "corral_http_requests" and counted["Count"] == 2
    (timed,) = [s for s in shown["Samples"] if s["Labels"] == {"route": "/v1/probe"}]
    assert (timed["Count"], timed["Sum"], timed["Mean"]) == (2, 2.0, 1.0)
