"""Worker settings, with Nomad's defaults (nomad-semantics.md §3)."""

from __future__ import annotations

import os
from typing import Annotated, ClassVar, Literal

from pydantic import Field, field_validator

from corral.domain.errors import InvalidArgument
from corral.domain.structs import SCHEDULER_VERSION, SECOND, JobType
from corral.runtime.settings import CommaList, Option, ServerSettings, SettingsGroup, StateAddr
from services.worker.scheduler.core_sched import GCConfig
from services.worker.scheduler.limits import DEFAULT_MAX_PLACEMENTS

#: loops beyond the core count still pay off: a loop waiting on a plan commit
#: or a dequeue holds no CPU (Nomad caps at NumCPU; Python overlaps the waits)
MAX_SCHEDULERS = 64


#: loops per core by default: a loop spends most of an eval waiting for its
#: plan to commit and its eval update to be written (measured by bench W1 on
#: 2 cores: 4 loops 152 placements/s, 16 loops 223/s, 32 loops 219/s)
LOOPS_PER_CORE = 8
DEFAULT_MAX_LOOPS = 16


def default_num_schedulers() -> int:
    """Nomad runs one loop per core; ours default to more (see above)."""
    return min(DEFAULT_MAX_LOOPS, (os.cpu_count() or 1) * LOOPS_PER_CORE)


class GCSettings(SettingsGroup):
    """Nomad's server GC thresholds: how old a terminal object must be before
    the core scheduler collects it. They live with the worker because its
    core scheduler applies them; the broker leader's `--core-gc-interval`
    says how often a collection runs. `corral system gc` ignores them all
    (Nomad's force GC)."""

    eval_gc_threshold: float = Field(
        3600.0, ge=0, description="seconds before a terminal eval and its allocs are collected"
    )
    batch_eval_gc_threshold: float = Field(
        86400.0,
        ge=0,
        description="seconds before a terminal eval of a batch job and its allocs are collected",
    )
    job_gc_threshold: float = Field(
        14400.0,
        ge=0,
        description="seconds before a stopped or dead job (with its evals, allocs and "
        "deployments) is collected",
    )
    deployment_gc_threshold: float = Field(
        3600.0, ge=0, description="seconds before an ended deployment is collected"
    )
    node_gc_threshold: float = Field(
        86400.0, ge=0, description="seconds before a down node with no live alloc is collected"
    )

    def config(self) -> GCConfig:
        """The thresholds as the core scheduler takes them (nanoseconds)."""
        return GCConfig(
            eval_gc_threshold=int(self.eval_gc_threshold * SECOND),
            batch_eval_gc_threshold=int(self.batch_eval_gc_threshold * SECOND),
            job_gc_threshold=int(self.job_gc_threshold * SECOND),
            deployment_gc_threshold=int(self.deployment_gc_threshold * SECOND),
            node_gc_threshold=int(self.node_gc_threshold * SECOND),
        )


class WorkerSettings(ServerSettings):
    """A worker process: scheduler loops sharing one replica (the pool and its
    loops read these settings too)."""

    ROLE: ClassVar[str] = "worker"

    state_addr: StateAddr
    broker_addrs: Annotated[CommaList, Option(flag="--broker-addr", env="CORRAL_BROKER_ADDR")] = (
        Field(min_length=1, description="broker address(es), comma-separated")
    )
    planner_addrs: Annotated[
        CommaList, Option(flag="--planner-addr", env="CORRAL_PLANNER_ADDR")
    ] = Field(min_length=1, description="planner address(es), comma-separated")
    num_schedulers: Annotated[
        int, Option(shown_default=f"{LOOPS_PER_CORE} per core, at most {DEFAULT_MAX_LOOPS}")
    ] = Field(
        default_factory=default_num_schedulers,
        ge=0,
        le=MAX_SCHEDULERS,
        description="scheduler loops in this process",
    )
    enabled_schedulers: Annotated[
        CommaList, Option(flag="--schedulers", env="CORRAL_WORKER_SCHEDULERS")
    ] = Field(
        default_factory=lambda: list(JobType.ALL),
        min_length=1,
        description="enabled scheduler types, comma-separated (must include _core)",
    )
    scheduler_version: int = Field(
        SCHEDULER_VERSION, ge=0, description="scheduler version sent on dequeue (rolling upgrades)"
    )
    dequeue_timeout: float = Field(0.5, gt=0, description="long-poll of one Eval.Dequeue (s)")
    sync_limit: float = Field(
        5.0,
        gt=0,
        description="seconds to wait for the replica to reach an eval's wait index before "
        "nacking it (Nomad's raftSyncLimit)",
    )
    slow_catchup: float = Field(
        50.0,
        ge=0,
        description="seconds to keep waiting after that nack, ending early once the replica "
        "catches up (Nomad's long backoff, 10 x the sync limit)",
    )
    backoff_fast: float = Field(0.02, ge=0, description="first backoff (s) after a dequeue error")
    backoff_slow: float = Field(
        0.5, ge=0, description="base of the exponential backoff (s) between plan submit retries"
    )
    backoff_limit: float = Field(
        10.0, gt=0, description="longest backoff (s) after dequeue errors and between retries"
    )
    version_mismatch_backoff: float = Field(
        30.0,
        ge=0,
        description="pause (s) after the broker refused this worker's scheduler version",
    )
    plan_retry_limit: float = Field(
        30.0,
        ge=0,
        description="bound (s) on one plan submit retrying a transient error (no leader, "
        "UNAVAILABLE)",
    )
    max_placements_per_eval: int = Field(
        DEFAULT_MAX_PLACEMENTS,
        ge=1,
        description="placements one evaluation may materialise; an eval asking for more "
        "fails with a description instead of exhausting the worker (docs/scheduler.md)",
    )
    heartbeat_interval: float = Field(
        1.0,
        gt=0,
        description="seconds between the worker's lease heartbeats to the broker (sent "
        "whatever the scheduler loops are doing; the broker's lease ttl is 5 s by default)",
    )
    gc: GCSettings = Field(default_factory=GCSettings)
    fault: Literal["", "stall-before-ack", "busy-scheduler"] = Field(
        "",
        description="test-only fault injection: stall-before-ack (hang between the plan and "
        "the outcome, which carries the ack), busy-scheduler (spin the CPU for 8 s in the "
        "scheduler thread first)",
    )

    @field_validator("enabled_schedulers")
    @classmethod
    def _known_schedulers(cls, value: list[str]) -> list[str]:
        """The pool's own rule (Worker.SetConfig applies it too), checked
        here so a bad flag is a usage error, not a crash at start."""
        try:
            validate_config(0, value)
        except InvalidArgument as exc:
            raise ValueError(str(exc).partition(": ")[2]) from None
        return value


def validate_config(num: int, enabled: list[str]) -> None:
    """The pool's rule for its loops (at start and on Worker.SetConfig)."""
    if not 0 <= num <= MAX_SCHEDULERS:
        raise InvalidArgument("num_schedulers", f"must be between 0 and {MAX_SCHEDULERS}")
    if not enabled:
        raise InvalidArgument("enabled_schedulers", "must not be empty")
    unknown = [s for s in enabled if s not in JobType.ALL]
    if unknown:
        raise InvalidArgument(
            "enabled_schedulers", f"unknown scheduler type(s): {', '.join(unknown)}"
        )
    if JobType.CORE not in enabled:
        raise InvalidArgument(
            "enabled_schedulers", f"must include {JobType.CORE!r} (garbage collection)"
        )
