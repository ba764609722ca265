"""The in-memory eval broker: ordering, per-job serialization, tokens, nack
delays, delivery limit, cancelable set, delays (nomad/eval_broker_test.go)."""

from __future__ import annotations

import asyncio
import time

import pytest

from corral.domain.errors import FailedPrecondition, NotFound
from corral.domain.structs import new_id
from corral.v1 import structs_pb2 as pb
from services.broker.config import BrokerSettings
from services.broker.eval_broker import FAILED_QUEUE, EvalBroker

FAST = BrokerSettings(
    nack_timeout=0.2, initial_nack_delay=0.05, subsequent_nack_delay=0.1, delivery_limit=3
)


def ev(
    job: str = "",
    priority: int = 50,
    create_index: int = 1,
    modify_index: int = 0,
    typ: str = "service",
    **kw: object,
) -> pb.Evaluation:
    e = pb.Evaluation(
        id=new_id(),
        namespace="default",
        job_id=job or new_id(),
        priority=priority,
        type=typ,
        status="pending",
        triggered_by="job-register",
        create_index=create_index,
        modify_index=modify_index or create_index,
    )
    for k, v in kw.items():
        setattr(e, k, v)
    return e


def broker(settings: BrokerSettings = FAST) -> EvalBroker:
    b = EvalBroker(settings)
    b.set_enabled(True)
    return b


async def test_priority_then_fifo_across_scheduler_types() -> None:
    b = broker()
    low = ev(priority=10, create_index=1)
    first = ev(priority=50, create_index=2)
    second = ev(priority=50, create_index=3)
    batch = ev(priority=80, create_index=4, typ="batch")
    for e in (low, second, first, batch):
        b.enqueue(e)
    got = [await b.dequeue(["service", "batch"], 0.1) for _ in range(4)]
    assert [g[0].id for g in got if g] == [batch.id, first.id, second.id, low.id]
    assert await b.dequeue(["service"], 0.05) is None


async def test_dequeue_long_polls_until_an_eval_arrives() -> None:
    b = broker()
    e = ev()
    waiter = asyncio.create_task(b.dequeue(["service"], 5))
    await asyncio.sleep(0.05)
    assert not waiter.done()
    b.enqueue(e)
    got = await asyncio.wait_for(waiter, 1)
    assert got is not None and got[0].id == e.id


async def test_one_outstanding_eval_per_job_pending_released_in_order_on_ack() -> None:
    b = broker()
    a = ev(job="web", create_index=1)
    hi = ev(job="web", priority=90, create_index=2)
    newer = ev(job="web", create_index=3, modify_index=3)
    for e in (a, hi, newer):
        b.enqueue(e)
    assert b.stats().total_pending == 2
    got = await b.dequeue(["service"], 0.1)
    assert got is not None and got[0].id == a.id
    assert await b.dequeue(["service"], 0.05) is None  # the job is busy
    b.ack(a.id, got[1])
    nxt = await b.dequeue(["service"], 0.1)
    assert nxt is not None and nxt[0].id == hi.id  # highest priority first
    # the rest was superseded by what the acked plan covered
    assert b.stats().total_cancelable == 1
    assert [c.id for c in b.take_cancelable(10)] == [newer.id]


async def test_cancelable_set_reaps_all_but_one_of_1000_queued_evals() -> None:
    b = broker()
    evals = [ev(job="storm", create_index=i + 1) for i in range(1000)]
    for e in evals:
        b.enqueue(e)
    got = await b.dequeue(["service"], 0.1)
    assert got is not None
    b.ack(got[0].id, got[1])
    s = b.stats()
    assert s.total_cancelable == 998 and s.total_ready == 1
    nxt = await b.dequeue(["service"], 0.1)
    assert nxt is not None and nxt[0].id == evals[-1].id  # newest (highest modify index) wins


