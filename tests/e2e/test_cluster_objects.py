"""Namespaces, node pools and scaling policies end to end, against one
`corral dev -acl` and three simulated nodes in a pool of their own
(`python -m services.agent.sim --node-pool gpu`): the CLI and the HTTP API
(python-nomad where it has the endpoint) with ACL tokens; a job pinned to
the pool never lands elsewhere, one in a pool without nodes blocks saying
so; the scaling policies of a job run by the CLI read back through
/v1/scaling/policies, and a scale through the API records its event."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nomad
import pytest
import requests
from nomad.api import exceptions as nomad_errors

from tests.devprocess import DevProcess, start_dev, stop_dev
from tests.wait import wait_for

ROOT = Path(__file__).resolve().parents[2]
SIM_NODES = 3

PINNED = """
job "pinned" {
  node_pool = "gpu"
  group "g" {
    count = 6
    task "t" {
      driver = "mock"
      config {
        run_for = "0"
      }
      resources {
        cpu    = 20
        memory = 16
      }
    }
  }
}
"""

STRANDED = (
    PINNED.replace('"pinned"', '"stranded"')
    .replace('"gpu"', '"empty"')
    .replace("count = 6", "count = 1")
)

SCALED = """
job "autoscaled" {
  group "web" {
    count = 2
    scaling {
      min = 1
      max = 4
      policy {
        cooldown = "1m"
        check "cpu" {
          source = "nomad-apm"
          query  = "avg_cpu"
          strategy "target-value" {
            target = 70
          }
        }
      }
    }
    task "t" {
      driver = "mock"
      config {
        run_for = "0"
      }
      resources {
        cpu    = 20
        memory = 16
      }
      scaling "mem" {
        max = 512
      }
    }
  }
}
"""

GPU_POOL = """
node_pool "gpu" {
  description = "The GPU machines"
  meta {
    vendor = "acme"
  }
  scheduler_config {
    scheduler_algorithm = "spread"
  }
}
"""


class World:
    def __init__(self, dev: DevProcess, workdir: Path) -> None:
        self.dev = dev
        self.workdir = workdir
        self.url = dev.http_addr
        match = re.fullmatch(r"http://([\d.]+):(\d+)", self.url)
        assert match, self.url
        self.host, self.port = match.group(1), int(match.group(2))
        self.token = dev.token
        self.api = self.client(self.token)

    def client(self, token: str | None, namespace: str | None = None) -> nomad.Nomad:
        return nomad.Nomad(
            host=self.host, port=self.port, token=token, timeout=30, namespace=namespace
        )

    def corral(self, *args: str, token: str | None = None, stdin: str = "") -> Any:
        env = {k: v for k, v in os.environ.items() if not k.startswith("CORRAL_")}
        env["CORRAL_ADDR"] = self.dev.info["address"]
        env["CORRAL_TOKEN"] = self.token if token is None else token
        return subprocess.run(
            [sys.executable, "-m", "cli", *args], cwd=ROOT, env=env, input=stdin,
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip

    def ok(self, *args: str, token: str | None = None, stdin: str = "") -> str:
        proc = self.corral(*args, token=token, stdin=stdin)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        return str(proc.stdout)

    def refused(self, message: str, *args: str, token: str | None = None) -> None:
        proc = self.corral(*args, token=token)
        assert proc.returncode == 1, proc.stdout
        assert proc.stderr.startswith("Error: ") and message in proc.stderr, proc.stderr
        assert "Traceback" not in proc.stderr

    def http(self, method: str, path: str, token: str | None = None, **kw: Any) -> Any:
        headers = {"X-Nomad-Token": self.token if token is None else token}
        return requests.request(method, self.url + path, headers=headers, timeout=30, **kw)

    def file(self, name: str, text: str) -> str:
        path = self.workdir / name
        path.write_text(text)
        return str(path)

    def token_for(self, name: str, rules: str) -> str:
        self.ok("acl", "policy", "apply", name, "-", stdin=rules)
        made = json.loads(self.ok("acl", "token", "create", "-policy", name, "-json"))
        return str(made["secret_id"])


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    env = {k: v for k, v in os.environ.items() if k != "CORRAL_SERVER_TOKEN"}
    workdir = tmp_path_factory.mktemp("cluster-objects")
    dev = start_dev(tmp_path_factory.mktemp("cluster-objects-dev"), "-acl", env=env)
    sim: subprocess.Popen[bytes] | None = None
    try:
        w = World(dev, workdir)
        # the pool exists before its nodes (node pool apply), with its own algorithm
        assert w.ok("node", "pool", "apply", w.file("gpu.hcl", GPU_POOL)) == (
            'Successfully applied node pool "gpu"!\n'
        )
        with (workdir / "sim.log").open("wb") as log:
            sim = subprocess.Popen(
                [sys.executable, "-m", "services.agent.sim", "--state-addr",
                 dev.info["address"], "--count", str(SIM_NODES), "--node-pool", "gpu",
                 "--seed", "27", "--stats-interval", "5"],
                cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
            )  # fmt: skip
        wait_for(
            "the dev node and the simulated gpu nodes ready",
            lambda: (
                len([n for n in w.api.nodes.get_nodes() if n["Status"] == "ready"]) == SIM_NODES + 1
            ),
            timeout=120,
        )
        yield w
    finally:
        if sim is not None:
            sim.terminate()
            try:
                sim.wait(30)
            except subprocess.TimeoutExpired:
                sim.kill()
        stop_dev(dev)


# ------------------------------------------------------------ namespaces


def test_namespaces_through_cli_and_http(world: World) -> None:
    w = world
    # a job naming a namespace that does not exist is refused, through both
    job = w.api.jobs.parse(PINNED.replace('"pinned"', '"early"'))
    job["Namespace"] = "team-a"
    with pytest.raises(nomad_errors.BadRequestNomadException) as err:
        w.api.jobs.register_job({"Job": job})
    assert "is in nonexistent namespace 'team-a'" in err.value.nomad_resp.text
    in_team_a = PINNED.replace('node_pool = "gpu"', 'namespace = "team-a"\n  node_pool = "gpu"')
    w.refused(
        "job 'pinned' is in nonexistent namespace 'team-a'",
        "job", "run", "-detach", w.file("team-a.hcl", in_team_a),
    )  # fmt: skip

    out = w.ok("namespace", "apply", "-description", "Team A", "-meta", "owner=a", "team-a")
    assert out == 'Successfully applied namespace "team-a"!\n'
    # python-nomad creates one with POST /v1/namespace
    w.api.namespace.create_namespace({"Name": "team-b", "Description": "Team B"})
    listed = {n["Name"]: n for n in w.api.namespaces.get_namespaces()}
    assert {"default", "team-a", "team-b"} <= set(listed)
    assert listed["team-a"]["Meta"] == {"owner": "a"}
    status = w.ok("namespace", "status", "team-a")
    assert re.search(r"Description\s+= Team A", status) and "owner" in status

    # a token sees the namespaces its rules name, and may not write them
    reader = w.token_for("team-a-read", 'namespace "team-a" { policy = "read" }')
    seen = [n["Name"] for n in w.client(reader).namespaces.get_namespaces()]
    assert seen == ["team-a"]
    assert w.ok("namespace", "list", token=reader).splitlines()[1].startswith("team-a")
    denied = w.http("POST", "/v1/namespace/team-c", token=reader, json={"Name": "team-c"})
    assert denied.status_code == 403 and denied.text == "Permission denied"
    w.refused("Permission denied", "namespace", "delete", "team-b", token=reader)

    # a namespace holding a live job is not deleted; once the job is gone it is
    job["Namespace"] = "team-a"
    job["ID"] = job["Name"] = "early"
    job["TaskGroups"][0]["Count"] = 0
    w.client(w.token, "team-a").job.register_job("early", {"Job": job})
    held = w.http("DELETE", "/v1/namespace/team-a")
    assert held.status_code == 400 and "non-terminal job 'early'" in held.text, held.text
    w.ok("job", "stop", "-purge", "-detach", "-namespace", "team-a", "early")
    w.ok("namespace", "delete", "team-a")
    assert w.http("GET", "/v1/namespace/team-a").status_code == 404
    w.refused("the default namespace cannot be deleted", "namespace", "delete", "default")


# ------------------------------------------------------------ node pools


def _pool_nodes(w: World) -> set[str]:
    return {n["ID"] for n in w.http("GET", "/v1/node/pool/gpu/nodes").json()}


def test_node_pools_and_a_pinned_job(world: World) -> None:
    w = world
    pools = {p["Name"]: p for p in w.http("GET", "/v1/node/pools").json()}
    assert {"all", "default", "gpu"} <= set(pools)
    gpu = pools["gpu"]
    assert gpu["SchedulerConfiguration"]["SchedulerAlgorithm"] == "spread"
    assert gpu["Meta"] == {"vendor": "acme"}
    info = w.ok("node", "pool", "info", "gpu")
    assert "The GPU machines" in info and re.search(r"Scheduler Algorithm\s+= spread", info)
    gpu_nodes = _pool_nodes(w)
    assert len(gpu_nodes) == SIM_NODES
    assert len(w.http("GET", "/v1/node/pool/all/nodes").json()) == SIM_NODES + 1
    assert w.ok("node", "pool", "nodes", "gpu").count("gpu") == SIM_NODES

    # a job pinned to the pool: every alloc on one of its three nodes
    w.ok("job", "run", "-detach", w.file("pinned.hcl", PINNED))

    def placed() -> list[dict[str, Any]] | None:
        allocs = [a for a in w.api.job.get_allocations("pinned") if a["DesiredStatus"] == "run"]
        return allocs if len(allocs) == 6 else None

    allocs = wait_for("six allocs of the pinned job", placed, timeout=90)
    assert {a["NodeID"] for a in allocs} <= gpu_nodes
    # and the pool's three nodes all take some
    assert len({a["NodeID"] for a in allocs}) == SIM_NODES
    jobs = [j["ID"] for j in w.http("GET", "/v1/node/pool/gpu/jobs").json()]
    assert jobs == ["pinned"]
    assert "pinned" in w.ok("node", "pool", "jobs", "gpu")

    # a pool with nodes or live jobs is not deleted; built-ins never
    held = w.http("DELETE", "/v1/node/pool/gpu")
    assert held.status_code == 400 and "has nodes" in held.text
    w.refused("deleting node pool 'all' is not allowed", "node", "pool", "delete", "all")

    # a job in a pool without nodes blocks, saying why
    w.ok("node", "pool", "apply", "-", stdin='node_pool "empty" { description = "none" }')
    run = w.corral("job", "run", w.file("stranded.hcl", STRANDED))
    assert 'No nodes are ready in node pool "empty"' in run.stdout, run.stdout + run.stderr

    def blocked() -> bool:
        evals = w.api.job.get_evaluations("stranded")
        return any(e["Status"] == "blocked" for e in evals)

    wait_for("the stranded job's blocked eval", blocked, timeout=60)
    failed = [e for e in w.api.job.get_evaluations("stranded") if e.get("FailedTGAllocs")][0][
        "FailedTGAllocs"
    ]["g"]
    assert failed["NodePool"] == "empty" and failed["NodesInPool"] == 0


def test_node_pool_rules(world: World) -> None:
    w = world
    reader = w.token_for(
        "gpu-read", 'node_pool "gpu" { policy = "read" }\nnode { policy = "read" }'
    )
    seen = [p["Name"] for p in w.http("GET", "/v1/node/pools", token=reader).json()]
    assert seen == ["gpu"]
    assert len(w.http("GET", "/v1/node/pool/gpu/nodes", token=reader).json()) == SIM_NODES
    assert w.http("GET", "/v1/node/pool/default", token=reader).status_code == 403
    body = {"Name": "gpu", "Description": "changed"}
    assert w.http("POST", "/v1/node/pool/gpu", token=reader, json=body).status_code == 403
    writer = w.token_for("scratch-write", 'node_pool "scratch-*" { policy = "write" }')
    made = w.http("POST", "/v1/node/pools", token=writer, json={"Name": "scratch-1"})
    assert made.status_code == 200, made.text
    assert w.http("DELETE", "/v1/node/pool/scratch-1", token=writer).status_code == 200
    w.refused("Permission denied", "node", "pool", "delete", "gpu", token=writer)


# ------------------------------------------------------------ scaling


def test_scaling_policies_after_job_run(world: World) -> None:
    w = world
    w.ok("job", "run", "-detach", w.file("autoscaled.hcl", SCALED))
    policies = w.api.scaling.get_scaling_policies(job="autoscaled")
    by_type = {p["Type"]: p for p in policies}
    assert set(by_type) == {"horizontal", "vertical_mem"}
    horizontal = by_type["horizontal"]
    assert horizontal["Target"] == {"Namespace": "default", "Job": "autoscaled", "Group": "web"}
    policy = w.api.scaling.get_scaling_policy(horizontal["ID"])
    assert (policy["Min"], policy["Max"], policy["Enabled"]) == (1, 4, True)
    assert policy["Policy"]["check"] == [
        {
            "cpu": [
                {
                    "source": "nomad-apm",
                    "query": "avg_cpu",
                    "strategy": [{"target-value": [{"target": 70}]}],
                }
            ]
        }
    ]
    listed = w.ok("scaling", "policy", "list")
    assert "Namespace:default,Job:autoscaled,Group:web" in listed

    # what nomad-autoscaler's target plugin sends, and reads back
    body = {"Count": 3, "Target": {"Group": "web"}, "Message": "cpu high", "Meta": {"v": 81}}
    over = {**body, "Count": 5}
    too_many = w.http("POST", "/v1/job/autoscaled/scale", json=over)
    assert too_many.status_code == 400
    assert "greater than scaling policy maximum: 5 > 4" in too_many.text

    def scaled() -> bool:
        resp = w.http("POST", "/v1/job/autoscaled/scale", json=body)
        if resp.status_code == 400 and "active deployment" in resp.text:
            return False  # the first registration's deployment is still running
        assert resp.status_code == 200, resp.text
        return True

    wait_for("the scale accepted", scaled, timeout=90)
    status = w.http("GET", "/v1/job/autoscaled/scale").json()
    web = status["TaskGroups"]["web"]
    assert web["Desired"] == 3 and web["Events"][0]["Message"] == "cpu high"
    assert web["Events"][0]["Count"] == 3 and web["Events"][0]["Meta"] == {"v": 81}
    # the policy's id did not change with the new version
    assert w.api.scaling.get_scaling_policy(horizontal["ID"])["ID"] == horizontal["ID"]
    w.refused(
        "group count was less than scaling policy minimum: 0 < 1",
        "job", "scale", "autoscaled", "web", "0",
    )  # fmt: skip
