"""The leader's periodic GC core evals go straight into the `_core` queue,
at the current index, highest priority, not serialized per job."""

from __future__ import annotations

import asyncio
import contextlib

from corral.structs import CORE_JOB_PRIORITY
from services.broker.core_timers import CORE_GC_JOBS, run_core_timers
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
