"""The `_core` GC scheduler: terminal evals and their allocs, dead jobs and
down nodes older than their thresholds are deleted (Nomad's
core_sched_test.go)."""

from __future__ import annotations

import logging

import pytest

from corral.domain import structs
from corral.domain.structs import (
    HOUR,
    MINUTE,
    ClientStatus,
    DesiredStatus,
    EvalStatus,
    JobStatus,
    NodeStatus,
)
from corral.testing import mock
from corral.testing.harness import Harness
from corral.v1 import structs_pb2 as pb
from services.worker.scheduler.core_sched import (
    CORE_JOB_DEPLOYMENT_GC,
    CORE_JOB_EVAL_GC,
    CORE_JOB_FORCE_GC,
    CORE_JOB_JOB_GC,
    CORE_JOB_NODE_GC,
    CoreScheduler,
    GCConfig,
    core_eval,
)
from services.worker.scheduler.interfaces import SchedulerError

NOW = 1_700_000_000 * structs.SECOND
LOG = logging.getLogger("test")


def run(h: Harness, kind: str, config: GCConfig | None = None) -> None:
    CoreScheduler(h.snapshot(), h, LOG, config, now=NOW).process(core_eval(kind))


def old_eval(job: pb.Job, *, age: int, status: str = EvalStatus.COMPLETE) -> pb.Evaluation:
    ev = mock.eval_for(job, status=status)
    ev.modify_time = NOW - age
    return ev


def alloc_for(job, ev, *, age: int, client=ClientStatus.COMPLETE, desired=DesiredStatus.RUN):
    a = mock.alloc(job, mock.node(), client_status=client, desired_status=desired, eval_id=ev.id)
    a.modify_time = NOW - age
    return a


def test_eval_gc_collects_old_terminal_eval_and_allocs():
    h = Harness(now=NOW)
    job = mock.job()
    h.upsert_jobs(job)
    ev = old_eval(job, age=2 * HOUR)
    a = alloc_for(job, ev, age=2 * HOUR, desired=DesiredStatus.STOP)
    h.store.apply(
        pb.ChangeBatch(
            index=h.next_index(),
            events=[
                pb.Event(topic="Evaluation", evaluation=ev),
                pb.Event(topic="Allocation", allocation=a),
            ],
        )
    )
    run(h, CORE_JOB_EVAL_GC)
    assert h.deleted_evals == [ev.id]
    assert h.deleted_allocs == [a.id]
    assert h.snapshot().eval_by_id(ev.id) is None
    assert h.snapshot().alloc_by_id(a.id) is None


def _put(h: Harness, *objs) -> None:
    events = []
    for o in objs:
        if isinstance(o, pb.Evaluation):
            events.append(pb.Event(topic="Evaluation", evaluation=o))
        elif isinstance(o, pb.Allocation):
            events.append(pb.Event(topic="Allocation", allocation=o))
        elif isinstance(o, pb.Node):
            events.append(pb.Event(topic="Node", node=o))
        elif isinstance(o, pb.Job):
            events.append(pb.Event(topic="Job", job=o))
    h.store.apply(pb.ChangeBatch(index=h.next_index(), events=events))


@pytest.mark.parametrize(
    ("status", "age", "collected"),
    [
        (EvalStatus.COMPLETE, 2 * HOUR, True),
        (EvalStatus.FAILED, 2 * HOUR, True),
        (EvalStatus.CANCELED, 2 * HOUR, True),
        (EvalStatus.COMPLETE, 10 * MINUTE, False),
        (EvalStatus.PENDING, 2 * HOUR, False),
        (EvalStatus.BLOCKED, 2 * HOUR, False),
    ],
)
def test_eval_gc_threshold_and_status(status, age, collected):
    h = Harness(now=NOW)
    job = mock.job()
    ev = old_eval(job, age=age, status=status)
    _put(h, job, ev)
    run(h, CORE_JOB_EVAL_GC)
    assert (h.deleted_evals == [ev.id]) is collected


def test_eval_gc_keeps_eval_with_running_alloc():
    h = Harness(now=NOW)
    job = mock.job()
    ev = old_eval(job, age=2 * HOUR)
    live = alloc_for(job, ev, age=2 * HOUR, client=ClientStatus.RUNNING)
    done = alloc_for(job, ev, age=2 * HOUR, desired=DesiredStatus.STOP)
    _put(h, job, ev, live, done)
    run(h, CORE_JOB_EVAL_GC)
    assert h.deleted_evals == []
    assert h.deleted_allocs == [done.id]


