"""The leader's garbage-collection evals (Nomad's leader.schedulePeriodic
and System.GarbageCollect).

Every `core_gc_interval` the broker leader puts one `_core` eval per
collector (eval-gc, job-gc, node-gc, deployment-gc) straight into the ready
queue; `corral system gc` puts one `force-gc` eval there (every collector,
thresholds ignored) and may wait for its ack. Core evals are never written
to state; the worker's core scheduler reads its snapshot at the index given
here, does the collection (with the thresholds of the worker's settings)
and acks."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from corral.domain import structs
from corral.domain.structs import CORE_JOB_PRIORITY, EvalStatus, JobType, Trigger, new_id
from corral.v1 import structs_pb2 as pb
from services.broker.eval_broker import EvalBroker

# the job ids the core scheduler dispatches on
CORE_GC_JOBS = ("eval-gc", "job-gc", "node-gc", "deployment-gc")
FORCE_GC = "force-gc"
#: how long a forced GC is waited for by default, and at most (s)
FORCE_GC_WAIT = 60.0
FORCE_GC_MAX_WAIT = 300.0


def core_eval(kind: str, index: int) -> pb.Evaluation:
    """A core eval at the leader's current state index, so the scheduler's
    snapshot is at least that recent."""
    now = structs.now_ns()
    return pb.Evaluation(
        id=new_id(),
        namespace="-",
        priority=CORE_JOB_PRIORITY,
        type=JobType.CORE,
        triggered_by=Trigger.SCHEDULED,
        job_id=kind,
        status=EvalStatus.PENDING,
        create_index=index,
        modify_index=index,
        create_time=now,
        modify_time=now,
    )


async def run_core_timers(broker: EvalBroker, interval: float, index: Callable[[], int]) -> None:
    """Until cancelled (leadership lost): enqueue the GC evals each interval."""
    if interval <= 0:
        return
    while True:
        await asyncio.sleep(interval)
        for kind in CORE_GC_JOBS:
            broker.enqueue(core_eval(kind, index()))


class ForcedGC:
    """Forced collections (`corral system gc`) and the callers waiting on
    them: each gets its own `force-gc:<id>` job id, so forced passes never
    queue behind one another (or get cancelled as superseded) in the
    broker's per-job serialization; the core scheduler reads only the part
    before the colon. The Eval.Ack handler calls `acked`; a pass a worker
    nacks is redelivered and still awaited, up to the caller's timeout."""

    def __init__(self, broker: EvalBroker, index: Callable[[], int]) -> None:
        self.broker = broker
        self.index = index
        self._waiting: dict[str, asyncio.Future[None]] = {}

    def acked(self, eval_id: str) -> None:
        fut = self._waiting.pop(eval_id, None)
        if fut is not None and not fut.done():
            fut.set_result(None)

    def enqueue(self) -> pb.Evaluation:
        ev = core_eval(FORCE_GC, self.index())
        ev.job_id = f"{FORCE_GC}:{ev.id[:8]}"
        self.broker.enqueue(ev)
        return ev

    async def run(self, *, wait: float | None) -> tuple[str, bool]:
        """Enqueue a forced pass; (its eval id, whether a worker acked it
        within `wait` seconds; None = do not wait)."""
        ev = self.enqueue()
        if wait is None:
            return ev.id, False
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting[ev.id] = fut
        try:
            await asyncio.wait_for(fut, wait)
        except TimeoutError:
            return ev.id, False
        finally:
            self._waiting.pop(ev.id, None)
        return ev.id, True