async def test_tokens_are_checked() -> None:
    b = broker()
    e = ev()
    b.enqueue(e)
    got = await b.dequeue(["service"], 0.1)
    assert got is not None
    with pytest.raises(FailedPrecondition, match="token does not match"):
        b.ack(e.id, "stale-token")
    with pytest.raises(NotFound):
        b.ack("unknown-eval", got[1])
    b.ack(e.id, got[1])


async def test_nack_timer_redelivers_then_delivery_limit_sends_to_failed_queue() -> None:
    b = broker()
    e = ev()
    b.enqueue(e)
    deliveries = []
    for _ in range(3):
        got = await b.dequeue(["service"], 2)
        assert got is not None and got[0].id == e.id
        deliveries.append(time.monotonic())
        # never acked: the nack timer (0.2 s) fires, then the nack delay
    failed = await b.dequeue([FAILED_QUEUE], 2)
    assert failed is not None and failed[0].id == e.id
    assert await b.dequeue(["service"], 0.3) is None
    # second redelivery waited the initial delay, third (n-1) x subsequent
    assert deliveries[1] - deliveries[0] >= 0.2 + 0.05
    assert deliveries[2] - deliveries[1] >= 0.2 + 0.1


async def test_explicit_nack_delays_and_stale_ack_after_timer() -> None:
    b = broker()
    e = ev()
    b.enqueue(e)
    got = await b.dequeue(["service"], 0.1)
    assert got is not None
    b.nack(e.id, got[1])
    assert b.stats().total_waiting == 1
    again = await b.dequeue(["service"], 1)
    assert again is not None and again[0].id == e.id
    await asyncio.sleep(0.3)  # nack timer expired
    with pytest.raises(FailedPrecondition, match="not outstanding"):
        b.ack(e.id, again[1])


async def test_reset_nack_timer() -> None:
    """A decision that only created evals restarts the eval's nack timer
    (Nomad's OutstandingReset), under the holder's token only."""
    b = broker()
    e = ev()
    b.enqueue(e)
    got = await b.dequeue(["service"], 0.1)
    assert got is not None
    with pytest.raises(FailedPrecondition, match="token does not match"):
        b.outstanding_reset(e.id, "stale")
    loop = asyncio.get_running_loop()
    before = loop.time()
    b.outstanding_reset(e.id, got[1])
    timer = b._unack[e.id].timer
    assert timer is not None and timer.when() >= before + FAST.nack_timeout
    b.ack(e.id, got[1])


async def test_wait_until_holds_the_eval() -> None:
    b = broker()
    e = ev(wait_until=time.time_ns() + 200_000_000)
    b.enqueue(e)
    assert b.stats().total_waiting == 1
    assert await b.dequeue(["service"], 0.05) is None
    got = await b.dequeue(["service"], 1)
    assert got is not None and got[0].id == e.id


async def test_requeue_of_an_outstanding_eval_happens_after_ack() -> None:
    b = broker()
    e = ev()
    b.enqueue(e)
    got = await b.dequeue(["service"], 0.1)
    assert got is not None
    b.enqueue(e)  # e.g. unblocked while its worker still holds it
    assert await b.dequeue(["service"], 0.05) is None
    b.ack(e.id, got[1])
    again = await b.dequeue(["service"], 0.1)
    assert again is not None and again[0].id == e.id


async def test_disable_flushes_everything() -> None:
    b = broker()
    for _ in range(3):
        b.enqueue(ev())
    waiter = asyncio.create_task(b.dequeue(["batch"], 5))
    await asyncio.sleep(0.01)
    b.set_enabled(False)
    assert await waiter is None
    s = b.stats()
    assert (s.total_ready, s.total_unacked, s.total_pending) == (0, 0, 0)
    b.enqueue(ev())
    assert b.stats().total_ready == 0


