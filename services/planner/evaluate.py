"""Plan evaluation: which parts of a plan still fit on the newest state?
(Nomad's `evaluatePlan` / `evaluateNodePlan` in nomad/plan_apply.go.)

Schedulers work on snapshots that may be stale, so every node a plan touches
is checked again here against the planner's snapshot (replica plus the
optimistic overlay of plans already applied). Each node is judged on its
own here; what a verdict does to the result (a node that fails is left out
whole, an all-at-once plan is emptied by any failure, the canaries are
corrected) is the commit rule in `corral.domain.plan_commit`.

Pure: reads one immutable snapshot, no SQL, no RPCs.
"""

from __future__ import annotations

from corral.domain.fit import allocs_fit
from corral.domain.plan_commit import PlanEvaluation, committable, live_allocs, proposed_allocs
from corral.domain.store import StateSnapshot
from corral.domain.structs import (
    ClientStatus,
    Eligibility,
    NodeStatus,
    replace_on_disconnect,
    task_group,
)
from corral.v1 import structs_pb2 as pb

REASON_NODE_MISSING = "node does not exist"
REASON_DISCONNECTED = "node is disconnected and contains invalid updates"
REASON_DOWN = "node is down and contains invalid updates"
REASON_NOT_READY = "node is not ready for placements"
REASON_INELIGIBLE = "node is not eligible"


def _placements(plan: pb.Plan, node_id: str) -> list[pb.Allocation]:
    # `in` first: indexing a protobuf message map inserts the key.
    if node_id not in plan.node_allocation:
        return []
    return list(plan.node_allocation[node_id].allocs)


def _alloc_group(snap: StateSnapshot, plan: pb.Plan, alloc: pb.Allocation) -> pb.TaskGroup | None:
    """The task group an alloc was placed for: the plan's job when versions
    agree, else the stored job version."""
    job: pb.Job | None = plan.job
    if (
        job is None
        or not job.task_groups  # sent as a reference (namespace + id) only
        or job.id != alloc.job_id
        or job.version != alloc.job_version
    ):
        job = snap.job_by_version(alloc.namespace, alloc.job_id, alloc.job_version) or plan.job
    return task_group(job, alloc.task_group) if job is not None else None


def _valid_for_disconnected_node(placements: list[pb.Allocation]) -> bool:
    """A disconnected node only takes updates that mark allocs unknown."""
    return all(a.client_status == ClientStatus.UNKNOWN for a in placements)


def _valid_for_down_node(
    snap: StateSnapshot, plan: pb.Plan, placements: list[pb.Allocation]
) -> bool:
    """A down node only takes updates marking allocs lost, or unknown for
    groups that do not replace allocs on disconnect."""
    for a in placements:
        if a.client_status == ClientStatus.LOST:
            continue
        if a.client_status == ClientStatus.UNKNOWN:
            tg = _alloc_group(snap, plan, a)
            if tg is not None and not replace_on_disconnect(tg):
                continue
        return False
    return True


def evaluate_node_plan(snap: StateSnapshot, plan: pb.Plan, node_id: str) -> str:
    """'' if the plan's part for `node_id` fits on it, else the reason."""
    placements = _placements(plan, node_id)
    if not placements:
        return ""  # stops and evictions only: always fits
    node = snap.node_by_id(node_id)
    if node is None:
        return REASON_NODE_MISSING
    if node.status == NodeStatus.DISCONNECTED:
        return "" if _valid_for_disconnected_node(placements) else REASON_DISCONNECTED
    if node.status == NodeStatus.DOWN:
        return "" if _valid_for_down_node(snap, plan, placements) else REASON_DOWN
    if node.status != NodeStatus.READY:
        return REASON_NOT_READY

    existing = live_allocs(snap, node_id)
    existing_ids = {a.id for a in existing}
    # Only in-place updates of allocs already there: allowed even on an
    # ineligible or full node (nothing new is asked of it).
    if all(a.id in existing_ids for a in placements):
        return ""
    if node.scheduling_eligibility == Eligibility.INELIGIBLE or node.drain:
        return REASON_INELIGIBLE

    fit = allocs_fit(node, proposed_allocs(existing, plan, node_id), check_devices=True)
    return "" if fit.fits else fit.dimension


def evaluate_plan(snap: StateSnapshot, plan: pb.Plan) -> PlanEvaluation:
    """Check every node of `plan` against `snap`; return what may commit
    (the commit rule, `corral.domain.plan_commit.committable`)."""
    return committable(snap, plan, lambda node_id: evaluate_node_plan(snap, plan, node_id))
