"""The `Eval` gRPC service (proto/corral/v1/eval.proto), served by the broker
leader; a standby answers UNAVAILABLE with the leader's address.

The broker takes no eval writes: a worker writes its eval's outcome, the
evals its run created and its ack in one `State.DecideEval` to the state,
and the broker acks the eval when the write reaches it on the change feed
(feed.py); the planner checks tokens with the key of `Eval.PlanFence`
(plan_fence.py). What is left here is the queue itself: Dequeue, Nack,
worker leases (Heartbeat), Stats, and Eval.Ack for a run with no outcome to
write (a core eval, an eval canceled while it was held), which is refused
while the eval is still `pending` in the state: the caller must nack it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from opentelemetry import trace
from prometheus_client import Gauge

from corral.domain.errors import FailedPrecondition, InvalidArgument, NotLeader, TakingOffice
from corral.domain.structs import EvalStatus, JobType
from corral.runtime import telemetry
from corral.runtime.replica import Replica
from corral.runtime.server import GrpcServer
from corral.v1 import (
    eval_pb2,
    eval_pb2_grpc,
    periodic_pb2,
    periodic_pb2_grpc,
    system_pb2,
    system_pb2_grpc,
)
from corral.v1 import structs_pb2 as pb
from services.broker import metrics
from services.broker.blocked_evals import BlockedEvals
from services.broker.config import BrokerSettings
from services.broker.core_timers import FORCE_GC_MAX_WAIT, FORCE_GC_WAIT, ForcedGC
from services.broker.eval_broker import EvalBroker
from services.broker.periodic import PeriodicDispatcher

Context = Any
tracer = telemetry.tracer("corral.broker")

log = logging.getLogger(__name__)

ROLE = "broker"


async def require_in_office(
    is_leader: Callable[[], bool], enabled: bool, leader_address: Callable[[], Awaitable[str]]
) -> None:
    """Serve only as the leader in office: a standby points at the leader; a
    leader still restoring its evals says so and names itself (callers back
    off and retry it: corral/runtime/rpc.py)."""
    if not is_leader():
        raise NotLeader(ROLE, await leader_address())
    if not enabled:
        raise TakingOffice(ROLE, await leader_address())


#: the longest worker id a Dequeue or Heartbeat may name
MAX_WORKER_ID = 128

GAUGES = {
    name: Gauge(
        f"corral_broker_{name}", f"Evals {name.removeprefix('total_')} (nomad.broker.{name})"
    )
    for name in (
        "total_ready",
        "total_unacked",
        "total_pending",
        "total_waiting",
        "total_cancelable",
        "total_failed",
        "total_blocked",
        "total_escaped",
    )
}
BY_SCHEDULER = Gauge(
    "corral_broker_evals", "Evals by scheduler type and state", ["scheduler", "state"]
)


class EvalServicer(eval_pb2_grpc.EvalServicer):
    def __init__(
        self,
        settings: BrokerSettings,
        broker: EvalBroker,
        blocked: BlockedEvals,
        replica: Replica,
        is_leader: Callable[[], bool],
        leader_address: Callable[[], Awaitable[str]],
        on_ack: Callable[[str], None] | None = None,
        shutting_down: asyncio.Event | None = None,
    ) -> None:
        self.settings = settings
        #: set when the server stops: the plan fence streams end
        self.shutting_down = shutting_down or asyncio.Event()
        self.broker = broker
        self.blocked = blocked
        self.replica = replica
        self.is_leader = is_leader
        self.leader_address = leader_address
        #: told of every acked eval id (a forced GC waits for its own)
        self.on_ack = on_ack

    async def _require_leader(self) -> None:
        await require_in_office(self.is_leader, self.broker.enabled, self.leader_address)

    # ------------------------------------------------------------ dequeue / ack

    async def Dequeue(
        self, request: eval_pb2.EvalDequeueRequest, context: Context
    ) -> eval_pb2.EvalDequeueResponse:
        if request.scheduler_version != self.settings.scheduler_version:
            raise FailedPrecondition(
                f"scheduler version mismatch: worker has {request.scheduler_version}, "
                f"broker requires {self.settings.scheduler_version}"
            )
        if not request.schedulers:
            raise InvalidArgument("schedulers", "at least one scheduler type is required")
        unknown = [s for s in request.schedulers if s not in JobType.ALL]
        if unknown:
            raise InvalidArgument("schedulers", f"unknown scheduler type(s): {', '.join(unknown)}")
        _check_worker_id(request.worker_id, required=False)
        await self._require_leader()
        timeout = (
            request.timeout_ms / 1000
            if request.timeout_ms > 0
            else self.settings.dequeue_default_timeout
        )
        timeout = min(timeout, self.settings.dequeue_max_timeout)
        got = await self.broker.dequeue(list(request.schedulers), timeout, request.worker_id)
        if got is None:
            return eval_pb2.EvalDequeueResponse()
        ev, token = got
        if not telemetry.tracing_enabled():
            return eval_pb2.EvalDequeueResponse(
                eval=ev,
                token=token,
                wait_index=self._wait_index(ev),
                enqueue_time=self.broker.enqueue_time(ev.id),
            )
        # the hand-off joins the eval's trace (the long poll itself is in none)
        queued = self.broker.handoff_span(ev.id)
        parent = (
            trace.set_span_in_context(queued)
            if queued is not None
            else telemetry.context_from_traceparent(ev.traceparent)
        )
        with tracer.start_as_current_span("broker.dequeue", context=parent) as span:
            span.set_attribute("eval.id", ev.id)
            return eval_pb2.EvalDequeueResponse(
                eval=ev,
                token=token,
                wait_index=self._wait_index(ev),
                traceparent=telemetry.traceparent_of(span),
                enqueue_time=self.broker.enqueue_time(ev.id),
            )

    def _wait_index(self, ev: pb.Evaluation) -> int:
        """max(eval modify index, every eval of its job in state): plans of
        one invocation must be seen by the next (seed 002)."""
        snap = self.replica.snapshot()
        index = ev.modify_index
        for other in snap.evals_by_job(ev.namespace, ev.job_id):
            index = max(index, other.modify_index)
        return index

    async def Ack(
        self, request: eval_pb2.EvalAckRequest, context: Context
    ) -> eval_pb2.EvalAckResponse:
        """Release the eval, unless the state still has it `pending`: an ack
        without the outcome written would leave it pending with nobody
        holding it. The eval stays outstanding with its token, so the worker
        nacks it (its nack timer, or its lease, is the backstop) and it is
        redelivered, within the delivery limit like any failing eval."""
        await self._require_leader()
        self.broker.check_outstanding(request.eval_id, request.token)
        self._check_not_pending(request.eval_id, request.token)
        self.broker.ack(request.eval_id, request.token)
        if self.on_ack is not None:
            self.on_ack(request.eval_id)
        return eval_pb2.EvalAckResponse()

    def _check_not_pending(self, eval_id: str, token: str) -> None:
        snap = self.replica.snapshot()
        stored = snap.eval_by_id(eval_id)
        if (
            stored is None  # never stored (core evals) or collected: nothing to leave behind
            or stored.type == JobType.CORE  # core evals' outcome is not written (Nomad)
            or stored.status != EvalStatus.PENDING
            or self.broker.requeue_pending(token)  # pending again on purpose: requeued on ack
        ):
            return
        metrics.ACKS_REFUSED.inc()
        log.warning(
            "refused the ack of eval %s: still pending in the state at index %d",
            eval_id,
            snap.index,
            extra={"eval_id": eval_id, "index": snap.index},
        )
        raise FailedPrecondition(
            f"evaluation {eval_id} is still pending in the state (index {snap.index}): write "
            "its outcome with State.DecideEval (which acks it), or nack it"
        )

    async def Nack(
        self, request: eval_pb2.EvalAckRequest, context: Context
    ) -> eval_pb2.EvalAckResponse:
        await self._require_leader()
        self.broker.nack(request.eval_id, request.token)
        return eval_pb2.EvalAckResponse()

    # ------------------------------------------------------------ the planner's token check

    async def PlanFence(  # type: ignore[override]  # an async generator
        self, request_iterator: AsyncIterator[eval_pb2.PlanFenceConfirm], context: Context
    ) -> AsyncIterator[eval_pb2.PlanFenceUpdate]:
        """The planner leader's stream (plan_fence.py): this term's key, then
        revoked tokens; the planner's messages confirm them. Ends when this
        broker's term does (leadership lost) or the planner goes away."""
        await self._require_leader()
        first = await anext(aiter(request_iterator), None)
        if first is None:
            return
        fence = self.broker.fence
        planner = fence.connect(first.planner)
        log.info("planner %s opened the plan fence", first.planner or "(unnamed)")

        async def confirms() -> None:
            try:
                fence.confirm(planner, list(first.tokens))
                async for msg in request_iterator:
                    fence.confirm(planner, list(msg.tokens))
            finally:
                planner.updates.put_nowait(None)

        async def shutdown() -> None:
            await self.shutting_down.wait()
            planner.updates.put_nowait(None)

        tasks = [asyncio.create_task(confirms()), asyncio.create_task(shutdown())]
        try:
            while (update := await planner.updates.get()) is not None:
                yield update
        finally:
            for task in tasks:
                task.cancel()
            fence.disconnect(planner)

    # ------------------------------------------------------------ worker leases

    async def Heartbeat(
        self, request: eval_pb2.EvalHeartbeatRequest, context: Context
    ) -> eval_pb2.EvalHeartbeatResponse:
        _check_worker_id(request.worker_id, required=True)
        await self._require_leader()
        outstanding = self.broker.heartbeat(request.worker_id)
        return eval_pb2.EvalHeartbeatResponse(
            ttl_ms=int(self.settings.worker_lease_ttl * 1000), outstanding=outstanding
        )

    # ------------------------------------------------------------ stats

    async def Stats(
        self, request: eval_pb2.BrokerStatsRequest, context: Context
    ) -> eval_pb2.BrokerStats:
        s = self.broker.stats()
        out = eval_pb2.BrokerStats(
            enabled=self.broker.enabled,
            total_ready=s.total_ready,
            total_unacked=s.total_unacked,
            total_pending=s.total_pending,
            total_waiting=s.total_waiting,
            total_failed=s.total_failed,
            total_cancelable=s.total_cancelable,
            total_blocked=self.blocked.total_blocked,
            total_escaped=self.blocked.total_escaped,
            delayed_evals=s.total_waiting,
            leader_address=await self.leader_address(),
            worker_leases=len(self.broker.leases),
        )
        for name, (ready, unacked) in s.by_scheduler.items():
            out.by_scheduler[name].ready = ready
            out.by_scheduler[name].unacked = unacked
        return out


