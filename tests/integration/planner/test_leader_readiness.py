"""The readiness the broker's and planner's pods report (deploy/k8s): two
real planner processes, and `python -m corral.runtime.probe` run as the kubelet's
exec probe runs it. Only the leader reports `corral.leader` SERVING, so a
Service routes to it alone; when it stops, the standby takes office and
turns ready; both stay live (the server-wide status) throughout."""

from __future__ import annotations

import asyncio
import os
import sys

from corral.runtime.probe import LEADER_SERVICE
from tests.cluster import Cluster
from tests.wait import until


async def probe(address: str, service: str) -> tuple[int, str]:
    """Exit status and stderr of the exec probe, as the kubelet sees them."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "corral.runtime.probe",
        address,
        service,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
        env=dict(os.environ),
    )
    _, err = await asyncio.wait_for(proc.communicate(), timeout=30)
    assert proc.returncode is not None
    return proc.returncode, err.decode()


async def test_only_the_leader_is_ready(cluster: Cluster) -> None:
    first = await cluster.start_async("planner", name="planner-a")
    # the first planner takes the lock: ready
    await until(
        lambda: _ok(first.address, LEADER_SERVICE), what="the first planner ready", timeout=30
    )
    second = await cluster.start_async("planner", name="planner-b")
    code, said = await probe(second.address, LEADER_SERVICE)
    assert code == 1 and "NOT_SERVING" in said  # a standby: out of the Service
    assert (await probe(second.address, ""))[0] == 0  # but live
    assert (await probe(first.address, LEADER_SERVICE))[0] == 0

    # the leader goes away: the standby takes office and turns ready
    await cluster.stop_async(first.name)
    await until(lambda: _ok(second.address, LEADER_SERVICE), what="the standby ready", timeout=45)
    # nothing listens where the old leader was: not ready, and the probe says why
    code, said = await probe(first.address, LEADER_SERVICE)
    assert code == 1 and "UNAVAILABLE" in said and "Traceback" not in said


async def _ok(address: str, service: str) -> bool:
    return (await probe(address, service))[0] == 0
