"""What one plan's committed part writes (Nomad's `applyPlan` request):
the flat, node-free `AppliedPlan` the merge (`corral.domain.plan_results`) takes,
built from the node-keyed `Plan` and the `PlanResult` saying which part of
it commits.

The planner hands it to `State.ApplyPlans` and to its overlay; the
scheduler test harness builds it the same way, so both feed the merge the
same input. Placed and updated allocs go whole; stops and preemptions go as
diffs the merge lays onto the newest stored alloc; one pending eval is
created per job that lost allocs to preemption, so that job gets a chance to
place them elsewhere (Nomad's preemption evals, written in the same index).
A plan for a job that no longer exists (purged) carries no job: it names the
job through its eval, and may only stop allocs.
"""

from __future__ import annotations

from collections.abc import Collection

from corral.domain.store import StateSnapshot
from corral.domain.structs import (
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
    """The write for `result` (the committable part of `plan`); `now`
    stamps the preemption evals."""
    namespace, job_id = plan.job.namespace, plan.job.id
    if not job_id:
        ev = snap.eval_by_id(plan.eval_id)
        if ev is not None:
            namespace, job_id = ev.namespace, ev.job_id
    out = state_pb2.AppliedPlan(
        eval_id=plan.eval_id,
        namespace=namespace or DEFAULT_NAMESPACE,
        job_id=job_id,
        traceparent=plan.traceparent,
    )
    for lst in result.node_allocation.values():
        out.allocs.extend(lst.allocs)
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


def new_alloc_ids(snap: StateSnapshot, result: pb.PlanResult) -> frozenset[str]:
    """The placements of `result` that create an alloc (not stored in `snap`)."""
    return frozenset(
        a.id
        for lst in result.node_allocation.values()
        for a in lst.allocs
        if snap.alloc_by_id(a.id) is None
    )


def stamp_result(result: pb.PlanResult, index: int, created: Collection[str]) -> None:
    """Give the result's allocs the indexes their commit at `index` gave
    them: the `created` ones are created there, every one is modified there.
    Schedulers tell new placements from in-place updates by `create_index ==
    modify_index` (queued-alloc accounting), as Nomad's do on the allocs its
    FSM stamped."""
    for lst in result.node_allocation.values():
        for a in lst.allocs:
            if a.id in created:
                a.create_index = index
            a.modify_index = index
            a.alloc_modify_index = index
