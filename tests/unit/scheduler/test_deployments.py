"""Deployments in the service scheduler, on the harness: which eval creates
one, how `max_parallel` bounds the allocs of a deployment that are pending
or unhealthy, and what a newer version, a pause or a failure change
(Nomad's reconcile_cluster_test.go deployment cases)."""

from __future__ import annotations

from corral.domain import structs
from corral.domain.deployments import (
    DESC_AUTO_PROMOTION,
    DESC_NEEDS_PROMOTION,
    DESC_NEWER_JOB,
    DESC_RUNNING,
    DESC_STOPPED_JOB,
)
from corral.domain.structs import SECOND, DeploymentStatus, Trigger
from corral.testing import mock
from corral.testing.harness import Harness
from corral.v1 import structs_pb2 as pb


def _cluster(n: int = 6) -> Harness:
    h = Harness()
    h.upsert_nodes(*(mock.node() for _ in range(n)))
    return h


def _job(count: int = 6, max_parallel: int = 2) -> pb.Job:
    job = mock.job(count=count)
    job.update.CopyFrom(
        pb.UpdateStrategy(
            max_parallel=max_parallel,
            health_check="task_states",
            min_healthy_time=1 * SECOND,
            healthy_deadline=10 * SECOND,
            progress_deadline=60 * SECOND,
        )
    )
    return job


def _register(h: Harness, job: pb.Job) -> pb.Job:
    h.upsert_jobs(job)
    return structs.copy_msg(h.job(job.namespace, job.id))


def _run(h: Harness, job: pb.Job, trigger: str = Trigger.JOB_REGISTER) -> None:
    h.process(job.type, mock.eval_for(job, triggered_by=trigger))


def _live(h: Harness, job: pb.Job) -> list[pb.Allocation]:
    return [
        a
        for a in h.snapshot().allocs_by_job(job.namespace, job.id)
        if not structs.alloc_terminal(a)
    ]


def _deployment(h: Harness, job: pb.Job) -> pb.Deployment:
    d = h.snapshot().latest_deployment_by_job(job.namespace, job.id)
    assert d is not None
    return d


def _new_version(h: Harness, job: pb.Job, value: str) -> pb.Job:
    job.task_groups[0].tasks[0].env["VERSION"] = value
    return _register(h, job)


def _deployed(h: Harness, count: int = 6, max_parallel: int = 2) -> pb.Job:
    """A job whose first version was placed and became healthy."""
    job = _register(h, _job(count, max_parallel))
    _run(h, job)
    for a in _live(h, job):
        h.set_alloc_health(a.id, True)
    return job


def test_first_version_places_every_alloc_under_one_deployment() -> None:
    h = _cluster()
    job = _register(h, _job())
    _run(h, job)
    allocs = _live(h, job)
    assert len(allocs) == 6  # placements of missing allocs are not rolled
    d = _deployment(h, job)
    assert d.status == DeploymentStatus.RUNNING
    assert d.job_version == job.version
    state = d.task_groups["web"]
    assert state.desired_total == 6
    assert state.placed_allocs == 6
    assert state.require_progress_by > 0
    assert {a.deployment_id for a in allocs} == {d.id}


def test_a_job_without_update_block_has_no_deployment() -> None:
    h = _cluster()
    job = _register(h, mock.job(count=3))
    _run(h, job)
    assert len(_live(h, job)) == 3
    assert h.snapshot().latest_deployment_by_job(job.namespace, job.id) is None
    assert all(not a.deployment_id for a in _live(h, job))


def test_health_is_counted_on_the_deployment() -> None:
    h = _cluster()
    job = _register(h, _job())
    _run(h, job)
    a, b = _live(h, job)[:2]
    h.set_alloc_health(a.id, True)
    h.set_alloc_health(b.id, False)
    state = _deployment(h, job).task_groups["web"]
    assert (state.healthy_allocs, state.unhealthy_allocs) == (1, 1)


