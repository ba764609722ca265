"""Committing plan results (State.ApplyPlans): everything one plan changes,
at one index; several plans at consecutive indexes in one transaction.

The planner has already checked every node fits against the newest state;
this layer merges the plan onto the stored objects the way Nomad's FSM does
(`UpsertPlanResults`): placed allocs are created, in-place updates keep the
client-side fields, stops and preemptions are applied as diffs onto the
newest copy of each alloc.
"""

from __future__ import annotations

from collections.abc import Sequence

from corral import deployments
from corral.errors import InvalidArgument
from corral.structs import ClientStatus, DesiredStatus, Eligibility, JobStatus, copy_msg
from corral.v1 import state_pb2
from corral.v1 import structs_pb2 as pb
from services.state import validate
from services.state.db.database import WriteTx
from services.state.writes.deployments import count_placements
from services.state.writes.evals import upsert_evals, validate_evals
from services.state.writes.jobs import refresh_job_status


def validate_plans(plans: Sequence[state_pb2.AppliedPlan]) -> None:
    validate.batch_size(len(plans), "plans")
    for i, p in enumerate(plans):
        f = f"plans[{i}]"
        validate.require_id(p.eval_id, f"{f}.eval_id")
        validate.require_id(p.job_id, f"{f}.job_id")
        seen: set[str] = set()
        for j, a in enumerate(p.allocs):
            validate.allocation(a, f"{f}.allocs[{j}]")
            if a.id in seen:
                raise InvalidArgument(
                    f"{f}.allocs[{j}].id", f"alloc {a.id} appears twice in the plan"
                )
            seen.add(a.id)
        for j, s in enumerate(p.stops):
            validate.alloc_stop(s, f"{f}.stops[{j}]")
        for j, s in enumerate(p.preemptions):
            validate.alloc_stop(s, f"{f}.preemptions[{j}]")
        if p.HasField("deployment"):
            validate.deployment(p.deployment, f"{f}.deployment")
        if p.evals:
            validate_evals(p.evals, f"{f}.evals")


async def apply_plan(tx: WriteTx, plan: state_pb2.AppliedPlan, index: int) -> None:
    """Write one plan's committed part at `index`."""
    job = await tx.get_job(plan.namespace, plan.job_id)
    if job is None:
        raise InvalidArgument("plan.job_id", f"job {plan.job_id!r} does not exist")

    touched = [a.id for a in plan.allocs] + [s.alloc_id for s in plan.stops]
    touched += [s.alloc_id for s in plan.preemptions]
    stored = await tx.get_allocs(touched)

    predecessors = [a.previous_allocation for a in plan.allocs if a.previous_allocation]
    if predecessors:
        stored.update(await tx.get_allocs([p for p in predecessors if p not in stored]))

    previous = {a.id: stored[a.id].deployment_id for a in plan.allocs if a.id in stored}
    for a in plan.allocs:
        alloc = copy_msg(a)
        old = stored.get(alloc.id)
        if old is None:
            alloc.create_index = 0
            alloc.create_time = 0
            if not alloc.client_status:
                alloc.client_status = ClientStatus.PENDING
        else:
            alloc.create_index = old.create_index
            alloc.create_time = old.create_time
            # The client owns its task states; the scheduler may only force
            # lost/unknown (disconnects), never overwrite a live status.
            alloc.task_states.clear()
            for name, ts in old.task_states.items():
                alloc.task_states[name].CopyFrom(ts)
            if alloc.client_status not in (ClientStatus.LOST, ClientStatus.UNKNOWN):
                alloc.client_status = old.client_status
                alloc.client_description = old.client_description
        alloc.alloc_modify_index = index
        tx.put_alloc(alloc, "PlanResult", index=index)
        stored[alloc.id] = alloc
        if old is None and alloc.previous_allocation:
            _link_replacement(tx, stored, alloc, index)

    for stops, desired in (
        (plan.stops, DesiredStatus.STOP),
        (plan.preemptions, DesiredStatus.EVICT),
    ):
        for stop in stops:
            stopped = _apply_stop(tx, stored.get(stop.alloc_id), stop, desired, index)
            if stopped is not None:
                stored[stopped.id] = stopped

    changed: dict[str, pb.Deployment] = {}
    if plan.HasField("deployment"):
        d = copy_msg(plan.deployment)
        old_d = await tx.get_deployment(d.id)
        d.create_index = old_d.create_index if old_d is not None else 0
        if old_d is None:
            deployments.start_progress_clock(d, tx.now)
        changed[d.id] = d
    for upd in plan.deployment_updates:
        cur = changed.get(upd.deployment_id) or await tx.get_deployment(upd.deployment_id)
        if cur is None:
            continue
        cur = copy_msg(cur)
        cur.status = upd.status
        cur.status_description = upd.status_description
        changed[cur.id] = cur
    await count_placements(tx, plan.allocs, previous, changed, index)

    if plan.evals:
        await upsert_evals(tx, plan.evals, index=index)

    if plan.ineligible_nodes:
        nodes = await tx.get_nodes(list(plan.ineligible_nodes))
        for node in nodes.values():
            node = copy_msg(node)
            node.scheduling_eligibility = Eligibility.INELIGIBLE
            tx.put_node(node, "NodeEligibility", index=index)

    if plan.allocs and job.status == JobStatus.PENDING and not job.stop:
        job = copy_msg(job)
        job.status = JobStatus.RUNNING
        tx.put_job(job, "JobStatusUpdated", index=index)
    elif job.stop and plan.stops:
        await refresh_job_status(tx, plan.namespace, plan.job_id, index=index)


def _link_replacement(
    tx: WriteTx, stored: dict[str, pb.Allocation], alloc: pb.Allocation, index: int
) -> None:
    """Point the replaced alloc at its replacement (next_allocation): the
    reconnect logic follows this chain to find which alloc replaced which."""
    prev = stored.get(alloc.previous_allocation)
    if prev is None:
        return
    linked = copy_msg(prev)
    linked.next_allocation = alloc.id
    stored[prev.id] = linked
    tx.put_alloc(linked, "PlanResult", index=index)


def _apply_stop(
    tx: WriteTx, current: pb.Allocation | None, stop: pb.AllocStop, default: str, index: int
) -> pb.Allocation | None:
    if current is None:
        return None  # already garbage collected; nothing left to stop
    alloc = copy_msg(current)
    alloc.desired_status = stop.desired_status or default
    if stop.desired_description:
        alloc.desired_description = stop.desired_description
    if stop.client_status and stop.client_status != alloc.client_status:
        # The scheduler changed the client status (e.g. lost): record it in
        # the alloc's state history as Nomad's AppendStoppedAlloc does.
        alloc.client_status = stop.client_status
        alloc.alloc_states.add(field="client_status", value=stop.client_status, time=tx.now)
    if stop.followup_eval_id:
        alloc.followup_eval_id = stop.followup_eval_id
    if stop.preempted_by_allocation:
        alloc.preempted_by_allocation = stop.preempted_by_allocation
    alloc.alloc_modify_index = index
    tx.put_alloc(alloc, "PlanResult", index=index)
    return alloc


async def apply_plans(tx: WriteTx, plans: Sequence[state_pb2.AppliedPlan]) -> list[int]:
    """Each plan at its own consecutive index of the transaction."""
    if len(plans) != len(tx.indexes):
        raise ValueError("one index per plan")
    for plan, index in zip(plans, tx.indexes, strict=True):
        await apply_plan(tx, plan, index)
    return list(tx.indexes)
