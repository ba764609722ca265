"""The leader's periodic garbage-collection evals (Nomad's
leader.schedulePeriodic): every `core_gc_interval` the broker leader puts
one `_core` eval per collector (eval-gc, job-gc, node-gc, deployment-gc) straight into the
ready queue. Core evals are never written to state; the worker's core
scheduler reads its snapshot at the index given here, does the collection
and acks."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from corral import structs
from corral.structs import CORE_JOB_PRIORITY, EvalStatus, JobType, Trigger, new_id
from corral.v1 import structs_pb2 as pb
from services.broker.eval_broker import EvalBroker

# the job ids the core scheduler dispatches on
CORE_GC_JOBS = ("eval-gc", "job-gc", "node-gc", "deployment-gc")


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
