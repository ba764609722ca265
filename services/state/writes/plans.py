"""Committing plan results (State.ApplyPlans): everything one plan changes,
at one index; several plans at consecutive indexes in one transaction.

The planner has already checked every node fits against the newest state;
this layer reads the stored objects the plan names, lets the shared merge
(`corral.domain.plan_results.merge_plan`, Nomad's `UpsertPlanResults`) decide what
they become, and writes that as the planner's overlay records it
(`plan_events`), plus what only the state does: preemption evals,
ineligible nodes, the job's status.

A plan may carry no job (`job_id` empty, or a job purged since): it then
only stops allocs (placements for a missing job are dropped by the merge).

Only the planner leader writes plans (fenced in the handler), and it checks
fit; what the state checks itself, on rows read in the transaction, is that
every alloc a plan writes is on a node that exists: a placement on a node
that does not (never registered, or deregistered since the planner's
snapshot) refuses the whole write with FAILED_PRECONDITION naming
`plans[i].allocs[j].node_id`.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from corral.domain.errors import FailedPrecondition, InvalidArgument
from corral.domain.plan_results import merge_plan, plan_events, plan_reads
from corral.domain.structs import Eligibility, JobStatus, copy_msg
from corral.domain.topics import EventType
from corral.v1 import state_pb2
from corral.v1 import structs_pb2 as pb
from services.state import validate
from services.state.db.database import WriteTx
from services.state.writes.evals import upsert_evals, validate_evals
from services.state.writes.jobs import refresh_job_status

log = logging.getLogger(__name__)


def validate_plans(plans: Sequence[state_pb2.AppliedPlan]) -> None:
    validate.batch_size(len(plans), "plans")
    for i, p in enumerate(plans):
        f = f"plans[{i}]"
        validate.require_id(p.eval_id, f"{f}.eval_id")
        if p.job_id:
            validate.require_id(p.job_id, f"{f}.job_id")
        elif p.allocs or p.HasField("deployment"):
            # only a plan for a purged job comes without one, and it only stops
            raise InvalidArgument(f"{f}.job_id", "is required for a plan that places allocs")
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


async def apply_plan(
    tx: WriteTx,
    plan: state_pb2.AppliedPlan,
    index: int,
    *,
    nodes: dict[str, pb.Node] | None = None,
    field: str = "plans[0]",
) -> None:
    """Write one plan's committed part at `index`: read what the merge
    needs inside the transaction, merge (`corral.domain.plan_results`), write.
    `nodes` holds the stored nodes of the plan's allocs (read here if None)."""
    if nodes is None:
        nodes = await tx.get_nodes(sorted({a.node_id for a in plan.allocs}))
    job = await tx.get_job(plan.namespace, plan.job_id) if plan.job_id else None
    reads = plan_reads(plan)
    stored = await tx.get_allocs(reads.alloc_ids)
    deployments: dict[str, pb.Deployment] = {}
    for dep_id in reads.deployment_ids:
        d = await tx.get_deployment(dep_id)
        if d is not None:
            deployments[dep_id] = d
    writes = merge_plan(
        plan,
        job=job,
        alloc=stored.get,
        deployment=deployments.get,
        ev=await tx.get_eval(plan.eval_id),
        index=index,
        now=tx.now,
    )
    dropped = set(writes.dropped)
    for j, a in enumerate(plan.allocs):
        if a.id not in dropped and a.node_id not in nodes:
            raise FailedPrecondition(
                f"{field}.allocs[{j}].node_id: node {a.node_id} does not exist; plan refused"
            )
    if writes.dropped:
        log.info(
            "placements dropped: job %r is stopped or purged",
            plan.job_id,
            extra={"eval_id": plan.eval_id, "job_id": plan.job_id, "index": index},
        )

    for change in plan_events(writes):
        tx.put_change(change, index=index)

    if plan.evals:
        await upsert_evals(tx, plan.evals, index=index)

    if plan.ineligible_nodes:
        nodes = await tx.get_nodes(list(plan.ineligible_nodes))
        for node in nodes.values():
            node = copy_msg(node)
            node.scheduling_eligibility = Eligibility.INELIGIBLE
            tx.put_node(node, EventType.NODE_ELIGIBILITY, index=index)

    if job is None:
        return  # purged: no status left to keep
    placed = len(plan.allocs) > len(writes.dropped)
    if placed and job.status == JobStatus.PENDING and not job.stop:
        job = copy_msg(job)
        job.status = JobStatus.RUNNING
        tx.put_job(job, EventType.JOB_STATUS_UPDATED, index=index)
    elif job.stop and plan.stops:
        await refresh_job_status(tx, plan.namespace, plan.job_id, index=index)


async def apply_plans(tx: WriteTx, plans: Sequence[state_pb2.AppliedPlan]) -> list[int]:
    """Each plan at its own consecutive index of the transaction."""
    if len(plans) != len(tx.indexes):
        raise ValueError("one index per plan")
    # one read for the nodes of every plan (plans never delete nodes)
    nodes = await tx.get_nodes(sorted({a.node_id for p in plans for a in p.allocs}))
    for i, (plan, index) in enumerate(zip(plans, tx.indexes, strict=True)):
        await apply_plan(tx, plan, index, nodes=nodes, field=f"plans[{i}]")
    return list(tx.indexes)
