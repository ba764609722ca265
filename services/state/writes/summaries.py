"""Nomad's reconcile of job summaries (`PUT /v1/system/reconcile/summaries`):
every job's stored summary recomputed from what the state holds and
rewritten where it differs.

Corral's stored summary keeps what only the scheduler knows, each task
group's queued count (written when an evaluation reports it); the other
counts are computed from the allocs on every read (services/state/stubs.py).
So the recomputed summary has the groups of the job as it stands (a group
removed from the job goes, a new one comes with 0) and each group's queued
count from the newest evaluation of the job that reported one for it, and
no other counts. (Nomad's reconcile sets queued to 0 until the next
evaluation; the newest report is what the summary would hold had it never
gone wrong.)"""

from __future__ import annotations

from collections.abc import Iterable

from corral.domain.structs import same_except
from corral.v1 import structs_pb2 as pb
from services.state.db.database import WriteTx


def recomputed(
    job: pb.Job, evals: Iterable[pb.Evaluation], stored: pb.JobSummary | None
) -> pb.JobSummary:
    """The summary `job` should have stored."""
    out = pb.JobSummary(
        job_id=job.id,
        namespace=job.namespace,
        create_index=stored.create_index if stored is not None else 0,
    )
    queued: dict[str, int] = {}
    for ev in sorted(evals, key=lambda e: (e.modify_index, e.create_index, e.id)):
        queued.update(ev.queued_allocations)
    for tg in job.task_groups:
        out.summary[tg.name].queued = queued.get(tg.name, 0)
    return out


async def reconcile_summaries(tx: WriteTx) -> tuple[int, int]:
    """Recompute every job's summary in one transaction; returns (jobs
    looked at, summaries rewritten)."""
    keys = await tx.job_keys()
    fixed = 0
    for namespace, job_id in keys:
        job = await tx.get_job(namespace, job_id)
        if job is None:
            continue
        stored = await tx.get_job_summary(namespace, job_id)
        want = recomputed(job, await tx.evals_by_job(namespace, job_id), stored)
        if stored is None or not same_except(stored, want, ("create_index", "modify_index")):
            tx.put_job_summary(want)
            fixed += 1
    return len(keys), fixed
