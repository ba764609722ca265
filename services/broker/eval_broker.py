"""The eval broker (Nomad's nomad/eval_broker.go): in-memory, leader only.

* ready heaps per scheduler type: higher priority first, then lower create
  index (FIFO);
* one eval per job is ready or unacked at a time; the others wait in the
  job's pending heap (higher priority, then higher modify index, first);
* unacked evals carry a per-dequeue token and a nack timer;
* evals with `wait` / `wait_until` are held until then;
* on ack, the job's pending evals that the run's snapshot covered are moved
  to the cancelable set, and of the others all but the best (Nomad's rule,
  seed 000), so a storm of N updates costs one run per burst of arrivals
  during a run, and none after the last (`_supersede`);
* past the delivery limit a nacked eval goes to the `_failed` queue;
* while paused (the scheduler configuration's `pause_eval_broker`) nothing
  is handed out, but everything is still recorded, so unpausing loses
  nothing;
* a dequeue naming a worker id binds the eval to that worker's lease
  (leases.py): when the lease lapses, the worker's evals are nacked at once;
* tokens are signed for the planner's own check, and a delivery the broker
  gives up on (lease lapsed, nack timer) is revoked at the planner before the
  eval is nacked, so no plan of it can commit after the redelivery
  (plan_fence.py).

Everything runs on one asyncio loop, so no locks: methods are synchronous
except `dequeue`, which waits.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from opentelemetry import trace

from corral.domain.errors import FailedPrecondition, NotFound
from corral.domain.structs import EvalStatus, JobType, job_key
from corral.runtime import telemetry
from corral.v1 import structs_pb2 as pb
from services.broker import metrics
from services.broker.config import BrokerSettings
from services.broker.leases import WorkerLeases
from services.broker.plan_fence import PlanFence

log = logging.getLogger(__name__)

FAILED_QUEUE = "_failed"

JobKey = tuple[str, str]
#: a ready or pending heap's entry: (-priority, create or -modify index, arrival, eval)
QueueEntry = tuple[int, int, int, pb.Evaluation]

tracer = telemetry.tracer("corral.broker")


@dataclass
class _Unack:
    eval: pb.Evaluation
    token: str
    timer: asyncio.TimerHandle | None = None
    #: the lease the eval is bound to ("" = none: only the nack timer)
    worker_id: str = ""
    #: the snapshot index of the run's `complete` outcome (its decision, from
    #: the feed): its job's pending evals written at or below it were seen
    #: by that run
    covered_index: int = 0
    queued: trace.Span | None = None  # its `broker.enqueue` span, ended at the dequeue
    #: when (Unix ns, this process's clock) it became ready for this dequeue
    enqueue_time: int = 0
    #: given up on: its token is being revoked at the planner, then it is nacked
    revoking: bool = False


@dataclass
class _Waiter:
    schedulers: frozenset[str]
    future: asyncio.Future[tuple[pb.Evaluation, str]]
    worker_id: str = ""


@dataclass
class BrokerStats:
    total_ready: int = 0
    total_unacked: int = 0
    total_pending: int = 0
    total_waiting: int = 0
    total_cancelable: int = 0
    total_failed: int = 0
    by_scheduler: dict[str, tuple[int, int]] = field(
        default_factory=dict
    )  # type -> (ready, unacked)
    pending_by_scheduler: dict[str, int] = field(default_factory=dict)
    waiting_by_scheduler: dict[str, int] = field(default_factory=dict)


def covered_by(ev: pb.Evaluation, snapshot_index: int) -> bool:
    """Whether a run of the same job on a snapshot at `snapshot_index` did
    this pending eval's work: the eval was written at or below that index
    (so was whatever triggered it: a job version, a node's status, a
    deployment's progress, capacity freed), and it is not a delayed eval. A
    delayed eval (`wait`, `wait_until`: a reschedule, a disconnect timeout,
    a failed eval's follow-up, the next step of a rolling update) is work
    for a later time, which a run before that time did not do; the
    scheduler hands some of it to that very eval (an alloc's follow-up eval
    id), so it is never canceled here."""
    return (
        snapshot_index > 0
        and 0 < ev.modify_index <= snapshot_index
        and ev.wait == 0
        and ev.wait_until == 0
    )


def _supersede(
    pending: list[QueueEntry], snapshot_index: int
) -> tuple[list[pb.Evaluation], pb.Evaluation | None]:
    """Split a job's pending evals when its run acks: the ones the run's
    snapshot covered (`covered_by`) are superseded, and of the rest Nomad's
    rule keeps the best (highest priority, then highest modify index) and
    supersedes the others, whose work the best one's later run does.
    Returns (superseded, the one to enqueue or None)."""
    superseded: list[pb.Evaluation] = []
    rest: list[QueueEntry] = []
    for entry in pending:
        if covered_by(entry[3], snapshot_index):
            superseded.append(entry[3])
        else:
            rest.append(entry)
    if not rest:
        return superseded, None
    heapq.heapify(rest)
    best = heapq.heappop(rest)[3]
    superseded.extend(entry[3] for entry in rest)
    return superseded, best


class EvalBroker:
    def __init__(
        self, settings: BrokerSettings, *, on_cancelable: Callable[[], None] | None = None
    ) -> None:
        self.settings = settings
        self.enabled = False
        self.paused = False
        self._seq = itertools.count()
        self._on_cancelable = on_cancelable
        self.leases = WorkerLeases(settings.worker_lease_ttl, self._lease_expired)
        self.fence = PlanFence(settings.nack_timeout)
        self._redeliveries: set[asyncio.Task[None]] = set()
        self._reset()

    def _reset(self) -> None:
        for span in getattr(self, "_queued", {}).values():
            span.end()
        # eval id -> its `broker.enqueue` span: the time from enqueue (or a
        # nack) to the dequeue, in the trace of the write that created it
        self._queued: dict[str, trace.Span] = {}
        self._evals: dict[str, int] = {}  # eval id -> dequeue count
        # eval id -> when (Unix ns) it entered a ready queue: the journey's
        # "enqueued", handed to the worker with the dequeue (no state write)
        self._ready_at: dict[str, int] = {}
        self._job_evals: dict[JobKey, str] = {}  # job -> its ready/unacked eval
        self._pending: dict[JobKey, list[QueueEntry]] = {}
        self._ready: dict[str, list[QueueEntry]] = {}
        self._unack: dict[str, _Unack] = {}
        self._requeue: dict[str, pb.Evaluation] = {}  # token -> eval to enqueue after its ack
        self._waiting: dict[str, asyncio.TimerHandle] = {}  # eval id -> release timer
        self._waiting_types: dict[str, str] = {}  # eval id -> scheduler type (stats)
        self._cancelable: list[pb.Evaluation] = []
        self._waiters: list[_Waiter] = []
        self.leases.clear()
        self.fence.new_term()

    # ------------------------------------------------------------ enable

    def set_enabled(self, enabled: bool) -> None:
        """Enabled only on the leader; disabling flushes everything and
        wakes blocked dequeuers (they return empty)."""
        if self.enabled == enabled:
            return
        self.enabled = enabled
        if not enabled:
            for u in self._unack.values():
                if u.timer is not None:
                    u.timer.cancel()
            for t in self._waiting.values():
                t.cancel()
            for w in self._waiters:
                if not w.future.done():
                    w.future.cancel()
            self._reset()

    def set_paused(self, paused: bool) -> None:
        """The operator's `pause_eval_broker`: while paused, dequeues get
        nothing (they wait out their timeout) but enqueues, acks, nacks,
        holds and the cancelable set go on as usual. Nomad disables (and
        flushes) its broker and restores it from state when unpaused;
        keeping everything in place is simpler and loses nothing, not even
        the outstanding evals' tokens. Unpausing wakes the waiting dequeuers."""
        if self.paused == paused:
            return
        self.paused = paused
        if not paused:
            self._wake_all()

    # ------------------------------------------------------------ enqueue

    def tracked(self, eval_id: str) -> bool:
        return eval_id in self._evals

    def known_ids(self) -> set[str]:
        """Every eval the broker holds in any form: ready, pending behind its
        job's eval, unacked, held (wait / nack delay), in the `_failed`
        queue, or canceled-to-be (the reconciler's notion of "known")."""
        return set(self._evals) | {ev.id for ev in self._cancelable}

    def enqueue(self, ev: pb.Evaluation) -> None:
        """Route a pending eval. An eval already tracked is ignored, unless it
        is unacked: then it is re-enqueued once that dequeue is acked
        (Nomad's EnqueueAll requeue: a blocked eval released while its
        worker still held it)."""
        if not self.enabled:
            return
        if ev.id in self._evals:
            unack = self._unack.get(ev.id)
            if unack is not None:
                self._requeue[unack.token] = ev
            return
        self._evals[ev.id] = 0
        self._trace_queued(ev)
        now = time.time_ns()
        if ev.wait_until and ev.wait_until > now:
            self._hold(ev, (ev.wait_until - now) / 1e9)
        elif ev.wait > 0:
            self._hold(ev, ev.wait / 1e9)
        else:
            self._enqueue_locked(ev, ev.type)

    def _trace_queued(self, ev: pb.Evaluation) -> None:
        if telemetry.tracing_enabled() and ev.id not in self._queued:
            span = tracer.start_span(
                "broker.enqueue", context=telemetry.context_from_traceparent(ev.traceparent)
            )
            span.set_attribute("eval.id", ev.id)
            span.set_attribute("eval.type", ev.type)
            self._queued[ev.id] = span

    def handoff_span(self, eval_id: str) -> trace.Span | None:
        """The (ended) `broker.enqueue` span of an outstanding eval: the
        dequeue's hand-off nests under it."""
        unack = self._unack.get(eval_id)
        return unack.queued if unack is not None else None

    def _hold(self, ev: pb.Evaluation, delay: float) -> None:
        loop = asyncio.get_running_loop()

        def release() -> None:
            self._waiting.pop(ev.id, None)
            self._waiting_types.pop(ev.id, None)
            if self.enabled:
                self._enqueue_locked(ev, ev.type)

        self._waiting[ev.id] = loop.call_later(delay, release)
        self._waiting_types[ev.id] = ev.type

    def _enqueue_locked(self, ev: pb.Evaluation, queue: str) -> None:
        key = job_key(ev.namespace, ev.job_id)
        if queue != FAILED_QUEUE and ev.type != JobType.CORE:
            owner = self._job_evals.get(key)
            if owner is None:
                self._job_evals[key] = ev.id
            elif owner != ev.id:
                heapq.heappush(
                    self._pending.setdefault(key, []),
                    # ties in modify index (one write) go to the newest arrival
                    (-ev.priority, -ev.modify_index, -next(self._seq), ev),
                )
                return
        self._ready_at.setdefault(ev.id, time.time_ns())
        heapq.heappush(
            self._ready.setdefault(queue, []), (-ev.priority, ev.create_index, next(self._seq), ev)
        )
        self._wake(queue)

    def _wake(self, queue: str) -> None:
        for w in list(self._waiters):
            if w.future.done():
                self._waiters.remove(w)
                continue
            if queue in w.schedulers:
                picked = self._pick(w.schedulers, w.worker_id)
                if picked is None:
                    return
                self._waiters.remove(w)
                w.future.set_result(picked)
                return

    def _wake_all(self) -> None:
        for w in list(self._waiters):
            if w.future.done():
                self._waiters.remove(w)
                continue
            picked = self._pick(w.schedulers, w.worker_id)
            if picked is not None:
                self._waiters.remove(w)
                w.future.set_result(picked)

    # ------------------------------------------------------------ dequeue

    async def dequeue(
        self, schedulers: list[str], timeout: float, worker_id: str = ""
    ) -> tuple[pb.Evaluation, str] | None:
        """The highest-priority ready eval of the given types with a fresh
        token, or None after `timeout` seconds. A `worker_id` renews that
        worker's lease and binds the eval to it."""
        wanted = frozenset(schedulers)
        if worker_id:
            self.leases.renew(worker_id)
        picked = self._pick(wanted, worker_id)
        if picked is not None:
            return picked
        if timeout <= 0:
            return None
        fut: asyncio.Future[tuple[pb.Evaluation, str]] = asyncio.get_running_loop().create_future()
        waiter = _Waiter(wanted, fut, worker_id)
        self._waiters.append(waiter)
        try:
            return await asyncio.wait_for(fut, timeout)
        except TimeoutError:
            self._give_back(fut)
            return None
        except asyncio.CancelledError:
            self._give_back(fut)
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise  # the caller itself was cancelled (shutdown)
            return None  # the broker was disabled (leadership lost)
        finally:
            if waiter in self._waiters:
                self._waiters.remove(waiter)

    def _give_back(self, fut: asyncio.Future[tuple[pb.Evaluation, str]]) -> None:
        """An eval handed to a dequeuer that gave up goes back at once."""
        if fut.done() and not fut.cancelled() and fut.exception() is None:
            ev, token = fut.result()
            unack = self._unack.pop(ev.id, None)
            if unack is not None and unack.timer is not None:
                unack.timer.cancel()
            self._evals[ev.id] = max(0, self._evals.get(ev.id, 1) - 1)
            if unack is not None and unack.enqueue_time:
                self._ready_at[ev.id] = unack.enqueue_time  # it never left the queue really
            self._enqueue_locked(ev, ev.type)

    def _pick(
        self, schedulers: frozenset[str], worker_id: str = ""
    ) -> tuple[pb.Evaluation, str] | None:
        """Pop the head of the requested queue whose head has the highest
        priority. Queues tied on priority are chosen between at random (as
        Nomad does), so a long queue of one type cannot starve another:
        breaking ties by age would hand out 500 queued service evals before
        the first of 500 batch evals queued just after them."""
        if not self.enabled or self.paused:
            return None
        tied: list[str] = []
        best_priority = 0
        for name in sorted(schedulers):
            heap = self._ready.get(name)
            if not heap:
                continue
            priority = -heap[0][0]
            if not tied or priority > best_priority:
                tied, best_priority = [name], priority
            elif priority == best_priority:
                tied.append(name)
        if not tied:
            return None
        best = tied[0] if len(tied) == 1 else random.choice(tied)
        ev = heapq.heappop(self._ready[best])[3]
        token = self.fence.issue(ev.id)
        self._evals[ev.id] = self._evals.get(ev.id, 0) + 1
        if worker_id:
            self.leases.renew(worker_id)  # the lease runs from the hand-over
        unack = _Unack(
            ev,
            token,
            worker_id=worker_id,
            queued=self._queued.pop(ev.id, None),
            enqueue_time=self._ready_at.pop(ev.id, 0),
        )
        if unack.queued is not None:
            unack.queued.set_attribute("eval.dequeues", self._evals[ev.id])
            unack.queued.end()
        unack.timer = self._nack_timer(ev.id, token)
        self._unack[ev.id] = unack
        return ev, token

    def _nack_timer(self, eval_id: str, token: str) -> asyncio.TimerHandle:
        return asyncio.get_running_loop().call_later(
            self.settings.nack_timeout, self.give_up, eval_id, token
        )

    # ------------------------------------------------------------ ack / nack

    def _outstanding(self, eval_id: str, token: str) -> _Unack:
        unack = self._unack.get(eval_id)
        if unack is None:
            if eval_id in self._evals:
                raise FailedPrecondition(
                    f"evaluation {eval_id} is not outstanding (nack timer expired?)"
                )
            raise NotFound(f"evaluation {eval_id} not found in the broker")
        if unack.token != token:
            raise FailedPrecondition(f"token does not match for evaluation {eval_id}")
        return unack

    def enqueue_time(self, eval_id: str) -> int:
        """When (Unix ns) an outstanding eval became ready for its dequeue, 0
        when it is not outstanding."""
        unack = self._unack.get(eval_id)
        return unack.enqueue_time if unack is not None else 0

    def outstanding_token(self, eval_id: str) -> str:
        unack = self._unack.get(eval_id)
        return unack.token if unack is not None else ""

    def check_outstanding(self, eval_id: str, token: str) -> None:
        """NotFound / FailedPrecondition unless outstanding with `token`."""
        self._outstanding(eval_id, token)

    def note_outcome(self, eval_id: str, token: str, ev: pb.Evaluation) -> None:
        """The outstanding eval's outcome was written: a `complete` run covered
        its job as of its snapshot (`snapshot_index`), which the ack uses to
        cancel the pending evals that snapshot already saw. Other outcomes
        (blocked, failed) cover nothing."""
        unack = self._unack.get(eval_id)
        if unack is not None and unack.token == token:
            covered = ev.snapshot_index if ev.status == EvalStatus.COMPLETE else 0
            unack.covered_index = covered

    def requeue_pending(self, token: str) -> bool:
        """A newer pending write of the eval arrived while this dequeue held
        it: the ack enqueues it again (so its `pending` status is expected)."""
        return token in self._requeue

    def ack(self, eval_id: str, token: str) -> None:
        unack = self._outstanding(eval_id, token)
        if unack.timer is not None:
            unack.timer.cancel()
        ev = unack.eval
        del self._unack[eval_id]
        self._evals.pop(eval_id, None)
        key = job_key(ev.namespace, ev.job_id)
        if self._job_evals.get(key) == eval_id:
            del self._job_evals[key]
        pending = self._pending.pop(key, None)
        if pending:
            superseded, best = _supersede(pending, unack.covered_index)
            for old in superseded:
                self._evals.pop(old.id, None)
                span = self._queued.pop(old.id, None)
                if span is not None:
                    span.set_attribute("eval.superseded", True)
                    span.end()
                self._cancelable.append(old)
            if best is not None:
                self._enqueue_locked(best, best.type)
            if superseded and self._on_cancelable is not None:
                self._on_cancelable()
        requeued = self._requeue.pop(token, None)
        if requeued is not None:
            self.enqueue(requeued)

    def nack(self, eval_id: str, token: str) -> None:
        unack = self._outstanding(eval_id, token)
        if unack.timer is not None:
            unack.timer.cancel()
        del self._unack[eval_id]
        self._requeue.pop(token, None)
        ev = unack.eval
        self._trace_queued(ev)  # waiting again, for its redelivery
        count = self._evals.get(eval_id, 0)
        if count >= self.settings.delivery_limit:
            self._enqueue_locked(ev, FAILED_QUEUE)
            return
        delay = self._nack_delay(count)
        if delay <= 0:
            self._enqueue_locked(ev, ev.type)
        else:
            self._hold_nacked(ev, delay)

    def _hold_nacked(self, ev: pb.Evaluation, delay: float) -> None:
        loop = asyncio.get_running_loop()

        def release() -> None:
            self._waiting.pop(ev.id, None)
            self._waiting_types.pop(ev.id, None)
            if self.enabled and ev.id in self._evals:
                self._enqueue_locked(ev, ev.type)

        self._waiting[ev.id] = loop.call_later(delay, release)
        self._waiting_types[ev.id] = ev.type

    def _nack_delay(self, count: int) -> float:
        """Nomad: count 1 -> initial delay; n >= 2 -> (n-1) x subsequent."""
        if count <= 0:
            return 0.0
        if count == 1:
            return self.settings.initial_nack_delay
        return (count - 1) * self.settings.subsequent_nack_delay

    def nack_quietly(self, eval_id: str, token: str) -> None:
        """A nack whose errors mean it is gone already."""
        try:
            self.nack(eval_id, token)
        except (NotFound, FailedPrecondition):
            pass

    def give_up(self, eval_id: str, token: str) -> None:
        """The broker gives up on a delivery (its nack timer fired, its
        worker's lease lapsed): revoke the token at the planner, then nack.
        Until the planner confirms, the eval stays outstanding: the worker's
        outcome may still arrive and ack it (its plan committed first)."""
        unack = self._unack.get(eval_id)
        if unack is None or unack.token != token or unack.revoking:
            return
        unack.revoking = True
        if unack.timer is not None:
            unack.timer.cancel()
            unack.timer = None

        async def revoke_then_nack() -> None:
            await self.fence.revoke(token)
            self.nack_quietly(eval_id, token)

        task = asyncio.get_running_loop().create_task(revoke_then_nack())
        self._redeliveries.add(task)
        task.add_done_callback(self._redeliveries.discard)

    # ------------------------------------------------------------ nack timer

    def outstanding_reset(self, eval_id: str, token: str) -> None:
        """Restart the nack timer (Nomad's OutstandingReset): a worker's
        decision that only created evals, before its plan, says the run
        goes on."""
        unack = self._outstanding(eval_id, token)
        if unack.timer is not None:
            unack.timer.cancel()
        unack.timer = self._nack_timer(eval_id, token)

    # ------------------------------------------------------------ worker leases

    def heartbeat(self, worker_id: str) -> int:
        """Renew the lease; returns how many evals the worker holds."""
        self.leases.renew(worker_id)
        return sum(1 for u in self._unack.values() if u.worker_id == worker_id)

    def _lease_expired(self, worker_id: str) -> None:
        """Nack every eval the worker holds, each as soon as the planner has
        no plan of it in flight (`give_up`)."""
        if not self.enabled:
            return
        metrics.LEASE_EXPIRIES.inc()
        held = [u for u in self._unack.values() if u.worker_id == worker_id and not u.revoking]
        for u in held:
            self.give_up(u.eval.id, u.token)
        metrics.LEASE_NACKS.inc(len(held))
        if not held:
            log.info("worker %s lost its lease holding no evals", worker_id)
            return
        ids = ",".join(u.eval.id for u in held)
        log.warning(
            "worker %s lost its lease: nacked %d eval(s) %s (once no plan of theirs is in flight)",
            worker_id,
            len(held),
            ids,
            extra={"eval_id": ids},
        )

    # ------------------------------------------------------------ reaping

    def take_cancelable(self, limit: int) -> list[pb.Evaluation]:
        out = self._cancelable[:limit]
        del self._cancelable[:limit]
        return out

    def return_cancelable(self, evals: list[pb.Evaluation]) -> None:
        """A batch whose cancel write failed goes back to the front."""
        if self.enabled:
            self._cancelable[:0] = evals

    def has_cancelable(self) -> bool:
        return bool(self._cancelable)

    def failed_ready(self) -> bool:
        return bool(self._ready.get(FAILED_QUEUE))

    # ------------------------------------------------------------ stats

    def stats(self) -> BrokerStats:
        s = BrokerStats()
        for name, heap in self._ready.items():
            if name == FAILED_QUEUE:
                s.total_failed = len(heap)
                continue
            s.total_ready += len(heap)
            ready, unacked = s.by_scheduler.get(name, (0, 0))
            s.by_scheduler[name] = (ready + len(heap), unacked)
        for u in self._unack.values():
            s.total_unacked += 1
            ready, unacked = s.by_scheduler.get(u.eval.type, (0, 0))
            s.by_scheduler[u.eval.type] = (ready, unacked + 1)
        # every eval pending for one job is of that job's type: count per job,
        # not per eval (an eval storm leaves 100,000 of them pending)
        for heap in self._pending.values():
            if heap:
                t = heap[0][3].type
                s.pending_by_scheduler[t] = s.pending_by_scheduler.get(t, 0) + len(heap)
        s.total_pending = sum(s.pending_by_scheduler.values())
        for t in self._waiting_types.values():
            s.waiting_by_scheduler[t] = s.waiting_by_scheduler.get(t, 0) + 1
        s.total_waiting = len(self._waiting)
        s.total_cancelable = len(self._cancelable)
        return s
