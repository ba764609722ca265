"""Deployments end to end, on real processes with real agents running mock
tasks: a rolling update of 6 allocs with max_parallel = 2 (driven by
`corral job run`, which follows the deployment) never has more than 2 allocs
being replaced and ends successful with the new version stable; a failing
update with auto_revert reverts to the last stable version; a paused
deployment replaces nothing until resumed (through the CLI)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from corral.security import transport
from corral.v1 import deployment_pb2, deployment_pb2_grpc, job_pb2, job_pb2_grpc
from corral.v1 import structs_pb2 as pb
from tests.cluster import Cluster
from tests.e2e.test_agent_lifecycle import BROKER, TTL, allocs
from tests.wait import until

ROOT = Path(__file__).resolve().parents[2]

UPDATE = """
    update {{
      max_parallel      = 2
      health_check      = "task_states"
      min_healthy_time  = "{min_healthy}"
      healthy_deadline  = "{healthy}"
      progress_deadline = "{progress}"
      auto_revert       = true
      canary            = {canary}
    }}
"""


def jobspec(
    version: str,
    *,
    fail: bool = False,
    count: int = 6,
    canary: int = 0,
    cpu: int = 20,
    progress: str = "30s",
    min_healthy: str = "1s",
) -> str:
    """A service job of `count` mock tasks; `fail`: the task exits 1 after
    half a second and is not restarted (its alloc turns unhealthy)."""
    config = 'run_for = "0.5s"\n        exit_code = 1' if fail else 'run_for = "0"'
    healthy = "2s" if progress != "30s" else "10s"
    update = UPDATE.format(
        canary=canary, healthy=healthy, progress=progress, min_healthy=min_healthy
    )
    return f"""
