"""Deleting garbage (State.GarbageCollect), decided again on stored rows.

The core scheduler picks what to collect on a worker's snapshot, which may
be behind, and the request carries no leader: nothing about the caller says
the objects are garbage. So the state checks every named object inside the
write transaction, on the rows it reads there, and refuses the whole request
(FAILED_PRECONDITION, naming the object) when any of them is not garbage —
before this, `GarbageCollect` deleted whatever it was told, a running job
included. The rules are what the core scheduler's own checks already imply
(services/worker/scheduler/core_sched.py), so its requests pass unless the
object changed since its snapshot; then the core eval fails and the next GC
run decides again on a newer one:

* an eval: terminal (complete, failed, canceled);
* an alloc: terminal (server or client side) and not running on its client;
* a job: stopped or dead, with no live alloc left;
* a node: down, with no live alloc left;
* a deployment: no longer active, or its job is gone.

Objects already gone are skipped (an earlier run may have collected them).
"""

from __future__ import annotations

from corral.domain import deployments, structs
from corral.domain.errors import FailedPrecondition
from corral.domain.structs import ClientStatus, JobStatus, NodeStatus
from corral.v1 import state_pb2
from corral.v1 import structs_pb2 as pb
from services.state.db.database import WriteTx
from services.state.writes import scaling as scaling_writes


def _refuse(what: str, why: str) -> FailedPrecondition:
    return FailedPrecondition(f"{what} is not garbage: {why}; nothing collected")


def _alloc_garbage(a: pb.Allocation) -> str:
    """Why `a` is not garbage ('' when it is)."""
    if not structs.alloc_terminal(a):
        return f"desired {a.desired_status}, client {a.client_status}"
    if a.client_status == ClientStatus.RUNNING:
        return "still running on its client"
    return ""


def _node_garbage(node: pb.Node, allocs: list[pb.Allocation]) -> str:
    if node.status != NodeStatus.DOWN:
        return f"status {node.status}"
    live = sum(1 for a in allocs if not structs.alloc_terminal(a))
    return f"{live} live alloc(s)" if live else ""


async def collect(tx: WriteTx, request: state_pb2.GarbageCollectRequest) -> None:
    """Check every named object, then delete them all (or nothing)."""
    evals = await tx.get_evals(list(request.eval_ids))
    for ev in evals.values():
        if not structs.eval_terminal(ev):
            raise _refuse(f"eval {ev.id}", f"status {ev.status}")
    allocs = await tx.get_allocs(list(request.alloc_ids))
    for a in allocs.values():
        why = _alloc_garbage(a)
        if why:
            raise _refuse(f"alloc {a.id}", why)
    jobs: dict[tuple[str, str], pb.Job] = {}
    for ref in request.jobs:
        job = await tx.get_job(ref.namespace, ref.job_id)
        if job is None:
            continue
        what = f"job {job.namespace}/{job.id}"
        if not (job.stop or job.status == JobStatus.DEAD):
            raise _refuse(what, f"status {job.status}")
        _, live = await tx.job_alloc_counts(job.namespace, job.id)
        if live:
            raise _refuse(what, f"{live} live alloc(s)")
        jobs[structs.job_key(job.namespace, job.id)] = job
    nodes = await tx.get_nodes(list(request.node_ids))
    for node in nodes.values():
        why = _node_garbage(node, await tx.allocs_by_node(node.id))
        if why:
            raise _refuse(f"node {node.id}", why)
    deps: list[pb.Deployment] = []
    for dep_id in request.deployment_ids:
        d = await tx.get_deployment(dep_id)
        if d is None:
            continue
        if deployments.is_active(d):
            key = structs.job_key(d.namespace, d.job_id)
            if key not in jobs and await tx.get_job(d.namespace, d.job_id) is not None:
                raise _refuse(f"deployment {d.id}", f"status {d.status}")
        deps.append(d)

    events = {k: await tx.get_scaling_events(*k) for k in jobs}
    for ev in evals.values():
        tx.delete_eval(ev)
    for a in allocs.values():
        tx.delete_alloc(a)
    for key, job in jobs.items():
        tx.delete_job(job)
        tx.delete_periodic_launch(job.namespace, job.id)
        scaling_writes.purge(tx, job, events[key])
    for d in deps:
        tx.delete_deployment(d)
    for node in nodes.values():
        tx.delete_node(node)
