"""Registering and deregistering jobs (Nomad's Job.Register/Deregister and
the FSM's upsertJob): the job and its evaluation are written in one
transaction at one index."""

from __future__ import annotations

import re
from collections.abc import Sequence

from google.protobuf.struct_pb2 import Struct

from corral.domain import (
    actions,
    artifacts,
    identity,
    lifecycle,
    namespaces,
    node_pools,
    periodic,
    regexp,
    scaling,
    services,
    structs,
    volumes,
)
from corral.domain.dispatch import Payload, payload_file_problem
from corral.domain.errors import FailedPrecondition, InvalidArgument, NotFound
from corral.domain.structs import (
    ClientStatus,
    DeploymentStatus,
    EvalStatus,
    JobStatus,
    JobType,
    Trigger,
    copy_msg,
)
from corral.domain.template import block as template_block
from corral.domain.topics import EventType
from corral.runtime import telemetry
from corral.v1 import structs_pb2 as pb
from services.state import validate
from services.state.db.database import WriteTx
from services.state.writes import scaling as scaling_writes

MAX_JOB_BYTES = 1024 * 1024
# Bounds on what one job may ask for, so no single registration can make a
# scheduler materialise an unbounded number of placements (a count of 2**31
# once grew a worker by 140 MB/s until the kernel killed it, eval after
# eval). Generous next to real jobs: the largest benchmark job has 10,000.
MAX_GROUPS = 1_000
MAX_TASKS_PER_GROUP = 100
MAX_GROUP_COUNT = 100_000
MAX_JOB_COUNT = 200_000  # allocs of all groups together
#: services of a group or a task, checks of a service, tags of a service
MAX_SERVICES = 100
MAX_CHECKS = 100
MAX_TAGS = 256
_NAME = re.compile(r"^[A-Za-z0-9._/\-]+$")
_OPERANDS = frozenset(structs.CONSTRAINT_OPERANDS)
_DELAY_FUNCTIONS = structs.DELAY_FUNCTIONS


