"""The commit rule: which part of a plan commits, and what that part writes
(Nomad's `evaluatePlan` and its `applyPlan` request).

Three places decide what a scheduler's plan commits: the planner (the real
decision, services/planner/evaluate.py, on its optimistic snapshot), the
dry run (`job plan`: everything commits) and the scheduler test harness
(nodes a test names are rejected). They all build the `PlanResult` with
`committable`, giving only their verdict per node, and the planner and the
harness turn it into the same `AppliedPlan` (`applied_plan`) for the merge
(`corral.domain.plan_results`); what a node would run once a plan applies
(`proposed_allocs`) is the same rule for the planner's fit check and the
scheduler's ranking.

* **accepted nodes**: a node's whole update set (stops, placements,
  preemptions) commits or none of it; an all-at-once plan commits nothing
  once a node is rejected; preemptions of allocs already terminal are left
  out; a partial result carries the rejected nodes and a refresh index (the
  snapshot's newest node or alloc change) for the scheduler to wait for;
* **the canary correction**: after a partial commit, a deployment lists as
  placed canaries only those actually placed;
* **the write**: placed and updated allocs go whole; stops and preemptions
  go as diffs the merge lays onto the newest stored alloc; one pending eval
  is created per job that lost allocs to preemption, so that job gets a
  chance to place them elsewhere (Nomad's preemption evals, written in the
  same index). A plan for a job that no longer exists (purged) carries no
  job: it names the job through its eval, and may only stop allocs.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass, field

from corral.domain.store import StateSnapshot
from corral.domain.structs import (
    DEFAULT_NAMESPACE,
    ClientStatus,
    DesiredStatus,
    EvalStatus,
    Trigger,
    alloc_terminal,
    new_id,
)
from corral.v1 import state_pb2
from corral.v1 import structs_pb2 as pb

#: a node's verdict on its part of a plan: "" to accept, else the reason
Verdict = Callable[[str], str]


_SERVER_TERMINAL = (DesiredStatus.STOP, DesiredStatus.EVICT)


def live_allocs(snap: StateSnapshot, node_id: str) -> list[pb.Allocation]:
    """The allocs on the node that still hold resources (not
    `alloc_terminal`; spelled out: the scheduler asks this for every node
    it ranks)."""
    client_terminal = ClientStatus.TERMINAL
    return [
        a
        for a in snap.allocs_by_node(node_id)
        if a.desired_status not in _SERVER_TERMINAL and a.client_status not in client_terminal
    ]


def _stop_ids(stops: pb.AllocStopList | None) -> Iterable[str]:
    return (s.alloc_id for s in stops.stops) if stops is not None else ()


def proposed_allocs(
    existing: list[pb.Allocation], plan: pb.Plan, node_id: str
) -> list[pb.Allocation]:
    """What the node would run if `plan` were applied: `existing` (its live
    allocs) minus the plan's stops and preemptions on it, with the plan's
    placements on it (an updated alloc replaces its old copy). `existing`
    itself, not a copy, when the plan does not touch the node."""
    stops = plan.node_update.get(node_id)
    preempted = plan.node_preemptions.get(node_id)
    placements = plan.node_allocation.get(node_id)
    placed = list(placements.allocs) if placements is not None else []
    if not (
        placed or (stops is not None and stops.stops) or (preempted is not None and preempted.stops)
    ):
        return existing
    removed = {a.id for a in placed}
    removed.update(_stop_ids(stops))
    removed.update(_stop_ids(preempted))
    out = [a for a in existing if a.id not in removed]
    out.extend(placed)
    return out


@dataclass(frozen=True, slots=True)
class NodeRejection:
    node_id: str
    reason: str


@dataclass(slots=True)
class PlanEvaluation:
    """The committable part of a plan, and why the rest was left out.

    `result.alloc_index` is filled in once written; `result.refresh_index`
    is set when any node was rejected.
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


def committable(snap: StateSnapshot, plan: pb.Plan, verdict: Verdict) -> PlanEvaluation:
    """The part of `plan` that commits, given each node's `verdict` on its
    part (see the module docstring); `snap` is what the verdicts were
    reached on."""
    result = pb.PlanResult()
    if plan.HasField("deployment"):
        result.deployment.CopyFrom(plan.deployment)
    result.deployment_updates.extend(plan.deployment_updates)
    evaluation = PlanEvaluation(result)

    for node_id in plan_node_ids(plan):
        reason = verdict(node_id)
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
        _correct_canaries(result)
    return evaluation


def _correct_canaries(result: pb.PlanResult) -> None:
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
