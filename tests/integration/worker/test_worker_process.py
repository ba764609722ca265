"""The worker pool as real processes over real state, broker, planner and
PostgreSQL (issue 5): end-to-end scheduling, pause/resume, resizing,
version mismatch back-off, a kill mid-eval, and the behind-the-state
long backoff that ends as soon as the replica catches up."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import grpc
import psycopg

from corral.security import transport
from corral.testing import mock
from corral.v1 import (
    eval_pb2_grpc,
    job_pb2,
    job_pb2_grpc,
    plan_pb2_grpc,
    state_pb2_grpc,
    worker_pb2,
    worker_pb2_grpc,
)
from corral.v1 import structs_pb2 as pb
from services.state.db.database import Database
from tests.cluster import Cluster
from tests.wait import until

BROKER_FAST = [
    "--nack-timeout",
    "2",
    "--initial-nack-delay",
    "0.2",
    "--subsequent-nack-delay",
    "0.5",
]


def job(job_id: str, count: int = 3) -> pb.Job:
    j = mock.job(job_id=job_id, count=count)
    for name in ("version", "create_index", "modify_index", "job_modify_index", "status"):
        j.ClearField(name)  # type: ignore[arg-type]
    return j


async def add_nodes(dsn: str, n: int = 3) -> None:
    db = Database(dsn, pool_size=1)
    try:
        async with db.write() as tx:
            for _ in range(n):
                tx.put_node(mock.node())
    finally:
        await db.close()


def eval_status(dsn: str, eval_id: str) -> str:
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT status FROM evals WHERE id = %s", (eval_id,)).fetchone()
    return str(row[0]) if row else ""


def placed(dsn: str, job_id: str) -> int:
    with psycopg.connect(dsn) as conn:
        row = conn.execute(
            "SELECT count(*) FROM allocs WHERE job_id = %s AND desired_status = 'run'", (job_id,)
        ).fetchone()
    return int(row[0]) if row else 0


def plan_commits(dsn: str, job_id: str) -> int:
    """Change-log batches that placed allocs of the job (one per committed plan)."""
    with psycopg.connect(dsn) as conn:
        rows = conn.execute("SELECT payload FROM change_log ORDER BY index").fetchall()
    n = 0
    for (payload,) in rows:
        batch = pb.ChangeBatch.FromString(payload)
        if any(e.type == "PlanResult" and e.allocation.job_id == job_id for e in batch.events):
            n += 1
    return n


def start_servers(c: Cluster) -> None:
    c.start("state")
    c.start("broker", *BROKER_FAST)
    c.start("planner", "--broker-addr", c.broker_addr)


async def register(c: Cluster, j: pb.Job) -> str:
    async with transport.dial(c.state_addr) as ch:
        resp = await job_pb2_grpc.JobStub(ch).Register(job_pb2.JobRegisterRequest(job=j))
    return str(resp.eval_id)


async def admin(c: Cluster, name: str, call: str, request: object) -> worker_pb2.WorkerListResponse:
    async with transport.dial(c.procs[name].address) as ch:
        resp: worker_pb2.WorkerListResponse = await getattr(worker_pb2_grpc.WorkerStub(ch), call)(
            request
        )
    return resp


async def test_registered_job_is_scheduled_end_to_end(make_cluster: Callable[..., Cluster]) -> None:
    c = make_cluster()
    start_servers(c)
    c.start("worker", "--num-schedulers", "2")
    await add_nodes(c.dsn)
    eval_id = await register(c, job("e2e", count=5))
    await until(lambda: eval_status(c.dsn, eval_id) == "complete")
    assert placed(c.dsn, "e2e") == 5
    assert plan_commits(c.dsn, "e2e") == 1


async def test_pause_resume_and_resize_at_run_time(make_cluster: Callable[..., Cluster]) -> None:
    c = make_cluster()
    start_servers(c)
    c.start("worker", "--num-schedulers", "2")
    await add_nodes(c.dsn)
    await admin(c, "worker", "Pause", worker_pb2.WorkerControlRequest())
    eval_id = await register(c, job("paused"))
    await asyncio.sleep(1.5)
    listed = await admin(c, "worker", "List", worker_pb2.WorkerListRequest())
    assert {w.status for w in listed.workers} == {"paused"}
    assert eval_status(c.dsn, eval_id) == "pending"  # nobody dequeued it
    await admin(c, "worker", "Resume", worker_pb2.WorkerControlRequest())
    await until(lambda: eval_status(c.dsn, eval_id) == "complete")

    async with transport.dial(c.procs["worker"].address) as ch:
        stub = worker_pb2_grpc.WorkerStub(ch)
        cfg = await stub.SetConfig(
            worker_pb2.WorkerPoolConfig(num_schedulers=4, enabled_schedulers=["service", "_core"])
        )
        assert cfg.num_schedulers == 4
        assert len((await stub.List(worker_pb2.WorkerListRequest())).workers) == 4
        cfg = await stub.SetConfig(
            worker_pb2.WorkerPoolConfig(num_schedulers=1, enabled_schedulers=["service", "_core"])
        )
        assert len((await stub.List(worker_pb2.WorkerListRequest())).workers) == 1
        try:
            await stub.SetConfig(
                worker_pb2.WorkerPoolConfig(num_schedulers=2, enabled_schedulers=["service"])
            )
            raise AssertionError("a config without _core must be refused")
        except grpc.aio.AioRpcError as exc:
            assert exc.code() == grpc.StatusCode.INVALID_ARGUMENT
    eval_id = await register(c, job("after-resize"))
    await until(lambda: eval_status(c.dsn, eval_id) == "complete")


async def test_version_mismatched_worker_gets_nothing_and_backs_off(
    make_cluster: Callable[..., Cluster],
) -> None:
    c = make_cluster()
    start_servers(c)
    c.start("worker", "--num-schedulers", "1", "--scheduler-version", "2", name="old")
    await add_nodes(c.dsn)
    eval_id = await register(c, job("mismatch"))
    await asyncio.sleep(2.0)
    assert eval_status(c.dsn, eval_id) == "pending"
    listed = await admin(c, "old", "List", worker_pb2.WorkerListRequest())
    assert {w.workload_status for w in listed.workers} == {"backoff"}
    assert "scheduler version mismatch" in c.log("old")
    c.start("worker", "--num-schedulers", "1", name="current")
    await until(lambda: eval_status(c.dsn, eval_id) == "complete")


async def test_killed_mid_eval_is_redelivered_and_plans_once(
    make_cluster: Callable[..., Cluster],
) -> None:
    c = make_cluster()
    start_servers(c)
    c.start(
        "worker",
        "--num-schedulers",
        "1",
        env={"CORRAL_WORKER_FAULT": "stall-before-ack"},
        name="doomed",
    )
    await add_nodes(c.dsn)
    eval_id = await register(c, job("killed", count=4))
    await until(lambda: "stalling before ack" in c.log("doomed"))
    assert placed(c.dsn, "killed") == 4  # its plan committed ...
    c.kill("doomed")  # ... but it never acked
    c.start("worker", "--num-schedulers", "1", name="rescuer")
    await until(lambda: eval_status(c.dsn, eval_id) == "complete", timeout=30)
    assert placed(c.dsn, "killed") == 4
    assert plan_commits(c.dsn, "killed") == 1  # the redelivery planned nothing new


async def test_worker_behind_the_state_nacks_then_resumes_when_caught_up(
    make_cluster: Callable[..., Cluster],
) -> None:
    """In-process pool over real processes, so the test can hold its replica."""
    from corral.runtime.replica import Replica
    from services.worker.clients import LeaderClient
    from services.worker.config import WorkerSettings
    from services.worker.pool import WorkerPool

    c = make_cluster()
    start_servers(c)
    await add_nodes(c.dsn)
    settings = WorkerSettings(
        state_addr=c.state_addr,
        broker_addrs=[c.broker_addr],
        planner_addrs=[c.planner_addr],
        num_schedulers=1,
        sync_limit=0.5,
        slow_catchup=30.0,
    )
    replica = Replica(c.state_addr, name="held")
    await replica.start()
    replica.pause()  # held behind: it will not see the eval's index
    broker = LeaderClient(settings.broker_addrs, eval_pb2_grpc.EvalStub)
    planner = LeaderClient(settings.planner_addrs, plan_pb2_grpc.PlanStub)
    channel = transport.dial(c.state_addr)
    pool = WorkerPool(settings, replica, broker, planner, state_pb2_grpc.StateStub(channel))
    await pool.start()
    try:
        eval_id = await register(c, job("behind"))
        worker = pool.workers[0]
        await until(lambda: worker.workload == "backoff", timeout=10)  # nacked, in the long wait
        assert eval_status(c.dsn, eval_id) == "pending"
        caught_up = time.monotonic()
        replica.resume()
        await until(lambda: eval_status(c.dsn, eval_id) == "complete", timeout=20)
        resumed_after = time.monotonic() - caught_up
        # a small fraction of the 30 s long backoff: it ended on catch-up
        assert resumed_after < settings.slow_catchup / 3, resumed_after
    finally:
        await pool.stop()
        await replica.stop()
        await broker.close()
        await planner.close()
        await channel.close()