def validate_job(job: pb.Job) -> None:
    """Everything a scheduler relies on; the first problem names its field."""
    size = job.ByteSize()
    if size > MAX_JOB_BYTES:
        raise InvalidArgument("job", f"is {size} bytes, more than the {MAX_JOB_BYTES} allowed")
    validate.no_nul(job, "job")
    validate.require_id(job.id, "job.id")
    validate.namespace(job.namespace, "job.namespace")
    if not _NAME.match(job.id):
        raise InvalidArgument("job.id", "may contain only letters, digits, '.', '_', '-' and '/'")
    validate.one_of(job.type, JobType.USER, "job.type")
    if not structs.MIN_PRIORITY <= job.priority <= structs.MAX_PRIORITY:
        raise InvalidArgument(
            "job.priority", f"must be between {structs.MIN_PRIORITY} and {structs.MAX_PRIORITY}"
        )
    if len(job.name) > validate.MAX_ID_LEN:
        raise InvalidArgument("job.name", f"is longer than {validate.MAX_ID_LEN} characters")
    for i, dc in enumerate(job.datacenters):
        # a `*` glob becomes an RE2 pattern in every scheduler pass
        validate.name_length(dc, f"job.datacenters[{i}]")
    _constraints(job.constraints, "job.constraints")
    _affinities(job.affinities, "job.affinities")
    _spreads(job.spreads, "job.spreads")
    validate.labels(job.meta, "job.meta")
    if job.HasField("parameterized"):
        if job.type not in (JobType.BATCH, JobType.SYSBATCH):
            raise InvalidArgument(
                "job.parameterized", "only batch and sysbatch jobs can be parameterized"
            )
        if job.parameterized.payload:
            validate.one_of(job.parameterized.payload, Payload.ALL, "job.parameterized.payload")
    _periodic(job)
    _update_supported(job.update, "job.update")
    if not job.task_groups:
        raise InvalidArgument("job.task_groups", "a job needs at least one task group")
    if len(job.task_groups) > MAX_GROUPS:
        raise InvalidArgument(
            "job.task_groups", f"has {len(job.task_groups)} groups, more than {MAX_GROUPS}"
        )
    for i, tg in enumerate(job.task_groups):
        if not 0 <= tg.count <= MAX_GROUP_COUNT:
            raise InvalidArgument(
                f"job.task_groups[{i}].count", f"must be between 0 and {MAX_GROUP_COUNT}"
            )
    total = sum(tg.count for tg in job.task_groups)
    if total > MAX_JOB_COUNT:
        raise InvalidArgument(
            "job.task_groups", f"ask for {total} allocations, more than {MAX_JOB_COUNT}"
        )
    groups: set[str] = set()
    for i, tg in enumerate(job.task_groups):
        f = f"job.task_groups[{i}]"
        if not tg.name:
            raise InvalidArgument(f"{f}.name", "is required")
        validate.name_length(tg.name, f"{f}.name")
        if tg.name in groups:
            raise InvalidArgument(f"{f}.name", f"duplicate task group {tg.name!r}")
        groups.add(tg.name)
        if len(tg.tasks) > MAX_TASKS_PER_GROUP:
            raise InvalidArgument(
                f"{f}.tasks", f"has {len(tg.tasks)} tasks, more than {MAX_TASKS_PER_GROUP}"
            )
        _constraints(tg.constraints, f"{f}.constraints")
        _affinities(tg.affinities, f"{f}.affinities")
        _spreads(tg.spreads, f"{f}.spreads")
        validate.labels(tg.meta, f"{f}.meta")
        rp = tg.reschedule_policy
        if rp.delay_function and rp.delay_function not in _DELAY_FUNCTIONS:
            validate.one_of(
                rp.delay_function, _DELAY_FUNCTIONS, f"{f}.reschedule_policy.delay_function"
            )
        for name in ("attempts", "interval", "delay", "max_delay"):
            if getattr(rp, name) < 0:
                raise InvalidArgument(f"{f}.reschedule_policy.{name}", "must not be negative")
        if tg.restart_policy.mode and tg.restart_policy.mode not in structs.RESTART_MODES:
            validate.one_of(
                tg.restart_policy.mode, structs.RESTART_MODES, f"{f}.restart_policy.mode"
            )
        if tg.update.max_parallel < 0:
            raise InvalidArgument(f"{f}.update.max_parallel", "must not be negative")
        _update_supported(tg.update, f"{f}.update")
        if structs.lost_after(tg) < 0 or structs.stop_on_client_after(tg) < 0:
            raise InvalidArgument(f"{f}.disconnect", "durations must not be negative")
        if tg.ephemeral_disk.size_mb < 0:
            raise InvalidArgument(f"{f}.ephemeral_disk.size_mb", "must not be negative")
        if not tg.tasks:
            raise InvalidArgument(f"{f}.tasks", f"task group {tg.name!r} needs at least one task")
        tasks: set[str] = set()
        for k, task in enumerate(tg.tasks):
            tf = f"{f}.tasks[{k}]"
            if not task.name:
                raise InvalidArgument(f"{tf}.name", "is required")
            validate.name_length(task.name, f"{tf}.name")
            if task.name in tasks:
                raise InvalidArgument(f"{tf}.name", f"duplicate task {task.name!r}")
            tasks.add(task.name)
            if not task.driver:
                raise InvalidArgument(f"{tf}.driver", "is required")
            validate.resources(task.resources, f"{tf}.resources")
            _constraints(task.constraints, f"{tf}.constraints")
            _affinities(task.affinities, f"{tf}.affinities")
            validate.labels(task.meta, f"{tf}.meta")
            for d, dev in enumerate(task.resources.devices):
                _constraints(dev.constraints, f"{tf}.resources.devices[{d}].constraints")
            if task.kill_timeout < 0:
                raise InvalidArgument(f"{tf}.kill_timeout", "must not be negative")
            if task.HasField("dispatch_payload"):
                problem = payload_file_problem(task.dispatch_payload.file)
                if problem is not None:
                    raise InvalidArgument(f"{tf}.dispatch_payload.file", problem)
            found = identity.problems(task)
            if found is not None:
                raise InvalidArgument(f"{tf}.{found[0]}", found[1])
            found = template_block.problems(task)
            if found is not None:
                raise InvalidArgument(f"{tf}.{found[0]}", found[1])
            found = actions.problems(task)
            if found is not None:
                raise InvalidArgument(f"{tf}.{found[0]}", found[1])
            problem = lifecycle.lifecycle_problem(task)
            if problem is not None:
                raise InvalidArgument(f"{tf}.lifecycle.hook", problem)
            logs = lifecycle.log_config_problem(task, tg.ephemeral_disk.size_mb)
            if logs is not None:
                raise InvalidArgument(f"{tf}.log_config.{logs[0]}", logs[1])
        problem = lifecycle.main_task_problem(tg)
        if problem is not None:
            raise InvalidArgument(f"{f}.tasks", problem)
        _reschedule_delays(tg.reschedule_policy, f"{f}.reschedule_policy")
        _service_bounds(tg.services, f"{f}.services")
        for k, task in enumerate(tg.tasks):
            _service_bounds(task.services, f"{f}.tasks[{k}].services")
    for found in (scaling.problem(job), volumes.problem(job), artifacts.problem(job)):
        if found is not None:
            raise InvalidArgument(*found)
    if job.node_pool:
        pool_problem = node_pools.name_problem(job.node_pool)
        if pool_problem is not None:
            raise InvalidArgument("job.node_pool", pool_problem)
    validate.durations(job, "job")
    found = services.problem(job)
    if found is not None:
        raise InvalidArgument(*found)


