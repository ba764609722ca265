"""Plan evaluation: which parts of a plan still fit on the newest state?
(Nomad's `evaluatePlan` / `evaluateNodePlan` in nomad/plan_apply.go.)

Schedulers work on snapshots that may be stale, so every node a plan touches
is checked again here against the planner's snapshot (replica plus the
optimistic overlay of plans already applied). Each node is judged on its
own; a node that fails is left out of the result whole (its stops and its
placements), and an all-at-once plan is emptied by any failure.

Pure: reads one immutable snapshot, no SQL, no RPCs.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from corral.domain.fit import allocs_fit
from corral.domain.store import StateSnapshot
from corral.domain.structs import (
    ClientStatus,
    Eligibility,
    NodeStatus,
    alloc_terminal,
    replace_on_disconnect,
    task_group,
)
from corral.v1 import structs_pb2 as pb

REASON_NODE_MISSING = "node does not exist"
REASON_DISCONNECTED = "node is disconnected and contains invalid updates"
REASON_DOWN = "node is down and contains invalid updates"
REASON_NOT_READY = "node is not ready for placements"
REASON_INELIGIBLE = "node is not eligible"


@dataclass(frozen=True, slots=True)
class NodeRejection:
    node_id: str
    reason: str


@dataclass(slots=True)
class PlanEvaluation:
    """The committable part of a plan, and why the rest was left out.

    `result.alloc_index` is filled in by the applier once written;
    `result.refresh_index` is set when any node was rejected.
    """

    result: pb.PlanResult
    rejections: list[NodeRejection] = field(default_factory=list)

    @property
    def partial(self) -> bool:
        return bool(self.rejections)

    def is_noop(self) -> bool:
        """Nothing to write (Nomad's PlanResult.IsNoOp)."""
        r = self.result
        return not (
            r.node_update
            or r.node_allocation
            or r.deployment_updates
            or r.HasField("deployment")
            or r.ineligible_nodes
        )


def plan_node_ids(plan: pb.Plan) -> list[str]:
    """Every node the plan stops or places on, stops first, no repeats."""
    seen: dict[str, None] = {}
    for nid in plan.node_update:
        seen.setdefault(nid, None)
    for nid in plan.node_allocation:
        seen.setdefault(nid, None)
    return list(seen)


def _placements(plan: pb.Plan, node_id: str) -> list[pb.Allocation]:
    # `in` first: indexing a protobuf message map inserts the key.
    if node_id not in plan.node_allocation:
        return []
    return list(plan.node_allocation[node_id].allocs)


def _stop_ids(stops: pb.AllocStopList | None) -> Iterable[str]:
    return (s.alloc_id for s in stops.stops) if stops is not None else ()


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

    existing = [a for a in snap.allocs_by_node(node_id) if not alloc_terminal(a)]
    existing_ids = {a.id for a in existing}
    # Only in-place updates of allocs already there: allowed even on an
    # ineligible or full node (nothing new is asked of it).
    if all(a.id in existing_ids for a in placements):
        return ""
    if node.scheduling_eligibility == Eligibility.INELIGIBLE or node.drain:
        return REASON_INELIGIBLE

    remove: set[str] = {a.id for a in placements}
    remove.update(_stop_ids(plan.node_update.get(node_id)))
    remove.update(_stop_ids(plan.node_preemptions.get(node_id)))
    proposed = [a for a in existing if a.id not in remove]
    proposed.extend(placements)
    fit = allocs_fit(node, proposed, check_devices=True)
    return "" if fit.fits else fit.dimension


def _correct_deployment_canaries(result: pb.PlanResult) -> None:
    """After a partial commit, a deployment lists as placed canaries only
    those actually placed."""
    if not result.HasField("deployment"):
        return
    placed = {a.id for lst in result.node_allocation.values() for a in lst.allocs}
    for state in result.deployment.task_groups.values():
        if state.placed_canaries:
            keep = [c for c in state.placed_canaries if c in placed]
            del state.placed_canaries[:]
            state.placed_canaries.extend(keep)


def evaluate_plan(snap: StateSnapshot, plan: pb.Plan) -> PlanEvaluation:
    """Check every node of `plan` against `snap`; return what may commit."""
    result = pb.PlanResult()
    if plan.HasField("deployment"):
        result.deployment.CopyFrom(plan.deployment)
    result.deployment_updates.extend(plan.deployment_updates)
    evaluation = PlanEvaluation(result)

    for node_id in plan_node_ids(plan):
        reason = evaluate_node_plan(snap, plan, node_id)
        if reason:
            evaluation.rejections.append(NodeRejection(node_id, reason))
            if plan.all_at_once:
                result.Clear()
                break
            continue
        if node_id in plan.node_update and plan.node_update[node_id].stops:
            result.node_update[node_id].CopyFrom(plan.node_update[node_id])
        if node_id in plan.node_allocation and plan.node_allocation[node_id].allocs:
            result.node_allocation[node_id].CopyFrom(plan.node_allocation[node_id])
        if node_id in plan.node_preemptions:
            live = []
            for stop in plan.node_preemptions[node_id].stops:
                cur = snap.alloc_by_id(stop.alloc_id)
                if cur is not None and not alloc_terminal(cur):
                    live.append(stop)
            if live:
                result.node_preemptions[node_id].stops.extend(live)

    if evaluation.rejections:
        result.rejected_nodes.extend(r.node_id for r in evaluation.rejections)
        result.refresh_index = snap.refresh_index() or snap.index
        _correct_deployment_canaries(result)
    return evaluation
