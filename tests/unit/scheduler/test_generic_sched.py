"""The service/batch scheduler on the in-memory harness: nodes and a job
in, plans and evals out (Nomad's generic_sched_test.go)."""

from __future__ import annotations

import logging
from collections.abc import Callable

import pytest

from corral.domain import structs
from corral.domain.structs import (
    MINUTE,
    SECOND,
    ClientStatus,
    DesiredStatus,
    EvalStatus,
    NodeStatus,
    Trigger,
)
from corral.testing import mock
from corral.testing.harness import Harness
from corral.v1 import structs_pb2 as pb
from services.worker.scheduler import util
from services.worker.scheduler.core_sched import CoreScheduler
from services.worker.scheduler.factory import new_scheduler
from services.worker.scheduler.generic_sched import GenericScheduler
from services.worker.scheduler.interfaces import Scheduler, SchedulerError
from services.worker.scheduler.system_sched import SystemScheduler


def cluster(n: int = 10, **node_kw) -> tuple[Harness, list[pb.Node]]:
    h = Harness()
    nodes = [mock.node(**node_kw) for _ in range(n)]
    h.upsert_nodes(*nodes)
    return h, nodes


def register(h: Harness, job: pb.Job) -> pb.Job:
    """Register and return a private copy of the stored job (snapshot
    messages are shared and must not be changed by the test)."""
    h.upsert_jobs(job)
    return structs.copy_msg(h.job(job.namespace, job.id))


def run(h: Harness, job: pb.Job, trigger: str = Trigger.JOB_REGISTER, **kw) -> pb.Evaluation:
    ev = mock.eval_for(job, triggered_by=trigger)
    for k, v in kw.items():
        setattr(ev, k, v)
    h.process(job.type, ev)
    return ev


def planned(plan: pb.Plan) -> list[pb.Allocation]:
    return [a for lst in plan.node_allocation.values() for a in lst.allocs]


def stops(plan: pb.Plan) -> list[pb.AllocStop]:
    return [s for lst in plan.node_update.values() for s in lst.stops]


def live_allocs(h: Harness, job: pb.Job) -> list[pb.Allocation]:
    return [
        a
        for a in h.snapshot().allocs_by_job(job.namespace, job.id)
        if not structs.alloc_terminal(a)
    ]


def running_allocs(
    h: Harness, job: pb.Job, nodes: list[pb.Node], count: int
) -> list[pb.Allocation]:
    allocs = []
    for i in range(count):
        a = mock.alloc(job, nodes[i % len(nodes)], index=i)
        allocs.append(a)
    h.upsert_allocs(*allocs)
    return allocs


# ----------------------------------------------------------------- register


def test_job_register_places_count_allocs():
    h, _ = cluster()
    job = register(h, mock.job(count=10))
    ev = run(h, job)

    assert len(h.plans) == 1
    allocs = planned(h.last_plan())
    assert len(allocs) == 10
    assert len({a.name for a in allocs}) == 10
    assert all(a.eval_id == ev.id and a.job_modify_index == job.job_modify_index for a in allocs)
    assert all(a.desired_status == DesiredStatus.RUN for a in allocs)
    assert all(a.client_status == ClientStatus.PENDING for a in allocs)
    assert all(a.metrics.nodes_evaluated > 0 for a in allocs)
    assert len(live_allocs(h, job)) == 10

    final = h.last_eval()
    assert final.id == ev.id and final.status == EvalStatus.COMPLETE
    assert dict(final.queued_allocations) == {"web": 0}
    assert not final.blocked_eval and not h.create_evals


def test_job_register_twice_is_a_noop():
    h, _ = cluster()
    job = register(h, mock.job(count=3))
    run(h, job)
    run(h, job)
    assert len(h.plans) == 1
    assert h.last_eval().status == EvalStatus.COMPLETE


def test_job_register_only_in_job_datacenters():
    h, _ = cluster(3)
    other = [mock.node(datacenter="dc2") for _ in range(3)]
    h.upsert_nodes(*other)
    job = register(h, mock.job(count=6))
    run(h, job)
    other_ids = {n.id for n in other}
    assert all(a.node_id not in other_ids for a in planned(h.last_plan()))


def test_job_register_skips_nodes_not_ready():
    h, nodes = cluster(3)
    down = mock.node(status=NodeStatus.DOWN)
    draining = mock.node()
    draining.drain = True
    inel = mock.node()
    inel.scheduling_eligibility = structs.Eligibility.INELIGIBLE
    h.upsert_nodes(down, draining, inel)
    job = register(h, mock.job(count=6))
    run(h, job)
    assert {a.node_id for a in planned(h.last_plan())} <= {n.id for n in nodes}


