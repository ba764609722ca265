"""The `Planner` a scheduler gets from the worker (Nomad's worker-as-planner).

Schedulers are synchronous and run in a thread; these methods hop onto the
worker's event loop for the RPCs and block the scheduler thread until they
finish. Every plan and eval written carries the snapshot index the
scheduler worked from; a partial plan's refresh index is waited for on the
replica and the fresher snapshot handed back, so the scheduler retries on
state that includes what made the plan fail.

One hop per decision: the scheduler's eval writes go to the state in one
`State.DecideEval`, which also acks the eval (the broker acks it when the
write reaches it on the change feed). Evals the scheduler creates are held
until then, except that a plan is never submitted before the evals it may
refer to (an alloc's follow-up eval, a blocked eval) are written: those go
in a `DecideEval` of their own, without an outcome, before the plan. The
outcome (`update_eval`, `reblock_eval`) is the run's last write.

The eval's journey (when the broker made it ready, when this worker got it,
when the scheduler submitted its first plan) rides on the writes of the
dequeued eval itself, so the UI's timeline has those stages without a state
write of their own; follow-up evals start without.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from opentelemetry import context as otel_context

from corral.domain import structs
from corral.domain.store import StateSnapshot
from corral.runtime import telemetry
from corral.v1 import plan_pb2, state_pb2
from corral.v1 import structs_pb2 as pb
from services.worker.scheduler.feasible.inflight import InFlightPlacements

T = TypeVar("T")


class Loop(Protocol):
    """The calls a scheduler loop (services/worker/worker.py) makes for its
    planner, on the event loop."""

    async def submit_plan(self, plan: pb.Plan) -> plan_pb2.PlanSubmitResponse: ...

    async def wait_for_refresh(self, index: int) -> StateSnapshot: ...

    async def decide_eval(
        self, eval_id: str, token: str, outcome: pb.Evaluation | None, created: list[pb.Evaluation]
    ) -> None: ...

    async def garbage_collect(self, request: state_pb2.GarbageCollectRequest) -> None: ...


@dataclass
class Journey:
    """Steps of one run of an eval the state does not see happen: Unix ns,
    enqueue on the broker's clock, the others on this worker's (0 = not
    seen). Written onto the dequeued eval by the run's own eval writes."""

    eval_id: str = ""
    enqueue_time: int = 0
    dequeue_time: int = 0
    plan_submit_time: int = 0

    def stamp(self, ev: pb.Evaluation) -> None:
        """Record the journey on a write of the eval this run dequeued; a
        follow-up (another id) carries none, even if copied from it."""
        own = bool(self.eval_id) and ev.id == self.eval_id
        ev.enqueue_time = self.enqueue_time if own else 0
        ev.dequeue_time = self.dequeue_time if own else 0
        ev.plan_submit_time = self.plan_submit_time if own else 0


def accepted_nodes(plan: pb.Plan, result: pb.PlanResult) -> set[str]:
    """The nodes whose part of `plan` committed: all but the rejected ones,
    none when an all-at-once plan had one rejected."""
    rejected = set(result.rejected_nodes)
    if plan.all_at_once and rejected:
        return set()
    return {n for n in plan.node_allocation if n not in rejected}


