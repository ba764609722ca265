"""The broker's cancel rule on ack (issue 30): the acked run's snapshot
covers the job's pending evals written at or below it, which are canceled
with the rest of Nomad's cancelable set; delayed evals, evals of other jobs
and evals written after the snapshot are not covered."""

from __future__ import annotations

import asyncio
import time

from corral.v1 import structs_pb2 as pb
from services.broker.eval_broker import EvalBroker, covered_by
from tests.unit.broker.test_eval_broker import broker, ev


def outcome(e: pb.Evaluation, snapshot_index: int, status: str = "complete") -> pb.Evaluation:
    """The outcome a worker's decision writes at the end of its run."""
    done = pb.Evaluation()
    done.CopyFrom(e)
    done.status = status
    done.snapshot_index = snapshot_index
    return done


async def run_first(
    b: EvalBroker, job: str, n: int
) -> tuple[pb.Evaluation, str, list[pb.Evaluation]]:
    """`n` evals of `job` at modify index 1..n; the first is dequeued, the
    others wait in the job's pending heap."""
    evals = [ev(job=job, create_index=i + 1) for i in range(n)]
    for e in evals:
        b.enqueue(e)
    got = await b.dequeue(["service"], 0.1)
    assert got is not None and got[0].id == evals[0].id
    return got[0], got[1], evals[1:]


async def test_ack_cancels_every_pending_eval_the_runs_snapshot_covered() -> None:
    b = broker()
    first, token, rest = await run_first(b, "storm", 500)
    b.note_outcome(first.id, token, outcome(first, snapshot_index=500))
    b.ack(first.id, token)
    s = b.stats()
    # the run saw all 499 updates: nothing is left to run
    assert (s.total_cancelable, s.total_ready, s.total_pending) == (499, 0, 0)
    assert {e.id for e in b.take_cancelable(1000)} == {e.id for e in rest}
    assert await b.dequeue(["service"], 0.05) is None


async def test_evals_written_after_the_snapshot_keep_nomads_rule() -> None:
    b = broker()
    first, token, rest = await run_first(b, "storm", 10)  # modify index 2..10 pending
    b.note_outcome(first.id, token, outcome(first, snapshot_index=5))
    b.ack(first.id, token)
    canceled = {e.id for e in b.take_cancelable(100)}
    # 2..5 covered by the snapshot; of 6..10 the newest runs, 6..9 are canceled
    assert canceled == {e.id for e in rest[:-1]}
    nxt = await b.dequeue(["service"], 0.1)
    assert nxt is not None and nxt[0].id == rest[-1].id


async def test_a_run_that_did_not_complete_covers_nothing() -> None:
    for status in ("failed", "blocked"):
        b = broker()
        first, token, rest = await run_first(b, "storm", 5)
        b.note_outcome(first.id, token, outcome(first, snapshot_index=100, status=status))
        b.ack(first.id, token)
        nxt = await b.dequeue(["service"], 0.1)
        assert nxt is not None and nxt[0].id == rest[-1].id  # the best one still runs
        assert len(b.take_cancelable(100)) == 3


async def test_an_outcome_under_another_token_is_ignored() -> None:
    b = broker()
    first, token, rest = await run_first(b, "storm", 5)
    b.note_outcome(first.id, "stale-token", outcome(first, snapshot_index=100))
    b.ack(first.id, token)
    nxt = await b.dequeue(["service"], 0.1)
    assert nxt is not None and nxt[0].id == rest[-1].id


async def test_a_redelivery_forgets_the_outcome_of_the_nacked_run() -> None:
    b = broker()
    first, token, rest = await run_first(b, "storm", 5)
    b.note_outcome(first.id, token, outcome(first, snapshot_index=100))
    b.nack(first.id, token)  # its plan was never committed, say
    again = await b.dequeue(["service"], 2.0)
    assert again is not None and again[0].id == first.id
    b.ack(first.id, again[1])  # acked without a new outcome: covers nothing
    nxt = await b.dequeue(["service"], 0.1)
    assert nxt is not None and nxt[0].id == rest[-1].id


async def test_a_delayed_eval_is_not_covered_and_runs_after_the_ack() -> None:
    b = broker()
    first, token, rest = await run_first(b, "storm", 5)
    # a follow-up held until its time (say, a reschedule), released while the
    # job's run is outstanding: it waits in the pending heap
    delayed = ev(
        job="storm",
        create_index=6,
        triggered_by="alloc-failure",
        wait_until=time.time_ns() + 50_000_000,
    )
    b.enqueue(delayed)
    assert b.stats().total_waiting == 1

    async def released() -> None:
        while b.stats().total_pending < 5:
            await asyncio.sleep(0.01)

    await asyncio.wait_for(released(), 2.0)
    b.note_outcome(first.id, token, outcome(first, snapshot_index=100))
    b.ack(first.id, token)
    assert {e.id for e in b.take_cancelable(100)} == {e.id for e in rest}
    nxt = await b.dequeue(["service"], 0.1)
    assert nxt is not None and nxt[0].id == delayed.id


async def test_another_jobs_evals_are_not_touched() -> None:
    b = broker()
    first, token, rest = await run_first(b, "storm", 4)
    other = [ev(job="other", create_index=10 + i) for i in range(3)]
    for e in other:
        b.enqueue(e)
    held = await b.dequeue(["service"], 0.1)
    assert held is not None and held[0].id == other[0].id
    b.note_outcome(first.id, token, outcome(first, snapshot_index=100))
    b.ack(first.id, token)
    assert {e.id for e in b.take_cancelable(100)} == {e.id for e in rest}
    assert b.stats().total_pending == 2  # the other job's, behind its outstanding eval
    b.ack(other[0].id, held[1])  # no outcome noted: Nomad's rule
    nxt = await b.dequeue(["service"], 0.1)
    assert nxt is not None and nxt[0].id == other[-1].id


def test_covered_by() -> None:
    assert covered_by(ev(modify_index=7), 7)
    assert covered_by(ev(modify_index=3), 7)
    assert not covered_by(ev(modify_index=8), 7)
    assert not covered_by(ev(modify_index=3), 0)  # no snapshot known
    assert not covered_by(ev(modify_index=3, wait=1_000_000_000), 7)
    assert not covered_by(ev(modify_index=3, wait_until=1), 7)
    unknown = ev()
    unknown.modify_index = 0  # never written: nothing says the run saw it
    assert not covered_by(unknown, 7)