def test_insufficient_capacity_creates_blocked_eval():
    h, _ = cluster(2)
    job = register(h, mock.job(count=4, cpu=3000))
    ev = run(h, job)

    assert len(planned(h.last_plan())) == 2
    final = h.last_eval()
    assert final.status == EvalStatus.COMPLETE
    assert dict(final.queued_allocations) == {"web": 2}
    metric = final.failed_tg_allocs["web"]
    assert metric.coalesced_failures == 1
    assert metric.nodes_exhausted > 0

    (blocked,) = h.create_evals
    assert blocked.status == EvalStatus.BLOCKED
    assert blocked.triggered_by == Trigger.QUEUED_ALLOCS
    assert blocked.status_description == util.BLOCKED_EVAL_FAILED_PLACEMENTS
    assert blocked.previous_eval == ev.id
    assert final.blocked_eval == blocked.id
    assert not blocked.escaped_computed_class
    assert "web" in blocked.failed_tg_allocs
    assert any(blocked.class_eligibility.values())


def test_infeasible_constraint_blocks_with_class_ineligible():
    h, _ = cluster(3)
    job = mock.job(count=2)
    job.constraints.add(l_target="${attr.kernel.name}", r_target="windows", operand="=")
    job = register(h, job)
    run(h, job)
    assert not h.plans or not planned(h.last_plan())
    (blocked,) = h.create_evals
    assert not blocked.escaped_computed_class
    assert blocked.class_eligibility and not any(blocked.class_eligibility.values())
    assert h.last_eval().failed_tg_allocs["web"].nodes_filtered > 0


def test_constraint_on_unique_attribute_escapes_class():
    h, _ = cluster(3)
    job = mock.job(count=1)
    job.constraints.add(l_target="${attr.unique.hostname}", r_target="nope", operand="=")
    job = register(h, job)
    run(h, job)
    (blocked,) = h.create_evals
    assert blocked.escaped_computed_class
    assert not blocked.class_eligibility


def test_no_nodes_blocks():
    h = Harness()
    job = register(h, mock.job(count=2))
    run(h, job)
    assert len(h.create_evals) == 1
    assert dict(h.last_eval().queued_allocations) == {"web": 2}


def test_blocked_eval_still_failing_is_reblocked():
    h, _ = cluster(1)
    job = register(h, mock.job(count=2, cpu=3000))
    blocked = mock.eval_for(job, triggered_by=Trigger.QUEUED_ALLOCS, status=EvalStatus.BLOCKED)
    h.process(job.type, blocked)
    assert len(h.reblock_evals) == 1
    assert h.reblock_evals[0].id == blocked.id
    assert not h.create_evals  # no new blocked eval for a blocked eval
    assert not h.evals


def test_blocked_eval_that_places_completes():
    h, _ = cluster(3)
    job = register(h, mock.job(count=2))
    blocked = mock.eval_for(job, triggered_by=Trigger.QUEUED_ALLOCS, status=EvalStatus.BLOCKED)
    h.process(job.type, blocked)
    assert not h.reblock_evals
    assert h.last_eval().status == EvalStatus.COMPLETE
    assert len(planned(h.last_plan())) == 2


def released(job: pb.Job, trigger: str = Trigger.QUEUED_ALLOCS) -> pb.Evaluation:
    """A blocked eval as a capacity change hands it to a worker: written back
    `pending` by the broker, with the counts of the run that blocked it."""
    ev = mock.eval_for(job, triggered_by=trigger)
    ev.status_description = "unblocked by a capacity change at index 7"
    ev.queued_allocations["web"] = 3
    ev.failed_tg_allocs["web"].nodes_exhausted = 9
    ev.snapshot_index = 3
    return ev


def test_released_blocked_eval_still_failing_is_reblocked_with_what_it_learned():
    h, nodes = cluster(1)
    job = register(h, mock.job(count=3, cpu=3000))
    ev = released(job)
    h.process(job.type, ev)

    assert len(planned(h.last_plan())) == 1  # what fits is placed
    (reblocked,) = h.reblock_evals
    assert reblocked.id == ev.id
    assert reblocked.status == EvalStatus.BLOCKED
    assert reblocked.status_description == util.BLOCKED_EVAL_FAILED_PLACEMENTS
    assert reblocked.triggered_by == Trigger.QUEUED_ALLOCS
    assert dict(reblocked.queued_allocations) == {"web": 2}
    assert reblocked.failed_tg_allocs["web"].nodes_exhausted == 1
    assert reblocked.failed_tg_allocs["web"].coalesced_failures == 1
    assert reblocked.class_eligibility == {nodes[0].computed_class: True}
    assert not reblocked.escaped_computed_class
    assert not h.create_evals  # no second blocked eval for the job
    assert not h.evals  # and the eval is not completed
    assert h.eval(ev.id).status == EvalStatus.BLOCKED


def test_released_max_plan_blocked_eval_keeps_its_trigger_when_reblocked():
    h, _ = cluster(1)
    job = register(h, mock.job(count=2, cpu=3000))
    ev = released(job, Trigger.MAX_PLAN_ATTEMPTS)
    h.process(job.type, ev)
    (reblocked,) = h.reblock_evals
    assert reblocked.triggered_by == Trigger.MAX_PLAN_ATTEMPTS
    assert reblocked.status_description == util.BLOCKED_EVAL_MAX_PLAN
    assert not h.create_evals