def test_update_replaces_at_most_max_parallel_not_yet_healthy() -> None:
    h = _cluster()
    job = _deployed(h)
    first = _deployment(h, job)
    job = _new_version(h, job, "2")
    _run(h, job)
    d = _deployment(h, job)
    assert d.id != first.id and d.job_version == job.version
    new = [a for a in _live(h, job) if a.job_version == job.version]
    assert len(new) == 2 and {a.deployment_id for a in new} == {d.id}

    # nothing became healthy: another eval replaces nothing more
    _run(h, job, Trigger.DEPLOYMENT_WATCHER)
    assert len([a for a in _live(h, job) if a.job_version == job.version]) == 2

    # one healthy: one more may go
    h.set_alloc_health(new[0].id, True)
    _run(h, job, Trigger.DEPLOYMENT_WATCHER)
    new = [a for a in _live(h, job) if a.job_version == job.version]
    assert len(new) == 3
    assert len(_live(h, job)) == 6

    # the rest, two at a time, as they become healthy
    while len(new) < 6:
        for a in new:
            if not a.deployment_status.HasField("healthy"):
                h.set_alloc_health(a.id, True)
        _run(h, job, Trigger.DEPLOYMENT_WATCHER)
        unhealthy = [
            a
            for a in _live(h, job)
            if a.job_version == job.version and not a.deployment_status.healthy
        ]
        assert len(unhealthy) <= 2
        new = [a for a in _live(h, job) if a.job_version == job.version]
    assert _deployment(h, job).task_groups["web"].placed_allocs == 6


def test_an_unhealthy_alloc_stops_the_roll_out() -> None:
    h = _cluster()
    job = _deployed(h, max_parallel=3)
    job = _new_version(h, job, "2")
    _run(h, job)
    new = [a for a in _live(h, job) if a.job_version == job.version]
    assert len(new) == 3
    h.set_alloc_health(new[0].id, True)
    h.set_alloc_health(new[1].id, True)
    h.set_alloc_health(new[2].id, False)
    _run(h, job, Trigger.DEPLOYMENT_WATCHER)
    assert len([a for a in _live(h, job) if a.job_version == job.version]) == 3


def test_paused_or_failed_deployment_replaces_nothing() -> None:
    for status in (DeploymentStatus.PAUSED, DeploymentStatus.FAILED):
        h = _cluster()
        job = _deployed(h)
        job = _new_version(h, job, "2")
        _run(h, job)
        d = structs.copy_msg(_deployment(h, job))
        for a in _live(h, job):
            if a.job_version == job.version:
                h.set_alloc_health(a.id, True)
        d = structs.copy_msg(_deployment(h, job))
        d.status = status
        h.upsert_deployments(d)
        _run(h, job, Trigger.DEPLOYMENT_WATCHER)
        assert len([a for a in _live(h, job) if a.job_version == job.version]) == 2, status


def test_a_newer_version_cancels_the_running_deployment() -> None:
    h = _cluster()
    job = _deployed(h)
    job = _new_version(h, job, "2")
    _run(h, job)
    v2 = _deployment(h, job)
    job = _new_version(h, job, "3")
    _run(h, job)
    got = h.snapshot().deployment_by_id(v2.id)
    assert got is not None
    assert got.status == DeploymentStatus.CANCELLED
    assert got.status_description == DESC_NEWER_JOB
    assert _deployment(h, job).job_version == job.version


def test_stopping_the_job_cancels_its_deployment() -> None:
    h = _cluster()
    job = _register(h, _job())
    _run(h, job)
    d = _deployment(h, job)
    job.stop = True
    job = _register(h, job)
    _run(h, job, Trigger.JOB_DEREGISTER)
    got = h.snapshot().deployment_by_id(d.id)
    assert got is not None
    assert got.status == DeploymentStatus.CANCELLED
    assert got.status_description == DESC_STOPPED_JOB


