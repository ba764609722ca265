"""Builds the scheduler for an evaluation's type (Nomad's
`scheduler.NewScheduler`). Kept apart from `interfaces`, which every
scheduler imports, so the package has no import circle."""

from __future__ import annotations

import logging
from collections.abc import Callable

from corral.domain.store import StateSnapshot
from corral.domain.structs import JobType
from services.worker.scheduler.core_sched import CoreScheduler, GCConfig
from services.worker.scheduler.feasible.inflight import InFlightPlacements
from services.worker.scheduler.generic_sched import GenericScheduler
from services.worker.scheduler.interfaces import Planner, Scheduler, SchedulerError
from services.worker.scheduler.system_sched import SystemScheduler

SchedulerFactory = Callable[[StateSnapshot, Planner, logging.Logger], Scheduler]


def new_scheduler(
    sched_type: str,
    snapshot: StateSnapshot,
    planner: Planner,
    *,
    log: logging.Logger | None = None,
    gc_config: GCConfig | None = None,
    inflight: InFlightPlacements | None = None,
) -> Scheduler:
    """The scheduler for an eval type: service, batch, system, sysbatch or
    `_core` (whose GC thresholds `gc_config` overrides). Unknown types raise
    `SchedulerError` (the worker nacks). `inflight` is the worker process's
    registry of its loops' placements (feasible/inflight.py); without it an
    eval sees only its snapshot, as Nomad's do."""
    logger = log or logging.getLogger("corral.scheduler")
    if sched_type == JobType.SERVICE:
        return GenericScheduler(snapshot, planner, logger, batch=False, inflight=inflight)
    if sched_type == JobType.BATCH:
        return GenericScheduler(snapshot, planner, logger, batch=True, inflight=inflight)
    if sched_type == JobType.SYSTEM:
        return SystemScheduler(snapshot, planner, logger, batch=False, inflight=inflight)
    if sched_type == JobType.SYSBATCH:
        return SystemScheduler(snapshot, planner, logger, batch=True, inflight=inflight)
    if sched_type == JobType.CORE:
        return CoreScheduler(snapshot, planner, logger, gc_config)
    raise SchedulerError(f"unknown scheduler type {sched_type!r}")