def test_released_blocked_eval_that_places_everything_completes():
    h, _ = cluster(3)
    job = register(h, mock.job(count=3, cpu=3000))
    ev = released(job)
    h.process(job.type, ev)
    assert not h.reblock_evals and not h.create_evals
    final = h.last_eval()
    assert final.id == ev.id and final.status == EvalStatus.COMPLETE
    assert dict(final.queued_allocations) == {"web": 0}
    assert not final.failed_tg_allocs


def test_pending_eval_that_was_never_blocked_creates_a_blocked_eval():
    """Only a blocked eval is reblocked: a job-register eval that cannot
    place everything completes and leaves a new blocked eval behind."""
    h, _ = cluster(1)
    job = register(h, mock.job(count=2, cpu=3000))
    ev = run(h, job)
    assert not h.reblock_evals
    (blocked,) = h.create_evals
    assert blocked.previous_eval == ev.id
    assert h.last_eval().status == EvalStatus.COMPLETE


def test_unsupported_trigger_fails_eval():
    h, _ = cluster(1)
    job = register(h, mock.job(count=1))
    run(h, job, trigger=Trigger.SCHEDULED)
    assert not h.plans
    final = h.last_eval()
    assert final.status == EvalStatus.FAILED
    assert final.status_description == "scheduler cannot handle 'scheduled' evaluation reason"


# ----------------------------------------------------------------- deregister and scaling


def test_job_deregister_stops_all():
    h, nodes = cluster(3)
    job = register(h, mock.job(count=5))
    allocs = running_allocs(h, job, nodes, 5)
    job.stop = True
    job = register(h, job)
    run(h, job, Trigger.JOB_DEREGISTER)
    assert {s.alloc_id for s in stops(h.last_plan())} == {a.id for a in allocs}
    assert not planned(h.last_plan())
    assert dict(h.last_eval().queued_allocations) == {}
    assert h.last_eval().status == EvalStatus.COMPLETE


def test_purged_job_stops_all():
    h, nodes = cluster(2)
    job = mock.job(count=2)
    allocs = running_allocs(h, job, nodes, 2)
    ev = run(h, job, Trigger.JOB_DEREGISTER)
    plan = h.last_plan()
    assert {s.alloc_id for s in stops(plan)} == {a.id for a in allocs}
    # Nomad: the plan for a job that is gone carries no job, and still commits
    assert not plan.HasField("job")
    assert {h.alloc(a.id).desired_status for a in allocs} == {DesiredStatus.STOP}
    assert h.eval(ev.id).modify_index >= h.results[-1].alloc_index > 0
    assert h.last_eval().status == EvalStatus.COMPLETE


def test_scale_down_stops_highest_indexes():
    h, nodes = cluster(3)
    job = register(h, mock.job(count=5))
    allocs = running_allocs(h, job, nodes, 5)
    job.task_groups[0].count = 2
    job = register(h, job)
    # a count change alone is not destructive: remaining allocs update in place
    run(h, job, Trigger.JOB_SCALING)
    stopped = {s.alloc_id for s in stops(h.last_plan())}
    assert stopped == {a.id for a in allocs[2:]}
    assert {a.id for a in planned(h.last_plan())} == {a.id for a in allocs[:2]}


def test_scale_up_places_new_names():
    h, nodes = cluster(3)
    job = register(h, mock.job(count=2))
    running_allocs(h, job, nodes, 2)
    job.task_groups[0].count = 4
    job = register(h, job)
    run(h, job, Trigger.JOB_SCALING)
    new = [
        a for a in planned(h.last_plan()) if a.create_index == 0 and a.eval_id == h.last_eval().id
    ]
    names = sorted(a.name for a in new if structs.alloc_name_index(a.name) >= 2)
    assert names == [f"{job.id}.web[2]", f"{job.id}.web[3]"]


# ----------------------------------------------------------------- updates


def test_in_place_update():
    h, nodes = cluster(3)
    job = register(h, mock.job(count=3))
    allocs = running_allocs(h, job, nodes, 3)
    job.task_groups[0].restart_policy.attempts = 9  # not destructive
    job = register(h, job)
    run(h, job)
    plan = h.last_plan()
    assert not stops(plan)
    updated = planned(plan)
    assert {a.id for a in updated} == {a.id for a in allocs}
    assert all(a.job_modify_index == job.job_modify_index for a in updated)
    assert h.last_plan().annotations.ByteSize() == 0  # not asked for
    for a in allocs:
        assert h.alloc(a.id).job_modify_index == job.job_modify_index