class WorkerPlanner:
    """Implements the scheduler's `Planner` and `CorePlanner` protocols."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        worker: Loop,
        token: str,
        snapshot: StateSnapshot,
        traceparent: str = "",
        journey: Journey | None = None,
        *,
        inflight: InFlightPlacements | None = None,
    ) -> None:
        self.loop = loop
        self.worker = worker
        self.token = token
        self.snapshot = snapshot
        self.traceparent = traceparent
        self.plans_submitted = 0
        self.journey = journey if journey is not None else Journey()
        #: the process's reservations: settled with each plan result
        self.inflight = inflight
        #: evals created and not yet written (the next plan or the outcome writes them)
        self.created: list[pb.Evaluation] = []
        #: the outcome was written, and with it the ack
        self.decided = False

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run `coro` on the worker's loop inside the scheduler thread's
        trace context, so its RPCs nest under the scheduler's span."""
        ctx = otel_context.get_current()

        async def in_trace() -> T:
            token = otel_context.attach(ctx)
            try:
                return await coro
            finally:
                otel_context.detach(token)

        return asyncio.run_coroutine_threadsafe(in_trace(), self.loop).result()

    # ------------------------------------------------------------ Planner

    def submit_plan(self, plan: pb.Plan) -> tuple[pb.PlanResult, StateSnapshot | None]:
        if self.created:  # the plan may refer to them: written first
            self._decide(self.journey.eval_id or plan.eval_id, None)
        plan.eval_token = self.token
        plan.snapshot_index = self.snapshot.index
        # the scheduler's span (this thread's), so the plan's steps nest under it
        plan.traceparent = telemetry.current_traceparent() or plan.traceparent or self.traceparent
        self.plans_submitted += 1
        if not self.journey.plan_submit_time:
            self.journey.plan_submit_time = structs.now_ns()
        try:
            resp: plan_pb2.PlanSubmitResponse = self._run(self.worker.submit_plan(plan))
        except BaseException:
            if self.inflight is not None:  # not known to have committed: unclaimed
                self.inflight.settle(plan.eval_id, set(), 0)
            raise
        result = resp.result
        if self.inflight is not None:
            self.inflight.settle(plan.eval_id, accepted_nodes(plan, result), result.alloc_index)
        if result.refresh_index:
            snap = self._run(self.worker.wait_for_refresh(result.refresh_index))
            self.snapshot = snap
            if self.inflight is not None:
                self.inflight.begin(plan.eval_id, snap.index)
            return result, snap
        return result, None

    def update_eval(self, ev: pb.Evaluation) -> None:
        self._stamp(ev)
        self._decide(self.journey.eval_id or ev.id, ev)

    def create_eval(self, ev: pb.Evaluation) -> None:
        self._stamp(ev)
        if not ev.create_time:
            ev.create_time = ev.modify_time
        self.created.append(ev)

    def reblock_eval(self, ev: pb.Evaluation) -> None:
        # A `blocked` outcome: the state writes the eval (new queued counts,
        # snapshot index, class eligibility) and the broker puts it back into
        # the blocked tracker with this token when it acks it, so no
        # Eval.Update first, as Nomad's worker needs.
        self._stamp(ev)
        self._decide(self.journey.eval_id or ev.id, ev)

    def write_created(self) -> None:
        """Write the evals created and not written yet (a run that ended
        without an outcome), without acking."""
        if self.created:
            self._decide(self.journey.eval_id, None)

    def _decide(self, eval_id: str, outcome: pb.Evaluation | None) -> None:
        """One `State.DecideEval`: the created evals and, if given, the
        outcome (which acks the eval)."""
        created, self.created = self.created, []
        try:
            self._run(self.worker.decide_eval(eval_id, self.token, outcome, created))
        except BaseException:
            self.created[:0] = created  # not known to be written
            raise
        if outcome is not None:
            self.decided = True

    # ------------------------------------------------------------ CorePlanner

    def delete_evals(self, eval_ids: Sequence[str], alloc_ids: Sequence[str]) -> None:
        self._gc(state_pb2.GarbageCollectRequest(eval_ids=eval_ids, alloc_ids=alloc_ids))

    def delete_jobs(self, jobs: Sequence[tuple[str, str]]) -> None:
        refs = [state_pb2.JobRef(namespace=ns, job_id=job_id) for ns, job_id in jobs]
        self._gc(state_pb2.GarbageCollectRequest(jobs=refs))

    def delete_nodes(self, node_ids: Sequence[str]) -> None:
        self._gc(state_pb2.GarbageCollectRequest(node_ids=node_ids))

    def delete_deployments(self, deployment_ids: Sequence[str]) -> None:
        self._gc(state_pb2.GarbageCollectRequest(deployment_ids=deployment_ids))

    def _gc(self, request: state_pb2.GarbageCollectRequest) -> None:
        if any(
            (
                request.eval_ids,
                request.alloc_ids,
                request.jobs,
                request.node_ids,
                request.deployment_ids,
            )
        ):
            self._run(self.worker.garbage_collect(request))

    def _stamp(self, ev: pb.Evaluation) -> None:
        ev.snapshot_index = self.snapshot.index
        ev.modify_time = structs.now_ns()
        self.journey.stamp(ev)