def test_eval_gc_keeps_failed_alloc_that_may_still_reschedule():
    h = Harness(now=NOW)
    job = mock.job()  # service: unlimited reschedules
    ev = old_eval(job, age=2 * HOUR)
    failed = alloc_for(job, ev, age=2 * HOUR, client=ClientStatus.FAILED)
    _put(h, job, ev, failed)
    run(h, CORE_JOB_EVAL_GC)
    assert h.deleted_evals == [] and h.deleted_allocs == []


def test_eval_gc_failed_alloc_with_replacement_goes():
    h = Harness(now=NOW)
    job = mock.job()
    ev = old_eval(job, age=2 * HOUR)
    failed = alloc_for(job, ev, age=2 * HOUR, client=ClientStatus.FAILED)
    failed.next_allocation = "replacement"
    _put(h, job, ev, failed)
    run(h, CORE_JOB_EVAL_GC)
    assert h.deleted_evals == [ev.id]


def test_batch_eval_uses_longer_threshold_and_keeps_live_job_allocs():
    h = Harness(now=NOW)
    job = mock.batch_job()
    job.status = JobStatus.RUNNING
    ev = old_eval(job, age=2 * HOUR)
    ev.type = "batch"
    a = alloc_for(job, ev, age=2 * HOUR)
    _put(h, job, ev, a)
    run(h, CORE_JOB_EVAL_GC)
    assert h.deleted_evals == []  # younger than 24 h

    h2 = Harness(now=NOW)
    ev.modify_time = NOW - 30 * HOUR
    a.modify_time = NOW - 30 * HOUR
    a.create_index = 1  # placed for the current version
    job.job_modify_index = 1
    _put(h2, job, ev, a)
    run(h2, CORE_JOB_EVAL_GC)
    # the job is still running: its completed allocs stay so they are not re-run
    assert h2.deleted_evals == [] and h2.deleted_allocs == []


def test_batch_eval_of_dead_stopped_job_is_collected():
    h = Harness(now=NOW)
    job = mock.batch_job()
    job.status = JobStatus.DEAD
    job.stop = True
    ev = old_eval(job, age=30 * HOUR)
    ev.type = "batch"
    a = alloc_for(job, ev, age=30 * HOUR)
    _put(h, job, ev, a)
    run(h, CORE_JOB_EVAL_GC)
    assert h.deleted_evals == [ev.id] and h.deleted_allocs == [a.id]


def test_job_gc_collects_dead_job_with_its_evals_and_allocs():
    h = Harness(now=NOW)
    job = mock.batch_job()
    job.status = JobStatus.DEAD
    job.submit_time = NOW - 5 * HOUR
    ev = old_eval(job, age=5 * HOUR)
    ev.type = "batch"
    a = alloc_for(job, ev, age=5 * HOUR)
    _put(h, job, ev, a)
    run(h, CORE_JOB_JOB_GC)
    assert h.deleted_jobs == [(job.namespace, job.id)]
    assert h.deleted_evals == [ev.id]
    assert h.deleted_allocs == [a.id]
    assert h.snapshot().job_by_id(job.namespace, job.id) is None


def test_job_gc_keeps_running_job_and_young_dead_job():
    h = Harness(now=NOW)
    running = mock.job()
    running.status = JobStatus.RUNNING
    running.submit_time = NOW - 10 * HOUR
    young = mock.job()
    young.status = JobStatus.DEAD
    young.submit_time = NOW - HOUR
    _put(h, running, young)
    run(h, CORE_JOB_JOB_GC)
    assert h.deleted_jobs == []


def test_job_gc_keeps_dead_job_with_pending_eval():
    h = Harness(now=NOW)
    job = mock.job()
    job.stop = True
    job.status = JobStatus.DEAD
    job.submit_time = NOW - 10 * HOUR
    ev = old_eval(job, age=10 * HOUR, status=EvalStatus.PENDING)
    _put(h, job, ev)
    run(h, CORE_JOB_JOB_GC)
    assert h.deleted_jobs == []


def test_job_gc_skips_periodic_parent():
    h = Harness(now=NOW)
    job = mock.batch_job()
    job.periodic.enabled = True
    job.status = JobStatus.DEAD
    job.submit_time = NOW - 10 * HOUR
    _put(h, job)
    run(h, CORE_JOB_JOB_GC)
    assert h.deleted_jobs == []