def _service_bounds(svcs: Sequence[pb.Service], field: str) -> None:
    validate.at_most(len(svcs), MAX_SERVICES, field, "services")
    for i, s in enumerate(svcs):
        validate.at_most(len(s.checks), MAX_CHECKS, f"{field}[{i}].checks", "checks")
        validate.at_most(len(s.tags), MAX_TAGS, f"{field}[{i}].tags", "tags")
        validate.at_most(len(s.canary_tags), MAX_TAGS, f"{field}[{i}].canary_tags", "tags")
        validate.labels(s.meta, f"{field}[{i}].meta")
        validate.labels(s.canary_meta, f"{field}[{i}].canary_meta")


def _reschedule_delays(rp: pb.ReschedulePolicy, field: str) -> None:
    """Nomad's rule: a delay that grows (exponential, fibonacci) needs a
    ceiling at least the first delay, or it doubles past any time."""
    if rp.delay_function in ("exponential", "fibonacci") and rp.max_delay < rp.delay:
        raise InvalidArgument(
            f"{field}.max_delay",
            f"must be at least delay ({rp.delay} ns) with the {rp.delay_function} delay function",
        )


def _periodic(job: pb.Job) -> None:
    """An enabled periodic block must be launchable: batch or sysbatch, not
    also parameterized, parsable cron specs, a known time zone."""
    if not job.HasField("periodic") or not job.periodic.enabled:
        return
    if job.type not in (JobType.BATCH, JobType.SYSBATCH):
        raise InvalidArgument("job.periodic", "only batch and sysbatch jobs can be periodic")
    if job.HasField("parameterized"):
        raise InvalidArgument("job.periodic", "a job cannot be both periodic and parameterized")
    try:
        periodic.validate(job.periodic)
    except periodic.PeriodicError as exc:
        raise InvalidArgument(exc.field, exc.message) from None


def _update_supported(up: pb.UpdateStrategy, field: str) -> None:
    """The update-block settings a deployment can act on: anything else is
    refused rather than accepted and ignored."""
    if up.canary < 0:
        raise InvalidArgument(f"{field}.canary", "must not be negative")
    if up.auto_promote and up.canary == 0:
        raise InvalidArgument(f"{field}.auto_promote", "needs canary > 0")
    if up.health_check and up.health_check not in ("checks", "task_states", "manual"):
        validate.one_of(
            up.health_check, ("checks", "task_states", "manual"), f"{field}.health_check"
        )


def _constraints(cs: Sequence[pb.Constraint], field: str) -> None:
    validate.at_most(len(cs), validate.MAX_CONSTRAINTS, field, "constraints")
    for i, c in enumerate(cs):
        operand = c.operand or "="
        if operand not in _OPERANDS:
            validate.one_of(operand, _OPERANDS, f"{field}[{i}].operand")
        if operand not in structs.OPERANDS_WITHOUT_ATTRIBUTE and not c.l_target:
            raise InvalidArgument(f"{field}[{i}].l_target", "is required")
        if operand == "regexp":
            _pattern(c.r_target, f"{field}[{i}].r_target")


