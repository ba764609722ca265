"""What one plan's committed part writes (Nomad's `applyPlan` request):
the `AppliedPlan` handed to `State.ApplyPlans`.

Placed and updated allocs get their times stamped; stops and preemptions go
as diffs the state merges onto the newest stored alloc; one pending eval is
created per job that lost allocs to preemption, so that job gets a chance to
place them elsewhere (Nomad's preemption evals, written in the same index).
"""

from __future__ import annotations

from corral.store import StateSnapshot
from corral.structs import (
    DEFAULT_NAMESPACE,
    DesiredStatus,
    EvalStatus,
    Trigger,
    new_id,
)
from corral.v1 import state_pb2
from corral.v1 import structs_pb2 as pb


def preemption_evals(snap: StateSnapshot, result: pb.PlanResult, now: int) -> list[pb.Evaluation]:
    """One pending eval per distinct job whose allocs this result preempts."""
    jobs: dict[tuple[str, str], None] = {}
    for stops in result.node_preemptions.values():
        for stop in stops.stops:
            alloc = snap.alloc_by_id(stop.alloc_id)
            if alloc is not None:
                jobs.setdefault((alloc.namespace or DEFAULT_NAMESPACE, alloc.job_id), None)
    evals: list[pb.Evaluation] = []
    for namespace, job_id in jobs:
        job = snap.job_by_id(namespace, job_id)
        if job is None:
            continue
        evals.append(
            pb.Evaluation(
                id=new_id(),
                namespace=job.namespace or DEFAULT_NAMESPACE,
                triggered_by=Trigger.PREEMPTION,
                job_id=job.id,
                type=job.type,
                priority=job.priority,
                status=EvalStatus.PENDING,
                create_time=now,
                modify_time=now,
            )
        )
    return evals


def applied_plan(
    snap: StateSnapshot, plan: pb.Plan, result: pb.PlanResult, now: int
) -> state_pb2.AppliedPlan:
    """The write for `result` (the committable part of `plan`)."""
    out = state_pb2.AppliedPlan(
        eval_id=plan.eval_id,
        namespace=plan.job.namespace or DEFAULT_NAMESPACE,
        job_id=plan.job.id,
        traceparent=plan.traceparent,
    )
    for lst in result.node_allocation.values():
        for a in lst.allocs:
            alloc = out.allocs.add()
            alloc.CopyFrom(a)
            if not alloc.create_time:
                alloc.create_time = now
            alloc.modify_time = now
    for stops in result.node_update.values():
        for s in stops.stops:
            stop = out.stops.add()
            stop.CopyFrom(s)
            if not stop.desired_status:
                stop.desired_status = DesiredStatus.STOP
    for stops in result.node_preemptions.values():
        for s in stops.stops:
            stop = out.preemptions.add()
            stop.CopyFrom(s)
            stop.desired_status = DesiredStatus.EVICT
    if result.HasField("deployment"):
        out.deployment.CopyFrom(result.deployment)
    out.deployment_updates.extend(result.deployment_updates)
    out.ineligible_nodes.extend(result.ineligible_nodes)
    out.evals.extend(preemption_evals(snap, result, now))
    return out
