"""`corral system gc` on real processes (issue 19): with Nomad's long
thresholds nothing is old enough, yet a forced pass collects a stopped
job with its evals and allocs, and a purged job's evals and allocs once
they are terminal; the CLI waits for the pass (or, with -detach, prints
the core eval's id), and a bad wait is refused before anything happens."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import grpc
import pytest

from corral.security import transport
from corral.v1 import (
    alloc_pb2,
    alloc_pb2_grpc,
    eval_pb2,
    job_pb2,
    job_pb2_grpc,
    system_pb2,
    system_pb2_grpc,
)
from tests.cluster import Cluster
from tests.wait import until

pytestmark = [pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]

JOB = """
job "%s" {
  datacenters = ["dc1"]
  group "g" {
    count = 2
    task "t" {
      driver = "mock"
      config {
        run_for = "1h"
      }
      resources {
        cpu    = 50
        memory = 32
      }
    }
  }
}
"""


def corral(c: Cluster, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "CORRAL_ADDR": c.state_addr}
    return subprocess.run(
        [sys.executable, "-m", "cli", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


async def job_allocs(c: Cluster, job_id: str) -> list[str]:
    """(id, client status) of every alloc of the job still in state."""
    async with transport.dial(c.state_addr) as ch:
        resp = await alloc_pb2_grpc.AllocStub(ch).List(alloc_pb2.AllocListRequest(job_id=job_id))
    return [f"{a.id}:{a.client_status}" for a in resp.allocs]


async def job_evals(c: Cluster, job_id: str) -> list[str]:
    from corral.v1 import eval_pb2_grpc

    async with transport.dial(c.state_addr) as ch:
        resp = await eval_pb2_grpc.EvalsStub(ch).List(eval_pb2.EvalListRequest(job_id=job_id))
    return [e.id for e in resp.evals]


async def job_exists(c: Cluster, job_id: str) -> bool:
    async with transport.dial(c.state_addr) as ch:
        try:
            await job_pb2_grpc.JobStub(ch).Get(job_pb2.JobGetRequest(job_id=job_id))
        except grpc.aio.AioRpcError as exc:
            assert exc.code() == grpc.StatusCode.NOT_FOUND
            return False
    return True


async def test_system_gc_forces_a_full_pass(make_cluster, tmp_path: Path) -> None:
    c = make_cluster()
    c.start("state")
    c.start("broker")
    c.start("planner")
    c.start("worker", "--num-schedulers", "2")
    c.start("sim", "--count", "2", "--classes", "0", "--racks", "0", module="services.agent.sim")

    for name in ("kept", "stopped", "purged"):
        spec = tmp_path / f"{name}.hcl"
        spec.write_text(JOB % name)
        run = corral(c, "job", "run", "-detach", str(spec))
        assert run.returncode == 0, run.stderr

    async def running(job_id: str) -> bool:
        allocs = await job_allocs(c, job_id)
        return len(allocs) == 2 and all(a.endswith(":running") for a in allocs)

    for name in ("kept", "stopped", "purged"):
        await until(lambda n=name: running(n), what=f"{name}'s allocs run")  # type: ignore[misc]

    assert corral(c, "job", "stop", "stopped").returncode == 0
    assert corral(c, "job", "stop", "-purge", "purged").returncode == 0

    async def stopped(job_id: str) -> bool:
        allocs = await job_allocs(c, job_id)
        return bool(allocs) and all(a.endswith(":complete") for a in allocs)

    await until(lambda: stopped("stopped"), what="the stopped job's allocs end")
    await until(lambda: stopped("purged"), what="the purged job's allocs end")
    assert await job_evals(c, "purged")  # Nomad's thresholds: nothing is old enough

    gc = corral(c, "system", "gc")
    assert gc.returncode == 0, gc.stderr
    assert "Garbage collection complete" in gc.stdout and "Evaluation ID:" in gc.stdout

    assert await job_allocs(c, "purged") == []
    assert await job_evals(c, "purged") == []
    assert not await job_exists(c, "stopped")
    assert await job_allocs(c, "stopped") == []
    assert await job_evals(c, "stopped") == []
    assert await job_exists(c, "kept")
    assert len(await job_allocs(c, "kept")) == 2

    detached = corral(c, "system", "gc", "-detach", "-json")
    assert detached.returncode == 0, detached.stderr
    answer = json.loads(detached.stdout)
    assert answer["eval_id"] and not answer.get("complete", False)

    bad = corral(c, "system", "gc", "-timeout", "301")
    assert bad.returncode != 0 and "-timeout" in bad.stderr
    async with transport.dial(c.state_addr) as ch:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await system_pb2_grpc.SystemStub(ch).GarbageCollect(
                system_pb2.SystemGCRequest(timeout_ms=10**9)
            )
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "timeout_ms" in (err.value.details() or "")
