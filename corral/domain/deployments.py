"""Deployments shared by the scheduler, the state, the broker's watcher and
the CLI: which groups an update block governs, what a fresh deployment for
a job version looks like, and when a deployment is finished.

A deployment follows one job version's roll-out. The scheduler creates it
(in the plan) when a version's allocs start being placed or replaced; the
state counts placements from plans and health from client updates; the
broker's watcher decides success, failure and the next batch.
"""

from __future__ import annotations

from collections.abc import Callable

from corral.domain import structs
from corral.domain.structs import DeploymentStatus, EvalStatus, JobType, Trigger
from corral.runtime import telemetry
from corral.v1 import structs_pb2 as pb

DESC_RUNNING = "Deployment is running"
DESC_NEEDS_PROMOTION = "Deployment is running but requires manual promotion"
DESC_AUTO_PROMOTION = "Deployment is running pending automatic promotion"
DESC_PAUSED = "Deployment is paused"
DESC_SUCCESSFUL = "Deployment completed successfully"
DESC_NEWER_JOB = "Cancelled due to newer version of job"
DESC_STOPPED_JOB = "Cancelled because job is stopped"
DESC_FAILED_ALLOCS = "Failed due to unhealthy allocations"
DESC_PROGRESS_DEADLINE = "Failed due to progress deadline"
DESC_FAILED_BY_USER = "Deployment marked as failed"


def update_strategy(job: pb.Job, tg: pb.TaskGroup) -> pb.UpdateStrategy | None:
    """The update block governing `tg` (the group's wins over the job's),
    or None when the group rolls out without a deployment."""
    if job.type != JobType.SERVICE:
        return None
    if tg.HasField("update"):
        up = tg.update
    elif job.HasField("update"):
        up = job.update
    else:
        return None
    return up if up.max_parallel > 0 else None


def has_deployment(job: pb.Job) -> bool:
    """Whether any group of `job` is rolled out under a deployment."""
    return any(update_strategy(job, tg) is not None for tg in job.task_groups)


def rollout_eval(d: pb.Deployment, job: pb.Job) -> pb.Evaluation:
    """The eval that lets the scheduler act on a change of deployment `d`
    of `job` (more allocs healthy, a promotion, a resume): written by the
    state for user actions and by the broker's watcher."""
    return pb.Evaluation(
        id=structs.new_id(),
        namespace=d.namespace,
        priority=job.priority,
        type=job.type,
        triggered_by=Trigger.DEPLOYMENT_WATCHER,
        job_id=d.job_id,
        job_modify_index=job.job_modify_index,
        deployment_id=d.id,
        status=EvalStatus.PENDING,
        traceparent=telemetry.current_traceparent(),
    )


def new_deployment(job: pb.Job, now: int) -> pb.Deployment:
    """A running deployment for the job's current version; its groups are
    added by the scheduler as it places them (see `group_state`)."""
    return pb.Deployment(
        id=structs.new_id(),
        namespace=job.namespace,
        job_id=job.id,
        job_version=job.version,
        job_modify_index=job.job_modify_index,
        job_create_index=job.create_index,
        status=DeploymentStatus.RUNNING,
        status_description=DESC_RUNNING,
        create_time=now,
    )


def group_state(up: pb.UpdateStrategy, tg: pb.TaskGroup) -> pb.DeploymentState:
    """A group's state in a new deployment. Its `desired_canaries` stay 0
    until the scheduler places canaries (only a destructive update does:
    a job's first version has nothing to canary), as in Nomad."""
    return pb.DeploymentState(
        auto_revert=up.auto_revert,
        auto_promote=up.auto_promote,
        desired_total=tg.count,
        progress_deadline=up.progress_deadline,
    )


def is_active(d: pb.Deployment | None) -> bool:
    return d is not None and d.status in DeploymentStatus.ACTIVE


def for_job_version(d: pb.Deployment | None, job: pb.Job) -> bool:
    """Whether `d` follows the roll-out of exactly this job version (and not
    of an earlier job of the same id that was purged)."""
    return d is not None and d.job_version == job.version and d.job_create_index == job.create_index


def all_healthy(d: pb.Deployment) -> bool:
    """Every group placed its desired allocs and they all became healthy
    (a group with canaries only after its promotion)."""
    return bool(d.task_groups) and all(
        s.healthy_allocs >= s.desired_total and (s.promoted or not s.placed_canaries)
        for s in d.task_groups.values()
    )


def running_description(d: pb.Deployment) -> str:
    """What a running deployment waits for, as Nomad words it: a promotion
    (automatic when every waiting group has auto_promote), or nothing."""
    waiting = [s for s in d.task_groups.values() if s.desired_canaries and not s.promoted]
    if not waiting:
        return DESC_RUNNING
    return DESC_AUTO_PROMOTION if all(s.auto_promote for s in waiting) else DESC_NEEDS_PROMOTION


def awaiting_promotion(d: pb.Deployment) -> list[str]:
    """The groups whose canaries wait for a promotion."""
    return sorted(g for g, s in d.task_groups.items() if s.placed_canaries and not s.promoted)


def canaries_healthy(
    state: pb.DeploymentState, desired: int, alloc: Callable[[str], pb.Allocation | None]
) -> bool:
    """All `desired` canaries of a group are placed and healthy."""
    if len(state.placed_canaries) < max(desired, 1):
        return False
    for aid in state.placed_canaries:
        a = alloc(aid)
        if a is None or not a.deployment_status.healthy:
            return False
    return True


def wants_revert(d: pb.Deployment) -> bool:
    return any(s.auto_revert for s in d.task_groups.values())


def start_progress_clock(d: pb.Deployment, now: int) -> None:
    """A deployment is held to its progress deadlines from its creation:
    one whose allocs cannot even be placed fails as well."""
    for state in d.task_groups.values():
        if state.progress_deadline and not state.require_progress_by:
            state.require_progress_by = now + state.progress_deadline


def count_placement(d: pb.Deployment, alloc: pb.Allocation, now: int) -> None:
    """An alloc joined `d` (placed, or updated in place into it): count it,
    and start the progress clock on the deployment's first placement."""
    state = d.task_groups.get(alloc.task_group)
    if state is None:
        return
    state.placed_allocs += 1
    if alloc.deployment_status.canary and alloc.id not in state.placed_canaries:
        state.placed_canaries.append(alloc.id)
        state.desired_canaries = max(state.desired_canaries, len(state.placed_canaries))
    if state.progress_deadline and not state.require_progress_by:
        state.require_progress_by = now + state.progress_deadline


def count_health(
    d: pb.Deployment, group: str, before: bool | None, after: bool | None, at: int
) -> bool:
    """An alloc of `d` changed health from `before` to `after` (None: not
    yet known). A healthy alloc is progress: the deadline moves on to
    `at + progress_deadline`. Returns whether a count changed."""
    state = d.task_groups.get(group)
    if state is None or before == after:
        return False
    if before is True:
        state.healthy_allocs -= 1
    elif before is False:
        state.unhealthy_allocs -= 1
    if after is True:
        state.healthy_allocs += 1
        if state.progress_deadline:
            state.require_progress_by = max(state.require_progress_by, at + state.progress_deadline)
    elif after is False:
        state.unhealthy_allocs += 1
    return True


def health_of(alloc: pb.Allocation) -> bool | None:
    ds = alloc.deployment_status
    return ds.healthy if ds.HasField("healthy") else None