def _check_worker_id(worker_id: str, *, required: bool) -> None:
    if not worker_id:
        if required:
            raise InvalidArgument("worker_id", "is required")
        return
    if len(worker_id) > MAX_WORKER_ID:
        raise InvalidArgument("worker_id", f"must be at most {MAX_WORKER_ID} characters")
    if not worker_id.isprintable():
        raise InvalidArgument("worker_id", "must be printable characters only")


def export_metrics(broker: EvalBroker, blocked: BlockedEvals) -> None:
    """Refresh the Prometheus gauges (called periodically)."""
    s = broker.stats()
    values = {
        "total_ready": s.total_ready,
        "total_unacked": s.total_unacked,
        "total_pending": s.total_pending,
        "total_waiting": s.total_waiting,
        "total_cancelable": s.total_cancelable,
        "total_failed": s.total_failed,
        "total_blocked": blocked.total_blocked,
        "total_escaped": blocked.total_escaped,
    }
    for name, value in values.items():
        GAUGES[name].set(value)
    blocked_by = blocked.by_scheduler()
    for sched in JobType.ALL:
        ready, unacked = s.by_scheduler.get(sched, (0, 0))
        per_state = {
            "ready": ready,
            "unacked": unacked,
            "pending": s.pending_by_scheduler.get(sched, 0),
            "waiting": s.waiting_by_scheduler.get(sched, 0),
            "blocked": blocked_by.get(sched, 0),
        }
        for state, value in per_state.items():
            BY_SCHEDULER.labels(sched, state).set(value)


