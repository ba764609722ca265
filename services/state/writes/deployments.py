"""Deployment writes: counts that follow plans and client health reports,
the watcher's and the operator's status changes, and job reverts.

Every function decides on rows read inside the caller's transaction: a
status change to a deployment that is no longer active is refused, a
revert reads the version it registers again in the same transaction.
"""

from __future__ import annotations

from collections.abc import Sequence

from corral.domain import deployments, structs
from corral.domain.errors import FailedPrecondition, InvalidArgument, NotFound
from corral.domain.structs import DeploymentStatus, Trigger, copy_msg
from corral.domain.topics import EventType
from corral.v1 import structs_pb2 as pb
from services.state.db.database import WriteTx
from services.state.writes.jobs import register_job

#: the statuses a watcher or an operator may set
SETTABLE = (DeploymentStatus.SUCCESSFUL, DeploymentStatus.FAILED)


async def follow_health(tx: WriteTx, before: pb.Allocation, after: pb.Allocation) -> None:
    """A client report changed an alloc's deployment health: the counts of
    its deployment follow."""
    if not after.deployment_id:
        return
    was, now = deployments.health_of(before), deployments.health_of(after)
    if was == now:
        return
    cur = await tx.get_deployment(after.deployment_id)
    if cur is None or not deployments.is_active(cur):
        return
    d = copy_msg(cur)
    # the client's time of the health change, never past the server's own
    # clock: a clock ahead (or a node lying) would push the progress deadline
    # out of reach, and out of int64 range
    at = min(after.deployment_status.timestamp or tx.now, tx.now)
    if deployments.count_health(d, after.task_group, was, now, at):
        tx.put_deployment(d)


async def set_status(
    tx: WriteTx, deployment_id: str, status: str, description: str
) -> tuple[pb.Deployment, pb.Evaluation | None, pb.Job | None]:
    """End an active deployment: successful marks its job version stable;
    failed reverts the job to its latest stable version when a group asks
    for auto_revert. Either way an eval lets the scheduler act on it.
    Returns the deployment, the eval and the reverted job (if any)."""
    if status not in SETTABLE:
        raise InvalidArgument("status", f"must be one of {', '.join(SETTABLE)}")
    d = await _active(tx, deployment_id)
    _check_reason(d, status, description, tx.now)
    d.status = status
    d.status_description = description
    reverted: pb.Job | None = None
    if status == DeploymentStatus.SUCCESSFUL:
        await _mark_stable(tx, d)
    elif deployments.wants_revert(d):
        reverted = await _revert_to_stable(tx, d)
    tx.put_deployment(d)
    # a revert registered a version, with its own eval
    ev = await _roll_on(tx, d) if reverted is None else None
    return d, ev, reverted


async def pause(
    tx: WriteTx, deployment_id: str, paused: bool
) -> tuple[pb.Deployment, pb.Evaluation | None]:
    """Pause a running deployment, or resume a paused one (with an eval, so
    the roll-out continues where it stopped)."""
    d = await _active(tx, deployment_id)
    if paused:
        d.status = DeploymentStatus.PAUSED
        d.status_description = deployments.DESC_PAUSED
        tx.put_deployment(d)
        return d, None
    d.status = DeploymentStatus.RUNNING
    d.status_description = deployments.running_description(d)
    tx.put_deployment(d)
    return d, await _roll_on(tx, d)


async def _roll_on(tx: WriteTx, d: pb.Deployment) -> pb.Evaluation | None:
    """The eval that lets the scheduler act on a deployment's change (its
    job's, unless the job is gone or stopped)."""
    job = await tx.get_job(d.namespace, d.job_id)
    if job is None or job.stop:
        return None
    ev = deployments.rollout_eval(d, job)
    tx.put_eval(ev)
    return ev


async def promote(
    tx: WriteTx, deployment_id: str, groups: Sequence[str] = ()
) -> tuple[pb.Deployment, pb.Evaluation | None]:
    """Promote the canaries of `groups` (default: every group waiting for
    it), once all of them are placed and healthy as stored; the eval then
    lets the canaries replace the old allocs and the roll-out continue."""
    d = await _active(tx, deployment_id)
    if d.status != DeploymentStatus.RUNNING:
        raise FailedPrecondition(f"deployment {deployment_id} is {d.status}: resume it first")
    waiting = deployments.awaiting_promotion(d)
    targets = list(groups) or waiting
    if not targets:
        raise FailedPrecondition(f"deployment {deployment_id} has no canaries to promote")
    job = await tx.get_job_version(d.namespace, d.job_id, d.job_version)
    ids = [aid for g in targets if g in d.task_groups for aid in d.task_groups[g].placed_canaries]
    allocs = await tx.get_allocs(ids)
    for g in targets:
        state = d.task_groups.get(g)
        if state is None or g not in waiting:
            raise InvalidArgument("groups", f"group {g!r} has no canaries awaiting promotion")
        tg = structs.task_group(job, g) if job is not None else None
        up = deployments.update_strategy(job, tg) if job is not None and tg is not None else None
        desired = up.canary if up is not None else state.desired_canaries
        if not deployments.canaries_healthy(state, desired, allocs.get):
            raise FailedPrecondition(
                f"group {g!r}: not every canary is placed and healthy yet; cannot promote"
            )
        state.promoted = True
    d.status_description = deployments.running_description(d)
    tx.put_deployment(d)
    return d, await _roll_on(tx, d)


