"""Nomad's native service discovery with the real agent (issue 28), against
`corral dev -acl`: a raw_exec job serving HTTP from its task directory
(`python3 -m http.server ${NOMAD_PORT_http}`) registers its service, its
http check passes and its deployment with `health_check = "checks"`
succeeds; `corral service info` and `/v1/service/:name` show where it
listens (and it does answer there); an in-place update whose check fails
fails the deployment; `check_restart` restarts a task whose check keeps
failing; a token without read-job in the namespace is refused; stopping
the job removes its instance, which the event stream tells. Then, on a
cluster of separate processes, a node going down takes its instances
along."""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from corral.domain.structs import NodeStatus
from corral.security import transport
from corral.v1 import job_pb2, job_pb2_grpc, query_pb2, service_pb2, service_pb2_grpc
from corral.v1 import structs_pb2 as pb
from tests.cluster import Cluster
from tests.devprocess import DevClient, start_dev, stop_dev
from tests.e2e.test_agent_lifecycle import nodes, start
from tests.wait import until, wait_for

WEB = """
job "web" {
  datacenters = ["dc1"]

  group "g" {
    network {
      port "http" {}
    }

    update {
      max_parallel      = 1
      health_check      = "checks"
      min_healthy_time  = "1s"
      healthy_deadline  = "8s"
      progress_deadline = "60s"
    }

    service {
      name     = "web"
      port     = "http"
      provider = "nomad"
      tags     = ["v1"]

      check {
        type     = "http"
        path     = "CHECK_PATH"
        interval = "1s"
        timeout  = "1s"
      }
    }

    task "server" {
      driver = "raw_exec"

      config {
        command = "python3"
        args    = ["-m", "http.server", "${NOMAD_PORT_http}"]
      }

      resources {
        cpu    = 50
        memory = 64
      }
    }
  }
}
"""

RESTARTING = """
job "restarting" {
  datacenters = ["dc1"]

  group "g" {
    network {
      port "http" {}
    }

    restart {
      attempts = 10
      interval = "10m"
      delay    = "1s"
      mode     = "fail"
    }

    task "server" {
      driver = "raw_exec"

      config {
        command = "python3"
        args    = ["-m", "http.server", "${NOMAD_PORT_http}"]
      }

      service {
        port     = "http"
        provider = "nomad"

        check {
          type     = "http"
          path     = "/not-there"
          interval = "1s"
          timeout  = "1s"

          check_restart {
            limit = 2
            grace = "1s"
          }
        }
      }

      resources {
        cpu    = 50
        memory = 64
      }
    }
  }
}
"""


class Dev(DevClient):
    """`corral dev -acl`: the gateway with the management token, the CLI."""

    def deployment(self, job: str) -> dict[str, Any]:
        found: dict[str, Any] = self.ok(f"/v1/job/{job}/deployment") or {}
        return found


@pytest.fixture(scope="module")
def dev(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Dev]:
    tmp = tmp_path_factory.mktemp("corral-dev-services")
    started = start_dev(
        tmp / "dev", "-acl", env={k: v for k, v in os.environ.items() if k != "CORRAL_SERVER_TOKEN"}
    )
    try:
        d = Dev(started, tmp)
        wait_for(
            "the dev client node",
            lambda: any(n["Status"] == "ready" for n in d.ok("/v1/nodes")),
            timeout=60,
        )
        yield d
    finally:
        stop_dev(started)