def test_destructive_update_replaces_allocs():
    h, nodes = cluster(3)
    job = register(h, mock.job(count=3))
    allocs = running_allocs(h, job, nodes, 3)
    job.task_groups[0].tasks[0].env["NEW"] = "1"
    job = register(h, job)
    run(h, job)
    plan = h.last_plan()
    assert {s.alloc_id for s in stops(plan)} == {a.id for a in allocs}
    assert all(s.desired_description == util.ALLOC_UPDATING for s in stops(plan))
    new = planned(plan)
    assert len(new) == 3 and not ({a.id for a in new} & {a.id for a in allocs})
    assert sorted(a.name for a in new) == sorted(a.name for a in allocs)


def test_log_sizes_update_in_place_but_a_lifecycle_or_disabled_logs_do_not():
    """Nomad's tasksUpdated: only `logs.disabled` of the logs block is
    destructive; Corral also replaces allocs whose task changes its
    lifecycle (the client orders the tasks once, when the alloc starts)."""
    for change, destructive in (
        (lambda t: setattr(t.log_config, "max_files", 3), False),
        (lambda t: setattr(t.log_config, "disabled", True), True),
        (lambda t: t.lifecycle.CopyFrom(pb.TaskLifecycleConfig(hook="poststart")), True),
    ):
        h, nodes = cluster(3)
        job = mock.job(count=2)
        extra = mock.task("side")
        job.task_groups[0].tasks.append(extra)
        job = register(h, job)
        allocs = running_allocs(h, job, nodes, 2)
        change(job.task_groups[0].tasks[1])
        job = register(h, job)
        run(h, job)
        stopped = {s.alloc_id for s in stops(h.last_plan())}
        assert stopped == ({a.id for a in allocs} if destructive else set())


def test_rolling_update_without_deployment_creates_rolling_eval():
    """A batch job has no deployment: its max_parallel batches are paced
    by `stagger` (service jobs are paced by their deployment, see
    test_deployments.py)."""
    h, nodes = cluster(5)
    job = mock.batch_job(count=5)
    job.update.CopyFrom(pb.UpdateStrategy(max_parallel=2, stagger=15 * SECOND))
    job = register(h, job)
    running_allocs(h, job, nodes, 5)
    job.task_groups[0].tasks[0].env["NEW"] = "1"
    job = register(h, job)
    ev = run(h, job)
    assert len(stops(h.last_plan())) == 2
    assert len(planned(h.last_plan())) == 2
    (rolling,) = h.create_evals
    assert rolling.triggered_by == Trigger.ROLLING_UPDATE
    assert rolling.wait == 15 * SECOND
    assert rolling.previous_eval == ev.id
    assert h.last_eval().next_eval == rolling.id
    assert dict(h.last_eval().queued_allocations) == {"web": 0}

    # the rolling eval continues with the next batch
    h.create_evals.clear()
    h.process(job.type, rolling)
    assert len(stops(h.last_plan())) == 2


def test_destructive_update_of_resources_that_no_longer_fit_in_place():
    h, nodes = cluster(1)
    job = register(h, mock.job(count=1))
    (a,) = running_allocs(h, job, nodes, 1)
    job.task_groups[0].tasks[0].resources.cpu = 1000
    job = register(h, job)
    run(h, job)
    assert [s.alloc_id for s in stops(h.last_plan())] == [a.id]
    assert planned(h.last_plan())[0].id != a.id


# ----------------------------------------------------------------- nodes: lost and drain


def test_node_down_replaces_lost_allocs():
    h, nodes = cluster(3)
    job = register(h, mock.job(count=3))
    allocs = running_allocs(h, job, nodes, 3)
    down = structs.copy_msg(nodes[0])
    down.status = NodeStatus.DOWN
    h.upsert_nodes(down)
    run(h, job, Trigger.NODE_UPDATE, node_id=down.id)
    lost = [a for a in allocs if a.node_id == down.id]
    plan = h.last_plan()
    assert {s.alloc_id for s in stops(plan)} == {a.id for a in lost}
    assert all(s.client_status == ClientStatus.LOST for s in stops(plan))
    new = planned(plan)
    assert len(new) == len(lost)
    assert all(a.node_id != down.id for a in new)
    assert {a.previous_allocation for a in new} == {a.id for a in lost}
    assert h.alloc(lost[0].id).client_status == ClientStatus.LOST


@pytest.mark.parametrize(
    "make_job", [lambda: mock.job(count=1), mock.system_job], ids=["service", "system"]
)
def test_stopped_alloc_on_down_node_is_marked_lost(make_job: Callable[[], pb.Job]) -> None:
    """The generic and the system scheduler alike."""
    h, nodes = cluster(2)
    job = register(h, make_job())
    a = mock.alloc(job, nodes[0], desired_status=DesiredStatus.STOP)
    b = mock.alloc(job, nodes[1])
    h.upsert_allocs(a, b)
    down = structs.copy_msg(nodes[0])
    down.status = NodeStatus.DOWN
    h.upsert_nodes(down)
    run(h, job, Trigger.NODE_UPDATE)
    (s,) = stops(h.last_plan())
    assert s.alloc_id == a.id and s.client_status == ClientStatus.LOST


