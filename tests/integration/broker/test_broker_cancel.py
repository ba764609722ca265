"""The broker's cancel rule over real processes (state, broker, planner,
worker) and PostgreSQL (issue 30): when a run acks, its job's pending evals
that the run's snapshot covered are written back `canceled` with Nomad's
description; a delayed eval of the same job and the evals of another job
are not, and nothing a burst of updates asked for is lost."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import psycopg

from corral.security import transport
from corral.v1 import eval_pb2, eval_pb2_grpc
from corral.v1 import structs_pb2 as pb
from tests.cluster import Cluster
from tests.integration.broker.test_broker_process import pending, write
from tests.integration.worker.test_worker_process import (
    add_nodes,
    job,
    register,
    start_servers,
)
from tests.wait import until

CANCELED = "canceled after more recent eval was processed"


def update(job_id: str, rev: int) -> pb.Job:
    """A new version of the job (a meta change: a destructive update)."""
    j = job(job_id)
    j.meta["rev"] = str(rev)
    return j


def evals_of(dsn: str, job_id: str) -> dict[str, pb.Evaluation]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute("SELECT payload FROM evals WHERE job_id = %s", (job_id,)).fetchall()
    return {e.id: e for e in (pb.Evaluation.FromString(r[0]) for r in rows)}


def settled(dsn: str, *job_ids: str) -> bool:
    return all(e.status != "pending" for job_id in job_ids for e in evals_of(dsn, job_id).values())


def live_versions(dsn: str, job_id: str) -> set[int]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            "SELECT payload FROM allocs WHERE job_id = %s AND desired_status = 'run'", (job_id,)
        ).fetchall()
    return {pb.Allocation.FromString(r[0]).job_version for r in rows}


async def broker_stats(c: Cluster) -> eval_pb2.BrokerStats:
    async with transport.dial(c.broker_addr) as ch:
        stats: eval_pb2.BrokerStats = await eval_pb2_grpc.EvalStub(ch).Stats(
            eval_pb2.BrokerStatsRequest()
        )
    return stats


async def test_one_run_covers_a_queued_burst_but_not_a_delayed_eval(
    make_cluster: Callable[..., Cluster],
) -> None:
    c = make_cluster()
    start_servers(c)  # no worker yet: everything queues in the broker
    await add_nodes(c.dsn)
    first = await register(c, job("storm"))
    other = await register(c, job("other"))
    # a follow-up of the job held until its time (as a reschedule is)
    delayed = pending(
        "storm", triggered_by="alloc-failure", wait_until=time.time_ns() + 1_000_000_000
    )
    await write(c.dsn, delayed)
    burst = [await register(c, update("storm", rev)) for rev in range(1, 31)]

    async def queued() -> bool:
        s = await broker_stats(c)
        # storm: the first eval ready, the burst and the released follow-up pending
        return s.total_waiting == 0 and s.total_pending == 31 and s.total_ready == 2

    await until(queued, what="the burst and the released follow-up queued")
    c.start("worker", "--num-schedulers", "1")
    await until(lambda: settled(c.dsn, "storm", "other"), 60, what="every eval settled")

    storm = evals_of(c.dsn, "storm")
    complete = {i for i, e in storm.items() if e.status == "complete"}
    canceled = {i: e for i, e in storm.items() if e.status == "canceled"}
    # the first run's snapshot saw all 30 updates; the follow-up still ran
    assert complete == {first, delayed.id}
    assert set(canceled) == set(burst)
    assert {e.status_description for e in canceled.values()} == {CANCELED}
    assert storm[first].snapshot_index >= max(e.create_index for e in canceled.values())
    assert live_versions(c.dsn, "storm") == {30}  # the last version is what runs
    assert evals_of(c.dsn, "other")[other].status == "complete"


async def test_a_burst_while_the_worker_runs_loses_nothing(
    make_cluster: Callable[..., Cluster],
) -> None:
    c = make_cluster()
    start_servers(c)
    c.start("worker", "--num-schedulers", "2")
    await add_nodes(c.dsn)
    await register(c, job("steady"))
    await until(lambda: settled(c.dsn, "steady") and live_versions(c.dsn, "steady") == {0})
    revs = list(range(1, 41))
    sem = asyncio.Semaphore(8)

    async def one(rev: int) -> str:
        async with sem:
            return await register(c, update("steady", rev))

    burst = await asyncio.gather(*(one(rev) for rev in revs))
    last = max(revs)
    await until(lambda: settled(c.dsn, "steady"), 60, what="every eval settled")
    await until(lambda: live_versions(c.dsn, "steady") == {last}, what="the last version live")
    evals = evals_of(c.dsn, "steady")
    runs = [e for e in evals.values() if e.id in burst and e.status == "complete"]
    canceled = [e for e in evals.values() if e.status == "canceled"]
    assert {e.status for e in evals.values()} <= {"complete", "canceled"}
    assert len(runs) + len(canceled) == len(burst)
    assert {e.status_description for e in canceled} == {CANCELED}
    # runs of one job are serial, so a burst costs a run per run's worth of
    # arrivals: far fewer runs than updates
    assert len(runs) < len(burst) // 2, [e.id for e in runs]