def test_a_service_registers_and_its_checks_pass_the_deployment(dev: Dev) -> None:
    dev.run("web", WEB.replace("CHECK_PATH", "/"))
    done = wait_for(
        "the deployment to succeed on its checks",
        lambda: (d := dev.deployment("web")).get("Status") == "successful" and d,
        timeout=90,
    )
    assert done["TaskGroups"]["g"]["HealthyAllocs"] == 1
    (instance,) = dev.ok("/v1/service/web")
    (alloc,) = [a for a in dev.ok("/v1/job/web/allocations") if a["ClientStatus"] == "running"]
    assert (instance["ServiceName"], instance["JobID"], instance["AllocID"]) == (
        "web", "web", alloc["ID"],
    )  # fmt: skip
    assert instance["Tags"] == ["v1"] and instance["Namespace"] == "default"
    # the address and port the catalog gives are where the task answers
    answer = requests.get(f"http://{instance['Address']}:{instance['Port']}/", timeout=10)
    assert answer.status_code == 200
    checks = dev.ok(f"/v1/client/allocation/{alloc['ID']}/checks")
    assert [c["Status"] for c in checks.values()] == ["success"]
    (result,) = checks.values()
    assert (result["Service"], result["Mode"], result["StatusCode"]) == ("web", "healthiness", 200)
    assert [r["ID"] for r in dev.ok("/v1/job/web/services")] == [instance["ID"]]
    assert [r["ID"] for r in dev.ok(f"/v1/allocation/{alloc['ID']}/services")] == [instance["ID"]]
    assert dev.ok("/v1/services") == [
        {"Namespace": "default", "Services": [{"ServiceName": "web", "Tags": ["v1"]}]}
    ]
    assert dev.ok("/v1/service/web", choose="1|some-alloc") == [instance]
    bad = dev.get("/v1/service/web", choose="one")
    assert bad.status_code == 400 and "<number>|<key>" in bad.text

    info = dev.corral("service", "info", "web")
    assert info.returncode == 0, info.stderr
    assert f"{instance['Address']}:{instance['Port']}" in info.stdout
    assert "1 passing" in info.stdout
    listed = dev.corral("service", "list")
    assert listed.returncode == 0 and "web" in listed.stdout and "[v1]" in listed.stdout
    as_json = json.loads(dev.corral("service", "info", "-json", "web").stdout)
    assert as_json[0]["port"] == instance["Port"]


def test_a_failing_check_fails_the_deployment(dev: Dev) -> None:
    wait_for("web running", lambda: dev.deployment("web").get("Status") == "successful", 90)
    # an in-place update: the same alloc, its check now asking for a missing page
    dev.run("web", WEB.replace("CHECK_PATH", "/missing"))
    failed = wait_for(
        "the new deployment to fail on its check",
        lambda: (
            (d := dev.deployment("web")).get("JobVersion") == 1
            and d.get("Status") == "failed"
            and d
        ),
        timeout=90,
    )
    assert failed["StatusDescription"] == "Failed due to unhealthy allocations"
    (alloc,) = [a for a in dev.ok("/v1/job/web/allocations") if a["ClientStatus"] == "running"]
    (result,) = dev.ok(f"/v1/client/allocation/{alloc['ID']}/checks").values()
    assert (result["Status"], result["StatusCode"]) == ("failure", 404)
    info = dev.corral("service", "info", "web")
    assert "1 failing" in info.stdout, info.stdout


def test_check_restart_restarts_the_task(dev: Dev) -> None:
    dev.run("restarting", RESTARTING)

    def restarted() -> dict[str, Any] | None:
        for stub in dev.ok("/v1/job/restarting/allocations"):
            alloc = dev.ok(f"/v1/allocation/{stub['ID']}")
            state = (alloc.get("TaskStates") or {}).get("server") or {}
            kinds = [e["Type"] for e in state.get("Events") or []]
            if state.get("Restarts", 0) >= 1 and "Restart Signaled" in kinds:
                return state
        return None

    state = wait_for("a restart for the failing check", restarted, timeout=60)
    signaled = next(e for e in state["Events"] if e["Type"] == "Restart Signaled")
    check = 'service: "restarting-g-server" check'
    assert signaled["DisplayMessage"] == f'healthcheck: check "{check}" unhealthy'