def test_drain_migrates_allocs_to_other_nodes():
    h, nodes = cluster(3)
    job = register(h, mock.job(count=3))
    allocs = running_allocs(h, job, nodes, 3)
    draining = structs.copy_msg(nodes[0])
    draining.drain = True
    draining.scheduling_eligibility = structs.Eligibility.INELIGIBLE
    h.upsert_nodes(draining)
    moving = [structs.copy_msg(a) for a in allocs if a.node_id == draining.id]
    for a in moving:
        a.desired_transition.migrate = True
    h.upsert_allocs(*moving)
    run(h, job, Trigger.NODE_DRAIN, node_id=draining.id)
    plan = h.last_plan()
    assert {s.alloc_id for s in stops(plan)} == {a.id for a in moving}
    assert all(s.desired_description == util.ALLOC_MIGRATING for s in stops(plan))
    new = planned(plan)
    assert len(new) == len(moving) and all(a.node_id != draining.id for a in new)


# ----------------------------------------------------------------- rescheduling


def fail(h: Harness, a: pb.Allocation, *, at: int) -> pb.Allocation:
    f = structs.copy_msg(h.alloc(a.id))
    f.client_status = ClientStatus.FAILED
    f.task_states["web"].CopyFrom(pb.TaskState(state="dead", failed=True, finished_at=at))
    h.upsert_allocs(f)
    return h.alloc(a.id)


def test_failed_alloc_rescheduled_now_with_tracker():
    h, nodes = cluster(3)
    job = mock.job(count=1)
    job.task_groups[0].reschedule_policy.CopyFrom(
        pb.ReschedulePolicy(delay=0, delay_function="constant", unlimited=True)
    )
    job = register(h, job)
    (a,) = running_allocs(h, job, nodes, 1)
    failed = fail(h, a, at=structs.now_ns() - 10 * SECOND)
    run(h, job, Trigger.ALLOC_FAILURE)
    plan = h.last_plan()
    assert [(s.alloc_id, s.desired_description) for s in stops(plan)] == [
        (failed.id, util.ALLOC_RESCHEDULED)
    ]
    (new,) = planned(plan)
    assert new.previous_allocation == failed.id and new.name == failed.name
    (event,) = new.reschedule_tracker.events
    assert event.prev_alloc_id == failed.id and event.prev_node_id == failed.node_id
    assert new.reschedule_tracker.last_reschedule == util.LAST_RESCHEDULE_OK
    assert new.node_id != failed.node_id  # its node is penalised
    assert h.alloc(failed.id).next_allocation == new.id


def test_failed_alloc_rescheduled_later_via_followup_eval():
    h, nodes = cluster(2)
    job = mock.job(count=1)
    job.task_groups[0].reschedule_policy.CopyFrom(
        pb.ReschedulePolicy(delay=MINUTE, delay_function="constant", unlimited=True)
    )
    job = register(h, job)
    (a,) = running_allocs(h, job, nodes, 1)
    finished = structs.now_ns() - SECOND
    fail(h, a, at=finished)
    ev = run(h, job, Trigger.ALLOC_FAILURE)
    (follow,) = h.create_evals
    assert follow.triggered_by == Trigger.RETRY_FAILED_ALLOC
    assert follow.wait_until == finished + MINUTE
    assert follow.previous_eval == ev.id
    assert h.last_eval().next_eval == follow.id
    (upd,) = planned(h.last_plan())
    assert upd.id == a.id and upd.followup_eval_id == follow.id
    assert not stops(h.last_plan())
    assert h.alloc(a.id).followup_eval_id == follow.id

    # the follow-up eval reschedules it
    h.create_evals.clear()
    h.process(job.type, follow)
    (new,) = [x for x in planned(h.last_plan()) if x.id != a.id]
    assert new.previous_allocation == a.id
    assert not h.create_evals


def test_followup_evals_not_created_while_processing_a_delayed_eval():
    h, nodes = cluster(2)
    job = mock.job(count=1)
    job.task_groups[0].reschedule_policy.CopyFrom(
        pb.ReschedulePolicy(delay=MINUTE, delay_function="constant", unlimited=True)
    )
    job = register(h, job)
    (a,) = running_allocs(h, job, nodes, 1)
    fail(h, a, at=structs.now_ns())
    run(h, job, Trigger.ALLOC_FAILURE, wait_until=structs.now_ns() - SECOND)
    assert not h.create_evals


def test_reschedule_that_cannot_place_keeps_failed_alloc():
    h, nodes = cluster(1)
    job = mock.job(count=1, cpu=3000)
    job.task_groups[0].reschedule_policy.CopyFrom(
        pb.ReschedulePolicy(delay=0, delay_function="constant", unlimited=True)
    )
    job = register(h, job)
    (a,) = running_allocs(h, job, nodes, 1)
    other = mock.alloc(mock.job(cpu=3000), nodes[0])
    h.upsert_allocs(other)
    fail(h, a, at=structs.now_ns() - SECOND)
    run(h, job, Trigger.ALLOC_FAILURE)
    plan = h.last_plan()
    assert not stops(plan)
    (upd,) = planned(plan)
    assert upd.id == a.id
    assert upd.reschedule_tracker.last_reschedule == util.LAST_RESCHEDULE_FAILED
    assert h.alloc(a.id).desired_status == DesiredStatus.RUN
    assert len(h.create_evals) == 1  # blocked


