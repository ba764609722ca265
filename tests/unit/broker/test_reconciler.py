"""The leader's eval reconciler over an in-memory replica: pending evals the
broker does not hold are enqueued again, blocked ones tracked again, and
nothing the broker holds in another form (unacked, canceled-to-be, a
release or a cancelation the reaper has yet to write, a blocked eval
untracked by a later complete eval) is touched; a candidate whose write was
in flight is left alone once that write lands."""

from __future__ import annotations

import asyncio

from corral.domain.store import StateSnapshot, StateStore
from corral.domain.structs import copy_msg
from corral.v1 import structs_pb2 as pb
from services.broker.blocked_evals import BlockedEvals
from services.broker.eval_broker import EvalBroker
from services.broker.reconciler import Reconciler, WriteTracker
from tests.unit.broker.test_eval_broker import broker, ev


class Replica:
    def __init__(self, *evals: pb.Evaluation, index: int = 10) -> None:
        self.snap = StateStore.build(index, evals=evals)

    def snapshot(self) -> StateSnapshot:
        return self.snap

    async def wait_for_index(self, min_index: int, timeout: float) -> StateSnapshot:
        return self.snap


def make(
    replica: Replica, write: WriteTracker | None = None, queued: set[str] | None = None
) -> tuple[Reconciler, EvalBroker, BlockedEvals]:
    b = broker()
    blocked = BlockedEvals(lambda evs, i: None)
    blocked.set_enabled(True)

    async def nowrite(evals: list[pb.Evaluation]) -> int:
        return 0

    r = Reconciler(
        30.0, b, blocked, replica, write or WriteTracker(nowrite), lambda: queued or set()
    )
    return r, b, blocked


async def test_unknown_pending_and_blocked_evals_are_put_back() -> None:
    lost = ev(job="lost")
    lost_blocked = ev(job="lb", status="blocked", escaped_computed_class=True)
    replica = Replica(lost, lost_blocked)
    r, b, blocked = make(replica)
    repairs = await r.reconcile()
    assert repairs.pending == [lost.id] and repairs.blocked == [lost_blocked.id]
    got = await b.dequeue(["service"], 0.1)
    assert got is not None and got[0].id == lost.id
    assert blocked.tracked(lost_blocked.id)
    # a second pass finds nothing: the unacked eval is held
    again = await r.reconcile()
    assert again.pending == [] and again.blocked == []


async def test_what_the_broker_holds_in_any_form_is_left_alone() -> None:
    outstanding = ev(job="a")
    superseded = [ev(job="storm", create_index=i + 1) for i in range(3)]
    tracked = ev(job="t", status="blocked", escaped_computed_class=True)
    releasing = ev(job="r", status="blocked")
    done_later = ev(job="u", status="blocked", modify_index=5)
    completed = ev(job="u", status="complete", create_index=6)
    core = ev(job="eval-gc:1", typ="_core")
    replica = Replica(outstanding, *superseded, tracked, releasing, done_later, completed, core)
    r, b, blocked = make(replica, queued={releasing.id})
    b.enqueue(outstanding)
    for e in superseded:
        b.enqueue(e)
    blocked.block(tracked)
    first = await b.dequeue(["service"], 0.1)
    storm = await b.dequeue(["service"], 0.1)
    assert first is not None and storm is not None
    b.ack(storm[0].id, storm[1])  # one storm eval left ready, one canceled-to-be
    assert b.stats().total_cancelable == 1
    acked = copy_msg(storm[0])
    acked.status = "complete"  # its outcome, written before the ack
    replica.snap = StateStore.build(
        11,
        evals=[
            outstanding,
            acked,
            *superseded[1:],
            tracked,
            releasing,
            done_later,
            completed,
            core,
        ],
    )
    repairs = await r.reconcile()
    assert repairs.pending == [] and repairs.blocked == []


async def test_a_candidate_whose_write_was_in_flight_is_not_repaired() -> None:
    released = ev(job="rel", status="blocked")
    replica = Replica(released)
    gate = asyncio.Event()

    async def slow_write(evals: list[pb.Evaluation]) -> int:
        await gate.wait()
        out = copy_msg(evals[0])
        out.modify_index = 11
        replica.snap = StateStore.build(11, evals=[out])
        return 11

    tracker = WriteTracker(slow_write)
    r, b, _ = make(replica, write=tracker)
    pending = copy_msg(released)
    pending.status = "pending"
    writing = asyncio.create_task(tracker([pending]))  # the reaper writing it back
    await asyncio.sleep(0)
    passing = asyncio.create_task(r.reconcile())
    await asyncio.sleep(0.05)
    assert not passing.done()  # it waits for the write it looked across
    gate.set()
    await writing
    repairs = await passing
    assert repairs.pending == [] and repairs.blocked == []
    assert b.stats().total_ready == 0  # the feed, not the reconciler, enqueues it
