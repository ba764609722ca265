"""What a committed plan does to the stored objects (Nomad's
`UpsertPlanResults` / `upsertAllocsImpl`), as one pure function.

Three places apply plans: the state service (the real write), the planner's
optimistic overlay (so the next plan is evaluated as if this one were
already replicated) and the scheduler test harness. They all call
`merge_plan`, and record what it returns as the same events
(`plan_events`), so a scheduler test exercises the merge production runs and
the overlay cannot drift from what the state writes.

The caller reads what the merge needs (`PlanReads`: the allocs, deployments
and eval the plan names, plus the plan's job as stored now), hands in
lookups over them (`merge_on_snapshot` does it for an in-memory snapshot),
the index the plan commits at and the time, and writes what comes back. No
I/O here.

The rules:

* **placements** (`plan.allocs`): an id not stored yet is created (create
  index/time = this write; client status `pending` unless the scheduler set
  one), unless the plan's job no longer exists or is stopped — then the
  placement is dropped, not an error (the job was stopped or purged after
  the scheduler's snapshot; failing would only make it retry on the same
  snapshot). An id already stored is an in-place update: the create
  index/time and `next_allocation` are kept, and the client's fields
  (`task_states`, `client_status`, `client_description`) win unless the
  scheduler forces `lost` or `unknown` (disconnects);
* **replacements**: a placement naming a `previous_allocation` sets that
  alloc's `next_allocation` (reconnect logic follows the chain);
* **stops and preemptions** are diffs merged onto the newest copy (a stop
  earlier in the same plan included): desired status `stop` / `evict`, the
  description, the follow-up eval id and `preempted_by_allocation` when
  given; the scheduler may force the client status to `lost`/`unknown`
  only, and such a change is recorded in `alloc_states`. A stop of an alloc
  already garbage-collected is skipped;
* every alloc written gets `modify_index` = `alloc_modify_index` = index
  (a predecessor only relinked gets `modify_index`: nothing changed for
  its client) and `modify_time` = now;
* **the deployment** is created or replaced keeping its create index/time
  and what the state keeps on it (`placed_allocs`, `healthy_allocs`,
  `unhealthy_allocs`, `require_progress_by`, `placed_canaries`, `promoted`)
  and any task group the plan
  does not mention; a new one starts its progress clock; **deployment
  status updates** apply to active deployments only (a missing or terminal
  one is skipped); an alloc that joins a deployment (placed, or updated in
  place into it) is counted as placed on it (canaries listed);
* **the plan's eval**, when stored, gets `modify_index` = index, so a worker
  that processes the eval again waits for a snapshot holding this plan
  (Nomad's `updateEvalModifyIndex`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from corral.domain import deployments, topics
from corral.domain.store import StateSnapshot
from corral.domain.structs import (
    ClientStatus,
    DeploymentStatus,
    DesiredStatus,
    copy_msg,
)
from corral.v1 import state_pb2
from corral.v1 import structs_pb2 as pb

#: client statuses the scheduler may force onto an alloc (its node went
#: down or disconnected); any other client status belongs to the client
SCHEDULER_CLIENT_STATUSES = frozenset((ClientStatus.LOST, ClientStatus.UNKNOWN))

AllocLookup = Callable[[str], pb.Allocation | None]
DeploymentLookup = Callable[[str], pb.Deployment | None]


@dataclass(frozen=True, slots=True)
class PlanReads:
    """The stored objects `merge_plan` looks at, for callers that fetch
    them up front (the state reads them inside its write transaction)."""

    alloc_ids: list[str]
    deployment_ids: list[str]


def plan_reads(plan: state_pb2.AppliedPlan) -> PlanReads:
    """Every alloc and deployment id `plan` may read, no repeats."""
    allocs: dict[str, None] = {}
    for a in plan.allocs:
        allocs.setdefault(a.id, None)
        if a.previous_allocation:
            allocs.setdefault(a.previous_allocation, None)
    for s in (*plan.stops, *plan.preemptions):
        allocs.setdefault(s.alloc_id, None)
    deployments: dict[str, None] = {}
    for a in plan.allocs:
        if a.deployment_id:
            deployments.setdefault(a.deployment_id, None)
    if plan.HasField("deployment"):
        deployments.setdefault(plan.deployment.id, None)
    for u in plan.deployment_updates:
        deployments.setdefault(u.deployment_id, None)
    return PlanReads(list(allocs), list(deployments))


@dataclass(slots=True)
class PlanWrites:
    """What to write for one plan: the final copy of every object it
    changes, in the order first changed."""

    allocs: dict[str, pb.Allocation] = field(default_factory=dict)
    deployments: dict[str, pb.Deployment] = field(default_factory=dict)
    eval: pb.Evaluation | None = None
    #: placements not created because the plan's job is gone or stopped
    dropped: list[str] = field(default_factory=list)


def merge_plan(
    plan: state_pb2.AppliedPlan,
    *,
    job: pb.Job | None,
    alloc: AllocLookup,
    deployment: DeploymentLookup,
    ev: pb.Evaluation | None,
    index: int,
    now: int,
) -> PlanWrites:
    """Merge `plan` onto the stored objects (see the module docstring).

    `job` is the plan's job as stored now (None once purged); `alloc` and
    `deployment` look up the stored objects named by `plan_reads(plan)`; `ev`
    is the stored eval the plan was made for (None if it is not stored)."""
    out = PlanWrites()

    def current(alloc_id: str) -> pb.Allocation | None:
        """The newest copy: as this plan left it, else as stored."""
        written = out.allocs.get(alloc_id)
        return written if written is not None else alloc(alloc_id)

    for placed in plan.allocs:
        old = current(placed.id)
        if old is None and (job is None or job.stop):
            out.dropped.append(placed.id)
            continue
        merged = _merge_placement(placed, old, index, now)
        out.allocs[merged.id] = merged
        prev_id = merged.previous_allocation
        prev = current(prev_id) if prev_id else None
        if prev is not None and prev.next_allocation != merged.id:
            linked = copy_msg(prev)
            linked.next_allocation = merged.id
            linked.modify_index = index
            linked.modify_time = now
            out.allocs[linked.id] = linked

    for stops, desired in (
        (plan.stops, DesiredStatus.STOP),
        (plan.preemptions, DesiredStatus.EVICT),
    ):
        for stop in stops:
            cur = current(stop.alloc_id)
            if cur is None:
                continue  # already garbage collected: nothing left to stop
            out.allocs[cur.id] = _merge_stop(cur, stop, desired, index, now)

    if plan.HasField("deployment"):
        d = _merge_deployment(plan.deployment, deployment(plan.deployment.id), index, now)
        out.deployments[d.id] = d
    for upd in plan.deployment_updates:
        cur_d = out.deployments.get(upd.deployment_id)
        if cur_d is None:
            cur_d = deployment(upd.deployment_id)
        if cur_d is None or cur_d.status not in DeploymentStatus.ACTIVE:
            continue
        d = copy_msg(cur_d)
        d.status = upd.status
        d.status_description = upd.status_description
        d.modify_index = index
        d.modify_time = now
        out.deployments[d.id] = d
    _count_placements(plan, out, alloc, deployment, index, now)

    if ev is not None:
        bumped = copy_msg(ev)
        bumped.modify_index = index
        bumped.modify_time = now
        out.eval = bumped
    return out


def merge_on_snapshot(
    plan: state_pb2.AppliedPlan,
    snap: StateSnapshot,
    *,
    ev: pb.Evaluation | None,
    index: int,
    now: int,
) -> PlanWrites:
    """`merge_plan` over the objects of an in-memory snapshot (the planner's
    overlay, the scheduler harness)."""
    return merge_plan(
        plan,
        job=snap.job_by_id(plan.namespace, plan.job_id) if plan.job_id else None,
        alloc=snap.alloc_by_id,
        deployment=snap.deployment_by_id,
        ev=ev,
        index=index,
        now=now,
    )


def plan_events(writes: PlanWrites, into: Any = None) -> list[pb.Event]:
    """The changes `writes` records, in the order the state writes them:
    every alloc, deployment and the eval's bump as a `PlanResult` event
    (Nomad's type for everything its plan apply writes). With `into` (a
    batch's events) they are built there."""
    result = topics.EventType.PLAN_RESULT
    out = [topics.ALLOCATION.event(a, result, into=into) for a in writes.allocs.values()]
    out += [topics.DEPLOYMENT.event(d, result, into=into) for d in writes.deployments.values()]
    if writes.eval is not None:
        out.append(topics.EVALUATION.event(writes.eval, result, into=into))
    return out


def _count_placements(
    plan: state_pb2.AppliedPlan,
    out: PlanWrites,
    alloc: AllocLookup,
    deployment: DeploymentLookup,
    index: int,
    now: int,
) -> None:
    """An alloc that joins a deployment (placed into it, or moved into it
    by an in-place update) counts as placed on it; an alloc already in it
    does not count again."""
    for placed in plan.allocs:
        merged = out.allocs.get(placed.id)
        if merged is None or not merged.deployment_id:
            continue
        stored = alloc(placed.id)
        if stored is not None and stored.deployment_id == merged.deployment_id:
            continue
        d = out.deployments.get(merged.deployment_id)
        if d is None:
            found = deployment(merged.deployment_id)
            if found is None:
                continue
            d = copy_msg(found)
            d.modify_index = index
            d.modify_time = now
            out.deployments[d.id] = d
        deployments.count_placement(d, merged, now)


def _merge_placement(
    placed: pb.Allocation, old: pb.Allocation | None, index: int, now: int
) -> pb.Allocation:
    a = copy_msg(placed)
    if old is None:
        a.create_index = index
        a.create_time = now
        if not a.client_status:
            a.client_status = ClientStatus.PENDING
        if a.HasField("deployment_status"):
            a.deployment_status.modify_index = index
    else:
        a.create_index = old.create_index
        a.create_time = old.create_time
        if old.next_allocation:
            a.next_allocation = old.next_allocation
        a.task_states.clear()
        for name, ts in old.task_states.items():
            a.task_states[name].CopyFrom(ts)
        if a.client_status not in SCHEDULER_CLIENT_STATUSES:
            a.client_status = old.client_status
            a.client_description = old.client_description
    a.modify_index = index
    a.alloc_modify_index = index
    a.modify_time = now
    return a


def _merge_stop(
    cur: pb.Allocation, stop: pb.AllocStop, desired: str, index: int, now: int
) -> pb.Allocation:
    a = copy_msg(cur)
    a.desired_status = stop.desired_status or desired
    a.desired_description = stop.desired_description
    if stop.client_status in SCHEDULER_CLIENT_STATUSES and stop.client_status != a.client_status:
        a.client_status = stop.client_status
        a.alloc_states.add(field="client_status", value=stop.client_status, time=now)
    if stop.followup_eval_id:
        a.followup_eval_id = stop.followup_eval_id
    if stop.preempted_by_allocation:
        a.preempted_by_allocation = stop.preempted_by_allocation
    a.modify_index = index
    a.alloc_modify_index = index
    a.modify_time = now
    return a


def _merge_deployment(
    planned: pb.Deployment, old: pb.Deployment | None, index: int, now: int
) -> pb.Deployment:
    d = copy_msg(planned)
    if old is None:
        d.create_index = index
        d.create_time = now
        deployments.start_progress_clock(d, now)
    else:
        d.create_index = old.create_index
        d.create_time = old.create_time
        for name, old_state in old.task_groups.items():
            if name not in d.task_groups:
                d.task_groups[name].CopyFrom(old_state)
                continue
            state = d.task_groups[name]
            state.placed_allocs = old_state.placed_allocs
            state.healthy_allocs = old_state.healthy_allocs
            state.unhealthy_allocs = old_state.unhealthy_allocs
            state.require_progress_by = old_state.require_progress_by
            state.promoted = old_state.promoted or state.promoted
            state.placed_canaries[:] = old_state.placed_canaries
    d.modify_index = index
    d.modify_time = now
    return d