def test_batch_completed_allocs_not_replaced_failed_rescheduled():
    h, nodes = cluster(3)
    job = mock.batch_job(count=3)
    job.task_groups[0].reschedule_policy.CopyFrom(
        pb.ReschedulePolicy(
            attempts=1, interval=24 * 60 * MINUTE, delay=0, delay_function="constant"
        )
    )
    job = register(h, job)
    allocs = running_allocs(h, job, nodes, 3)
    done = []
    for a in allocs[:2]:
        c = structs.copy_msg(a)
        c.client_status = ClientStatus.COMPLETE
        c.task_states["web"].CopyFrom(pb.TaskState(state="dead", finished_at=structs.now_ns()))
        done.append(c)
    h.upsert_allocs(*done)
    failed = fail(h, allocs[2], at=structs.now_ns() - SECOND)
    run(h, job, Trigger.ALLOC_FAILURE)
    (new,) = planned(h.last_plan())
    assert new.previous_allocation == failed.id
    assert [s.alloc_id for s in stops(h.last_plan())] == [failed.id]


def test_batch_reschedule_attempts_exhausted():
    h, nodes = cluster(2)
    job = mock.batch_job(count=1)
    job.task_groups[0].reschedule_policy.CopyFrom(
        pb.ReschedulePolicy(
            attempts=1, interval=24 * 60 * MINUTE, delay=0, delay_function="constant"
        )
    )
    job = register(h, job)
    (a,) = running_allocs(h, job, nodes, 1)
    f = structs.copy_msg(a)
    f.reschedule_tracker.events.add(reschedule_time=structs.now_ns() - MINUTE, delay=0)
    h.upsert_allocs(f)
    fail(h, a, at=structs.now_ns())
    run(h, job, Trigger.ALLOC_FAILURE)
    assert not h.plans
    assert h.last_eval().status == EvalStatus.COMPLETE


# ----------------------------------------------------------------- retries and partial commits


def test_partial_commit_refreshes_and_retries():
    h, nodes = cluster(2)
    job = register(h, mock.job(count=4))
    h.reject_nodes.add(nodes[0].id)
    h.reject_plans = 1
    run(h, job)
    assert len(h.plans) == 2
    assert len(live_allocs(h, job)) == 4
    assert h.last_eval().status == EvalStatus.COMPLETE
    assert dict(h.last_eval().queued_allocations) == {"web": 0}


def test_max_attempts_fails_eval_with_max_plan_blocked_eval():
    h, nodes = cluster(1)
    job = register(h, mock.job(count=1))
    h.reject_nodes.add(nodes[0].id)
    run(h, job)
    assert len(h.plans) == 5
    final = h.last_eval()
    assert final.status == EvalStatus.FAILED
    assert final.status_description == "maximum attempts reached (5)"
    (blocked,) = h.create_evals
    assert blocked.triggered_by == Trigger.MAX_PLAN_ATTEMPTS
    assert blocked.status_description == util.BLOCKED_EVAL_MAX_PLAN
    assert final.blocked_eval == blocked.id


def test_batch_max_attempts_is_two():
    h, nodes = cluster(1)
    job = register(h, mock.batch_job(count=1))
    h.reject_nodes.add(nodes[0].id)
    run(h, job)
    assert len(h.plans) == 2
    assert h.last_eval().status_description == "maximum attempts reached (2)"


def test_queued_allocations_per_task_group():
    h, _ = cluster(1)
    job = mock.job(count=2)
    tg2 = structs.copy_msg(job.task_groups[0])
    tg2.name = "api"
    tg2.count = 3
    tg2.tasks[0].resources.cpu = 3500
    job.task_groups.append(tg2)
    job = register(h, job)
    run(h, job)
    queued = dict(h.last_eval().queued_allocations)
    assert queued["web"] == 0
    assert queued["api"] == 3


def test_datacenter_change_moves_allocs_destructively():
    h, nodes = cluster(2)
    dc2 = [mock.node(datacenter="dc2") for _ in range(2)]
    h.upsert_nodes(*dc2)
    job = register(h, mock.job(count=2))
    allocs = running_allocs(h, job, nodes, 2)
    del job.datacenters[:]
    job.datacenters.append("dc2")
    job = register(h, job)
    run(h, job)
    assert {s.alloc_id for s in stops(h.last_plan())} == {a.id for a in allocs}
    assert {a.node_id for a in planned(h.last_plan())} <= {n.id for n in dc2}