async def set_alloc_health(
    tx: WriteTx, deployment_id: str, healthy: Sequence[str], unhealthy: Sequence[str]
) -> tuple[pb.Deployment, pb.Evaluation | None]:
    """Health given by hand to allocs of an active deployment, counted on
    it as a client's report is; an eval follows so the roll-out moves on."""
    d = await _active(tx, deployment_id)
    verdicts = dict.fromkeys(healthy, True)
    for aid in unhealthy:
        if aid in verdicts:
            raise InvalidArgument("unhealthy_alloc_ids", f"alloc {aid} is also listed as healthy")
        verdicts[aid] = False
    if not verdicts:
        raise InvalidArgument("healthy_alloc_ids", "name at least one alloc")
    allocs = await tx.get_allocs(list(verdicts))
    for aid, verdict in verdicts.items():
        cur = allocs.get(aid)
        if cur is None or cur.deployment_id != d.id:
            raise InvalidArgument("alloc_ids", f"alloc {aid} is not part of deployment {d.id}")
        alloc = copy_msg(cur)
        alloc.deployment_status.healthy = verdict
        alloc.deployment_status.timestamp = tx.now
        tx.put_alloc(alloc, EventType.ALLOCATION_UPDATED)
        deployments.count_health(d, alloc.task_group, deployments.health_of(cur), verdict, tx.now)
    tx.put_deployment(d)
    return d, await _roll_on(tx, d)


async def revert_job(
    tx: WriteTx,
    namespace: str,
    job_id: str,
    version: int,
    *,
    prior_version: int | None = None,
) -> tuple[pb.Job, pb.Evaluation | None]:
    """Register `version`'s spec again as the job's next version."""
    current = await tx.get_job(namespace, job_id)
    if current is None:
        raise NotFound(f"job {job_id!r} not found")
    if prior_version is not None and current.version != prior_version:
        raise FailedPrecondition(
            f"job {job_id!r} is at version {current.version}, not {prior_version}"
        )
    if version == current.version:
        raise InvalidArgument("version", f"job {job_id!r} is already at version {version}")
    old = await tx.get_job_version(namespace, job_id, version)
    if old is None:
        raise NotFound(f"job {job_id!r} has no version {version}")
    spec = copy_msg(old)
    spec.stop = False
    return await register_job(tx, spec, trigger=Trigger.JOB_REGISTER)


def _check_reason(d: pb.Deployment, status: str, description: str, now: int) -> None:
    """A watcher's verdict, taken on its replica, must still hold on the
    deployment as stored: success only with every alloc healthy, failure
    for unhealthy allocs or a missed deadline only if that is so (an
    operator's failure needs no reason)."""
    problem = ""
    if status == DeploymentStatus.SUCCESSFUL and not deployments.all_healthy(d):
        problem = "has allocs not yet healthy"
    elif description == deployments.DESC_FAILED_ALLOCS and not any(
        s.unhealthy_allocs > 0 for s in d.task_groups.values()
    ):
        problem = "has no unhealthy alloc"
    elif description == deployments.DESC_PROGRESS_DEADLINE and not any(
        s.healthy_allocs < s.desired_total and 0 < s.require_progress_by < now
        for s in d.task_groups.values()
    ):
        problem = "has not missed its progress deadline"
    if problem:
        raise FailedPrecondition(f"deployment {d.id} {problem}")


async def _active(tx: WriteTx, deployment_id: str) -> pb.Deployment:
    cur = await tx.get_deployment(deployment_id)
    if cur is None:
        raise NotFound(f"deployment {deployment_id!r} not found")
    if not deployments.is_active(cur):
        raise FailedPrecondition(f"deployment {deployment_id} is {cur.status}, no longer active")
    return copy_msg(cur)


async def _mark_stable(tx: WriteTx, d: pb.Deployment) -> None:
    """The deployed version becomes stable: the one an auto-revert goes
    back to."""
    job = await tx.get_job(d.namespace, d.job_id)
    if job is not None and job.version == d.job_version and job.create_index == d.job_create_index:
        job = copy_msg(job)
        job.stable = True
        tx.put_job(job, EventType.JOB_STABILITY_UPDATED)
        return
    old = await tx.get_job_version(d.namespace, d.job_id, d.job_version)
    if old is not None and not old.stable:
        old = copy_msg(old)
        old.stable = True
        tx.put_job_version(old)


async def _revert_to_stable(tx: WriteTx, d: pb.Deployment) -> pb.Job | None:
    """Register the newest stable version before the failed one again, if
    the job is still at the failed version and there is one."""
    job = await tx.get_job(d.namespace, d.job_id)
    if job is None or job.stop or job.version != d.job_version:
        return None
    for version in range(d.job_version - 1, -1, -1):
        old = await tx.get_job_version(d.namespace, d.job_id, version)
        if old is not None and old.stable:
            reverted, _ = await revert_job(tx, d.namespace, d.job_id, version)
            d.status_description = f"{d.status_description} - rolling back to job version {version}"
            return reverted
    d.status_description = f"{d.status_description} - no stable job version to auto revert to"
    return None
