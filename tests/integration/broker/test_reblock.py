"""Reblocking through the real processes: a worker's `blocked` decision
(`State.DecideEval`) writes what the re-run learned and the broker, acking
it from the feed, puts the same eval back in the tracker; and a blocked eval
released by a capacity change that still cannot place everything is
reblocked under the same id by a real worker — no new blocked eval."""

from __future__ import annotations

from collections.abc import Callable

import psycopg

from corral.security import transport
from corral.testing import mock
from corral.v1 import eval_pb2, eval_pb2_grpc
from corral.v1 import structs_pb2 as pb
from tests.cluster import Cluster
from tests.integration.broker.test_broker_process import (
    cluster,  # noqa: F401  (fixture)
    dequeue,
    finish,
    pending,
    write,
)
from tests.integration.worker.test_worker_process import job, placed, register, start_servers
from tests.wait import until


def evals_of(dsn: str, job_id: str) -> dict[str, pb.Evaluation]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute("SELECT payload FROM evals WHERE job_id = %s", (job_id,)).fetchall()
    return {e.id: e for e in (pb.Evaluation.FromString(p) for (p,) in rows)}


def queued_in_summary(dsn: str, job_id: str) -> dict[str, int]:
    with psycopg.connect(dsn) as conn:
        row = conn.execute(
            "SELECT payload FROM job_summaries WHERE job_id = %s", (job_id,)
        ).fetchone()
    if row is None:
        return {}
    summary = pb.JobSummary.FromString(row[0])
    return {tg: s.queued for tg, s in summary.summary.items()}


async def test_reblock_writes_what_the_rerun_learned(cluster: Cluster) -> None:  # noqa: F811
    small = mock.node(node_class="small")
    blocked = pending("rw", status="blocked", triggered_by="queued-allocs")
    blocked.escaped_computed_class = True
    blocked.queued_allocations["web"] = 3
    await write(cluster.dsn, mock.job(job_id="rw"), blocked)
    await until(lambda: evals_of(cluster.dsn, "rw")[blocked.id].status == "blocked")
    await write(cluster.dsn, small)  # releases it: written back pending
    await until(lambda: evals_of(cluster.dsn, "rw")[blocked.id].status == "pending")
    async with transport.dial(cluster.procs["broker"].address) as ch:
        stub = eval_pb2_grpc.EvalStub(ch)
        got = await dequeue(stub, 5000)
        assert got.eval.id == blocked.id
        rerun = pb.Evaluation()
        rerun.CopyFrom(got.eval)
        rerun.status = "blocked"
        rerun.status_description = "created to place remaining allocations"
        rerun.escaped_computed_class = False
        rerun.class_eligibility[small.computed_class] = False
        rerun.queued_allocations["web"] = 1
        rerun.failed_tg_allocs["web"].nodes_exhausted = 1
        rerun.snapshot_index = got.wait_index
        index = await finish(cluster, stub, got, outcome=rerun)
        stored = evals_of(cluster.dsn, "rw")[blocked.id]
        assert stored.modify_index == index
        assert stored.status == "blocked"
        assert dict(stored.queued_allocations) == {"web": 1}
        assert dict(stored.class_eligibility) == {small.computed_class: False}
        assert not stored.escaped_computed_class
        assert stored.snapshot_index == got.wait_index
        assert stored.failed_tg_allocs["web"].nodes_exhausted == 1
        assert queued_in_summary(cluster.dsn, "rw") == {"web": 1}
        stats = await stub.Stats(eval_pb2.BrokerStatsRequest())
        assert (stats.total_blocked, stats.total_escaped) == (1, 0)
        assert len(evals_of(cluster.dsn, "rw")) == 1


async def test_released_blocked_eval_still_short_is_reblocked_by_the_worker(
    make_cluster: Callable[..., Cluster],
) -> None:
    c = make_cluster()
    start_servers(c)
    c.start("worker", "--num-schedulers", "1")
    big = job("short", count=3)
    big.task_groups[0].tasks[0].resources.cpu = 3000  # one alloc per node
    register_eval = await register(c, big)
    await until(
        lambda: bool(evals_of(c.dsn, "short").get(register_eval, pb.Evaluation()).blocked_eval)
    )
    blocked_id = evals_of(c.dsn, "short")[register_eval].blocked_eval
    assert evals_of(c.dsn, "short")[blocked_id].status == "blocked"

    await write(c.dsn, mock.node())  # room for one of the three
    await until(
        lambda: (
            placed(c.dsn, "short") == 1
            and (e := evals_of(c.dsn, "short")[blocked_id]).status == "blocked"
            and dict(e.queued_allocations) == {"web": 2}
        )
    )
    evals = evals_of(c.dsn, "short")
    assert set(evals) == {register_eval, blocked_id}  # the same eval, no new blocked one
    assert queued_in_summary(c.dsn, "short") == {"web": 2}

    await write(c.dsn, mock.node(), mock.node())  # room for the rest
    await until(lambda: evals_of(c.dsn, "short")[blocked_id].status == "complete")
    assert placed(c.dsn, "short") == 3
    assert set(evals_of(c.dsn, "short")) == {register_eval, blocked_id}
    assert dict(evals_of(c.dsn, "short")[blocked_id].queued_allocations) == {"web": 0}