def test_sticky_disk_prefers_previous_node_on_update():
    h, nodes = cluster(5)
    job = mock.job(count=1)
    job.task_groups[0].ephemeral_disk.sticky = True
    job = register(h, job)
    (a,) = running_allocs(h, job, nodes, 1)
    job.task_groups[0].tasks[0].env["X"] = "1"
    job = register(h, job)
    run(h, job)
    (new,) = planned(h.last_plan())
    assert new.node_id == a.node_id and new.previous_allocation == a.id


def test_eval_for_unknown_job_with_no_allocs_completes_without_plan():
    h, _ = cluster(1)
    job = mock.job(count=1)
    run(h, job, Trigger.JOB_DEREGISTER)
    assert not h.plans
    assert h.last_eval().status == EvalStatus.COMPLETE


def test_register_count_zero_makes_no_plan():
    h, _ = cluster(2)
    job = register(h, mock.job(count=0))
    run(h, job)
    assert not h.plans
    assert h.last_eval().status == EvalStatus.COMPLETE
    assert not h.create_evals


def test_feasible_and_infeasible_task_groups():
    h, _ = cluster(2)
    job = mock.job(count=2)
    bad = structs.copy_msg(job.task_groups[0])
    bad.name = "bad"
    bad.constraints.add(l_target="${attr.kernel.name}", r_target="plan9", operand="=")
    job.task_groups.append(bad)
    job = register(h, job)
    run(h, job)
    assert {a.task_group for a in planned(h.last_plan())} == {"web"}
    final = h.last_eval()
    assert set(final.failed_tg_allocs) == {"bad"}
    assert dict(final.queued_allocations) == {"web": 0, "bad": 2}
    (blocked,) = h.create_evals
    assert set(blocked.failed_tg_allocs) == {"bad"}


def test_node_update_with_nothing_to_do_is_a_noop():
    h, nodes = cluster(2)
    job = register(h, mock.job(count=2))
    running_allocs(h, job, nodes, 2)
    run(h, job, Trigger.NODE_UPDATE, node_id=nodes[0].id)
    assert not h.plans
    assert h.last_eval().status == EvalStatus.COMPLETE


def test_batch_lost_alloc_on_down_node_is_replaced():
    h, nodes = cluster(2)
    job = register(h, mock.batch_job(count=1))
    (a,) = running_allocs(h, job, nodes, 1)
    down = structs.copy_msg(nodes[0])
    down.status = NodeStatus.DOWN
    h.upsert_nodes(down)
    run(h, job, Trigger.NODE_UPDATE)
    (s,) = stops(h.last_plan())
    assert s.alloc_id == a.id and s.client_status == ClientStatus.LOST
    (new,) = planned(h.last_plan())
    assert new.node_id == nodes[1].id and new.previous_allocation == a.id


def test_multiple_failed_allocs_rescheduled_in_one_eval():
    h, nodes = cluster(4)
    job = mock.job(count=3)
    job.task_groups[0].reschedule_policy.CopyFrom(
        pb.ReschedulePolicy(delay=0, delay_function="constant", unlimited=True)
    )
    job = register(h, job)
    allocs = running_allocs(h, job, nodes, 3)
    for a in allocs[:2]:
        fail(h, a, at=structs.now_ns() - SECOND)
    run(h, job, Trigger.ALLOC_FAILURE)
    new = planned(h.last_plan())
    assert {a.previous_allocation for a in new} == {allocs[0].id, allocs[1].id}
    assert {s.alloc_id for s in stops(h.last_plan())} == {allocs[0].id, allocs[1].id}


def test_reschedule_tracker_keeps_only_events_inside_the_interval():
    h, nodes = cluster(3)
    job = mock.job(count=1)
    job.task_groups[0].reschedule_policy.CopyFrom(
        pb.ReschedulePolicy(attempts=5, interval=structs.HOUR, delay=0, delay_function="constant")
    )
    job = register(h, job)
    (a,) = running_allocs(h, job, nodes, 1)
    now = structs.now_ns()
    f = structs.copy_msg(h.alloc(a.id))
    f.reschedule_tracker.events.add(reschedule_time=now - 2 * structs.HOUR, prev_alloc_id="old")
    f.reschedule_tracker.events.add(reschedule_time=now - 10 * MINUTE, prev_alloc_id="recent")
    h.upsert_allocs(f)
    fail(h, a, at=now - SECOND)
    run(h, job, Trigger.ALLOC_FAILURE)
    (new,) = planned(h.last_plan())
    assert [e.prev_alloc_id for e in new.reschedule_tracker.events] == ["recent", a.id]


