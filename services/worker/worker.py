"""One scheduler loop: Nomad's `worker.go` (seed 001), with the index-wait
and long-backoff behaviour of seeds 000/002.

    paused? -> wait | Eval.Dequeue -> wait for the replica to reach
    max(eval.modify_index, wait_index) -> invoke the scheduler on that
    snapshot, whose outcome is written with State.DecideEval, which acks
    the eval (one hop: the broker acks it from the change feed) -> Eval.Nack
    on any failure; Eval.Ack only for a run that wrote no outcome (core evals,
    an eval canceled meanwhile).

A worker whose replica cannot reach the index within the sync limit nacks
the eval and then waits up to the slow catch-up period, ending early as soon
as the replica catches up (the replica wakes it; nothing polls), so a worker
on a freshly started or lagging process neither fails evals needlessly nor
spins on redeliveries.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from concurrent.futures import Executor
from typing import Any, Protocol

import grpc
from opentelemetry import context as otel_context
from opentelemetry import trace

from corral.domain import structs
from corral.domain.store import StateSnapshot
from corral.domain.structs import EvalStatus
from corral.runtime import telemetry
from corral.runtime.replica import Replica
from corral.v1 import eval_pb2, plan_pb2, state_pb2, state_pb2_grpc
from corral.v1 import structs_pb2 as pb
from services.worker import metrics
from services.worker.clients import RoleClient
from services.worker.config import WorkerSettings
from services.worker.planner_bridge import Journey, WorkerPlanner
from services.worker.scheduler.factory import new_scheduler
from services.worker.scheduler.feasible.inflight import InFlightPlacements

log = logging.getLogger(__name__)
tracer = telemetry.tracer("corral.worker")


def _canceled_meanwhile(snapshot: StateSnapshot, ev: pb.Evaluation) -> bool:
    """The eval was canceled while the broker held it (a max-disconnect-
    timeout follow-up whose allocs reconnected): acknowledge it without
    scheduling, as Nomad drops such evals from its delay heap; running it
    would overwrite `canceled` with `complete`."""
    stored = snapshot.eval_by_id(ev.id)
    return stored is not None and stored.status == EvalStatus.CANCELED


class LoopPool(Protocol):
    """What a loop shares with the other loops of its pool
    (services/worker/pool.py): the settings, the replica, the executor its
    scheduler runs on, the clients, the process's broker lease and the
    placements its loops have in flight."""

    settings: WorkerSettings
    enabled_schedulers: list[str]
    lease_id: str
    replica: Replica
    executor: Executor
    broker: RoleClient
    planner: RoleClient
    state: state_pb2_grpc.StateAsyncStub
    inflight: InFlightPlacements


class Status:
    STARTING = "starting"
    STARTED = "started"
    PAUSING = "pausing"
    PAUSED = "paused"
    RESUMING = "resuming"
    STOPPING = "stopping"
    STOPPED = "stopped"


class Workload:
    RUNNING = "running"
    WAITING_TO_DEQUEUE = "waiting_to_dequeue"
    WAITING_FOR_RAFT = "waiting_for_raft"
    SCHEDULING = "scheduling"
    SUBMITTING = "submitting"
    BACKOFF = "backoff"
    PAUSED = "paused"
    STOPPED = "stopped"


# gRPC codes worth retrying (no leader yet, a standby, a restart in progress)
TRANSIENT = (
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.DEADLINE_EXCEEDED,
    grpc.StatusCode.ABORTED,
)


async def _first(*events: asyncio.Event) -> None:
    """Return when any of the events is set."""
    waiters = [asyncio.ensure_future(e.wait()) for e in events]
    try:
        await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in waiters:
            w.cancel()


#: test-only fault (CORRAL_WORKER_FAULT): hang after the scheduler's plan
#: committed and before its outcome and ack (one State.DecideEval) are
#: written, so a test can kill the worker there
FAULT_STALL_BEFORE_ACK = "stall-before-ack"
#: test-only fault: a scheduling run that keeps the CPU busy (in its thread)
#: for BUSY_SCHEDULER_SECONDS before scheduling, longer than a lease ttl
FAULT_BUSY_SCHEDULER = "busy-scheduler"
BUSY_SCHEDULER_SECONDS = 8.0


def _spin(seconds: float) -> None:
    """Burn CPU in pure Python (holding the GIL between switches)."""
    end = time.monotonic() + seconds
    n = 0
    while time.monotonic() < end:
        n += 1


class WorkerStopping(Exception):
    """The worker was stopped while it waited."""


class Worker:
    def __init__(self, pool: LoopPool, worker_id: str) -> None:
        self.pool = pool
        self.id = worker_id
        self.status = Status.STARTING
        self.workload = Workload.RUNNING
        self.current_eval_id = ""
        #: the namespace of that eval: Worker.List shows its id only to a
        #: caller who may read-job there
        self.current_eval_namespace = ""
        self.snapshot_index = 0
        self.evals_processed = 0
        self.started = time.time_ns()
        self._failures = 0
        self._resume = asyncio.Event()
        self._resume.set()
        self._pausing = asyncio.Event()  # set from pause() until resume()
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    # ------------------------------------------------------------ control

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name=f"worker-{self.id}")

    def pause(self) -> bool:
        """Nomad: not from pausing/paused/stopping/stopped."""
        if self.status in (Status.PAUSING, Status.PAUSED, Status.STOPPING, Status.STOPPED):
            return False
        self.status = Status.PAUSING
        self._resume.clear()
        self._pausing.set()
        return True

    def resume(self) -> bool:
        """Nomad: only from paused (or a pause not yet taken effect)."""
        if self.status not in (Status.PAUSED, Status.PAUSING):
            return False
        self.status = Status.RESUMING
        self._pausing.clear()
        self._resume.set()
        return True

    def stop(self) -> None:
        if self.status == Status.STOPPED:
            return
        self.status = Status.STOPPING
        self._stop.set()
        self._resume.set()

    async def wait_stopped(self, timeout: float | None = None) -> None:
        if self._task is not None:
            with contextlib.suppress(asyncio.CancelledError, TimeoutError):
                await asyncio.wait_for(asyncio.shield(self._task), timeout)

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    # ------------------------------------------------------------ the loop

    async def _run(self) -> None:
        self.status = Status.STARTED
        try:
            while not self.stopping:
                if not self._resume.is_set():
                    self.status = Status.PAUSED
                    self.workload = Workload.PAUSED
                    await self._resume.wait()
                    if self.stopping:
                        break
                    self.status = Status.STARTED
                await self._one_eval()
        except WorkerStopping:
            pass
        except asyncio.CancelledError:
            log.warning("worker %s cancelled", self.id)
        finally:
            self.status = Status.STOPPED
            self.workload = Workload.STOPPED
            self.current_eval_id = ""

    async def _one_eval(self) -> None:
        self.workload = Workload.WAITING_TO_DEQUEUE
        resp = await self._dequeue()
        if resp is None or not resp.eval.id:
            return
        ev, token = resp.eval, resp.token
        journey = Journey(ev.id, resp.enqueue_time, structs.now_ns())
        self.current_eval_id = ev.id
        self.current_eval_namespace = ev.namespace
        # the eval's work, from the dequeue to the ack, under the broker's hand-off
        span = tracer.start_span(
            "worker.eval",
            context=telemetry.context_from_traceparent(resp.traceparent or ev.traceparent),
        )
        span.set_attribute("eval.id", ev.id)
        span.set_attribute("job.id", ev.job_id)
        span.set_attribute("worker.id", self.id)
        with trace.use_span(span, end_on_exit=True):
            await self._process(resp, ev, token, journey)

    async def _process(
        self,
        resp: eval_pb2.EvalDequeueResponse,
        ev: pb.Evaluation,
        token: str,
        journey: Journey,
    ) -> None:
        extra = {"eval_id": ev.id, "job_id": ev.job_id}
        try:
            if self.stopping:
                await self._nack(ev, token)
                return
            wait_index = max(ev.modify_index, resp.wait_index)
            snapshot = await self._wait_for_index(ev, token, wait_index)
            if snapshot is None:
                return
            self.snapshot_index = snapshot.index
            if _canceled_meanwhile(snapshot, ev):
                await self._ack(ev, token)
                return
            self.workload = Workload.SCHEDULING
            decided = await self._invoke_scheduler(ev, token, snapshot, journey)
            if decided is None:
                await self._nack(ev, token)
            elif not decided:
                # no outcome written (a core eval's is not): ack it here
                await self._ack(ev, token)
        except WorkerStopping:
            log.warning(
                "worker %s shutting down with eval outstanding; nacking", self.id, extra=extra
            )
            await self._nack(ev, token)
            raise
        finally:
            self.current_eval_id = ""

    async def _dequeue(self) -> eval_pb2.EvalDequeueResponse | None:
        settings = self.pool.settings
        req = eval_pb2.EvalDequeueRequest(
            schedulers=self.pool.enabled_schedulers,
            timeout_ms=int(settings.dequeue_timeout * 1000),
            scheduler_version=settings.scheduler_version,
            worker_id=self.pool.lease_id,
        )
        start = time.perf_counter()
        call = asyncio.ensure_future(
            self.pool.broker.call("Dequeue", req, timeout=settings.dequeue_timeout + 5.0)
        )
        # a pause or stop cancels the long poll: a paused worker dequeues nothing
        interrupt = asyncio.ensure_future(_first(self._pausing, self._stop))
        try:
            done, _ = await asyncio.wait({call, interrupt}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            interrupt.cancel()
        if call not in done:
            call.cancel()
            with contextlib.suppress(asyncio.CancelledError, grpc.aio.AioRpcError):
                await call
            return None
        try:
            resp: eval_pb2.EvalDequeueResponse = call.result()
        except grpc.aio.AioRpcError as exc:
            details = exc.details() or ""
            if details.startswith("scheduler version mismatch"):
                log.warning("worker %s: %s; backing off", self.id, details)
                await self._backoff(
                    settings.version_mismatch_backoff, settings.version_mismatch_backoff
                )
            else:
                log.debug("worker %s: dequeue failed: %s", self.id, details)
                await self._backoff(settings.backoff_fast, settings.backoff_limit)
            return None
        if resp.eval.id:
            metrics.DEQUEUE_EVAL.observe(time.perf_counter() - start)
            self._failures = 0
        return resp

    async def _wait_for_index(
        self, ev: pb.Evaluation, token: str, index: int
    ) -> StateSnapshot | None:
        """Snapshot-min-index: the snapshot must include the eval's own write
        and every write its job's evals saw (seed 002). Behind the state:
        nack now, then wait up to the slow catch-up period for the replica."""
        settings = self.pool.settings
        replica = self.pool.replica
        self.workload = Workload.WAITING_FOR_RAFT
        start = time.perf_counter()
        try:
            with tracer.start_as_current_span("worker.wait_for_index") as span:
                span.set_attribute("index", index)
                snap: StateSnapshot = await self._interruptible(
                    replica.wait_for_index(index, settings.sync_limit)
                )
            metrics.WAIT_FOR_INDEX.observe(time.perf_counter() - start)
            return snap
        except WorkerStopping:
            log.warning(
                "worker %s: shutdown while waiting for state index %d (eval %s)",
                self.id,
                index,
                ev.id,
                extra={"eval_id": ev.id, "index": index},
            )
            raise
        except TimeoutError:
            pass
        metrics.BEHIND_STATE.inc()
        log.warning(
            "worker %s: state at index %d is behind eval %s's index %d after %.1fs; nacking and "
            "waiting up to %.0fs for it to catch up",
            self.id,
            replica.index,
            ev.id,
            index,
            settings.sync_limit,
            settings.slow_catchup,
            extra={"eval_id": ev.id, "index": index},
        )
        await self._nack(ev, token)
        self.workload = Workload.BACKOFF
        with contextlib.suppress(TimeoutError):
            await self._interruptible(replica.wait_for_index(index, settings.slow_catchup))
        return None

    async def _invoke_scheduler(
        self, ev: pb.Evaluation, token: str, snapshot: StateSnapshot, journey: Journey
    ) -> bool | None:
        """Run the scheduler: None when it failed (nack), else whether its
        outcome was written (and so the eval acked)."""
        loop = asyncio.get_running_loop()
        inflight = self.pool.inflight
        planner = WorkerPlanner(
            loop, self, token, snapshot, ev.traceparent, journey, inflight=inflight
        )
        sched_log = logging.LoggerAdapter(log, {"eval_id": ev.id, "job_id": ev.job_id})
        start = time.perf_counter()
        ctx = otel_context.get_current()  # the scheduler's thread joins this trace

        busy = self.pool.settings.fault == FAULT_BUSY_SCHEDULER

        def run() -> None:
            if busy:
                log.error("fault injection: busy scheduler on eval %s", ev.id)
                _spin(BUSY_SCHEDULER_SECONDS)
            with tracer.start_as_current_span(f"scheduler.{ev.type}", context=ctx) as span:
                span.set_attribute("eval.id", ev.id)
                span.set_attribute("job.id", ev.job_id)
                sched = new_scheduler(
                    ev.type,
                    snapshot,
                    planner,
                    log=sched_log.logger,
                    gc_config=self.pool.settings.gc.config(),
                    inflight=inflight,
                )
                sched.process(ev)
            planner.write_created()

        inflight.begin(ev.id, snapshot.index)
        try:
            await loop.run_in_executor(self.pool.executor, run)
        except Exception as exc:
            metrics.EVALS_PROCESSED.labels("failed").inc()
            log.error(
                "worker %s: scheduler failed on eval %s: %s",
                self.id,
                ev.id,
                exc,
                extra={"eval_id": ev.id, "job_id": ev.job_id},
                exc_info=not isinstance(exc, grpc.aio.AioRpcError),
            )
            return None
        finally:
            inflight.end(ev.id)
            metrics.INVOKE_SCHEDULER.labels(ev.type).observe(time.perf_counter() - start)
        self.evals_processed += 1
        metrics.EVALS_PROCESSED.labels("ok").inc()
        return planner.decided

    # ------------------------------------------------------------ RPCs used by the planner bridge

    async def submit_plan(self, plan: pb.Plan) -> plan_pb2.PlanSubmitResponse:
        """Plan.Submit, retrying transient errors (no planner leader yet, a
        standby, a restart) with the slow backoff, as Nomad's worker does."""
        settings = self.pool.settings
        self.workload = Workload.SUBMITTING
        start = time.perf_counter()
        deadline = time.monotonic() + settings.plan_retry_limit
        attempt = 0
        try:
            while True:
                try:
                    with tracer.start_as_current_span("worker.submit_plan"):
                        resp: plan_pb2.PlanSubmitResponse = await self.pool.planner.call(
                            "Submit", plan_pb2.PlanSubmitRequest(plan=plan), timeout=60.0
                        )
                    return resp
                except grpc.aio.AioRpcError as exc:
                    transient = exc.code() in TRANSIENT or "plan queue" in (exc.details() or "")
                    if not transient or time.monotonic() > deadline or self.stopping:
                        raise
                    attempt += 1
                    await asyncio.sleep(
                        min(settings.backoff_limit, settings.backoff_slow * 2**attempt)
                    )
        finally:
            metrics.SUBMIT_PLAN.observe(time.perf_counter() - start)
            self.workload = Workload.SCHEDULING

    async def wait_for_refresh(self, index: int) -> StateSnapshot:
        return await self.pool.replica.wait_for_index(index, self.pool.settings.sync_limit)

    async def decide_eval(
        self, eval_id: str, token: str, outcome: pb.Evaluation | None, created: list[pb.Evaluation]
    ) -> None:
        """State.DecideEval: the created evals, and the outcome with the ack."""
        if outcome is not None and self.pool.settings.fault == FAULT_STALL_BEFORE_ACK:
            log.error(
                "fault injection: stalling before ack of eval %s",
                eval_id,
                extra={"eval_id": eval_id},
            )
            await self._interruptible(asyncio.Event().wait())
        request = state_pb2.DecideEvalRequest(eval_id=eval_id, token=token, created=created)
        if outcome is not None:
            request.outcome.CopyFrom(outcome)
        start = time.perf_counter()
        try:
            with tracer.start_as_current_span("worker.decide_eval"):
                await self.pool.state.DecideEval(request, timeout=30.0)
        finally:
            metrics.EVAL_WRITE.labels("outcome" if outcome is not None else "create").observe(
                time.perf_counter() - start
            )

    async def garbage_collect(self, request: state_pb2.GarbageCollectRequest) -> None:
        await self.pool.state.GarbageCollect(request, timeout=60.0)

    # ------------------------------------------------------------ ack / nack / backoff

    async def _ack(self, ev: pb.Evaluation, token: str) -> None:
        """Ack; if the broker refuses (the eval is still pending in the state:
        its outcome was never written), nack so it is redelivered now rather
        than after the nack timeout."""
        refused = await self._send("Ack", ev, token)
        if refused == grpc.StatusCode.FAILED_PRECONDITION:
            await self._nack(ev, token)

    async def _nack(self, ev: pb.Evaluation, token: str) -> None:
        await self._send("Nack", ev, token)

    async def _send(self, op: str, ev: pb.Evaluation, token: str) -> grpc.StatusCode | None:
        """The call's error code, None on success (errors are logged)."""
        start = time.perf_counter()
        try:
            with tracer.start_as_current_span(f"worker.{op.lower()}"):
                await self.pool.broker.call(
                    op, eval_pb2.EvalAckRequest(eval_id=ev.id, token=token), timeout=10.0
                )
            return None
        except grpc.aio.AioRpcError as exc:
            # The broker redelivers after the nack timeout; nothing is lost.
            log.warning(
                "worker %s: %s of eval %s failed: %s",
                self.id,
                op,
                ev.id,
                exc.details(),
                extra={"eval_id": ev.id},
            )
            code: grpc.StatusCode = exc.code()
            return code
        finally:
            metrics.SEND_ACK.labels(op.lower()).observe(time.perf_counter() - start)

    async def _backoff(self, base: float, limit: float) -> None:
        """Exponential in consecutive failures, ended early by stop."""
        self.workload = Workload.BACKOFF
        delay = min(limit, base * (2**self._failures))
        self._failures += 1
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stop.wait(), delay)

    async def _interruptible(self, coro: Any) -> Any:
        """Run coro unless stop comes first (then raise WorkerStopping)."""
        task = asyncio.ensure_future(coro)
        stopper = asyncio.ensure_future(self._stop.wait())
        try:
            done, _ = await asyncio.wait({task, stopper}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopper.cancel()
        if task in done:
            return task.result()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task
        raise WorkerStopping()