# ---------------------------------------------------------------- forced GC


class CoreGCServicer(system_pb2_grpc.CoreGCServicer):
    """`CoreGC.Force` on the leader, whose broker holds the core evals (the
    state service relays users' `System.GarbageCollect` here)."""

    def __init__(
        self,
        forced: ForcedGC,
        broker: EvalBroker,
        is_leader: Callable[[], bool],
        leader_address: Callable[[], Awaitable[str]],
    ) -> None:
        self.forced = forced
        self.broker = broker
        self.is_leader = is_leader
        self.leader_address = leader_address

    async def Force(
        self, request: system_pb2.SystemGCRequest, context: Context
    ) -> system_pb2.SystemGCResponse:
        if request.timeout_ms > FORCE_GC_MAX_WAIT * 1000:
            raise InvalidArgument(
                "timeout_ms", f"at most {int(FORCE_GC_MAX_WAIT * 1000)} ms may be waited"
            )
        await require_in_office(self.is_leader, self.broker.enabled, self.leader_address)
        wait = None if request.detach else (request.timeout_ms / 1000 or FORCE_GC_WAIT)
        eval_id, complete = await self.forced.run(wait=wait)
        return system_pb2.SystemGCResponse(eval_id=eval_id, complete=complete)


def register_core_gc(
    server: GrpcServer,
    forced: ForcedGC,
    broker: EvalBroker,
    is_leader: Callable[[], bool],
    leader_address: Callable[[], Awaitable[str]],
) -> None:
    server.add(
        system_pb2_grpc.add_CoreGCServicer_to_server,
        CoreGCServicer(forced, broker, is_leader, leader_address),
        system_pb2.DESCRIPTOR.services_by_name["CoreGC"].full_name,
    )