def test_unlimited_reschedule_tracker_keeps_last_five_events():
    h, nodes = cluster(3)
    job = mock.job(count=1)
    job.task_groups[0].reschedule_policy.CopyFrom(
        pb.ReschedulePolicy(delay=0, delay_function="constant", unlimited=True)
    )
    job = register(h, job)
    (a,) = running_allocs(h, job, nodes, 1)
    f = structs.copy_msg(h.alloc(a.id))
    for i in range(7):
        f.reschedule_tracker.events.add(reschedule_time=i, prev_alloc_id=f"p{i}")
    h.upsert_allocs(f)
    fail(h, a, at=structs.now_ns() - SECOND)
    run(h, job, Trigger.ALLOC_FAILURE)
    (new,) = planned(h.last_plan())
    assert [e.prev_alloc_id for e in new.reschedule_tracker.events] == [
        "p2",
        "p3",
        "p4",
        "p5",
        "p6",
        a.id,
    ]


def test_exponential_delay_recorded_on_the_tracker():
    h, nodes = cluster(3)
    job = mock.job(count=1)
    job.task_groups[0].reschedule_policy.CopyFrom(
        pb.ReschedulePolicy(
            delay=SECOND, delay_function="exponential", max_delay=structs.HOUR, unlimited=True
        )
    )
    job = register(h, job)
    (a,) = running_allocs(h, job, nodes, 1)
    f = structs.copy_msg(h.alloc(a.id))
    f.reschedule_tracker.events.add(reschedule_time=structs.now_ns() - MINUTE, delay=SECOND)
    h.upsert_allocs(f)
    fail(h, a, at=structs.now_ns() - 10 * SECOND)
    run(h, job, Trigger.ALLOC_FAILURE)
    (new,) = planned(h.last_plan())
    assert new.reschedule_tracker.events[-1].delay == 2 * SECOND


def test_batch_drain_migrates_running_alloc():
    h, nodes = cluster(2)
    job = register(h, mock.batch_job(count=1))
    (a,) = running_allocs(h, job, nodes, 1)
    draining = structs.copy_msg(nodes[0])
    draining.drain = True
    h.upsert_nodes(draining)
    m = structs.copy_msg(h.alloc(a.id))
    m.desired_transition.migrate = True
    h.upsert_allocs(m)
    run(h, job, Trigger.NODE_DRAIN)
    (s,) = stops(h.last_plan())
    assert s.alloc_id == a.id and s.desired_description == util.ALLOC_MIGRATING
    (new,) = planned(h.last_plan())
    assert new.node_id == nodes[1].id


def test_partial_commit_without_refresh_is_a_scheduler_error():
    """A planner that drops placements without a refresh snapshot breaks the
    contract: the eval is nacked (SchedulerError), not silently completed."""
    h, _ = cluster(2)
    job = register(h, mock.job(count=2))
    ev = mock.eval_for(job)

    class Dropping(Harness):
        def submit_plan(self, plan):
            self.plans.append(plan)
            return pb.PlanResult(), None

    d = Dropping(h.store)
    with pytest.raises(SchedulerError):
        new_scheduler(job.type, h.snapshot(), d, log=logging.getLogger("t")).process(ev)
    assert not d.evals


def test_unknown_scheduler_type_is_an_error():
    with pytest.raises(SchedulerError):
        new_scheduler("quantum", Harness().snapshot(), Harness())


def test_new_scheduler_types():
    h = Harness()
    kinds = {
        "service": GenericScheduler,
        "batch": GenericScheduler,
        "system": SystemScheduler,
        "sysbatch": SystemScheduler,
        "_core": CoreScheduler,
    }
    for name, cls in kinds.items():
        s = new_scheduler(name, h.snapshot(), h)
        assert isinstance(s, cls) and isinstance(s, Scheduler)


def test_alloc_of_a_version_no_longer_stored_is_updated_destructively():
    h, nodes = cluster(2)
    job = register(h, mock.job(count=1))
    a = mock.alloc(job, nodes[0])
    a.job_version = 99  # its spec is gone: cannot prove an in-place update is safe
    a.job_modify_index = 1
    h.upsert_allocs(a)
    run(h, job)
    assert [s.alloc_id for s in stops(h.last_plan())] == [a.id]
    assert len(planned(h.last_plan())) == 1


def test_datacenter_globs_select_nodes_in_production_path() -> None:
    """The schedulers use the one ready-node lookup, with Nomad 1.5+ globs."""
    h = Harness()
    east = [mock.node(datacenter=f"us-east-{i}") for i in range(3)]
    h.upsert_nodes(*east, mock.node(datacenter="eu-west-1"))
    job = register(h, mock.job(count=6, datacenters=("us-east-*",)))
    run(h, job)
    placed = planned(h.plans[-1])
    assert len(placed) == 6
    assert {a.node_id for a in placed} <= {n.id for n in east}


def test_every_filtered_node_counts_under_its_constraint() -> None:
    """Two nodes of one class failing the same constraint: the metric says
    2 (the second is skipped by the class memo but keeps the reason)."""
    h, _ = cluster(2, attributes={"kernel.name": "windows"})
    job = register(h, mock.job(count=1))
    run(h, job)
    m = h.last_eval().failed_tg_allocs["web"]
    assert m.nodes_evaluated == 2 and m.nodes_filtered == 2
    assert dict(m.constraint_filtered) == {"${attr.kernel.name} = linux": 2}
