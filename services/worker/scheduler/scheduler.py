"""The scheduler contract: what a worker hands a scheduler and what a
scheduler may call back (Nomad's `scheduler/scheduler.go`).

A scheduler turns one evaluation plus one immutable snapshot into at most a
few plans, submitted through a `Planner`. It never writes state itself and
never stamps index fields: the worker's `Planner` stamps `snapshot_index` on
plans and evals, exactly as Nomad's worker does. Everything here is
synchronous; the worker runs schedulers in a thread or process of its own.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from corral.store import StateSnapshot
from corral.structs import JobType
from corral.v1 import structs_pb2 as pb

if TYPE_CHECKING:
    from services.worker.scheduler.core_sched import GCConfig


class SchedulerError(Exception):
    """An evaluation could not be processed; the worker nacks it so the
    broker redelivers it later (Nomad returns an error from Process)."""


@runtime_checkable
class Planner(Protocol):
    """The scheduler's only way to change the world (Nomad's `Planner`)."""

    def submit_plan(self, plan: pb.Plan) -> tuple[pb.PlanResult, StateSnapshot | None]:
        """Submit a plan for evaluation and commit. Returns the result and,
        when `result.refresh_index != 0` (part of the plan was rejected), a
        snapshot at an index >= refresh_index so the scheduler can retry on
        fresher state."""
        ...

    def update_eval(self, ev: pb.Evaluation) -> None:
        """Write the final status of the evaluation being processed."""
        ...

    def create_eval(self, ev: pb.Evaluation) -> None:
        """Create a follow-up or blocked evaluation."""
        ...

    def reblock_eval(self, ev: pb.Evaluation) -> None:
        """Put a blocked evaluation that still cannot place back into the
        blocked tracker without changing its status."""
        ...


@runtime_checkable
class CorePlanner(Planner, Protocol):
    """A planner that can also delete garbage (used by the `_core` GC
    scheduler only). Deletions are writes through the state service."""

    def delete_evals(self, eval_ids: Sequence[str], alloc_ids: Sequence[str]) -> None:
        """Delete terminal evals and the terminal allocs that hang off them."""
        ...

    def delete_jobs(self, jobs: Sequence[tuple[str, str]]) -> None:
        """Delete dead jobs by (namespace, job id), with all their versions."""
        ...

    def delete_nodes(self, node_ids: Sequence[str]) -> None:
        """Delete nodes that have been down past the threshold."""
        ...


@runtime_checkable
class Scheduler(Protocol):
    def process(self, ev: pb.Evaluation) -> None:
        """Process one evaluation; raises `SchedulerError` to ask for a nack."""
        ...


SchedulerFactory = Callable[[StateSnapshot, Planner, logging.Logger], Scheduler]


def new_scheduler(
    sched_type: str,
    snapshot: StateSnapshot,
    planner: Planner,
    *,
    log: logging.Logger | None = None,
    gc_config: GCConfig | None = None,
) -> Scheduler:
    """The scheduler for an eval type: service, batch, system, sysbatch or
    `_core` (whose GC thresholds `gc_config` overrides). Unknown types raise
    `SchedulerError` (the worker nacks)."""
    # Imported here: the concrete schedulers import this module.
    from services.worker.scheduler.core_sched import CoreScheduler
    from services.worker.scheduler.generic_sched import GenericScheduler
    from services.worker.scheduler.system_sched import SystemScheduler

    logger = log or logging.getLogger("corral.scheduler")
    if sched_type == JobType.SERVICE:
        return GenericScheduler(snapshot, planner, logger, batch=False)
    if sched_type == JobType.BATCH:
        return GenericScheduler(snapshot, planner, logger, batch=True)
    if sched_type == JobType.SYSTEM:
        return SystemScheduler(snapshot, planner, logger, sysbatch=False)
    if sched_type == JobType.SYSBATCH:
        return SystemScheduler(snapshot, planner, logger, sysbatch=True)
    if sched_type == JobType.CORE:
        return CoreScheduler(snapshot, planner, logger, gc_config)
    raise SchedulerError(f"unknown scheduler type {sched_type!r}")