def test_in_place_update_joins_the_new_deployment_and_health_is_tracked_again() -> None:
    h = _cluster()
    job = _deployed(h, count=3)
    job.priority = 70  # no task change: updated in place
    job = _register(h, job)
    _run(h, job)
    d = _deployment(h, job)
    assert d.job_version == job.version
    allocs = _live(h, job)
    assert len(allocs) == 3 and all(a.job_version == job.version for a in allocs)
    assert {a.deployment_id for a in allocs} == {d.id}
    assert not any(a.deployment_status.HasField("healthy") for a in allocs)
    assert d.task_groups["web"].placed_allocs == 3


def _promote(h: Harness, job: pb.Job) -> None:
    d = structs.copy_msg(_deployment(h, job))
    for state in d.task_groups.values():
        state.promoted = True
    h.upsert_deployments(d)


def test_canaries_run_beside_the_old_allocs_until_promoted() -> None:
    h = _cluster()
    job = _job(count=4, max_parallel=2)
    job.update.canary = 1
    job = _register(h, job)
    _run(h, job)
    for a in _live(h, job):
        h.set_alloc_health(a.id, True)
    assert not _deployment(h, job).task_groups["web"].placed_canaries  # no canary at first

    job = _new_version(h, job, "2")
    _run(h, job)
    (canary,) = [a for a in _live(h, job) if a.job_version == job.version]
    assert canary.deployment_status.canary
    assert len(_live(h, job)) == 5  # four old allocs keep running beside it
    state = _deployment(h, job).task_groups["web"]
    assert list(state.placed_canaries) == [canary.id] and state.desired_canaries == 1
    assert canary.name in {a.name for a in _live(h, job) if a.job_version != job.version}

    # healthy but not promoted: nothing is replaced, no second canary
    h.set_alloc_health(canary.id, True)
    _run(h, job, Trigger.DEPLOYMENT_WATCHER)
    assert len(_live(h, job)) == 5
    assert [a.id for a in _live(h, job) if a.job_version == job.version] == [canary.id]

    # promoted: the canary replaces the old alloc of its name, two more roll
    _promote(h, job)
    _run(h, job, Trigger.DEPLOYMENT_WATCHER)
    live = _live(h, job)
    new = [a for a in live if a.job_version == job.version]
    assert len(live) == 4 and len(new) == 3
    assert len({a.name for a in live}) == 4
    for a in new:
        h.set_alloc_health(a.id, True)
    _run(h, job, Trigger.DEPLOYMENT_WATCHER)
    live = _live(h, job)
    assert len(live) == 4 and all(a.job_version == job.version for a in live)


def test_a_deployment_says_what_it_waits_for() -> None:
    """Nomad's reconciler: a job's first version has nothing to canary (no
    desired canaries, nothing to promote); a destructive update with
    canaries requires a promotion, automatic with auto_promote."""
    for auto_promote, waiting in ((False, DESC_NEEDS_PROMOTION), (True, DESC_AUTO_PROMOTION)):
        h = _cluster()
        job = _job(count=2)
        job.update.canary = 1
        job.update.auto_promote = auto_promote
        job = _register(h, job)
        _run(h, job)
        first = _deployment(h, job)
        assert first.task_groups["web"].desired_canaries == 0
        assert first.status_description == DESC_RUNNING
        for a in _live(h, job):
            h.set_alloc_health(a.id, True)

        job = _new_version(h, job, "2")
        _run(h, job)
        second = _deployment(h, job)
        assert second.id != first.id and second.task_groups["web"].desired_canaries == 1
        assert second.status_description == waiting


