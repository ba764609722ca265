"""An eval that would materialise more placements than the worker's limit
fails with a description, before reconciling (services/worker/scheduler/
limits.py): nothing is placed, no blocked eval is created, and the
scheduler never builds the oversized placement list."""

from __future__ import annotations

import logging

from corral.domain.structs import EvalStatus, Trigger
from corral.testing import mock
from corral.testing.harness import Harness
from corral.v1 import structs_pb2 as pb
from services.worker.scheduler import limits
from services.worker.scheduler.generic_sched import GenericScheduler
from services.worker.scheduler.system_sched import SystemScheduler
from tests.unit.scheduler.test_generic_sched import cluster, register

LOG = logging.getLogger("test")


def _eval(h: Harness, job: pb.Job) -> pb.Evaluation:
    ev = mock.eval_for(job, triggered_by=Trigger.JOB_REGISTER)
    h.upsert_evals(ev)
    return ev


def test_generic_eval_over_the_limit_fails_without_placing() -> None:
    h, _ = cluster(3)
    # far beyond anything a worker could build: the check must come first
    job = register(h, mock.job(count=2_000_000_000))
    ev = _eval(h, job)
    GenericScheduler(h.store.snapshot(), h, LOG, batch=False, max_placements=100).process(ev)
    assert h.plans == []
    assert h.create_evals == []
    (update,) = h.evals
    assert update.status == EvalStatus.FAILED
    assert "2000000000 placements" in update.status_description
    assert "limit of 100" in update.status_description


def test_generic_eval_at_the_limit_places_everything() -> None:
    h, _ = cluster(3)
    job = register(h, mock.job(count=5))
    ev = _eval(h, job)
    GenericScheduler(h.store.snapshot(), h, LOG, batch=False, max_placements=5).process(ev)
    assert h.evals[-1].status == EvalStatus.COMPLETE
    assert sum(len(v.allocs) for v in h.plans[0].node_allocation.values()) == 5


def test_stopping_a_job_is_never_limited() -> None:
    h, _ = cluster(3)
    job = register(h, mock.job(count=1_000))
    job.stop = True
    job = register(h, job)
    ev = _eval(h, job)
    GenericScheduler(h.store.snapshot(), h, LOG, batch=False, max_placements=10).process(ev)
    assert h.evals[-1].status == EvalStatus.COMPLETE


def test_system_eval_counts_placements_across_ready_nodes() -> None:
    h, _ = cluster(6)
    job = register(h, mock.system_job())
    ev = _eval(h, job)
    SystemScheduler(h.store.snapshot(), h, LOG, batch=False, max_placements=5).process(ev)
    assert h.plans == []
    assert h.evals[-1].status == EvalStatus.FAILED
    assert "6 placements" in h.evals[-1].status_description
    ev = _eval(h, job)
    SystemScheduler(h.store.snapshot(), h, LOG, batch=False, max_placements=6).process(ev)
    assert h.evals[-1].status == EvalStatus.COMPLETE


def test_configured_limit_reaches_every_new_scheduler() -> None:
    try:
        limits.configure(7)
        h, _ = cluster(2)
        job = register(h, mock.job(count=8))
        h.process(job.type, mock.eval_for(job, triggered_by=Trigger.JOB_REGISTER))
        assert h.evals[-1].status == EvalStatus.FAILED
        assert "limit of 7" in h.evals[-1].status_description
    finally:
        limits.configure(limits.DEFAULT_MAX_PLACEMENTS)
