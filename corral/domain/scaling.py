"""Scaling policies (Nomad's `ScalingPolicy`): the defaults a job's `scaling`
blocks take, the checks on them, the policies a job registers as objects
(one per group `scaling` block, one per task `scaling "cpu"|"mem"` block)
and the bounds they put on `Job.Scale`.

A policy is known by its job key (type, group, task): a new version of a job
keeps the id its policy had, as Nomad's `propagateScalingPolicyIDs` does, so
an autoscaler following a policy by id follows it across versions.
"""

from __future__ import annotations

from collections.abc import Iterator

from corral.domain.structs import INDEX_FIELDS, new_id, same_except
from corral.v1 import structs_pb2 as pb

HORIZONTAL = "horizontal"
VERTICAL_CPU = "vertical_cpu"
VERTICAL_MEM = "vertical_mem"
#: a task's `scaling "<label>"` block → its policy type
TASK_LABELS = {"cpu": VERTICAL_CPU, "mem": VERTICAL_MEM}
TASK_TYPES = (VERTICAL_CPU, VERTICAL_MEM)

#: Target keys (Nomad's ScalingTarget*)
TARGET_NAMESPACE = "Namespace"
TARGET_JOB = "Job"
TARGET_GROUP = "Group"
TARGET_TASK = "Task"

#: scaling events kept per task group (Nomad's JobTrackedScalingEvents)
MAX_EVENTS = 20

PolicyKey = tuple[str, str, str]


def canonicalize(job: pb.Job) -> None:
    """Nomad's defaults, in place: a group policy is horizontal, enabled,
    with min = the group's count; a task policy takes its type from its
    label (set by the parser), enabled, min 0. Targets name the policy's
    namespace, job, group (and task)."""
    for tg in job.task_groups:
        if tg.HasField("scaling"):
            p = tg.scaling
            p.type = p.type or HORIZONTAL
            if not p.HasField("min"):
                p.min = tg.count
            if not p.HasField("enabled"):
                p.enabled = True
            _target(p, job, tg.name)
        for task in tg.tasks:
            for p in task.scaling_policies:
                if not p.HasField("min"):
                    p.min = 0
                if not p.HasField("enabled"):
                    p.enabled = True
                _target(p, job, tg.name, task.name)


def _target(p: pb.ScalingPolicy, job: pb.Job, group: str, task: str = "") -> None:
    p.target.clear()
    p.target[TARGET_NAMESPACE] = job.namespace
    p.target[TARGET_JOB] = job.id
    p.target[TARGET_GROUP] = group
    if task:
        p.target[TARGET_TASK] = task


def problem(job: pb.Job) -> tuple[str, str] | None:
    """(proto path, problem) of the first wrong policy of `job`, or None
    (Nomad's ScalingPolicy.Validate and validateScalingPolicy)."""
    for gi, tg in enumerate(job.task_groups):
        path = f"job.task_groups[{gi}].scaling"
        if tg.HasField("scaling"):
            p = tg.scaling
            if p.type and p.type != HORIZONTAL:
                return f"{path}.type", f"a group's scaling policy is {HORIZONTAL!r}, not {p.type!r}"
            found = _bounds(p, path)
            if found is not None:
                return found
            if p.max < tg.count:
                return f"{path}.max", f"must not be less than the group's count ({tg.count})"
            if p.HasField("min") and tg.count < p.min:
                return f"{path}.min", f"must not be greater than the group's count ({tg.count})"
        for ti, task in enumerate(tg.tasks):
            seen: set[str] = set()
            for pi, p in enumerate(task.scaling_policies):
                ppath = f"job.task_groups[{gi}].tasks[{ti}].scaling_policies[{pi}]"
                if p.type not in TASK_TYPES:
                    return f"{ppath}.type", (
                        f"a task's scaling policy is {' or '.join(map(repr, TASK_TYPES))}, "
                        f"not {p.type!r}"
                    )
                if p.type in seen:
                    return ppath, f"task {task.name!r} has two {p.type} policies"
                seen.add(p.type)
                found = _bounds(p, ppath)
                if found is not None:
                    return found
    return None


def _bounds(p: pb.ScalingPolicy, path: str) -> tuple[str, str] | None:
    if not p.HasField("max"):
        return f"{path}.max", "is required"
    if p.max < 0:
        return f"{path}.max", "must not be negative"
    if p.HasField("min"):
        if p.min < 0:
            return f"{path}.min", "must not be negative"
        if p.max < p.min:
            return f"{path}.max", f"must not be less than min ({p.min})"
    return None


def key(p: pb.ScalingPolicy) -> PolicyKey:
    """What identifies a policy within its job (Nomad's JobKey)."""
    return (p.type, p.target.get(TARGET_GROUP, ""), p.target.get(TARGET_TASK, ""))


def embedded(job: pb.Job) -> Iterator[pb.ScalingPolicy]:
    """The job's own policy messages (groups first, then tasks), to read or
    to stamp in place."""
    for tg in job.task_groups:
        if tg.HasField("scaling"):
            yield tg.scaling
        for task in tg.tasks:
            yield from task.scaling_policies


def assign_ids(job: pb.Job, known: dict[PolicyKey, str]) -> None:
    """Give each of the job's policies the id its key had (`known`: from the
    stored policies), or a new one; in place."""
    for p in embedded(job):
        p.id = known.get(key(p)) or p.id or new_id()


def same_spec(a: pb.ScalingPolicy, b: pb.ScalingPolicy) -> bool:
    """Equal but for indexes (Nomad's ScalingPolicy.Diff)."""
    return same_except(a, b, INDEX_FIELDS)


def count_problem(tg: pb.TaskGroup, count: int) -> str | None:
    """Why Job.Scale may not set `tg`'s count to `count` (outside its
    policy's min..max, Nomad's words), or None."""
    if not tg.HasField("scaling"):
        return None
    p = tg.scaling
    if p.HasField("min") and count < p.min:
        return f"group count was less than scaling policy minimum: {count} < {p.min}"
    if p.HasField("max") and p.max < count:
        return f"group count was greater than scaling policy maximum: {count} > {p.max}"
    return None