job "web" {{
  datacenters = ["dc1"]
  type = "service"

  group "g" {{
    count = {count}
{update}
    restart {{
      attempts = 0
      mode     = "fail"
    }}

    task "main" {{
      driver = "mock"
      config {{
        {config}
      }}
      env {{
        VERSION = "{version}"
      }}
      resources {{
        cpu    = {cpu}
        memory = 16
      }}
    }}
  }}
}}
"""


def start(c: Cluster, tmp: Path, agents: int = 2) -> None:
    c.start("state", *TTL)
    c.start("broker", *BROKER)
    c.start("planner")
    c.start("worker", "--num-schedulers", "2")
    for i in range(agents):
        c.start(
            "agent", "--data-dir", str(tmp / f"agent{i}"), "--name", f"agent{i}", name=f"agent{i}"
        )


def corral(c: Cluster, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, CORRAL_ADDR=c.state_addr)
    return subprocess.run(
        [sys.executable, "-m", "cli", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def corral_json(c: Cluster, *args: str) -> Any:
    proc = corral(c, *args, "-json")
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


async def deployments_of(c: Cluster, job_id: str) -> list[pb.Deployment]:
    async with transport.dial(c.state_addr) as ch:
        resp = await deployment_pb2_grpc.DeploymentStub(ch).List(
            deployment_pb2.DeploymentListRequest(job_id=job_id)
        )
    return list(resp.deployments)


async def deployment_of(c: Cluster, job_id: str, version: int) -> pb.Deployment | None:
    return next((d for d in await deployments_of(c, job_id) if d.job_version == version), None)


async def versions(c: Cluster, job_id: str) -> list[pb.Job]:
    async with transport.dial(c.state_addr) as ch:
        resp = await job_pb2_grpc.JobStub(ch).Versions(job_pb2.JobVersionsRequest(job_id=job_id))
    return sorted(resp.versions, key=lambda j: j.version)


async def _status(c: Cluster, version: int, status: str) -> pb.Deployment | None:
    d = await deployment_of(c, "web", version)
    return d if d is not None and d.status == status else None


def being_replaced(live: list[pb.Allocation], version: int) -> int:
    """Allocs of the new version that should run and are not yet healthy."""
    return sum(
        1
        for a in live
        if a.job_version == version
        and a.desired_status == "run"
        and a.client_status in ("pending", "running")
        and not a.deployment_status.healthy
    )


async def _run_file(
    c: Cluster, tmp: Path, name: str, spec: str
) -> subprocess.CompletedProcess[str]:
    path = tmp / name
    path.write_text(spec)
    return await asyncio.to_thread(corral, c, "job", "run", str(path))


async def test_rolling_update_of_six_two_at_a_time_ends_successful(
    make_cluster: Callable[..., Cluster], tmp_path: Path
) -> None:
    c = make_cluster()
    start(c, tmp_path)
    first = await _run_file(c, tmp_path, "v0.hcl", jobspec("0"))
    assert first.returncode == 0, first.stdout + first.stderr
    assert "successful" in first.stdout
    await until(lambda: _status(c, 0, "successful"), what="version 0 deployed")

    run = asyncio.create_task(_run_file(c, tmp_path, "v1.hcl", jobspec("1")))
    most = 0
    while not run.done():
        live = await allocs(c, "web")
        most = max(most, being_replaced(live, 1))
        await asyncio.sleep(0.05)
    proc = await run
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Monitoring deployment" in proc.stdout and "successful" in proc.stdout
    assert 1 <= most <= 2

    d = await deployment_of(c, "web", 1)
    assert d is not None and d.status == "successful"
    assert d.task_groups["g"].healthy_allocs == 6 and d.task_groups["g"].placed_allocs == 6
    live = [a for a in await allocs(c, "web") if a.desired_status == "run"]
    assert len(live) == 6 and {a.job_version for a in live} == {1}
    assert [v.stable for v in await versions(c, "web")] == [True, True]

    listed = corral_json(c, "job", "deployments", "web")
    assert [x["job_version"] for x in listed] == [1, 0]
    assert corral_json(c, "deployment", "status", d.id[:8])["status"] == "successful"
    status = corral(c, "job", "status", "web")
    assert status.returncode == 0 and "Latest Deployment" in status.stdout
    assert "successful" in status.stdout


async def test_failing_update_auto_reverts_to_the_stable_version(
    make_cluster: Callable[..., Cluster], tmp_path: Path
) -> None:
    c = make_cluster()
    start(c, tmp_path)
    first = await _run_file(c, tmp_path, "v0.hcl", jobspec("good", count=3))
    assert first.returncode == 0, first.stdout + first.stderr

    bad = await _run_file(c, tmp_path, "v1.hcl", jobspec("bad", fail=True, count=3))
    assert bad.returncode == 1, bad.stdout + bad.stderr
    assert "failed" in bad.stdout

    failed = await until(lambda: _status(c, 1, "failed"), what="version 1 failed")
    assert "rolling back to job version 0" in failed.status_description
    await until(lambda: _status(c, 2, "successful"), what="the revert (version 2) deployed")
    history = await versions(c, "web")
    assert [(v.version, v.stable) for v in history] == [(0, True), (1, False), (2, True)]
    assert history[2].task_groups[0].tasks[0].env["VERSION"] == "good"
    live = [a for a in await allocs(c, "web") if a.desired_status == "run"]
    assert len(live) == 3 and {a.job_version for a in live} == {2}

    shown = corral(c, "job", "history", "web")
    assert shown.returncode == 0 and shown.stdout.count("Stable") == 3


async def test_paused_deployment_waits_for_resume(
    make_cluster: Callable[..., Cluster], tmp_path: Path
) -> None:
    c = make_cluster()
    start(c, tmp_path)
    first = await _run_file(c, tmp_path, "v0.hcl", jobspec("0", count=4))
    assert first.returncode == 0, first.stdout + first.stderr

    path = tmp_path / "v1.hcl"
    # the first batch turns healthy only after the pause below has landed (a
    # CLI process takes a second or two to start on a loaded machine)
    path.write_text(jobspec("1", count=4, min_healthy="6s"))
    detached = await asyncio.to_thread(corral, c, "job", "run", "-detach", str(path))
    assert detached.returncode == 0, detached.stderr
    d = await until(lambda: deployment_of(c, "web", 1), what="version 1's deployment")
    paused = await asyncio.to_thread(corral, c, "deployment", "pause", d.id)
    assert paused.returncode == 0, paused.stderr
    # the first batch becomes healthy; nothing more is replaced while paused
    await until(
        lambda: _healthy(c, 1, 2),
        what="the first batch healthy",
    )
    live = await allocs(c, "web")
    assert sum(1 for a in live if a.job_version == 1) == 2
    assert (await deployment_of(c, "web", 1)).status == "paused"  # type: ignore[union-attr]

    resumed = await asyncio.to_thread(corral, c, "deployment", "resume", d.id[:8])
    assert resumed.returncode == 0, resumed.stderr
    await until(lambda: _status(c, 1, "successful"), what="version 1 deployed after resume")


async def _healthy(c: Cluster, version: int, n: int) -> bool:
    d = await deployment_of(c, "web", version)
    return d is not None and d.task_groups["g"].healthy_allocs >= n


async def test_canary_waits_for_promote_then_rolls_out(
    make_cluster: Callable[..., Cluster], tmp_path: Path
) -> None:
    c = make_cluster()
    start(c, tmp_path)
    first = await _run_file(c, tmp_path, "v0.hcl", jobspec("0", count=4, canary=1))
    assert first.returncode == 0, first.stdout + first.stderr

    # job run returns once the canary is healthy and waits for a promotion
    run = await _run_file(c, tmp_path, "v1.hcl", jobspec("1", count=4, canary=1))
    assert run.returncode == 0, run.stdout + run.stderr
    assert "corral deployment promote" in run.stdout
    d = await deployment_of(c, "web", 1)
    assert d is not None and d.status == "running"
    assert len(d.task_groups["g"].placed_canaries) == 1 and not d.task_groups["g"].promoted
    live = [a for a in await allocs(c, "web") if a.desired_status == "run"]
    assert sorted(a.job_version for a in live) == [0, 0, 0, 0, 1]  # beside the old ones
    (canary,) = [a for a in live if a.job_version == 1]
    assert canary.deployment_status.canary and canary.deployment_status.healthy

    promoted = await asyncio.to_thread(corral, c, "deployment", "promote", d.id[:8])
    assert promoted.returncode == 0, promoted.stderr
    await until(lambda: _status(c, 1, "successful"), what="version 1 deployed after promotion")
    live = [a for a in await allocs(c, "web") if a.desired_status == "run"]
    assert len(live) == 4 and {a.job_version for a in live} == {1}
    assert canary.id in {a.id for a in live}  # the canary stayed, in its old alloc's place
    assert [v.stable for v in await versions(c, "web")] == [True, True]


async def test_an_update_that_cannot_be_placed_fails_by_its_progress_deadline(
    make_cluster: Callable[..., Cluster], tmp_path: Path
) -> None:
    c = make_cluster()
    start(c, tmp_path)
    first = await _run_file(c, tmp_path, "v0.hcl", jobspec("0", count=2, progress="3s"))
    assert first.returncode == 0, first.stdout + first.stderr

    path = tmp_path / "v1.hcl"
    path.write_text(jobspec("1", count=2, cpu=1_000_000, progress="3s"))  # fits nowhere
    detached = await asyncio.to_thread(corral, c, "job", "run", "-detach", str(path))
    assert detached.returncode == 0, detached.stderr
    failed = await until(lambda: _status(c, 1, "failed"), what="version 1 failed")
    assert failed.status_description.startswith("Failed due to progress deadline")
    assert failed.task_groups["g"].placed_allocs == 0
    await until(lambda: _status(c, 2, "successful"), what="the revert (version 2) deployed")
    live = [a for a in await allocs(c, "web") if a.desired_status == "run"]
    assert len(live) == 2 and {a.job_version for a in live} <= {0, 2}
