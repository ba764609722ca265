"""Checks on a parsed job, in the wire contract's terms.

`check(job)` raises `FieldProblem("job.task_groups[0].count", "must be >= 0")`;
the HCL and JSON front ends turn that into a `JobspecError` pointing at the
line (HCL) or the field (JSON) it came from. The state service validates again
on Register — these checks exist so a user gets the line number, and so
nothing is sent for a file that cannot be right."""

from __future__ import annotations

import re
from collections.abc import Iterable

from google.protobuf.json_format import MessageToDict

from corral.domain import (
    actions,
    artifacts,
    driver_config,
    identity,
    lifecycle,
    periodic,
    regexp,
    scaling,
    services,
    volumes,
)
from corral.domain.dispatch import Payload, payload_file_problem
from corral.domain.jobspec import limits
from corral.domain.structs import (
    CONSTRAINT_OPERANDS,
    DELAY_FUNCTIONS,
    OPERANDS_WITHOUT_ATTRIBUTE,
    RESTART_MODES,
    JobType,
)
from corral.domain.template import block as template_block
from corral.v1 import structs_pb2 as pb

JOB_TYPES = (JobType.SERVICE, JobType.BATCH, JobType.SYSTEM, JobType.SYSBATCH)
HEALTH_CHECKS = ("checks", "task_states", "manual")
RECONCILE = ("best_score", "keep_original", "keep_replacement", "longest_running")
PAYLOAD = Payload.ALL
_NAME = re.compile(r"^[^\s\x00/]+$")
#: memory_max = -1: no memory ceiling (Nomad's structs.MemoryNoLimit)
MEMORY_NO_LIMIT = -1


class FieldProblem(Exception):
    def __init__(self, path: str, problem: str) -> None:
        super().__init__(f"{path}: {problem}")
        self.path = path
        self.problem = problem


def _name(value: str, path: str, what: str) -> None:
    if not value:
        raise FieldProblem(path, f"{what} is required")
    if len(value) > 128:
        raise FieldProblem(path, f"{what} is longer than 128 characters")
    if not _NAME.match(value):
        raise FieldProblem(path, f"{what} {value!r} must not contain spaces, '/' or NUL")


def _one_of(value: str, allowed: tuple[str, ...], path: str) -> None:
    if value not in allowed:
        raise FieldProblem(path, f"unknown value {value!r} (expected one of: {', '.join(allowed)})")


def _not_negative(value: int, path: str) -> None:
    if value < 0:
        raise FieldProblem(path, "must not be negative")


