"""The `Plan` gRPC service (proto/corral/v1/plan.proto; Nomad's
nomad/plan_endpoint.go).

`Submit`: a standby answers NotLeader (UNAVAILABLE with the leader's
address); the plan is validated (INVALID_ARGUMENT naming the field); its
eval token is checked here, without a call to the broker (fence.py: a
token the broker did not sign for this eval, or has revoked, is refused
with FAILED_PRECONDITION); the plan is queued and the call waits for its
result, the token counted in flight meanwhile, so a revocation is
confirmed to the broker only after it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from corral.domain.errors import InvalidArgument, NotLeader, Unavailable
from corral.domain.structs import (
    DEFAULT_NAMESPACE,
    DEFAULT_PRIORITY,
    ClientStatus,
    DesiredStatus,
)
from corral.runtime import telemetry
from corral.v1 import plan_pb2, plan_pb2_grpc
from corral.v1 import structs_pb2 as pb
from services.planner import metrics
from services.planner.applier import ApplierStats
from services.planner.fence import TokenFence
from services.planner.plan_queue import ERR_DISABLED, PlanQueue

log = logging.getLogger(__name__)

Context = Any
ROLE = "planner"


def validate_plan(plan: pb.Plan) -> None:
    """Reject malformed plans before they reach the queue; fills in the
    defaults a worker may leave out (alloc node and namespace, priority).
    Only a plan that just stops allocs may come without a job (its job was
    purged: Nomad's plan for a deregistered job)."""
    if not plan.eval_id:
        raise InvalidArgument("plan.eval_id", "is required")
    if not plan.eval_token:
        raise InvalidArgument("plan.eval_token", "is required")
    if not plan.job.id and _places_or_deploys(plan):
        # A plan without a job is the scheduler's answer to a job purged
        # since: it may only stop (and evict) that job's allocs.
        raise InvalidArgument("plan.job.id", "is required for a plan that places allocs")
    if plan.job.id and not plan.job.namespace:
        plan.job.namespace = DEFAULT_NAMESPACE
    if plan.priority < 0:
        raise InvalidArgument("plan.priority", "must be >= 0")
    if plan.priority == 0:
        plan.priority = plan.job.priority or DEFAULT_PRIORITY
    seen: set[str] = set()
    for node_id, lst in plan.node_allocation.items():
        base = f"plan.node_allocation[{node_id}]"
        if not node_id:
            raise InvalidArgument("plan.node_allocation", "node id key must not be empty")
        for j, a in enumerate(lst.allocs):
            f = f"{base}.allocs[{j}]"
            if not a.id:
                raise InvalidArgument(f"{f}.id", "is required")
            if a.id in seen:
                raise InvalidArgument(f"{f}.id", f"alloc {a.id} appears twice in the plan")
            seen.add(a.id)
            if not a.node_id:
                a.node_id = node_id
            elif a.node_id != node_id:
                raise InvalidArgument(f"{f}.node_id", f"is {a.node_id!r}, not the key {node_id!r}")
            if not a.namespace:
                a.namespace = plan.job.namespace
            if not a.eval_id:
                a.eval_id = plan.eval_id
            if not a.desired_status:
                a.desired_status = DesiredStatus.RUN
            if a.job_id != plan.job.id or a.namespace != plan.job.namespace:
                raise InvalidArgument(f"{f}.job_id", "must be the plan's job")
            if not a.task_group:
                raise InvalidArgument(f"{f}.task_group", "is required")
            if a.client_status and a.client_status not in ClientStatus.ALL:
                raise InvalidArgument(f"{f}.client_status", f"unknown status {a.client_status!r}")
            if a.desired_status and a.desired_status not in DesiredStatus.ALL:
                raise InvalidArgument(f"{f}.desired_status", f"unknown status {a.desired_status!r}")
            r = a.resources
            for dim in ("cpu", "cores", "memory_mb", "disk_mb"):
                if getattr(r, dim) < 0:
                    raise InvalidArgument(f"{f}.resources.{dim}", "must be >= 0")
    for name, mapping in (
        ("node_update", plan.node_update),
        ("node_preemptions", plan.node_preemptions),
    ):
        for node_id, stops in mapping.items():
            for j, s in enumerate(stops.stops):
                f = f"plan.{name}[{node_id}].stops[{j}]"
                if not s.alloc_id:
                    raise InvalidArgument(f"{f}.alloc_id", "is required")
                if s.client_status and s.client_status not in ClientStatus.ALL:
                    raise InvalidArgument(
                        f"{f}.client_status", f"unknown status {s.client_status!r}"
                    )
                if s.desired_status and s.desired_status not in (
                    DesiredStatus.STOP,
                    DesiredStatus.EVICT,
                ):
                    raise InvalidArgument(f"{f}.desired_status", "must be 'stop' or 'evict'")
    if plan.HasField("deployment") and not plan.deployment.id:
        raise InvalidArgument("plan.deployment.id", "is required")
    for j, upd in enumerate(plan.deployment_updates):
        if not upd.deployment_id:
            raise InvalidArgument(f"plan.deployment_updates[{j}].deployment_id", "is required")


def _places_or_deploys(plan: pb.Plan) -> bool:
    return (
        any(len(lst.allocs) for lst in plan.node_allocation.values())
        or plan.HasField("deployment")
        or bool(plan.node_preemptions)
    )


class PlanServicer(plan_pb2_grpc.PlanServicer):
    def __init__(
        self,
        queue: PlanQueue,
        tokens: TokenFence,
        *,
        is_leader: Callable[[], bool],
        leader_address: Callable[[], Awaitable[str]],
        stats: Callable[[], ApplierStats],
    ) -> None:
        self.queue = queue
        self.tokens = tokens
        self._is_leader = is_leader
        self._leader_address = leader_address
        self._stats = stats

    async def _require_leader(self) -> None:
        if not self._is_leader():
            raise NotLeader(ROLE, await self._leader_address())
        if not self.queue.enabled:
            raise Unavailable(ERR_DISABLED)

    async def Submit(
        self, request: plan_pb2.PlanSubmitRequest, context: Context
    ) -> plan_pb2.PlanSubmitResponse:
        start = time.perf_counter()
        await self._require_leader()
        if not request.HasField("plan"):
            raise InvalidArgument("plan", "is required")
        plan = request.plan
        validate_plan(plan)
        # the applier's evaluate and apply nest under this call's span
        plan.traceparent = telemetry.current_traceparent() or plan.traceparent
        try:
            await self.tokens.check(plan.eval_id, plan.eval_token)
            self.tokens.begin(plan.eval_token)
            try:
                pending = self.queue.enqueue(plan)
                try:
                    result = await asyncio.shield(pending.future)
                except asyncio.CancelledError:
                    pending.future.cancel()  # still queued: the applier skips it
                    raise
            finally:
                self.tokens.end(plan.eval_token)
        finally:
            metrics.SUBMIT.observe(time.perf_counter() - start)
        return plan_pb2.PlanSubmitResponse(result=result, index=result.alloc_index)

    async def Stats(
        self, request: plan_pb2.PlanStatsRequest, context: Context
    ) -> plan_pb2.PlanStats:
        s = self._stats()
        leader = ""
        with contextlib.suppress(Exception):
            leader = await self._leader_address()
        return plan_pb2.PlanStats(
            enabled=self.queue.enabled,
            queue_depth=len(self.queue),
            plans_applied=s.plans_applied,
            plans_partial=s.plans_partial,
            nodes_rejected=s.nodes_rejected,
            commits=s.commits,
            leader_address=leader,
        )