def test_replacing_an_alloc_of_the_deployed_version_starts_no_deployment() -> None:
    h = _cluster()
    spec = _job(count=3)
    spec.task_groups[0].reschedule_policy.CopyFrom(
        pb.ReschedulePolicy(unlimited=True, delay_function="constant")
    )
    job = _register(h, spec)
    _run(h, job)
    for a in _live(h, job):
        h.set_alloc_health(a.id, True)
    first = _deployment(h, job)
    # the deployment is gone (garbage collected): a reschedule of the same
    # version must not start another one
    h.store.apply(
        pb.ChangeBatch(
            index=h.next_index(),
            events=[pb.Event(topic="Deployment", key=first.id, deleted=True, deployment=first)],
        )
    )
    victim = structs.copy_msg(_live(h, job)[0])
    victim.client_status = "failed"
    h.upsert_allocs(victim)
    _run(h, job, Trigger.ALLOC_FAILURE)
    replacement = [a for a in _live(h, job) if a.previous_allocation == victim.id]
    assert len(replacement) == 1 and not replacement[0].deployment_id
    assert h.snapshot().latest_deployment_by_job(job.namespace, job.id) is None


def test_an_update_that_cannot_be_placed_is_still_held_to_its_progress_deadline() -> None:
    h = _cluster(2)
    job = _deployed(h, count=2)
    job.task_groups[0].tasks[0].resources.cpu = 1_000_000  # fits nowhere
    job = _register(h, job)
    _run(h, job)
    d = _deployment(h, job)
    assert d.job_version == job.version
    state = d.task_groups["web"]
    assert state.placed_allocs == 0 and state.require_progress_by > 0
    assert all(a.job_version != job.version for a in _live(h, job))  # the old ones stay


def test_the_eval_names_the_deployment_its_plan_creates() -> None:
    """Nomad's TestServiceSched_JobModify_Rolling: 10 allocs of a version
    without deployment, then a destructive update with max_parallel 4: one
    plan with 4 stops and 4 placements creates the deployment, and the eval
    is completed naming it (setStatus's DeploymentID)."""
    h = _cluster(10)
    job = mock.job(count=10)
    job = _register(h, job)
    _run(h, job)
    assert not h.last_eval().deployment_id  # no update block, no deployment
    plans = len(h.plans)
    job.task_groups[0].update.CopyFrom(
        pb.UpdateStrategy(
            max_parallel=4,
            health_check="checks",
            min_healthy_time=10 * SECOND,
            healthy_deadline=600 * SECOND,
        )
    )
    job.task_groups[0].tasks[0].config.update({"command": "/bin/other"})
    job = _register(h, job)
    _run(h, job)
    assert len(h.plans) == plans + 1
    plan = h.last_plan()
    assert sum(len(u.stops) for u in plan.node_update.values()) == 4
    assert sum(len(a.allocs) for a in plan.node_allocation.values()) == 4
    assert plan.HasField("deployment")
    assert plan.deployment.task_groups["web"].desired_total == 10
    ev = h.last_eval()
    assert ev.status == "complete"
    assert ev.deployment_id == plan.deployment.id

    # the deployment watcher's eval that rolls the next batch names it too
    for a in _live(h, job):
        if a.deployment_id:
            h.set_alloc_health(a.id, True)
    _run(h, job, Trigger.DEPLOYMENT_WATCHER)
    assert h.last_eval().deployment_id == plan.deployment.id


def test_a_batch_eval_names_no_deployment() -> None:
    h = _cluster(2)
    job = _register(h, mock.batch_job(count=2))
    _run(h, job)
    assert h.last_eval().status == "complete" and not h.last_eval().deployment_id


def test_a_promotion_or_resume_words_what_is_still_awaited() -> None:
    """The state rewrites a running deployment's description on promote and
    resume from what its groups still wait for (one group promoted of two
    leaves the other awaiting)."""
    from corral.domain.deployments import running_description

    d = pb.Deployment()
    d.task_groups["a"].CopyFrom(pb.DeploymentState(desired_canaries=1, promoted=True))
    d.task_groups["b"].CopyFrom(pb.DeploymentState(desired_canaries=1, auto_promote=True))
    assert running_description(d) == DESC_AUTO_PROMOTION
    d.task_groups["c"].CopyFrom(pb.DeploymentState(desired_canaries=2))
    assert running_description(d) == DESC_NEEDS_PROMOTION
    for g in ("b", "c"):
        d.task_groups[g].promoted = True
    assert running_description(d) == DESC_RUNNING