def check(job: pb.Job) -> None:
    _name(job.id, "job.id", "job id")
    _one_of(job.type, JOB_TYPES, "job.type")
    if not 1 <= job.priority <= 100:
        raise FieldProblem("job.priority", f"must be between 1 and 100, got {job.priority}")
    if not job.task_groups:
        raise FieldProblem("job", 'needs at least one group (a `group "name" { ... }` block)')
    for i, dc in enumerate(job.datacenters):
        if not dc:
            raise FieldProblem(f"job.datacenters[{i}]", "must not be empty")
    _placement(job.constraints, job.affinities, job.spreads, "job")
    if job.HasField("periodic"):
        if job.type not in (JobType.BATCH, JobType.SYSBATCH):
            raise FieldProblem("job.periodic", "only batch and sysbatch jobs can be periodic")
        if job.periodic.enabled:
            try:
                periodic.validate(job.periodic)
            except periodic.PeriodicError as exc:
                raise FieldProblem(exc.field, exc.message) from None
    if job.HasField("parameterized"):
        if job.type not in (JobType.BATCH, JobType.SYSBATCH):
            raise FieldProblem(
                "job.parameterized", "only batch and sysbatch jobs can be parameterized"
            )
        _one_of(job.parameterized.payload, PAYLOAD, "job.parameterized.payload")
    if job.HasField("periodic") and job.HasField("parameterized"):
        raise FieldProblem("job.periodic", "a job cannot be both periodic and parameterized")
    for found in (scaling.problem(job), volumes.problem(job), artifacts.problem(job)):
        if found is not None:
            raise FieldProblem(*found)

    groups: set[str] = set()
    for gi, tg in enumerate(job.task_groups):
        gp = f"job.task_groups[{gi}]"
        _name(tg.name, f"{gp}.name", "group name")
        if tg.name in groups:
            raise FieldProblem(f"{gp}.name", f"group {tg.name!r} is defined twice")
        groups.add(tg.name)
        _not_negative(tg.count, f"{gp}.count")
        if job.type in (JobType.SYSTEM, JobType.SYSBATCH) and tg.count > 1:
            raise FieldProblem(
                f"{gp}.count", f"{job.type} jobs run one alloc per node; count must be 0 or 1"
            )
        if not tg.tasks:
            raise FieldProblem(
                gp, f'group {tg.name!r} needs at least one task (a `task "name"` block)'
            )
        _placement(tg.constraints, tg.affinities, tg.spreads, gp)
        _restart(tg.restart_policy, f"{gp}.restart_policy")
        if tg.HasField("reschedule_policy"):
            if job.type in (JobType.SYSTEM, JobType.SYSBATCH):
                raise FieldProblem(
                    f"{gp}.reschedule_policy", f"{job.type} jobs are not rescheduled"
                )
            rp = tg.reschedule_policy
            _one_of(rp.delay_function, DELAY_FUNCTIONS, f"{gp}.reschedule_policy.delay_function")
            for f in ("attempts", "interval", "delay", "max_delay"):
                _not_negative(getattr(rp, f), f"{gp}.reschedule_policy.{f}")
            if rp.unlimited and rp.attempts:
                raise FieldProblem(
                    f"{gp}.reschedule_policy.attempts",
                    "cannot be set together with unlimited = true",
                )
            growing = rp.delay_function in ("exponential", "fibonacci")
            if (rp.max_delay or growing) and rp.max_delay < rp.delay:
                # a growing delay needs its ceiling (the state refuses it too)
                raise FieldProblem(f"{gp}.reschedule_policy.max_delay", "must be >= delay")
        if tg.HasField("update"):
            up = tg.update
            _one_of(up.health_check, HEALTH_CHECKS, f"{gp}.update.health_check")
            for f in ("max_parallel", "canary", "stagger", "min_healthy_time", "healthy_deadline"):
                _not_negative(getattr(up, f), f"{gp}.update.{f}")
            if up.healthy_deadline and up.min_healthy_time >= up.healthy_deadline:
                raise FieldProblem(
                    f"{gp}.update.min_healthy_time", "must be less than healthy_deadline"
                )
            if up.progress_deadline and up.progress_deadline < up.healthy_deadline:
                raise FieldProblem(f"{gp}.update.progress_deadline", "must be >= healthy_deadline")
        d = tg.disconnect
        _not_negative(d.lost_after, f"{gp}.disconnect.lost_after")
        _not_negative(d.stop_on_client_after, f"{gp}.disconnect.stop_on_client_after")
        if d.reconcile:
            _one_of(d.reconcile, RECONCILE, f"{gp}.disconnect.reconcile")
        if d.lost_after and d.stop_on_client_after:
            raise FieldProblem(
                f"{gp}.disconnect",
                "lost_after (max_client_disconnect) and stop_on_client_after "
                "(stop_after_client_disconnect) cannot both be set",
            )
        _not_negative(tg.ephemeral_disk.size_mb, f"{gp}.ephemeral_disk.size_mb")
        _not_negative(tg.shutdown_delay, f"{gp}.shutdown_delay")
        _not_negative(tg.max_run_duration, f"{gp}.max_run_duration")

        tasks: set[str] = set()
        for ti, task in enumerate(tg.tasks):
            tp = f"{gp}.tasks[{ti}]"
            _name(task.name, f"{tp}.name", "task name")
            if task.name in tasks:
                raise FieldProblem(
                    f"{tp}.name", f"task {task.name!r} is defined twice in group {tg.name!r}"
                )
            tasks.add(task.name)
            if not task.driver:
                raise FieldProblem(f"{tp}.driver", 'is required (e.g. driver = "raw_exec")')
            if limits.struct_depth(task.config) > limits.MAX_VALUE_DEPTH:
                raise FieldProblem(
                    f"{tp}.config",
                    f"nested more than {limits.MAX_VALUE_DEPTH} levels deep (the nesting limit "
                    "of a task's configuration)",
                )
            config = MessageToDict(task.config) if task.HasField("config") else {}
            for key, wrong in driver_config.problems(task.driver, config):
                raise FieldProblem(f"{tp}.config.{key}", wrong)
            r = task.resources
            for f in ("cpu", "cores", "memory_mb", "disk_mb"):
                _not_negative(getattr(r, f), f"{tp}.resources.{f}")
            if r.cpu and r.cores:
                raise FieldProblem(f"{tp}.resources.cores", "cannot be set together with cpu")
            if r.memory_max_mb < MEMORY_NO_LIMIT:
                raise FieldProblem(
                    f"{tp}.resources.memory_max_mb", "must be >= memory, or -1 for no limit"
                )
            if r.memory_max_mb > 0 and r.memory_max_mb < r.memory_mb:
                raise FieldProblem(f"{tp}.resources.memory_max_mb", "must be >= memory")
            _not_negative(task.shutdown_delay, f"{tp}.shutdown_delay")
            _placement(task.constraints, task.affinities, [], tp)
            if task.HasField("restart_policy"):
                _restart(task.restart_policy, f"{tp}.restart_policy")
            _not_negative(task.kill_timeout, f"{tp}.kill_timeout")
            found = identity.problems(task)
            if found is not None:
                raise FieldProblem(f"{tp}.{found[0]}", found[1])
            found = template_block.problems(task)
            if found is not None:
                raise FieldProblem(f"{tp}.{found[0]}", found[1])
            found = actions.problems(task)
            if found is not None:
                raise FieldProblem(f"{tp}.{found[0]}", found[1])
            if task.HasField("dispatch_payload"):
                problem = payload_file_problem(task.dispatch_payload.file)
                if problem is not None:
                    raise FieldProblem(f"{tp}.dispatch_payload.file", problem)
            problem = lifecycle.lifecycle_problem(task)
            if problem is not None:
                raise FieldProblem(f"{tp}.lifecycle.hook", problem)
            logs = lifecycle.log_config_problem(task, tg.ephemeral_disk.size_mb)
            if logs is not None:
                raise FieldProblem(f"{tp}.log_config.{logs[0]}", logs[1])
        if sum(1 for t in tg.tasks if t.leader) > 1:
            raise FieldProblem(gp, "only one task may be the leader")
        problem = lifecycle.main_task_problem(tg)
        if problem is not None:
            raise FieldProblem(f"{gp}.tasks", problem)
    found = services.problem(job)
    if found is not None:
        raise FieldProblem(*found)