def test_node_gc_collects_old_down_node_without_live_allocs():
    h = Harness(now=NOW)
    down = mock.node(status=NodeStatus.DOWN)
    down.status_updated_at = NOW - 25 * HOUR
    busy = mock.node(status=NodeStatus.DOWN)
    busy.status_updated_at = NOW - 25 * HOUR
    recent = mock.node(status=NodeStatus.DOWN)
    recent.status_updated_at = NOW - HOUR
    ready = mock.node()
    ready.status_updated_at = NOW - 25 * HOUR
    job = mock.job()
    live = mock.alloc(job, busy)
    dead = mock.alloc(job, down, client_status=ClientStatus.LOST, desired_status=DesiredStatus.STOP)
    _put(h, down, busy, recent, ready, live, dead)
    run(h, CORE_JOB_NODE_GC)
    assert h.deleted_nodes == [down.id]


def test_force_gc_ignores_thresholds():
    h = Harness(now=NOW)
    job = mock.job()
    job.stop = True
    job.status = JobStatus.DEAD
    job.submit_time = NOW - 1
    ev = old_eval(job, age=1)
    down = mock.node(status=NodeStatus.DOWN)
    down.status_updated_at = NOW - 1
    _put(h, job, ev, down)
    run(h, CORE_JOB_FORCE_GC)
    assert h.deleted_jobs == [(job.namespace, job.id)]
    assert ev.id in h.deleted_evals
    assert h.deleted_nodes == [down.id]


def test_custom_thresholds():
    h = Harness(now=NOW)
    job = mock.job()
    ev = old_eval(job, age=10 * MINUTE)
    _put(h, job, ev)
    run(h, CORE_JOB_EVAL_GC, GCConfig(eval_gc_threshold=5 * MINUTE))
    assert h.deleted_evals == [ev.id]


def test_unknown_core_job_is_an_error():
    h = Harness(now=NOW)
    with pytest.raises(SchedulerError):
        run(h, "bogus-gc")


def test_core_scheduler_needs_a_deleting_planner():
    class PlainPlanner:
        def submit_plan(self, plan):
            raise AssertionError

        def update_eval(self, ev):
            pass

        def create_eval(self, ev):
            pass

        def reblock_eval(self, ev):
            pass

    h = Harness(now=NOW)
    job = mock.job()
    _put(h, job, old_eval(job, age=2 * HOUR))
    with pytest.raises(SchedulerError):
        CoreScheduler(h.snapshot(), PlainPlanner(), LOG, now=NOW).process(
            core_eval(CORE_JOB_EVAL_GC)
        )


def test_new_scheduler_passes_gc_config():
    from services.worker.scheduler.factory import new_scheduler

    h = Harness()
    job = mock.job()
    ev = mock.eval_for(job, status=EvalStatus.COMPLETE)
    ev.modify_time = structs.now_ns() - 10 * MINUTE
    _put(h, job, ev)
    new_scheduler("_core", h.snapshot(), h).process(core_eval(CORE_JOB_EVAL_GC))
    assert h.deleted_evals == []
    cfg = GCConfig(eval_gc_threshold=MINUTE)
    new_scheduler("_core", h.snapshot(), h, gc_config=cfg).process(core_eval(CORE_JOB_EVAL_GC))
    assert h.deleted_evals == [ev.id]


def _deployment(job: pb.Job, status: str, *, age: int) -> pb.Deployment:
    d = pb.Deployment(
        id=structs.new_id(),
        namespace=job.namespace,
        job_id=job.id,
        job_version=job.version,
        status=status,
        modify_time=NOW - age,
    )
    d.task_groups["web"].desired_total = 1
    return d


def test_deployment_gc_collects_old_ended_deployments_no_live_alloc_uses():
    h = Harness(now=NOW)
    job = mock.job(count=1)
    h.upsert_jobs(job)
    old = _deployment(job, "successful", age=2 * HOUR)
    young = _deployment(job, "failed", age=10 * MINUTE)
    running = _deployment(job, "running", age=2 * HOUR)
    in_use = _deployment(job, "successful", age=2 * HOUR)
    h.upsert_deployments(old, young, running, in_use)
    a = mock.alloc(job, mock.node())
    a.deployment_id = in_use.id
    h.upsert_allocs(a)
    run(h, CORE_JOB_DEPLOYMENT_GC)
    assert h.deleted_deployments == [old.id]
    assert h.snapshot().deployment_by_id(old.id) is None
    run(h, CORE_JOB_FORCE_GC)  # no age threshold; still not the active or the used one
    assert sorted(h.deleted_deployments) == sorted([old.id, young.id])


