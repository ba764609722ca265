"""More broker rules through the real process over real state and
PostgreSQL: priority across scheduler types then FIFO within one (types tied
on priority are picked at random), one outstanding eval
per job with the rest pending (superseded ones canceled on ack), escaped
blocked evals released by any node, a reblock decision's checks (a blocked
eval's, under the holder's token) and its tracking, and the Stats totals."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from corral.domain.structs import copy_msg
from corral.security import transport
from corral.testing import mock
from corral.v1 import eval_pb2, eval_pb2_grpc
from tests.cluster import Cluster
from tests.integration.broker.test_broker_process import (
    cluster,  # noqa: F401  (fixture)
    decide,
    dequeue,
    eval_rows,
    finish,
    held,
    ignored,
    pending,
    write,
)
from tests.wait import until


async def take(
    stub: eval_pb2_grpc.EvalAsyncStub, schedulers: list[str]
) -> eval_pb2.EvalDequeueResponse:
    resp: eval_pb2.EvalDequeueResponse = await stub.Dequeue(
        eval_pb2.EvalDequeueRequest(schedulers=schedulers, timeout_ms=3000, scheduler_version=1)
    )
    return resp


async def test_priority_across_types_then_fifo_within_a_type(cluster: Cluster) -> None:  # noqa: F811
    a = pending("a", priority=50)
    b = pending("b", priority=70)
    c = pending("c", priority=50, type="batch")
    d = pending("d", priority=90, type="batch")
    e = pending("e", priority=50)
    for ev in (a, b, c, d, e):  # one write each: increasing create index
        await write(cluster.dsn, ev)
    async with transport.dial(cluster.procs["broker"].address) as ch:
        stub = eval_pb2_grpc.EvalStub(ch)
        stats = eval_pb2.BrokerStats()
        for _ in range(100):
            stats = await stub.Stats(eval_pb2.BrokerStatsRequest())
            if stats.total_ready == 5:
                break
            await asyncio.sleep(0.05)
        assert stats.total_ready == 5
        assert stats.by_scheduler["service"].ready == 3
        assert stats.by_scheduler["batch"].ready == 2
        order = []
        for _ in range(5):
            got = await take(stub, ["service", "batch"])
            order.append(got.eval.id)
        assert order[:2] == [d.id, b.id]  # priority first, whatever the type
        assert set(order[2:]) == {a.id, c.id, e.id}  # tied types: either may come first
        assert order.index(a.id) < order.index(e.id)  # FIFO within a type
        stats = await stub.Stats(eval_pb2.BrokerStatsRequest())
        assert (stats.total_ready, stats.total_unacked) == (0, 5)


async def test_one_outstanding_eval_per_job(cluster: Cluster) -> None:  # noqa: F811
    first = pending("same")
    older = pending("same")
    newer = pending("same")
    other = pending("other")
    for ev in (first, older, newer, other):
        await write(cluster.dsn, ev)
    async with transport.dial(cluster.procs["broker"].address) as ch:
        stub = eval_pb2_grpc.EvalStub(ch)
        got1 = await dequeue(stub)
        got2 = await dequeue(stub)
        assert {got1.eval.id, got2.eval.id} == {first.id, other.id}
        none = await dequeue(stub, 300)  # the job's others wait as pending
        assert not none.eval.id
        stats = await stub.Stats(eval_pb2.BrokerStatsRequest())
        assert (stats.total_pending, stats.total_unacked) == (2, 2)
        mine = got1 if got1.eval.id == first.id else got2
        await finish(cluster, stub, mine)
        nxt = await dequeue(stub)
        assert nxt.eval.id == newer.id  # highest modify index wins
        await until(lambda: eval_rows(cluster.dsn, "same")[older.id][0] == "canceled")
        await finish(cluster, stub, nxt)
        # an ack twice: the token is stale now
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stub.Ack(eval_pb2.EvalAckRequest(eval_id=newer.id, token=nxt.token))
        assert err.value.code() in (
            grpc.StatusCode.FAILED_PRECONDITION,
            grpc.StatusCode.NOT_FOUND,
        )


async def test_escaped_blocked_eval_released_by_any_node(cluster: Cluster) -> None:  # noqa: F811
    odd = mock.node(node_class="odd")
    e = pending("escaped", status="blocked", triggered_by="queued-allocs")
    e.escaped_computed_class = True
    e.class_eligibility[odd.computed_class] = False  # ignored: escaped
    await write(cluster.dsn, mock.job(job_id="escaped"), e)
    async with transport.dial(cluster.procs["broker"].address) as ch:
        stub = eval_pb2_grpc.EvalStub(ch)
        for _ in range(100):
            stats = await stub.Stats(eval_pb2.BrokerStatsRequest())
            if stats.total_escaped == 1:
                break
            await asyncio.sleep(0.05)
        assert (stats.total_blocked, stats.total_escaped) == (1, 1)
        await write(cluster.dsn, odd)
        await until(lambda: eval_rows(cluster.dsn, "escaped")[e.id][0] == "pending")
        got = await dequeue(stub)
        assert got.eval.id == e.id


async def test_a_reblock_decision_needs_a_blocked_eval_and_the_holders_token(
    cluster: Cluster,  # noqa: F811
) -> None:
    """What `Eval.Reblock` checked, on the worker's decision: the state
    refuses a `blocked` outcome of an eval that is not a blocked one; the
    broker ignores one under a token it no longer holds the eval with; the
    holder's reblock acks the eval and tracks it again under its id, and the
    next capacity change releases it."""
    plain = pending("rb-plain")
    released = pending("rb", triggered_by="queued-allocs")  # as a release writes it back
    await write(cluster.dsn, mock.job(job_id="rb-plain"), mock.job(job_id="rb"), plain)
    await write(cluster.dsn, released)  # a later create index: dequeued second
    async with transport.dial(cluster.procs["broker"].address) as ch:
        stub = eval_pb2_grpc.EvalStub(ch)
        got = await dequeue(stub)
        assert got.eval.id == plain.id
        reblocked = copy_msg(got.eval)
        reblocked.status = "blocked"
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await decide(cluster, got.token, reblocked)
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "not blocked" in (err.value.details() or "")
        assert eval_rows(cluster.dsn, "rb-plain")[plain.id][0] == "pending"  # nothing written
        assert await held(stub, plain.id)
        await finish(cluster, stub, got)

        got = await dequeue(stub)
        assert got.eval.id == released.id
        reblocked = copy_msg(got.eval)
        reblocked.status = "blocked"
        # a decision under a token the broker does not hold it with (a worker
        # whose lease lapsed) is written, but acks and tracks nothing
        await decide(cluster, "stale-token", reblocked)
        await ignored(cluster, released.id)
        assert await held(stub, released.id)
        stats = await stub.Stats(eval_pb2.BrokerStatsRequest())
        assert (stats.total_blocked, stats.total_unacked) == (0, 1)
        # the holder's reblock: acked, and tracked again under the same id
        await finish(cluster, stub, got, status="blocked")
        stats = await stub.Stats(eval_pb2.BrokerStatsRequest())
        assert (stats.total_blocked, stats.total_unacked) == (1, 0)
        assert eval_rows(cluster.dsn, "rb") == {released.id: ("blocked", "")}
        await write(cluster.dsn, mock.node())
        await until(lambda: eval_rows(cluster.dsn, "rb")[released.id][0] == "pending")
        again = await dequeue(stub)
        assert again.eval.id == released.id
