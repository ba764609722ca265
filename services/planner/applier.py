"""The plan applier loop (Nomad's `planApply` in nomad/plan_apply.go), with
group commit.

Two tasks share the work:

* the **evaluator** takes every plan waiting in the queue (up to
  `max_batch`), evaluates them one after another against the replica's
  newest snapshot plus the optimistic overlay — each plan sees the plans
  evaluated before it — and hands the batch to the writer;
* the **writer** commits a batch with one `State.ApplyPlans` call (one
  transaction, each plan at its own consecutive index) and answers each
  plan with its own `alloc_index`.

While the writer commits batch N the evaluator already evaluates batch N+1
(`pipeline_depth` batches may be handed over and not yet written; default
1, as Nomad's `plan_apply_pipeline`). Writes happen strictly in order, one
at a time, so batch N+1 is never written unless N committed: a failed write
discards the overlay and fails, with ABORTED, every plan evaluated on it.
Because an ambiguous failure (a timeout) may still have committed, the next
evaluation first waits for the replica to reach the state's newest index.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import time
from dataclasses import dataclass, field
from typing import Protocol

import grpc
from opentelemetry import trace

from corral.domain.errors import (
    Aborted,
    CorralError,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    Unavailable,
)
from corral.domain.plan_commit import PlanEvaluation, applied_plan, new_alloc_ids, stamp_result
from corral.domain.store import StateSnapshot
from corral.domain.structs import now_ns
from corral.runtime import telemetry
from corral.v1 import state_pb2
from services.planner import metrics
from services.planner.config import FAULT_EXIT_BEFORE_APPLY, PlannerSettings
from services.planner.evaluate import evaluate_plan
from services.planner.overlay import Overlay, OverlayEntry
from services.planner.plan_queue import ERR_FLUSHED, PendingPlan, PlanQueue
from services.planner.state_client import PlanWriter

log = logging.getLogger(__name__)
tracer = telemetry.tracer("corral.planner")

#: exit status of the test-only fault `exit-before-apply`
FAULT_EXIT_STATUS = 75

_PLAN_FIELD = re.compile(r"^plans\[(\d+)\]")
#: how the state words a fenced write (services/state/writes/fence.py)
_NOT_LEADER = "is not the planner leader"


class ReplicaView(Protocol):
    """What the applier needs of `corral.runtime.replica.Replica`."""

    @property
    def index(self) -> int: ...

    def snapshot(self) -> StateSnapshot: ...

    async def wait_for_index(self, min_index: int, timeout: float) -> StateSnapshot: ...


@dataclass(eq=False, slots=True)
class Decision:
    """An evaluated plan on its way to the writer."""

    pending: PendingPlan
    evaluation: PlanEvaluation
    generation: int
    write: state_pb2.AppliedPlan | None = None
    entry: OverlayEntry | None = None
    #: placements that create an alloc (stamped as created at the commit)
    created: frozenset[str] = frozenset()


@dataclass
class ApplierStats:
    plans_applied: int = 0
    plans_partial: int = 0
    nodes_rejected: int = 0
    commits: int = 0


@dataclass(eq=False)
class PlanApplier:
    queue: PlanQueue
    replica: ReplicaView
    state: PlanWriter
    settings: PlannerSettings
    stats: ApplierStats = field(default_factory=ApplierStats)
    last_committed_index: int = 0

    def __post_init__(self) -> None:
        self.overlay = Overlay()
        self._resync = True
        self._writes: asyncio.Queue[list[Decision]] = asyncio.Queue()
        self._slots = asyncio.Semaphore(self.settings.pipeline_depth)
        self._active: set[PendingPlan] = set()

    # ------------------------------------------------------------ lifecycle

    async def run(self) -> None:
        """Evaluate and write until cancelled (leadership lost, shutdown);
        every plan not yet answered then fails with "plan queue flushed"."""
        self.overlay.discard()
        self._resync = True
        # fresh per term: a cancelled term may have left a slot taken
        self._writes = asyncio.Queue()
        self._slots = asyncio.Semaphore(self.settings.pipeline_depth)
        try:
            async with asyncio.TaskGroup() as tg:
                tg.create_task(self._evaluator(), name="plan-evaluator")
                tg.create_task(self._writer(), name="plan-writer")
        finally:
            err = Unavailable(ERR_FLUSHED)
            for pending in list(self._active):
                pending.fail(err)
            self._active.clear()
            while not self._writes.empty():
                for d in self._writes.get_nowait():
                    d.pending.fail(err)
            metrics.OUTSTANDING_APPLY.set(0)

    # ------------------------------------------------------------ evaluator

    async def _evaluator(self) -> None:
        limit = self.settings.max_batch
        max_size = self.settings.max_batch_allocs
        while True:
            batch = await self.queue.dequeue(limit, max_size)
            self._active.update(batch)
            try:
                decisions = await self._evaluate(batch)
            except Exception as exc:  # a bug must not stop the applier
                log.exception("plan evaluation failed")
                self._fail_all(batch, Aborted(f"plan evaluation failed: {exc}"))
                continue
            if not decisions:
                continue
            await self._slots.acquire()
            # The writer is free for us now; plans that arrived while we
            # waited join this batch instead of paying a commit of their own.
            room = limit - len(decisions)
            size = sum(d.pending.size for d in decisions)
            if room > 0 and (not max_size or size < max_size):
                more = self.queue.pop_ready(
                    room, max_size - size if max_size else 0, take_one=False
                )
                if more:
                    self._active.update(more)
                    decisions.extend(await self._evaluate(more))
            metrics.OUTSTANDING_APPLY.inc()
            self._writes.put_nowait(decisions)

    async def _evaluate(self, batch: list[PendingPlan]) -> list[Decision]:
        if self._resync and not await self._resync_replica(batch):
            return []
        batch = await self._wait_for_snapshot_index(batch)
        out: list[Decision] = []
        for pending in batch:
            if pending.future.done():  # the submitter gave up
                self._active.discard(pending)
                continue
            decision = self._evaluate_one(pending)
            if decision is not None:
                out.append(decision)
        return out

    async def _resync_replica(self, batch: list[PendingPlan]) -> bool:
        """Bring the replica up to the state's newest index (after gaining
        leadership or a failed write: anything committed must be visible
        before the next evaluation)."""
        timeout = self.settings.wait_for_index_timeout
        try:
            index = await self.state.latest_index(timeout=timeout)
            await self.replica.wait_for_index(index, timeout)
        except (grpc.aio.AioRpcError, TimeoutError) as exc:
            log.warning("planner cannot catch up with the state: %s", exc)
            err = Unavailable(f"planner is catching up with the state: {_describe(exc)}")
            for pending in batch:
                self._fail(pending, err)
            return False
        self.overlay.discard()
        self._resync = False
        return True

    async def _wait_for_snapshot_index(self, batch: list[PendingPlan]) -> list[PendingPlan]:
        """Plans must be evaluated on state at least as new as the snapshot
        their scheduler used (Nomad's snapshotMinIndex, 10 s)."""
        need = max(p.plan.snapshot_index for p in batch)
        if self.replica.index >= need:
            return batch
        start = time.perf_counter()
        with contextlib.suppress(TimeoutError):
            await self.replica.wait_for_index(need, self.settings.wait_for_index_timeout)
        metrics.WAIT_FOR_INDEX.observe(time.perf_counter() - start)
        have = self.replica.index
        ready: list[PendingPlan] = []
        for pending in batch:
            if pending.plan.snapshot_index <= have:
                ready.append(pending)
                continue
            self._fail(
                pending,
                Unavailable(
                    f"timed out after {self.settings.wait_for_index_timeout:g}s waiting for "
                    f"index={pending.plan.snapshot_index} (planner replica at {have})"
                ),
            )
        return ready

    def _evaluate_one(self, pending: PendingPlan) -> Decision | None:
        plan = pending.plan
        snap = self.overlay.snapshot(self.replica.snapshot())
        if not plan.job.task_groups:
            # sent as a reference (Nomad's workers send namespace + id): the
            # commit denormalises the stored job
            stored = snap.job_by_id(plan.job.namespace, plan.job.id)
            if stored is not None:
                plan.job.CopyFrom(stored)
        start = time.perf_counter()
        try:
            evaluation = evaluate_plan(snap, plan)
        except Exception as exc:
            log.exception("failed to evaluate plan", extra={"eval_id": plan.eval_id})
            self._fail(pending, Aborted(f"failed to evaluate plan: {exc}"))
            return None
        finally:
            metrics.EVALUATE.observe(time.perf_counter() - start)
        if telemetry.tracing_enabled():
            _span(plan.traceparent, "plan.evaluate", start, plan.eval_id, evaluation)
        result = evaluation.result
        if evaluation.rejections:
            metrics.NODE_REJECTED.inc(len(evaluation.rejections))
            self.stats.nodes_rejected += len(evaluation.rejections)
            for rej in evaluation.rejections:
                log.info(
                    "plan for node rejected: %s",
                    rej.reason,
                    extra={"eval_id": plan.eval_id, "node_id": rej.node_id, "job_id": plan.job.id},
                )
            if not result.refresh_index:
                result.refresh_index = self.last_committed_index
            if not result.refresh_index:
                self._fail(pending, Aborted("partial commit with a refresh index of 0"))
                return None

        if evaluation.is_noop():
            if evaluation.partial and self._writes_unconfirmed():
                # Rejected, perhaps because of plans still being written: the
                # answer waits for them so its refresh index covers them.
                return Decision(pending, evaluation, self.overlay.generation)
            if evaluation.partial:
                result.refresh_index = max(result.refresh_index, self.last_committed_index)
            self._answer(pending, evaluation)
            return None

        # A job stopped or purged since the scheduler's snapshot: its
        # placements are dropped by the merge; its stops still commit.
        write = applied_plan(snap, plan, result, now_ns())
        created = new_alloc_ids(snap, result)
        entry = self.overlay.add(write)
        return Decision(pending, evaluation, self.overlay.generation, write, entry, created)

    def _writes_unconfirmed(self) -> bool:
        return any(e.index == 0 for e in self.overlay.entries)

    # ------------------------------------------------------------ writer

    async def _writer(self) -> None:
        while True:
            decisions = await self._writes.get()
            try:
                await self._write(decisions)
            except Exception as exc:  # a bug must not stop the applier
                log.exception("plan write handling failed")
                self.overlay.discard()
                self._resync = True
                self._fail_all([d.pending for d in decisions], Aborted(f"plan apply failed: {exc}"))
            finally:
                metrics.OUTSTANDING_APPLY.dec()
                self._slots.release()

    async def _write(self, decisions: list[Decision]) -> None:
        gen = self.overlay.generation
        stale_err = Aborted(
            "plan was evaluated on state invalidated by a failed plan write; resubmit"
        )
        live: list[Decision] = []
        for d in decisions:
            if d.generation != gen:
                self._fail(d.pending, stale_err)
            else:
                live.append(d)
        writes = [d for d in live if d.write is not None]
        if writes:
            if self.settings.fault == FAULT_EXIT_BEFORE_APPLY:
                log.error("fault injection: exiting between evaluate and apply")
                logging.shutdown()
                os._exit(FAULT_EXIT_STATUS)
            start = time.perf_counter()
            spans = _apply_spans(writes)
            try:
                # one write for the group: its RPC and commit join the first plan's trace
                with trace.use_span(spans[0]) if spans else contextlib.nullcontext():
                    indexes = await self.state.apply_plans(
                        [d.write for d in writes if d.write is not None],
                        timeout=self.settings.apply_timeout,
                    )
            except Exception as exc:
                for span in spans:
                    span.set_status(trace.StatusCode.ERROR, _describe(exc))
                    span.end()
                log.warning("plan write failed: %s", _describe(exc))
                self.overlay.discard()
                self._resync = True
                for d, err in zip(writes, _write_errors(exc, len(writes)), strict=True):
                    self._fail(d.pending, err)
                for d in live:
                    if d.write is None:
                        self._fail(d.pending, stale_err)
                return
            metrics.APPLY.observe(time.perf_counter() - start)
            for span, index in zip(spans, indexes if spans else [], strict=True):
                span.set_attribute("plan.alloc_index", index)
                span.set_attribute("plan.group_commit_size", len(writes))
                span.end()
            metrics.GROUP_COMMIT_SIZE.observe(len(writes))
            self.stats.commits += 1
            for d, index in zip(writes, indexes, strict=True):
                if d.entry is not None:
                    self.overlay.committed(d.entry, index)
                d.evaluation.result.alloc_index = index
                stamp_result(d.evaluation.result, index, d.created)
            self.last_committed_index = max(self.last_committed_index, *indexes)
        for d in live:
            result = d.evaluation.result
            if result.refresh_index:
                floor = result.alloc_index if d.write is not None else self.last_committed_index
                result.refresh_index = max(result.refresh_index, floor)
            self._answer(d.pending, d.evaluation)

    # ------------------------------------------------------------ answers

    def _answer(self, pending: PendingPlan, evaluation: PlanEvaluation) -> None:
        self._active.discard(pending)
        if evaluation.result.alloc_index:
            self.stats.plans_applied += 1
        if evaluation.partial:
            self.stats.plans_partial += 1
        if evaluation.partial:
            outcome = "partial"
        elif evaluation.result.alloc_index:
            outcome = "committed"
        else:
            outcome = "noop"
        metrics.PLANS.labels(outcome).inc()
        if evaluation.result.alloc_index:
            metrics.count_committed(evaluation.result)
        pending.respond(evaluation.result)

    def _fail_all(self, pendings: list[PendingPlan], err: CorralError) -> None:
        for pending in pendings:
            if not pending.future.done():
                self._fail(pending, err)

    def _fail(self, pending: PendingPlan, err: CorralError) -> None:
        self._active.discard(pending)
        metrics.PLANS.labels("failed").inc()
        pending.fail(err)


def _span(
    traceparent: str, name: str, start: float, eval_id: str, evaluation: PlanEvaluation
) -> None:
    """Record a finished step of a plan in the eval's trace (started
    `start` perf-counter seconds ago)."""
    now_wall = time.time_ns()
    begin = now_wall - int((time.perf_counter() - start) * 1e9)
    ctx = telemetry.context_from_traceparent(traceparent)
    span = tracer.start_span(name, context=ctx, start_time=begin)
    span.set_attribute("eval.id", eval_id)
    span.set_attribute("plan.nodes_rejected", len(evaluation.rejections))
    span.set_attribute("plan.alloc_index", evaluation.result.alloc_index)
    span.end(end_time=now_wall)


def _apply_spans(writes: list[Decision]) -> list[trace.Span]:
    """A `plan.apply` span per plan in its own trace (empty when not
    tracing); each placed alloc carries its plan's span as its
    traceparent, so the agent's start of it joins the eval's trace."""
    if not telemetry.tracing_enabled():
        return []
    spans: list[trace.Span] = []
    for d in writes:
        plan = d.pending.plan
        span = tracer.start_span(
            "plan.apply", context=telemetry.context_from_traceparent(plan.traceparent)
        )
        span.set_attribute("eval.id", plan.eval_id)
        if d.write is not None:
            span.set_attribute("plan.allocs", len(d.write.allocs))
            traceparent = telemetry.traceparent_of(span)
            for alloc in d.write.allocs:
                alloc.traceparent = traceparent
        spans.append(span)
    return spans


def _describe(exc: BaseException) -> str:
    if isinstance(exc, grpc.aio.AioRpcError):
        return f"{exc.code().name}: {exc.details()}"
    return str(exc) or type(exc).__name__


def _write_errors(exc: BaseException, n: int) -> list[CorralError]:
    """The error each of `n` plans of a failed group commit gets.

    A plan the state found invalid fails with the state's reason; the other
    plans of its group get ABORTED (retryable: they were fine, but were
    evaluated together with it). Anything else (state unreachable, timeout)
    is UNAVAILABLE for all: the worker retries."""
    if isinstance(exc, grpc.aio.AioRpcError):
        code, details = exc.code(), exc.details() or ""
        if code == grpc.StatusCode.FAILED_PRECONDITION and _NOT_LEADER in details:
            # fenced: this planner was deposed; the worker retries the new leader
            return [Unavailable(f"{ERR_FLUSHED}: {details}") for _ in range(n)]
        kinds: dict[grpc.StatusCode, type[CorralError]] = {
            grpc.StatusCode.INVALID_ARGUMENT: InvalidArgument,
            grpc.StatusCode.FAILED_PRECONDITION: FailedPrecondition,
            grpc.StatusCode.NOT_FOUND: NotFound,
        }
        kind = kinds.get(code)
        if kind is not None:
            m = _PLAN_FIELD.match(details)
            culprit = int(m.group(1)) if m else (0 if n == 1 else -1)

            def own(msg: str) -> CorralError:
                return InvalidArgument("", msg) if kind is InvalidArgument else kind(msg)

            aborted = Aborted("plan not committed: another plan of its group commit failed")
            return [own(details) if i == culprit else aborted for i in range(n)]
        return [Unavailable(f"plan write failed: {code.name}: {details}") for _ in range(n)]
    return [Unavailable(f"plan write failed: {_describe(exc)}") for _ in range(n)]