def _affinities(affs: Sequence[pb.Affinity], field: str) -> None:
    validate.at_most(len(affs), validate.MAX_AFFINITIES, field, "affinities")
    for i, a in enumerate(affs):
        if a.weight == 0 or not -100 <= a.weight <= 100:
            raise InvalidArgument(f"{field}[{i}].weight", "must be between -100 and 100 and not 0")
        if a.operand and a.operand not in _OPERANDS:
            validate.one_of(a.operand, _OPERANDS, f"{field}[{i}].operand")
        if a.operand == "regexp":
            _pattern(a.r_target, f"{field}[{i}].r_target")


def _pattern(pattern: str, field: str) -> None:
    """A `regexp` target must compile with RE2, the engine the scheduler
    matches with (Nomad's Go regexp, at submission as Nomad does): refused
    here, not found to match nothing on every node later."""
    problem = regexp.pattern_problem(pattern)
    if problem is not None:
        raise InvalidArgument(field, f"invalid regular expression: {problem}")


def _spreads(spreads: Sequence[pb.Spread], field: str) -> None:
    validate.at_most(len(spreads), validate.MAX_SPREADS, field, "spreads")
    for j, sp in enumerate(spreads):
        if not sp.attribute:
            raise InvalidArgument(f"{field}[{j}].attribute", "is required")
        if not 0 <= sp.weight <= 100:
            raise InvalidArgument(f"{field}[{j}].weight", "must be between 0 and 100")
        validate.at_most(
            len(sp.spread_target),
            validate.MAX_SPREAD_TARGETS,
            f"{field}[{j}].spread_target",
            "targets",
        )


def canonicalize(job: pb.Job) -> pb.Job:
    """Fill the defaults a job spec may leave out."""
    job = copy_msg(job)
    job.namespace = job.namespace or structs.DEFAULT_NAMESPACE
    job.name = job.name or job.id
    job.type = job.type or JobType.SERVICE
    job.priority = job.priority or structs.DEFAULT_PRIORITY
    # an empty node_pool takes the namespace's default when registered
    if not job.datacenters:
        job.datacenters.append("*")
    for tg in job.task_groups:
        if job.type in (JobType.SYSTEM, JobType.SYSBATCH):
            tg.count = 1 if tg.count == 0 else tg.count
        if not tg.HasField("reschedule_policy"):
            tg.reschedule_policy.CopyFrom(structs.default_reschedule_policy(job.type))
        if not tg.HasField("restart_policy"):
            # Nomad: service 2 restarts per 30 min, batch 3 per 24 h, 15 s apart
            batch = job.type in (JobType.BATCH, JobType.SYSBATCH)
            tg.restart_policy.CopyFrom(
                pb.RestartPolicy(
                    attempts=3 if batch else 2,
                    interval=24 * structs.HOUR if batch else 30 * structs.MINUTE,
                    delay=15 * structs.SECOND,
                    mode="fail",
                )
            )
        if not tg.ephemeral_disk.size_mb:
            tg.ephemeral_disk.size_mb = 300
        for task in tg.tasks:
            if not task.resources.cpu:
                task.resources.cpu = 100
            if not task.resources.memory_mb:
                task.resources.memory_mb = 300
            if not task.kill_timeout:
                task.kill_timeout = 5 * structs.SECOND
            for artifact in task.artifacts:
                artifacts.canonicalize(artifact)
            template_block.canonicalize(task)
            lifecycle.default_log_config(task)
    services.canonicalize(job)
    scaling.canonicalize(job)
    return job


async def admit(tx: WriteTx, job: pb.Job) -> None:
    """What the job's namespace decides, in place, on rows read in this
    transaction (Nomad's admission hooks): an unset node pool becomes the
    namespace's default; `namespaces.admission_problem` refuses the rest."""
    ns = await tx.get_namespace(job.namespace)
    if ns is not None and not job.node_pool:
        job.node_pool = namespaces.default_pool(ns)
    exists = ns is not None and await tx.get_node_pool(job.node_pool) is not None
    found = namespaces.admission_problem(job, ns, exists)
    if found is not None:
        raise InvalidArgument(*found)


def new_eval(
    job: pb.Job, trigger: str, *, priority: int = 0, traceparent: str = ""
) -> pb.Evaluation:
    return pb.Evaluation(
        id=structs.new_id(),
        namespace=job.namespace,
        priority=priority or job.priority,
        type=job.type,
        triggered_by=trigger,
        job_id=job.id,
        status=EvalStatus.PENDING,
        traceparent=traceparent or telemetry.current_traceparent(),
    )


