"""Nomad's defaults for a parsed job (its api `Canonicalize`), applied by the
CLI so `job plan` and `job inspect` show what will really run.

Only fields the user left unset are filled: a job file that sets a policy
field keeps it, and the rest of that policy comes from the defaults for the
job's type (Nomad merges the same way)."""

from __future__ import annotations

from typing import Any

from corral.domain import artifacts, identity, scaling, services
from corral.domain.lifecycle import default_log_config
from corral.domain.structs import JobType
from corral.domain.template import block as template_block
from corral.v1 import structs_pb2 as pb

SECOND = 1_000_000_000
MINUTE = 60 * SECOND
HOUR = 60 * MINUTE

DEFAULT_PRIORITY = 50
DEFAULT_NAMESPACE = "default"
DEFAULT_DATACENTERS = ("*",)
DEFAULT_CPU_MHZ = 100
DEFAULT_MEMORY_MB = 300
DEFAULT_DISK_MB = 300
DEFAULT_KILL_TIMEOUT = 5 * SECOND


def restart_defaults(job_type: str) -> pb.RestartPolicy:
    """Service/system tasks restart twice in 30 minutes; batch ones three
    times a day; both wait 15 s between restarts and then fail."""
    if job_type in (JobType.BATCH, JobType.SYSBATCH):
        return pb.RestartPolicy(attempts=3, interval=24 * HOUR, delay=15 * SECOND, mode="fail")
    return pb.RestartPolicy(attempts=2, interval=30 * MINUTE, delay=15 * SECOND, mode="fail")


def reschedule_defaults(job_type: str) -> pb.ReschedulePolicy | None:
    """Service: unlimited, exponential from 30 s up to 1 h. Batch: once a day
    after 5 s. System and sysbatch jobs are never rescheduled."""
    if job_type == JobType.SERVICE:
        return pb.ReschedulePolicy(
            delay=30 * SECOND, delay_function="exponential", max_delay=HOUR, unlimited=True
        )
    if job_type == JobType.BATCH:
        return pb.ReschedulePolicy(
            attempts=1, interval=24 * HOUR, delay=5 * SECOND, delay_function="constant"
        )
    return None


def update_defaults() -> pb.UpdateStrategy:
    """What an `update {}` block means when it leaves fields out."""
    return pb.UpdateStrategy(
        stagger=30 * SECOND,
        max_parallel=1,
        health_check="checks",
        min_healthy_time=10 * SECOND,
        healthy_deadline=5 * MINUTE,
        progress_deadline=10 * MINUTE,
    )


def migrate_defaults() -> pb.MigrateStrategy:
    return pb.MigrateStrategy(
        max_parallel=1,
        health_check="checks",
        min_healthy_time=10 * SECOND,
        healthy_deadline=5 * MINUTE,
    )


def _merge(
    base: pb.RestartPolicy | pb.ReschedulePolicy | pb.UpdateStrategy | pb.MigrateStrategy,
    override: object,
    set_fields: set[str],
) -> None:
    """Copy the fields named in `set_fields` from `override` onto `base`."""
    for name in set_fields:
        setattr(base, name, getattr(override, name))


def canonicalize(job: pb.Job, explicit: dict[str, set[str]] | None = None) -> None:
    """Fill unset fields of `job` (a fresh message, modified in place).

    `explicit` maps a policy's proto path ("job.task_groups[0].restart_policy")
    to the fields the job file set, so zero values the user wrote ("attempts
    = 0") are kept rather than mistaken for "unset". Without it, any non-zero
    field counts as set (JSON input)."""
    explicit = explicit or {}
    if not job.type:
        job.type = JobType.SERVICE
    if not job.namespace:
        job.namespace = DEFAULT_NAMESPACE
    if not job.name:
        job.name = job.id
    if job.priority == 0 and "job.priority" not in explicit:
        job.priority = DEFAULT_PRIORITY
    if not job.datacenters:
        job.datacenters.extend(DEFAULT_DATACENTERS)
    # an empty node_pool takes the namespace's default pool on the server
    if job.HasField("periodic") and "job.periodic.enabled" not in explicit:
        job.periodic.enabled = True
    if job.HasField("parameterized") and not job.parameterized.payload:
        job.parameterized.payload = "optional"

    for gi, tg in enumerate(job.task_groups):
        gpath = f"job.task_groups[{gi}]"
        if tg.count == 0 and f"{gpath}.count" not in explicit:
            # Nomad: a group without a count starts at its scaling minimum
            has_min = tg.HasField("scaling") and tg.scaling.HasField("min")
            tg.count = tg.scaling.min if has_min else 1
        _policy(
            tg, "restart_policy", restart_defaults(job.type), f"{gpath}.restart_policy", explicit
        )
        resched = reschedule_defaults(job.type)
        if resched is not None:
            _policy(tg, "reschedule_policy", resched, f"{gpath}.reschedule_policy", explicit)
        if job.HasField("update") and not tg.HasField("update"):
            tg.update.CopyFrom(job.update)
        if tg.HasField("update"):
            _policy(tg, "update", update_defaults(), f"{gpath}.update", explicit)
        if job.type == JobType.SERVICE:
            _policy(tg, "migrate", migrate_defaults(), f"{gpath}.migrate", explicit)
        if tg.ephemeral_disk.size_mb == 0:
            tg.ephemeral_disk.size_mb = DEFAULT_DISK_MB
        # The seed-era fields and the disconnect block describe the same thing.
        if tg.HasField("max_client_disconnect") and tg.disconnect.lost_after == 0:
            tg.disconnect.lost_after = tg.max_client_disconnect
        if tg.HasField("stop_after_client_disconnect") and tg.disconnect.stop_on_client_after == 0:
            tg.disconnect.stop_on_client_after = tg.stop_after_client_disconnect
        for ti, task in enumerate(tg.tasks):
            tpath = f"{gpath}.tasks[{ti}]"
            if task.resources.cpu == 0 and task.resources.cores == 0:
                task.resources.cpu = DEFAULT_CPU_MHZ
            if task.resources.memory_mb == 0:
                task.resources.memory_mb = DEFAULT_MEMORY_MB
            if task.kill_timeout == 0 and f"{tpath}.kill_timeout" not in explicit:
                task.kill_timeout = DEFAULT_KILL_TIMEOUT
            default_log_config(task)
            identity.canonicalize(task)
            template_block.canonicalize(task, explicit, tpath)
            if task.HasField("restart_policy"):
                _policy(
                    task, "restart_policy", tg.restart_policy, f"{tpath}.restart_policy", explicit
                )
            for artifact in task.artifacts:
                artifacts.canonicalize(artifact)
    services.canonicalize(job)
    scaling.canonicalize(job)


def _policy(
    owner: pb.TaskGroup | pb.Task,
    name: str,
    default: pb.RestartPolicy | pb.ReschedulePolicy | pb.UpdateStrategy | pb.MigrateStrategy,
    path: str,
    explicit: dict[str, set[str]],
) -> None:
    current = getattr(owner, name)
    if path in explicit:
        chosen = explicit[path]
    elif owner.HasField(name):  # type: ignore[arg-type]
        chosen = {f.name for f, _ in current.ListFields()}
    else:
        chosen = set()
    merged: Any = type(default)()
    merged.CopyFrom(default)
    _merge(merged, current, chosen)
    current.CopyFrom(merged)
