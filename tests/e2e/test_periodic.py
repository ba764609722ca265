"""Periodic jobs on real processes: `corral job periodic force` launches a
child whose alloc runs on an agent, `job status` shows the next launch and
the children, and the dispatcher follows the broker's leadership — a standby
taking over launches the next tick once, and a broker elected after ticks
were missed launches once, not once per missed tick."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import grpc
import pytest

from corral.domain import periodic
from corral.security import transport
from corral.v1 import (
    eval_pb2,
    eval_pb2_grpc,
    job_pb2,
    job_pb2_grpc,
    query_pb2,
    state_pb2,
    state_pb2_grpc,
)
from corral.v1 import structs_pb2 as pb
from tests.cluster import Cluster
from tests.wait import until

pytestmark = [pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]

BROKER = ["--nack-timeout", "5", "--initial-nack-delay", "0.2", "--subsequent-nack-delay", "0.5"]
JOB = """
job "report" {
  type = "batch"
  datacenters = ["dc1"]
  periodic {
    %s
    time_zone        = "Europe/Paris"
    prohibit_overlap = true
  }
  group "g" {
    task "t" {
      driver = "mock"
      config {
        run_for = "1s"
      }
      resources {
        cpu    = 50
        memory = 32
      }
    }
  }
}
"""


def start(c: Cluster, tmp: Path) -> None:
    c.start("state")
    c.start("broker", *BROKER, name="broker")
    c.start("broker", *BROKER, name="broker2")
    c.start("planner")
    c.start("worker", "--num-schedulers", "1")
    c.start("agent", "--data-dir", str(tmp / "agent0"), "--name", "agent0", name="agent0")


def corral(c: Cluster, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "CORRAL_ADDR": c.state_addr, "TZ": "UTC"}
    return subprocess.run(
        [sys.executable, "-m", "cli", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


async def children(c: Cluster) -> list[job_pb2.JobListStub]:
    async with transport.dial(c.state_addr) as ch:
        resp = await job_pb2_grpc.JobStub(ch).List(
            job_pb2.JobListRequest(query=query_pb2.QueryOptions(prefix="report/periodic-"))
        )
    return [j for j in resp.jobs if j.parent_id == "report"]


async def child_ids(c: Cluster) -> list[str]:
    return sorted(j.id for j in await children(c))


async def allocs(c: Cluster, job_id: str) -> list[pb.Allocation]:
    async with transport.dial(c.state_addr) as ch:
        resp = await job_pb2_grpc.JobStub(ch).Allocations(
            job_pb2.JobGetRequest(job_id=job_id, all=True)
        )
    return list(resp.allocs)


async def ran(c: Cluster, job_id: str) -> bool:
    """The child's alloc was placed on the agent and ran to completion."""
    return any(a.node_id and a.client_status == "complete" for a in await allocs(c, job_id))


async def is_leader(address: str) -> bool:
    async with transport.dial(address) as ch:
        try:
            stats = await eval_pb2_grpc.EvalStub(ch).Stats(eval_pb2.BrokerStatsRequest(), timeout=5)
        except grpc.aio.AioRpcError:
            return False
    return bool(stats.enabled)


async def recorded_launch(c: Cluster) -> int:
    async with transport.dial(c.state_addr) as ch:
        resp = await state_pb2_grpc.StateStub(ch).PeriodicLaunches(
            state_pb2.PeriodicLaunchesRequest(namespace="default", job_id="report")
        )
    return resp.launches[0].launch


def exact(at: datetime) -> str:
    """A 7-field cron (seconds first, year last) matching `at` only, in Paris."""
    local = at.astimezone(periodic.location(pb.PeriodicConfig(time_zone="Europe/Paris")))
    return f"{local.second} {local.minute} {local.hour} {local.day} {local.month} * *"