def _restart(rp: pb.RestartPolicy, path: str) -> None:
    _one_of(rp.mode, RESTART_MODES, f"{path}.mode")
    for f in ("attempts", "interval", "delay"):
        _not_negative(getattr(rp, f), f"{path}.{f}")


def _pattern(pattern: str, path: str) -> None:
    """RE2 (Go's syntax, as the servers match): what it refuses, the state
    would refuse too."""
    problem = regexp.pattern_problem(pattern)
    if problem is not None:
        raise FieldProblem(path, f"invalid regular expression: {problem}")


def _placement(
    constraints: Iterable[pb.Constraint],
    affinities: Iterable[pb.Affinity],
    spreads: Iterable[pb.Spread],
    path: str,
) -> None:
    for i, c in enumerate(constraints):
        cp = f"{path}.constraints[{i}]"
        _one_of(c.operand, CONSTRAINT_OPERANDS, f"{cp}.operand")
        if c.operand not in OPERANDS_WITHOUT_ATTRIBUTE and not c.l_target:
            raise FieldProblem(f"{cp}.l_target", f"{c.operand or '='} needs an attribute")
        if c.operand == "regexp":
            _pattern(c.r_target, f"{cp}.r_target")
    for i, a in enumerate(affinities):
        ap = f"{path}.affinities[{i}]"
        _one_of(a.operand, CONSTRAINT_OPERANDS, f"{ap}.operand")
        if not a.l_target:
            raise FieldProblem(f"{ap}.l_target", "an attribute is required")
        if a.weight == 0 or not -100 <= a.weight <= 100:
            raise FieldProblem(f"{ap}.weight", f"must be -100..100 and not 0, got {a.weight}")
        if a.operand == "regexp":
            _pattern(a.r_target, f"{ap}.r_target")
    for i, s in enumerate(spreads):
        sp = f"{path}.spreads[{i}]"
        if not s.attribute:
            raise FieldProblem(f"{sp}.attribute", "is required")
        if not 0 <= s.weight <= 100:
            raise FieldProblem(f"{sp}.weight", f"must be 0..100, got {s.weight}")
        total = 0
        for j, t in enumerate(s.spread_target):
            if not 0 <= t.percent <= 100:
                raise FieldProblem(f"{sp}.spread_target[{j}].percent", "must be 0..100")
            total += t.percent
        if total > 100:
            raise FieldProblem(
                f"{sp}.spread_target", f"percentages add up to {total}, more than 100"
            )
