"""Nomad's Job.Statuses (`/v1/jobs/statuses`, the job list of Nomad's web
UI): each job with its allocs in brief, its latest deployment and, for a
periodic or parameterized job, its children's statuses; read from one
snapshot.

Order and pages are Nomad's: most recently changed job first (by modify
index; `reverse` for oldest first), the paging token a modify index, so a
page starts at the first job whose modify index is not past the token.
The answer's index is the newest modify index among the page's jobs,
allocs and deployments (a change elsewhere wakes no blocking query), or
the jobs table's when the set of jobs on the page changed since the query
first looked."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from itertools import dropwhile

from corral.domain import deployments
from corral.domain.store import StateSnapshot
from corral.domain.structs import DeploymentStatus
from corral.v1 import job_pb2
from corral.v1 import structs_pb2 as pb

#: (namespace, id) of a job
Key = tuple[str, str]


def _key(job: pb.Job) -> Key:
    return (job.namespace or "default", job.id)


def _latest_deployment(d: pb.Deployment) -> job_pb2.JobStatusesLatestDeployment:
    running = d.status == DeploymentStatus.RUNNING and bool(d.task_groups)
    waiting = [s for s in d.task_groups.values() if s.desired_canaries > 0]
    return job_pb2.JobStatusesLatestDeployment(
        id=d.id,
        is_active=deployments.is_active(d),
        job_version=d.job_version,
        status=d.status,
        status_description=d.status_description,
        all_auto_promote=running and all(s.auto_promote for s in waiting),
        requires_promotion=running and any(not s.promoted for s in waiting),
    )


def _alloc(a: pb.Allocation) -> job_pb2.JobStatusesAlloc:
    out = job_pb2.JobStatusesAlloc(
        id=a.id,
        group=a.task_group,
        client_status=a.client_status,
        node_id=a.node_id,
        canary=a.deployment_status.canary,
        job_version=a.job_version,
        followup_eval_id=a.followup_eval_id,
    )
    if a.deployment_status.HasField("healthy"):
        out.healthy = a.deployment_status.healthy
    return out


def job_status(
    snap: StateSnapshot, job: pb.Job, children: Callable[[pb.Job], list[pb.Job]]
) -> tuple[job_pb2.JobStatusesJob, int]:
    """One job's entry and the newest modify index of what it shows."""
    newest = job.modify_index
    out = job_pb2.JobStatusesJob(
        id=job.id,
        namespace=job.namespace or "default",
        name=job.name,
        type=job.type,
        node_pool=job.node_pool,
        datacenters=list(job.datacenters),
        priority=job.priority,
        version=job.version,
        submit_time=job.submit_time,
        modify_index=job.modify_index,
        group_count_sum=sum(tg.count for tg in job.task_groups),
        parent_id=job.parent_id,
        stop=job.stop,
        is_pack="pack.name" in job.meta,
        status=job.status,
    )
    if job.periodic.enabled or job.HasField("parameterized"):
        # a parent has no allocs or deployments of its own
        out.has_children = True
        for child in children(job):
            newest = max(newest, child.modify_index)
            out.child_statuses.append(child.status)
        return out, newest
    for a in sorted(snap.allocs_by_job(job.namespace, job.id), key=lambda a: a.id):
        out.allocs.append(_alloc(a))
        newest = max(newest, a.modify_index)
    d = snap.latest_deployment_by_job(job.namespace, job.id)
    if d is not None:
        out.latest_deployment.CopyFrom(_latest_deployment(d))
        newest = max(newest, d.modify_index)
    return out, newest


def _children_of(snap: StateSnapshot) -> Callable[[pb.Job], list[pb.Job]]:
    """Children by parent, indexed once per answer and only if asked for."""
    index: dict[Key, list[pb.Job]] | None = None

    def children(parent: pb.Job) -> list[pb.Job]:
        nonlocal index
        if index is None:
            index = {}
            for j in snap.iter_jobs():
                if j.parent_id:
                    index.setdefault((j.namespace or "default", j.parent_id), []).append(j)
            for kids in index.values():
                kids.sort(key=lambda j: j.id)
        return index.get(_key(parent), [])

    return children


def page(
    snap: StateSnapshot,
    request: job_pb2.JobStatusesRequest,
    shown: Callable[[str], bool],
) -> tuple[list[job_pb2.JobStatusesJob], str, int, set[Key]]:
    """One page: its entries, the next page's token, the page's index and
    the jobs on it. `shown(namespace)`: whether the caller sees that
    namespace's jobs."""
    q = request.query
    wanted = {(j.namespace or "default", j.id) for j in request.jobs}
    per_page = len(wanted) if wanted else q.per_page
    newest_first = not q.reverse
    ordered: Iterable[pb.Job] = sorted(
        snap.iter_jobs(),
        key=lambda j: (j.modify_index, j.namespace or "default", j.id),
        reverse=newest_first,
    )
    if q.next_token:
        target = int(q.next_token) if q.next_token.isdigit() else 0

        def passed(j: pb.Job) -> bool:
            return j.modify_index > target if newest_first else j.modify_index < target

        ordered = dropwhile(passed, ordered)
    children = _children_of(snap)
    out: list[job_pb2.JobStatusesJob] = []
    keys: set[Key] = set()
    index = 0
    for job in ordered:
        if not shown(job.namespace or "default"):
            continue
        if job.parent_id and not request.include_children:
            continue
        if wanted and _key(job) not in wanted:
            continue
        if per_page and len(out) == per_page:
            return out, str(job.modify_index), index, keys
        entry, newest = job_status(snap, job, children)
        out.append(entry)
        keys.add(_key(job))
        index = max(index, newest)
    return out, "", index, keys