# ---------------------------------------------------------------- periodic


class PeriodicServicer(periodic_pb2_grpc.PeriodicServicer):
    """`Periodic.Force` on the leader, where the periodic dispatcher runs
    (the state service relays users' calls here)."""

    def __init__(
        self,
        dispatcher: PeriodicDispatcher,
        is_leader: Callable[[], bool],
        leader_address: Callable[[], Awaitable[str]],
    ) -> None:
        self.dispatcher = dispatcher
        self.is_leader = is_leader
        self.leader_address = leader_address

    async def Force(
        self, request: periodic_pb2.PeriodicForceRequest, context: Context
    ) -> periodic_pb2.PeriodicForceResponse:
        if not request.job_id:
            raise InvalidArgument("job_id", "is required")
        await require_in_office(self.is_leader, self.dispatcher.enabled, self.leader_address)
        launched = await self.dispatcher.force(request.namespace, request.job_id)
        return periodic_pb2.PeriodicForceResponse(
            eval_id=launched.response.eval_id,
            eval_create_index=launched.response.eval_create_index,
            child_job_id=launched.child_id,
            index=launched.response.index,
        )


def register_periodic(
    server: GrpcServer,
    dispatcher: PeriodicDispatcher,
    is_leader: Callable[[], bool],
    leader_address: Callable[[], Awaitable[str]],
) -> None:
    server.add(
        periodic_pb2_grpc.add_PeriodicServicer_to_server,
        PeriodicServicer(dispatcher, is_leader, leader_address),
        periodic_pb2.DESCRIPTOR.services_by_name["Periodic"].full_name,
    )