async def register_job(
    tx: WriteTx,
    job: pb.Job,
    *,
    enforce_index: bool = False,
    job_modify_index: int = 0,
    eval_priority: int = 0,
    traceparent: str = "",
    trigger: str = Trigger.JOB_REGISTER,
    dispatch: bool = False,
    submission: pb.JobSubmission | None = None,
) -> tuple[pb.Job, pb.Evaluation | None]:
    """Upsert the job (a new version only when its spec changed) and its
    register eval, at the transaction's index. `dispatch`: the state's own
    Job.Dispatch writing a child, the one writer of a new dispatched job.
    `submission`: the file it came from, kept with the version unless that
    version already has one (Nomad's updateJobSubmission)."""
    job = copy_msg(job)
    await admit(tx, job)
    scaling.canonicalize(job)  # targets name this job (a dispatched child, a revert)
    current = await tx.get_job(job.namespace, job.id)
    if current is not None and not current.region and job.region:
        # stored before jobs carried their region: it was this region's
        current = copy_msg(current)
        current.region = job.region
    check_update(current, job, dispatch=dispatch)
    if enforce_index:
        have = current.job_modify_index if current is not None else 0
        if have != job_modify_index:
            if job_modify_index == 0:
                raise FailedPrecondition(
                    f"enforcing job modify index 0: job {job.id!r} already exists"
                )
            raise FailedPrecondition(
                f"enforcing job modify index {job_modify_index}: job exists with conflicting "
                f"job modify index: {have}"
            )
    job.submit_time = tx.now
    scaling_writes.carry_ids(current, job)
    if current is not None and not current.stop and not structs.job_spec_changed(current, job):
        job = current  # identical re-registration: only a new eval
    else:
        job.version = current.version + 1 if current is not None else 0
        job.create_index = current.create_index if current is not None else 0
        job.job_modify_index = tx.index
        job.status = JobStatus.RUNNING if _launches_children(job) else JobStatus.PENDING
        job.stable = False
        job.ClearField("version_tag")  # a new version starts untagged (a revert too)
        scaling_writes.update_policies(tx, current, job)
        tx.put_job(job)
    if submission is not None and (
        await tx.get_job_submission(job.namespace, job.id, job.version) is None
    ):
        sub = copy_msg(submission)
        sub.namespace, sub.job_id = job.namespace, job.id
        sub.version, sub.job_modify_index = job.version, job.job_modify_index
        tx.put_job_submission(sub)
    if await _record_launch(tx, job):
        trigger = Trigger.PERIODIC_JOB  # Nomad's dispatcher evals its children so
    ev: pb.Evaluation | None = None
    if not job.periodic.enabled and not job.HasField("parameterized"):
        ev = new_eval(job, trigger, priority=eval_priority, traceparent=traceparent)
        ev.job_modify_index = job.job_modify_index
        tx.put_eval(ev)
    return job, ev


async def evaluate_job(
    tx: WriteTx, namespace: str, job_id: str, *, force_reschedule: bool = False
) -> tuple[pb.Job, pb.Evaluation]:
    """A new eval of the job as it stands (Nomad's Job.Evaluate). With
    `force_reschedule`, each failed alloc not yet replaced, of a group whose
    policy reschedules at all, is marked to be rescheduled now (the
    reconciler skips its delay)."""
    job = await tx.get_job(namespace, job_id)
    if job is None:
        raise NotFound(f"job {job_id!r} not found")
    if job.periodic.enabled:
        raise InvalidArgument("job_id", "can't evaluate periodic job")
    if job.HasField("parameterized"):
        raise InvalidArgument("job_id", "can't evaluate parameterized job")
    if force_reschedule:
        groups = {tg.name: tg for tg in job.task_groups}
        for alloc in await tx.allocs_by_job(namespace, job_id):
            tg = groups.get(alloc.task_group)
            if tg is None or not _reschedules(tg.reschedule_policy):
                continue
            if (
                alloc.client_status == ClientStatus.FAILED
                and not alloc.next_allocation
                and not alloc.desired_transition.force_reschedule
            ):
                alloc = copy_msg(alloc)
                alloc.desired_transition.force_reschedule = True
                tx.put_alloc(alloc, EventType.ALLOCATION_UPDATE_DESIRED_STATUS)
    ev = new_eval(job, Trigger.JOB_REGISTER)
    ev.job_modify_index = job.job_modify_index
    tx.put_eval(ev)
    return job, ev