async def test_force_status_and_a_leader_change(make_cluster, tmp_path: Path) -> None:
    c = make_cluster()
    start(c, tmp_path)
    spec = tmp_path / "report.nomad.hcl"
    spec.write_text(JOB % 'cron = "0 0 1 1 *"')  # once a year: only forced launches
    run = corral(c, "job", "run", str(spec))
    assert run.returncode == 0, run.stderr
    assert "Approximate next launch time:" in run.stdout

    forced = corral(c, "job", "periodic", "force", "report", "-json")
    assert forced.returncode == 0, forced.stderr
    first = json.loads(forced.stdout)
    assert first["eval_id"] and first["child_job_id"].startswith("report/periodic-")
    await until(lambda: ran(c, first["child_job_id"]), what="the forced child ran")

    status = corral(c, "job", "status", "report")
    assert status.returncode == 0, status.stderr
    # midnight on 1 January in Paris, printed in UTC
    new_year = f"{datetime.now(UTC).year}-12-31T23:00:00+00:00"
    assert re.search(rf"Next Periodic Launch\s+= {re.escape(new_year)} \(", status.stdout), (
        status.stdout
    )
    assert re.search(r"Status\s+= running", status.stdout), status.stdout
    assert "Previously Launched Jobs" in status.stdout
    assert re.search(rf"{re.escape(first['child_job_id'])}\s+dead", status.stdout), status.stdout
    plan = corral(c, "job", "plan", str(spec))
    assert f"next periodic launch would be at {new_year}" in plan.stdout, plan.stdout
    status_json = json.loads(corral(c, "job", "status", "-json", "report").stdout)
    assert [k["id"] for k in status_json["children"]] == [first["child_job_id"]]

    # the leader dies; the standby restores the job and launches nothing by itself
    assert await is_leader(c.procs["broker"].address)
    c.kill("broker")
    await until(lambda: is_leader(c.procs["broker2"].address), what="the standby leads")
    await until(lambda: int(time.time()) > int(first["child_job_id"].rsplit("-", 1)[1]))
    forced = corral(c, "job", "periodic", "force", "report")  # monitors like job run
    assert forced.returncode == 0, forced.stdout + forced.stderr
    assert "Launched job" in forced.stdout and 'finished with status "complete"' in forced.stdout
    kids = await child_ids(c)
    assert len(kids) == 2 and first["child_job_id"] in kids
    assert await recorded_launch(c) == periodic.launch_of(kids[-1], "report")

    # a stopped parent is no longer tracked: force is refused
    stop = corral(c, "job", "stop", "-detach", "report")
    assert stop.returncode == 0, stop.stderr
    refused = corral(c, "job", "periodic", "force", "report")
    assert refused.returncode != 0 and "stopped" in refused.stderr


async def test_ticks_across_a_takeover_and_missed_ticks_launch_once(
    make_cluster, tmp_path: Path
) -> None:
    """The one test that waits for real ticks (about 30 s): a cron with a
    seconds field, one tick for each phase."""
    c = make_cluster()
    start(c, tmp_path)
    t1 = datetime.now(UTC).replace(microsecond=0) + timedelta(seconds=8)
    t2 = t1 + timedelta(seconds=12)  # the standby's, after the leader dies
    t3, t4 = t2 + timedelta(seconds=5), t2 + timedelta(seconds=8)  # no broker runs then
    far = t1 + timedelta(hours=2)
    crons = ", ".join(f'"{exact(t)}"' for t in (t1, t2, t3, t4, far))
    spec = tmp_path / "report.nomad.hcl"
    spec.write_text((JOB % f"crons = [{crons}]").replace("prohibit_overlap = true", ""))
    run = corral(c, "job", "run", str(spec))
    assert run.returncode == 0, run.stderr

    def child(t: datetime) -> str:
        return periodic.child_id("report", t)

    await until(lambda: child_ids(c), timeout=30, what="the first tick")
    assert await child_ids(c) == [child(t1)]
    c.kill("broker")
    await until(lambda: is_leader(c.procs["broker2"].address), what="the standby leads")
    assert datetime.now(UTC) < t2, "the standby took over too late for this test"
    await until(lambda: len_is(c, 2), timeout=30, what="the standby's tick")
    assert await child_ids(c) == sorted([child(t1), child(t2)])
    await until(lambda: ran(c, child(t2)), what="the second child ran")

    # no broker at all across t3 and t4
    c.kill("broker2")
    await until(lambda: datetime.now(UTC) > t4 + timedelta(seconds=1), timeout=30)
    earlier = len(c.log("broker"))
    broker = c.procs["broker"]
    broker.args += ["--listen", broker.address]  # where the worker and planner look for it
    c.restart("broker")
    await until(
        lambda: "periodic dispatcher: launched" in c.log("broker")[earlier:],
        what="the new leader restored the dispatcher",
    )
    assert "periodic dispatcher: launched 1 missed" in c.log("broker")[earlier:]
    kids = await child_ids(c)
    assert len(kids) == 3, kids
    late = [k for k in kids if k not in (child(t1), child(t2))][0]
    assert late not in (child(t3), child(t4))
    assert (periodic.launch_of(late, "report") or 0) > periodic.to_unix_ns(t4)
    await until(lambda: ran(c, late), what="the catch-up child ran")


async def len_is(c: Cluster, n: int) -> bool:
    return len(await child_ids(c)) >= n
