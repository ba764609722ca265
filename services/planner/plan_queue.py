"""The plan queue (Nomad's nomad/plan_queue.go): submitted plans waiting for
the single applier, highest priority first, then in arrival order.

Enabled only on the leader. Disabling it (leadership lost) fails every
waiting plan with "plan queue flushed"; enqueueing while disabled fails with
"plan queue is disabled" — both UNAVAILABLE, so workers retry elsewhere.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time
from dataclasses import dataclass, field

from corral.domain.errors import CorralError, Unavailable
from corral.v1 import structs_pb2 as pb
from services.planner import metrics

ERR_DISABLED = "plan queue is disabled"
ERR_FLUSHED = "plan queue flushed"


def plan_size(plan: pb.Plan) -> int:
    """Allocs a plan places, stops or preempts."""
    n = sum(len(lst.allocs) for lst in plan.node_allocation.values())
    n += sum(len(lst.stops) for lst in plan.node_update.values())
    n += sum(len(lst.stops) for lst in plan.node_preemptions.values())
    return n


@dataclass(eq=False, slots=True)
class PendingPlan:
    """A submitted plan and the future its submitter waits on."""

    plan: pb.Plan
    future: asyncio.Future[pb.PlanResult]
    seq: int
    enqueued_at: float = field(default_factory=time.monotonic)
    size: int = 0  # allocs placed, stopped or preempted: the rows its commit writes

    @property
    def priority(self) -> int:
        return self.plan.priority

    def respond(self, result: pb.PlanResult) -> None:
        if not self.future.done():
            self.future.set_result(result)

    def fail(self, err: BaseException) -> None:
        if not self.future.done():
            self.future.set_exception(err)


class PlanQueue:
    def __init__(self) -> None:
        self._heap: list[tuple[int, int, PendingPlan]] = []
        self._seq = itertools.count()
        self._enabled = False
        self._ready = asyncio.Event()

    @property
    def enabled(self) -> bool:
        return self._enabled

    def __len__(self) -> int:
        return len(self._heap)

    def set_enabled(self, enabled: bool) -> None:
        """Enable on gaining leadership; disabling flushes the queue."""
        self._enabled = enabled
        if not enabled:
            self.flush(Unavailable(ERR_FLUSHED))

    def flush(self, err: CorralError) -> None:
        """Fail every waiting plan with `err`."""
        heap, self._heap = self._heap, []
        for _, _, pending in heap:
            pending.fail(err)
        self._ready.clear()
        metrics.QUEUE_DEPTH.set(0)

    def enqueue(self, plan: pb.Plan) -> PendingPlan:
        if not self._enabled:
            raise Unavailable(ERR_DISABLED)
        fut: asyncio.Future[pb.PlanResult] = asyncio.get_running_loop().create_future()
        pending = PendingPlan(plan, fut, next(self._seq), size=plan_size(plan))
        self._push(pending)
        return pending

    def requeue(self, pending: PendingPlan) -> None:
        """Put a plan back in its original place (it keeps its arrival order)."""
        if not self._enabled:
            pending.fail(Unavailable(ERR_FLUSHED))
            return
        self._push(pending)

    def _push(self, pending: PendingPlan) -> None:
        heapq.heappush(self._heap, (-pending.priority, pending.seq, pending))
        metrics.QUEUE_DEPTH.set(len(self._heap))
        self._ready.set()

    def pop_ready(
        self, limit: int, max_size: int = 0, *, take_one: bool = True
    ) -> list[PendingPlan]:
        """Up to `limit` waiting plans in order, without waiting, stopping
        before their total size passes `max_size` (0 = no bound; with
        `take_one` the first plan is taken whatever its size). Plans whose
        submitter gave up are dropped."""
        out: list[PendingPlan] = []
        total = 0
        while self._heap and len(out) < limit:
            _, _, pending = self._heap[0]
            if pending.future.done():
                heapq.heappop(self._heap)
                continue
            if max_size and total + pending.size > max_size and (out or not take_one):
                break
            heapq.heappop(self._heap)
            total += pending.size
            out.append(pending)
        if not self._heap:
            self._ready.clear()
        metrics.QUEUE_DEPTH.set(len(self._heap))
        return out

    async def dequeue(self, limit: int, max_size: int = 0) -> list[PendingPlan]:
        """Wait for at least one plan, then take as `pop_ready` does."""
        while True:
            await self._ready.wait()
            out = self.pop_ready(limit, max_size)
            if out:
                return out