def test_a_token_without_read_job_is_refused(dev: Dev) -> None:
    wait_for("web registered", lambda: dev.ok("/v1/service/web"), 60)
    ns = requests.post(
        dev.url + "/v1/namespace",
        json={"Name": "other"},
        headers={"X-Nomad-Token": dev.token},
        timeout=30,
    )
    assert ns.status_code == 200, ns.text
    policy = {"Name": "other-reader", "Rules": 'namespace "other" { policy = "read" }'}
    made = requests.post(
        dev.url + "/v1/acl/policy/other-reader",
        json=policy,
        headers={"X-Nomad-Token": dev.token},
        timeout=30,
    )
    assert made.status_code == 200, made.text
    token = requests.post(
        dev.url + "/v1/acl/token",
        json={"Name": "t", "Type": "client", "Policies": ["other-reader"]},
        headers={"X-Nomad-Token": dev.token},
        timeout=30,
    ).json()["SecretID"]
    for path in ("/v1/services", "/v1/service/web", "/v1/job/web/services"):
        refused = dev.get(path, token=token)
        assert (refused.status_code, refused.text) == (403, "Permission denied"), path
    assert dev.get("/v1/services", token=token, namespace="*").json() == []
    denied = dev.corral("service", "list", token=token)
    assert denied.returncode == 1 and "Permission denied" in denied.stderr


def test_stopping_the_job_removes_its_instance(dev: Dev) -> None:
    (instance,) = wait_for("web registered", lambda: dev.ok("/v1/service/web"), 60)
    events: list[dict[str, Any]] = []

    def follow() -> None:
        with requests.get(
            dev.url + "/v1/event/stream",
            params={"topic": "Service:web", "index": str(instance["CreateIndex"] - 1)},
            headers={"X-Nomad-Token": dev.token},
            stream=True,
            timeout=60,
        ) as stream:
            for line in stream.iter_lines():
                if line:
                    events.extend(json.loads(line).get("Events") or [])
                if any(e["Type"] == "ServiceDeregistration" for e in events):
                    return

    reader = threading.Thread(target=follow, daemon=True)
    reader.start()
    stopped = dev.corral("job", "stop", "-detach", "web")
    assert stopped.returncode == 0, stopped.stderr
    wait_for("the instance to leave the catalog", lambda: dev.ok("/v1/service/web") == [], 60)
    reader.join(60)
    kinds = [(e["Type"], e["Key"]) for e in events]
    assert ("ServiceRegistration", instance["ID"]) in kinds
    assert ("ServiceDeregistration", instance["ID"]) in kinds
    gone = next(e for e in events if e["Type"] == "ServiceDeregistration")
    assert gone["Payload"]["Service"]["ServiceName"] == "web"
    assert dev.corral("service", "info", "web").returncode == 1


# ------------------------------------------------------------------ node down


def _catalog_job() -> pb.Job:
    """A mock task that runs until stopped, with a service on its port."""
    task = pb.Task(name="main", driver="mock", resources=pb.Resources(cpu=50, memory_mb=32))
    task.config.update({"run_for": "0"})
    tg = pb.TaskGroup(
        name="g",
        count=1,
        tasks=[task],
        networks=[pb.NetworkResource(mode="host", dynamic_ports=[pb.Port(label="db")])],
        services=[pb.Service(name="db", port_label="db", provider="nomad")],
    )
    return pb.Job(id="db", type="service", datacenters=["dc1"], task_groups=[tg])


async def test_a_node_going_down_takes_its_instances_along(
    make_cluster: Callable[..., Cluster], tmp_path: Path
) -> None:
    c = make_cluster()
    start(c, tmp_path, 1)
    async with transport.dial(c.state_addr) as ch:
        await job_pb2_grpc.JobStub(ch).Register(job_pb2.JobRegisterRequest(job=_catalog_job()))
        catalog = service_pb2_grpc.ServiceRegistrationStub(ch)

        async def instances() -> list[pb.ServiceRegistration]:
            resp = await catalog.GetService(
                service_pb2.ServiceGetRequest(service_name="db", query=query_pb2.QueryOptions())
            )
            return list(resp.registrations)

        (registered,) = await until(instances, what="the db instance", timeout=60)
        assert registered.port > 0
        c.kill("agent0")
        node = await until(lambda: _down(c), what="the killed agent's node down", timeout=60)
        assert node.id == registered.node_id
        await until(lambda: _gone(instances), what="the instance gone", timeout=30)


async def _down(c: Cluster) -> Any:
    node = (await nodes(c)).get("agent0")
    return node if node is not None and node.status == NodeStatus.DOWN else None


async def _gone(instances: Callable[[], Awaitable[list[pb.ServiceRegistration]]]) -> bool:
    return not await instances()