def _reschedules(rp: pb.ReschedulePolicy) -> bool:
    return rp.attempts > 0 or rp.unlimited


async def set_stability(
    tx: WriteTx, namespace: str, job_id: str, version: int, stable: bool
) -> pb.Job:
    """Mark one version of the job stable or not (Nomad's Job.Stable); the
    current version's job row too. Returns the job as it stands."""
    job = await tx.get_job(namespace, job_id)
    old = None
    if job is not None and job.version != version:
        old = await tx.get_job_version(namespace, job_id, version)
    if job is None or (job.version != version and old is None):
        raise NotFound(f"job {job_id!r} in namespace {namespace!r} at version {version} not found")
    if old is None:
        job = copy_msg(job)
        job.stable = stable
        tx.put_job(job, EventType.JOB_STABILITY_UPDATED)
        return job
    old = copy_msg(old)
    old.stable = stable
    tx.put_job_version(old)
    return job


def check_update(current: pb.Job | None, job: pb.Job, *, dispatch: bool = False) -> None:
    """What a registration may not change (Nomad's rules): only Job.Dispatch
    creates a dispatched job, and a job stays parameterized (or not) and
    dispatched (or not) for its whole life, since its children and its
    scheduling depend on it."""
    if current is None:
        if job.dispatched and not dispatch:
            raise InvalidArgument(
                "job.dispatched", "is set only by dispatching a parameterized job"
            )
        return
    was = current.HasField("parameterized") and not current.dispatched
    now = job.HasField("parameterized") and not job.dispatched
    if was != now:
        raise InvalidArgument(
            "job.parameterized",
            f"job {job.id!r} is {'' if was else 'not '}parameterized; a new version cannot "
            f"{'remove' if was else 'add'} the parameterized block (purge the job first)",
        )
    if current.dispatched != job.dispatched:
        raise InvalidArgument("job.dispatched", "is read-only")


def _launches_children(job: pb.Job) -> bool:
    """Periodic and parameterized parents are `running` until stopped,
    then `dead`: their work is done by their children (Nomad)."""
    return job.periodic.enabled or job.HasField("parameterized")


async def _record_launch(tx: WriteTx, job: pb.Job) -> bool:
    """Nomad's periodic_launch bookkeeping, decided on rows read in this
    transaction: a periodic parent seen for the first time records its
    registration as a launch (so a missed first tick is noticed after a
    leader change); a periodic child records the launch its id encodes on
    its parent, never moving the record backwards. True for a periodic child."""
    if periodic.is_active(job):
        if await tx.get_periodic_launch(job.namespace, job.id) is None:
            tx.put_periodic_launch(
                pb.PeriodicLaunch(namespace=job.namespace, job_id=job.id, launch=tx.now)
            )
        return False
    if not job.parent_id:
        return False
    launch = periodic.launch_of(job.id, job.parent_id)
    if launch is None:
        return False
    parent = await tx.get_job(job.namespace, job.parent_id)
    if parent is None or not parent.HasField("periodic"):
        return False
    current = await tx.get_periodic_launch(job.namespace, job.parent_id)
    if current is None or current.launch < launch:
        record = copy_msg(current) if current is not None else pb.PeriodicLaunch()
        record.namespace, record.job_id, record.launch = job.namespace, job.parent_id, launch
        tx.put_periodic_launch(record)
    return True


