"""The leader's periodic GC core evals go straight into the `_core` queue,
at the current index, highest priority, not serialized per job; a forced
GC (`corral system gc`) is one `force-gc:<id>` eval whose caller waits for
its ack."""

from __future__ import annotations

import asyncio
import contextlib

from corral.domain.structs import CORE_JOB_PRIORITY
from services.broker.core_timers import CORE_GC_JOBS, ForcedGC, run_core_timers
from tests.unit.broker.test_eval_broker import broker


async def test_core_gc_evals_are_enqueued_each_interval() -> None:
    b = broker()
    task = asyncio.create_task(run_core_timers(b, 0.05, lambda: 42))
    kinds = []
    try:
        for _ in range(2 * len(CORE_GC_JOBS)):  # two rounds
            got = await b.dequeue(["_core"], 2.0)
            assert got is not None
            ev, token = got
            b.ack(ev.id, token)
            assert (ev.type, ev.namespace, ev.priority) == ("_core", "-", CORE_JOB_PRIORITY)
            assert ev.modify_index == 42
            kinds.append(ev.job_id)
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    assert sorted(kinds) == sorted(CORE_GC_JOBS * 2)


async def test_zero_interval_disables_them() -> None:
    b = broker()
    await asyncio.wait_for(run_core_timers(b, 0, lambda: 1), 1.0)
    assert await b.dequeue(["_core"], 0.1) is None


async def test_a_forced_gc_is_waited_for_until_its_ack() -> None:
    b = broker()
    forced = ForcedGC(b, lambda: 7)
    waiting = asyncio.create_task(forced.run(wait=5.0))
    got = await b.dequeue(["_core"], 2.0)
    assert got is not None
    ev, token = got
    assert ev.job_id.startswith("force-gc:") and ev.modify_index == 7
    assert not waiting.done()
    b.nack(ev.id, token)  # a worker's failed pass is redelivered, still awaited
    await asyncio.sleep(0)
    assert not waiting.done()
    again = await b.dequeue(["_core"], 3.0)
    assert again is not None
    b.ack(again[0].id, again[1])
    forced.acked(again[0].id)
    assert await waiting == (ev.id, True)


async def test_forced_gcs_do_not_queue_behind_one_another_and_may_time_out() -> None:
    b = broker()
    forced = ForcedGC(b, lambda: 1)
    first, second = forced.enqueue(), forced.enqueue()
    assert first.job_id != second.job_id
    for _ in range(2):  # both ready at once: no per-job serialization
        assert await b.dequeue(["_core"], 1.0) is not None
    timed_out, complete = await forced.run(wait=0.05)
    assert timed_out and not complete
    detached, complete = await forced.run(wait=None)  # returns at once
    assert not complete
    queued = set()
    for _ in range(2):
        got = await b.dequeue(["_core"], 1.0)
        assert got is not None
        queued.add(got[0].id)
    assert queued == {timed_out, detached}