async def test_equal_priority_types_are_dequeued_fairly() -> None:
    """500 service evals queued before 500 batch evals of the same priority:
    dequeuing both types must interleave them (Nomad picks among the tied
    queues at random); creation order would hand out 500 services first."""
    b = broker(BrokerSettings(nack_timeout=60))
    for i in range(500):
        b.enqueue(ev(create_index=i + 1))
    for i in range(500):
        b.enqueue(ev(create_index=501 + i, typ="batch"))
    types: list[str] = []
    for _ in range(1000):
        got = await b.dequeue(["service", "batch"], 0)
        assert got is not None
        types.append(got[0].type)
        b.ack(got[0].id, got[1])
    assert types.count("service") == types.count("batch") == 500
    longest = run = 1
    for prev, cur in zip(types, types[1:], strict=False):
        run = run + 1 if cur == prev else 1
        longest = max(longest, run)
    assert longest < 250, f"{longest} evals of one type in a row"


async def test_priority_still_wins_over_the_random_tie_break() -> None:
    b = broker()
    low = [ev(priority=10, typ="batch") for _ in range(20)]
    high = [ev(priority=60) for _ in range(20)]
    for e in (*low, *high):
        b.enqueue(e)
    order = []
    for _ in range(40):
        got = await b.dequeue(["service", "batch"], 0)
        assert got is not None
        order.append(got[0].priority)
    assert order == [60] * 20 + [10] * 20


async def test_paused_broker_hands_out_nothing_and_keeps_everything() -> None:
    b = broker(BrokerSettings(nack_timeout=60))
    held = ev(job="held")
    b.enqueue(held)
    got = await b.dequeue(["service"], 0)
    assert got is not None
    b.set_paused(True)
    queued = [ev(job=f"j{i}") for i in range(3)]
    for e in queued:
        b.enqueue(e)  # still recorded while paused
    waiter = asyncio.create_task(b.dequeue(["service"], 5))
    assert await b.dequeue(["service"], 0.2) is None
    assert b.stats().total_ready == 3
    b.ack(held.id, got[1])  # the outstanding eval's token still counts
    assert not waiter.done()
    b.set_paused(False)  # wakes the waiting dequeuer
    first = await asyncio.wait_for(waiter, 1)
    assert first is not None
    rest = [await b.dequeue(["service"], 0) for _ in range(2)]
    assert {first[0].id} | {r[0].id for r in rest if r} == {e.id for e in queued}


async def test_enqueue_time_is_when_the_eval_became_ready_for_its_dequeue() -> None:
    """The journey's "enqueued" (EvalDequeueResponse.enqueue_time): an eval
    waiting behind its job's outstanding one becomes ready at that ack, a
    nacked one again at its redelivery."""
    b = broker()
    first, behind = ev(job="web", create_index=1), ev(job="web", create_index=2)
    before = time.time_ns()
    b.enqueue(first)
    b.enqueue(behind)
    after = time.time_ns()
    got = await b.dequeue(["service"], 0.1)
    assert got is not None and got[0].id == first.id
    assert before <= b.enqueue_time(first.id) <= after
    assert b.enqueue_time(behind.id) == 0  # not outstanding
    acked = time.time_ns()
    b.ack(first.id, got[1])
    assert b.enqueue_time(first.id) == 0
    got = await b.dequeue(["service"], 0.1)
    assert got is not None and got[0].id == behind.id
    ready = b.enqueue_time(behind.id)
    assert acked <= ready <= time.time_ns()
    b.nack(behind.id, got[1])
    got = await b.dequeue(["service"], 1.0)
    assert got is not None and got[0].id == behind.id
    assert b.enqueue_time(behind.id) > ready


async def test_a_held_eval_is_enqueued_when_its_wait_ends() -> None:
    b = broker()
    e = ev(wait_until=time.time_ns() + 100_000_000)
    b.enqueue(e)
    got = await b.dequeue(["service"], 2.0)
    assert got is not None
    # (asyncio may run a timer up to its clock resolution early: 1 ms of slack)
    assert b.enqueue_time(e.id) >= e.wait_until - 1_000_000