def test_job_gc_takes_the_job_deployments_along():
    h = Harness(now=NOW)
    job = mock.job(count=1)
    job.stop = True
    job.submit_time = NOW - 5 * HOUR
    h.upsert_jobs(job)
    d = _deployment(job, "cancelled", age=10 * MINUTE)
    h.upsert_deployments(d)
    run(h, CORE_JOB_JOB_GC)
    assert h.deleted_jobs == [(job.namespace, job.id)]
    assert h.deleted_deployments == [d.id]


# ---------------------------------------------------------------- purged jobs (issue 19)


def test_a_purged_jobs_evals_and_allocs_go_once_terminal_whatever_the_threshold():
    """Purge deletes the job at once; its evals and allocs follow at the next
    eval GC once terminal, not an eval threshold later."""
    h = Harness(now=NOW)
    job = mock.job()  # never stored: purged
    ev = old_eval(job, age=MINUTE)
    done = alloc_for(job, ev, age=MINUTE, desired=DesiredStatus.STOP)
    _put(h, ev, done)
    run(h, CORE_JOB_EVAL_GC)
    assert h.deleted_evals == [ev.id]
    assert h.deleted_allocs == [done.id]


def test_a_purged_jobs_eval_waits_for_its_allocs_to_stop_running():
    h = Harness(now=NOW)
    job = mock.job()
    ev = old_eval(job, age=MINUTE)
    stopping = alloc_for(
        job, ev, age=MINUTE, client=ClientStatus.RUNNING, desired=DesiredStatus.STOP
    )
    pending = old_eval(job, age=MINUTE, status=EvalStatus.PENDING)
    _put(h, ev, stopping, pending)
    run(h, CORE_JOB_EVAL_GC)
    assert h.deleted_evals == []
    assert h.deleted_allocs == []


def test_allocs_with_neither_job_nor_eval_are_collected_once_terminal():
    h = Harness(now=NOW)
    job = mock.job()
    gone = mock.eval_for(job)  # never stored
    orphan = alloc_for(job, gone, age=MINUTE, desired=DesiredStatus.STOP)
    running = alloc_for(job, gone, age=MINUTE, client=ClientStatus.RUNNING)
    _put(h, orphan, running)
    run(h, CORE_JOB_EVAL_GC)
    assert h.deleted_allocs == [orphan.id]


def test_a_live_jobs_young_evals_keep_their_threshold():
    h = Harness(now=NOW)
    job = mock.job()
    ev = old_eval(job, age=MINUTE)
    _put(h, job, ev)
    run(h, CORE_JOB_EVAL_GC)
    assert h.deleted_evals == []


def test_a_purged_jobs_deployments_go_once_no_live_alloc_uses_them():
    h = Harness(now=NOW)
    job = mock.job(count=1)  # never stored: purged
    free = _deployment(job, "running", age=MINUTE)
    used = _deployment(job, "running", age=MINUTE)
    h.upsert_deployments(free, used)
    a = mock.alloc(job, mock.node())
    a.deployment_id = used.id
    h.upsert_allocs(a)
    run(h, CORE_JOB_DEPLOYMENT_GC)
    assert h.deleted_deployments == [free.id]


def test_gc_settings_become_the_core_schedulers_thresholds(monkeypatch):
    from corral.runtime.settings import load
    from services.worker.config import WorkerSettings

    monkeypatch.setenv("CORRAL_WORKER_EVAL_GC_THRESHOLD", "30")
    settings, _ = load(
        WorkerSettings,
        [
            "--state-addr", "s:1", "--broker-addr", "b:1", "--planner-addr", "p:1",
            "--job-gc-threshold", "90", "--node-gc-threshold", "1.5",
        ],
        prog="worker",
    )  # fmt: skip
    cfg = settings.gc.config()
    assert cfg.eval_gc_threshold == 30 * structs.SECOND
    assert cfg.job_gc_threshold == 90 * structs.SECOND
    assert cfg.node_gc_threshold == int(1.5 * structs.SECOND)
    assert cfg.batch_eval_gc_threshold == 24 * HOUR  # Nomad's default
    assert cfg.deployment_gc_threshold == HOUR