async def scale_job(
    tx: WriteTx,
    namespace: str,
    job_id: str,
    group: str,
    count: int | None,
    *,
    message: str = "",
    error: bool = False,
    meta: Struct | None = None,
    enforce_index: bool = False,
    job_modify_index: int = 0,
) -> tuple[pb.Job, pb.Evaluation | None]:
    """Nomad's Job.Scale on the newest committed job: with a count, set the
    group's count (within its scaling policy's bounds, not while a
    deployment of this job is active) as a new version with its eval;
    without, change nothing. Either way record a scaling event."""
    current = await tx.get_job(namespace, job_id)
    if current is None:
        raise NotFound(f"job {job_id!r} not found")
    tg = structs.task_group(current, group)
    if tg is None:
        raise InvalidArgument(
            "group", f"task group {group!r} specified for scaling does not exist in job"
        )
    event = pb.ScalingEvent(time=tx.now, previous_count=tg.count, message=message, error=error)
    if meta is not None:
        event.meta.CopyFrom(meta)
    job, ev = current, None
    if count is not None:
        if current.type in (JobType.SYSTEM, JobType.SYSBATCH):
            raise FailedPrecondition(
                f"cannot scale a {current.type} job: it runs one alloc per node"
            )
        problem = scaling.count_problem(tg, count)
        if problem is not None:
            raise InvalidArgument("count", problem)
        # the bound Job.Register holds a job to (validate_job), named for this call
        total = sum(g.count for g in current.task_groups) - tg.count + count
        if total > MAX_JOB_COUNT:
            raise InvalidArgument(
                "count",
                f"would make the job ask for {total} allocations, more than {MAX_JOB_COUNT}",
            )
        if await _deploying(tx, current):
            raise FailedPrecondition("job scaling blocked due to active deployment")
        scaled = copy_msg(current)
        target = structs.task_group(scaled, group)
        assert target is not None
        target.count = count  # at most MAX_GROUP_COUNT (the handler checks)
        job, ev = await register_job(
            tx,
            scaled,
            enforce_index=enforce_index,
            job_modify_index=job_modify_index,
            trigger=Trigger.JOB_SCALING,
        )
        event.count = count
        event.eval_id = ev.id if ev is not None else ""
    await scaling_writes.record_event(tx, job.namespace, job.id, group, event)
    return job, ev


async def _deploying(tx: WriteTx, job: pb.Job) -> bool:
    """Whether a deployment of this job (this registration of it) is active:
    Nomad refuses to scale then, since the deployment would be judged
    against a count that moved under it."""
    for d in await tx.deployments_by_job(job.namespace, job.id):
        if d.status in DeploymentStatus.ACTIVE and d.job_create_index == job.create_index:
            return True
    return False


async def deregister_job(
    tx: WriteTx, namespace: str, job_id: str, *, purge: bool = False, traceparent: str = ""
) -> tuple[pb.Job, pb.Evaluation]:
    """Stop the job (a new, stopped version) or purge it; either way a
    deregister eval makes the scheduler stop its allocs."""
    current = await tx.get_job(namespace, job_id)
    if current is None:
        raise NotFound(f"job {job_id!r} not found")
    if purge:
        events = await tx.get_scaling_events(namespace, job_id)
        tx.delete_job(current)
        tx.delete_periodic_launch(namespace, job_id)
        scaling_writes.purge(tx, current, events)
        job = current
    else:
        job = copy_msg(current)
        job.stop = True
        job.version = current.version + 1
        job.ClearField("version_tag")  # the tag stays on the version it names
        job.job_modify_index = tx.index
        job.status = JobStatus.DEAD if current.status == JobStatus.PENDING else current.status
        if _launches_children(job):
            job.status = JobStatus.DEAD
        tx.put_job(job, EventType.JOB_DEREGISTERED)
    ev = new_eval(job, Trigger.JOB_DEREGISTER, traceparent=traceparent)
    ev.job_modify_index = tx.index
    tx.put_eval(ev)
    return job, ev


async def refresh_job_status(
    tx: WriteTx, namespace: str, job_id: str, *, index: int | None = None
) -> None:
    """Nomad's job status: `dead` once a stopped job has nothing left
    running, or a batch/sysbatch job's allocs have all finished with no
    eval still pending or blocked; `running` while allocs run; else pending."""
    job = await tx.get_job(namespace, job_id)
    if job is None:
        return
    allocs, live = await tx.job_alloc_counts(namespace, job_id)
    if _launches_children(job):
        status = JobStatus.DEAD if job.stop else JobStatus.RUNNING
    elif job.stop:
        status = JobStatus.DEAD if not live else JobStatus.RUNNING
    elif live:
        status = JobStatus.RUNNING
    elif (
        job.type in (JobType.BATCH, JobType.SYSBATCH)
        and allocs
        and not await tx.job_has_evals_in(
            namespace, job_id, (EvalStatus.PENDING, EvalStatus.BLOCKED)
        )
    ):
        status = JobStatus.DEAD
    else:
        status = job.status if allocs else JobStatus.PENDING
    if status != job.status:
        job = copy_msg(job)
        job.status = status
        tx.put_job(job, EventType.JOB_STATUS_UPDATED, index=index)
