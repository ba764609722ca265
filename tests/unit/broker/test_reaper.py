"""The reaper's write-backs, with the state write recorded in memory:
cancelations go one batch (728) per pass and a backlog drains back to
back, a failed write keeps the batch for the next pass, duplicates of
blocked evals are canceled in one write, released blocked evals are written
back as pending."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from corral.v1 import structs_pb2 as pb
from services.broker.blocked_evals import BlockedEvals
from services.broker.config import BrokerSettings
from services.broker.reaper import Reaper
from tests.unit.broker.test_eval_broker import FAST, broker, ev
from tests.wait import until


class Recorder:
    def __init__(self) -> None:
        self.writes: list[list[pb.Evaluation]] = []
        self.fail = False

    async def __call__(self, evals: list[pb.Evaluation]) -> int:
        if self.fail:
            raise ConnectionError("state unavailable")
        self.writes.append(list(evals))
        return len(self.writes)


def make(settings: BrokerSettings = FAST) -> tuple[Reaper, Recorder]:
    b = broker(settings)
    blocked = BlockedEvals(on_release=lambda evs, i: reaper.on_release(evs, i))
    blocked.set_enabled(True)
    rec = Recorder()
    reaper = Reaper(settings, b, blocked, rec, lambda e: True)
    return reaper, rec


async def test_cancelations_are_paced_one_batch_per_wake() -> None:
    reaper, rec = make()
    for i in range(1000):
        reaper.broker.enqueue(ev(job="storm", create_index=i + 1))
    got = await reaper.broker.dequeue(["service"], 0.1)
    assert got is not None
    reaper.broker.ack(got[0].id, got[1])
    await reaper._flush()
    assert [len(w) for w in rec.writes] == [728]
    assert {e.status for e in rec.writes[0]} == {"canceled"}
    rec.fail = True
    with pytest.raises(ConnectionError):
        await reaper._flush()
    assert reaper.broker.stats().total_cancelable == 270  # kept for the retry
    rec.fail = False
    await reaper._flush()
    assert [len(w) for w in rec.writes] == [728, 270]
    assert reaper.broker.stats().total_cancelable == 0
    ids = {e.id for w in rec.writes for e in w}
    assert len(ids) == 998


async def test_duplicate_blocked_evals_and_releases_are_written() -> None:
    reaper, rec = make()
    old = ev(job="j", create_index=1, status="blocked")
    new = ev(job="j", create_index=2, status="blocked")
    reaper.blocked.block(old)
    reaper.blocked.block(new)
    await reaper._flush()
    assert [(e.id, e.status) for w in rec.writes for e in w] == [(old.id, "canceled")]
    reaper.blocked.unblock("any-class", 7)
    await reaper._flush()
    released = rec.writes[-1]
    assert [(e.id, e.status) for e in released] == [(new.id, "pending")]
    assert "index 7" in released[0].status_description


async def test_a_backlog_drains_back_to_back_without_waiting_for_sweeps() -> None:
    reaper, rec = make()  # a sweep every 5 s: the drain must not need one
    for i in range(3000):
        reaper.broker.enqueue(ev(job="storm", create_index=i + 1))
    got = await reaper.broker.dequeue(["service"], 0.1)
    assert got is not None
    reaper.broker.ack(got[0].id, got[1])
    task = asyncio.create_task(reaper.run())
    try:
        reaper.wake.set()  # what the ack's on_cancelable does in the broker process
        await until(lambda: sum(len(w) for w in rec.writes) == 2998, 4.0)
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    assert [len(w) for w in rec.writes] == [728, 728, 728, 728, 86]
