"""The cluster reconciler on its own: given a job, its allocs and their
nodes' state, what does it decide? (Nomad's reconcile_cluster_test.go.)"""

from __future__ import annotations

from corral.domain import structs
from corral.domain.structs import SECOND, ClientStatus, DesiredStatus, NodeStatus, Trigger
from corral.testing import mock
from corral.v1 import structs_pb2 as pb
from services.worker.scheduler import util
from services.worker.scheduler.reconcile.reconciler import AllocReconciler, ReconcileResults

NOW = 1_700_000_000 * SECOND


def destructive_on_change(a: pb.Allocation, job: pb.Job, tg: pb.TaskGroup):
    if a.job_modify_index == job.job_modify_index:
        return True, False, None
    return False, True, None


def inplace_on_change(a: pb.Allocation, job: pb.Job, tg: pb.TaskGroup):
    if a.job_modify_index == job.job_modify_index:
        return True, False, None
    u = structs.copy_msg(a)
    u.job_modify_index = job.job_modify_index
    return False, False, u


def make_allocs(job: pb.Job, n: int, *, node: pb.Node | None = None, start: int = 0, **kw):
    node = node or mock.node()
    out = []
    for i in range(start, start + n):
        a = mock.alloc(job, node, index=i, **kw)
        a.modify_time = NOW - 60 * SECOND
        out.append(a)
    return out


def reconcile(
    job: pb.Job | None,
    allocs: list[pb.Allocation],
    *,
    tainted: dict[str, pb.Node | None] | None = None,
    batch: bool = False,
    eval_id: str = "eval-1",
    now: int = NOW,
    update_fn=destructive_on_change,
    job_id: str | None = None,
    initializing: frozenset[str] = frozenset(),
) -> ReconcileResults:
    return AllocReconciler(
        job=job,
        job_id=job_id or (job.id if job is not None else allocs[0].job_id),
        is_batch=batch,
        eval_id=eval_id,
        eval_priority=50,
        existing=allocs,
        tainted=tainted or {},
        now=now,
        alloc_update_fn=update_fn,
        initializing=initializing,
    ).compute()


def names(places) -> list[str]:
    return sorted(p.name for p in places)


def stop_ids(res: ReconcileResults) -> set[str]:
    return {s.alloc.id for s in res.stop}


def prev_id(p) -> str:
    assert p.previous_alloc is not None
    return str(p.previous_alloc.id)


def idx(name: str) -> int:
    return structs.alloc_name_index(name)


# ----------------------------------------------------------------- counts and names


def test_place_all_when_nothing_exists():
    job = mock.job(count=10)
    res = reconcile(job, [])
    assert names(res.place) == sorted(f"{job.id}.web[{i}]" for i in range(10))
    assert res.desired_tg_updates["web"].place == 10
    assert not res.stop and not res.destructive_update


def test_scale_up_fills_lowest_free_names():
    job = mock.job(count=10)
    allocs = make_allocs(job, 5)
    res = reconcile(job, allocs)
    assert sorted(idx(p.name) for p in res.place) == [5, 6, 7, 8, 9]
    assert res.desired_tg_updates["web"].ignore == 5


def test_scale_up_fills_gaps_first():
    job = mock.job(count=4)
    allocs = make_allocs(job, 1, start=0) + make_allocs(job, 1, start=3)
    res = reconcile(job, allocs)
    assert sorted(idx(p.name) for p in res.place) == [1, 2]


def test_scale_down_stops_highest_names():
    job = mock.job(count=5)
    allocs = make_allocs(job, 10)
    res = reconcile(job, allocs)
    stopped = sorted(idx(s.alloc.name) for s in res.stop)
    assert stopped == [5, 6, 7, 8, 9]
    assert all(s.description == util.ALLOC_NOT_NEEDED for s in res.stop)
    assert not res.place
    assert res.desired_tg_updates["web"].stop == 5


def test_scale_down_to_zero_stops_everything():
    job = mock.job(count=0)
    allocs = make_allocs(job, 4)
    res = reconcile(job, allocs)
    assert stop_ids(res) == {a.id for a in allocs}
    assert not res.place


def test_scale_down_with_duplicate_names_still_reaches_count():
    job = mock.job(count=2)
    allocs = make_allocs(job, 2) + make_allocs(job, 2)  # names 0,1 twice
    res = reconcile(job, allocs)
    assert len(res.stop) == 2
    assert not res.place


def test_removed_task_group_is_stopped():
    job = mock.job(count=3)
    allocs = make_allocs(job, 3)
    job.task_groups[0].name = "other"
    res = reconcile(job, allocs)
    assert stop_ids(res) == {a.id for a in allocs}
    assert names(res.place) == sorted(f"{job.id}.other[{i}]" for i in range(3))


def test_stopped_job_stops_all_and_marks_lost_on_down_nodes():
    job = mock.job(count=3)
    down = mock.node(status=NodeStatus.DOWN)
    allocs = make_allocs(job, 2) + make_allocs(job, 1, node=down, start=2)
    job.stop = True
    res = reconcile(job, allocs, tainted={down.id: down})
    by_id = {s.alloc.id: s for s in res.stop}
    assert set(by_id) == {a.id for a in allocs}
    assert by_id[allocs[2].id].client_status == ClientStatus.LOST
    assert by_id[allocs[0].id].client_status == ""
    assert not res.place


def test_deleted_job_stops_all():
    job = mock.job(count=2)
    allocs = make_allocs(job, 2)
    res = reconcile(None, allocs, job_id=job.id)
    assert stop_ids(res) == {a.id for a in allocs}


def test_terminal_allocs_of_stopped_job_are_left_alone():
    job = mock.job(count=2)
    allocs = make_allocs(job, 2, client_status=ClientStatus.COMPLETE)
    job.stop = True
    res = reconcile(job, allocs)
    assert not res.stop


# ----------------------------------------------------------------- updates


def test_inplace_updates():
    job = mock.job(count=4)
    allocs = make_allocs(job, 4)
    job.job_modify_index += 10
    res = reconcile(job, allocs, update_fn=inplace_on_change)
    assert len(res.inplace_update) == 4
    assert res.desired_tg_updates["web"].in_place_update == 4
    assert not res.place and not res.destructive_update


def test_destructive_updates_without_update_block_happen_at_once():
    job = mock.job(count=5)
    allocs = make_allocs(job, 5)
    job.job_modify_index += 10
    res = reconcile(job, allocs)
    assert len(res.destructive_update) == 5
    assert all(
        d.stop_previous and d.stop_description == util.ALLOC_UPDATING
        for d in res.destructive_update
    )
    assert not res.rolling_limited


def test_destructive_updates_bounded_by_max_parallel():
    job = mock.batch_job(count=10)
    job.update.CopyFrom(pb.UpdateStrategy(max_parallel=3, stagger=10 * SECOND))
    allocs = make_allocs(job, 10)
    job.job_modify_index += 10
    res = reconcile(job, allocs)
    assert sorted(idx(d.name) for d in res.destructive_update) == [0, 1, 2]
    assert res.desired_tg_updates["web"].destructive_update == 3
    assert res.desired_tg_updates["web"].ignore == 7
    assert res.rolling_limited == ["web"]


def test_group_update_block_overrides_job_update_block():
    job = mock.job(count=4)
    job.update.CopyFrom(pb.UpdateStrategy(max_parallel=1))
    job.task_groups[0].update.CopyFrom(pb.UpdateStrategy(max_parallel=2))
    allocs = make_allocs(job, 4)
    job.job_modify_index += 1
    res = reconcile(job, allocs)
    assert len(res.destructive_update) == 2


def test_placements_use_the_rolling_budget_first():
    job = mock.job(count=6)
    job.update.CopyFrom(pb.UpdateStrategy(max_parallel=3))
    allocs = make_allocs(job, 4)
    job.job_modify_index += 1
    res = reconcile(job, allocs)
    assert len(res.place) == 2
    assert len(res.destructive_update) == 1


def test_scale_down_and_destructive_update_together():
    job = mock.job(count=2)
    allocs = make_allocs(job, 4)
    job.job_modify_index += 1
    res = reconcile(job, allocs)
    assert sorted(idx(s.alloc.name) for s in res.stop) == [2, 3]
    assert sorted(idx(d.name) for d in res.destructive_update) == [0, 1]


# ----------------------------------------------------------------- lost and migrate


def test_lost_allocs_on_down_node_are_replaced():
    job = mock.job(count=4)
    down = mock.node(status=NodeStatus.DOWN)
    allocs = make_allocs(job, 2) + make_allocs(job, 2, node=down, start=2)
    res = reconcile(job, allocs, tainted={down.id: down})
    lost = [s for s in res.stop if s.client_status == ClientStatus.LOST]
    assert {s.alloc.id for s in lost} == {allocs[2].id, allocs[3].id}
    assert all(s.description == util.ALLOC_LOST for s in lost)
    assert sorted(idx(p.name) for p in res.place) == [2, 3]
    assert all(p.lost and p.previous_alloc is not None for p in res.place)


def test_lost_allocs_on_missing_node_are_replaced():
    job = mock.job(count=1)
    allocs = make_allocs(job, 1)
    res = reconcile(job, allocs, tainted={allocs[0].node_id: None})
    assert [s.client_status for s in res.stop] == [ClientStatus.LOST]
    assert len(res.place) == 1


def test_lost_replacements_capped_by_count_on_scale_down():
    job = mock.job(count=2)
    down = mock.node(status=NodeStatus.DOWN)
    allocs = make_allocs(job, 2) + make_allocs(job, 2, node=down, start=2)
    res = reconcile(job, allocs, tainted={down.id: down})
    assert len(res.stop) == 2
    assert not res.place


def test_drain_migrates_marked_allocs():
    job = mock.job(count=3)
    draining = mock.node()
    draining.drain = True
    allocs = make_allocs(job, 3, node=draining)
    for a in allocs[:2]:
        a.desired_transition.migrate = True
    res = reconcile(job, allocs, tainted={draining.id: draining})
    migrating = [s for s in res.stop if s.description == util.ALLOC_MIGRATING]
    assert {s.alloc.id for s in migrating} == {allocs[0].id, allocs[1].id}
    assert sorted(idx(p.name) for p in res.place) == [0, 1]
    assert {prev_id(p) for p in res.place} == {allocs[0].id, allocs[1].id}
    assert res.desired_tg_updates["web"].migrate == 2


def test_scale_down_prefers_stopping_migrating_allocs():
    job = mock.job(count=2)
    allocs = make_allocs(job, 3)
    allocs[2].desired_transition.migrate = True
    allocs[0].desired_transition.migrate = True
    res = reconcile(job, allocs)
    assert stop_ids(res) >= {allocs[2].id}
    not_needed = [s for s in res.stop if s.description == util.ALLOC_NOT_NEEDED]
    assert [s.alloc.id for s in not_needed] == [allocs[2].id]
    assert len(res.place) == 1  # allocs[0] migrates


def test_batch_alloc_stopped_for_reschedule_is_not_migrated_twice():
    job = mock.batch_job(count=1)
    allocs = make_allocs(job, 1, client_status=ClientStatus.FAILED)
    allocs[0].desired_transition.migrate = True
    allocs[0].desired_transition.reschedule = True
    allocs[0].task_states["web"].CopyFrom(
        pb.TaskState(state="dead", failed=True, finished_at=NOW - 60 * SECOND)
    )
    res = reconcile(job, allocs, batch=True)
    # one placement only: the reschedule, not an extra migration placement
    assert len(res.place) == 1
    assert res.place[0].reschedule


# ----------------------------------------------------------------- rescheduling


def failed_alloc(job, node=None, *, index=0, finished=NOW - 60 * SECOND, **kw):
    a = mock.alloc(job, node or mock.node(), index=index, client_status=ClientStatus.FAILED, **kw)
    a.task_states["web"].CopyFrom(pb.TaskState(state="dead", failed=True, finished_at=finished))
    a.modify_time = finished
    return a


def test_failed_service_alloc_rescheduled_now_when_due():
    job = mock.job(count=2)
    job.task_groups[0].reschedule_policy.CopyFrom(
        pb.ReschedulePolicy(delay=5 * SECOND, delay_function="constant", unlimited=True)
    )
    ok = make_allocs(job, 1)
    bad = failed_alloc(job, index=1)
    res = reconcile(job, ok + [bad])
    assert len(res.place) == 1 and res.place[0].reschedule
    assert prev_id(res.place[0]) == bad.id
    assert res.place[0].name == bad.name
    resched_stops = [s for s in res.stop if s.description == util.ALLOC_RESCHEDULED]
    assert [s.alloc.id for s in resched_stops] == [bad.id]


def test_failed_alloc_rescheduled_later_with_followup_eval():
    job = mock.job(count=1)
    job.task_groups[0].reschedule_policy.CopyFrom(
        pb.ReschedulePolicy(delay=5 * structs.MINUTE, delay_function="constant", unlimited=True)
    )
    bad = failed_alloc(job, finished=NOW - 10 * SECOND)
    res = reconcile(job, [bad])
    assert not res.place
    evs = res.followup_evals()
    assert len(evs) == 1
    ev = evs[0]
    assert ev.triggered_by == Trigger.RETRY_FAILED_ALLOC
    assert ev.wait_until == bad.task_states["web"].finished_at + 5 * structs.MINUTE
    assert ev.status_description == util.RESCHEDULING_FOLLOWUP
    assert res.attribute_updates[bad.id].followup_eval_id == ev.id
    assert res.desired_tg_updates["web"].reschedule_later == 1


def test_reschedule_later_batches_within_five_seconds():
    job = mock.job(count=3)
    job.task_groups[0].reschedule_policy.CopyFrom(
        pb.ReschedulePolicy(delay=60 * SECOND, delay_function="constant", unlimited=True)
    )
    base = NOW - 30 * SECOND
    allocs = [
        failed_alloc(job, index=0, finished=base),
        failed_alloc(job, index=1, finished=base + 2 * SECOND),
        failed_alloc(job, index=2, finished=base + 8 * SECOND),
    ]
    res = reconcile(job, allocs)
    evs = sorted(res.followup_evals(), key=lambda e: e.wait_until)
    assert len(evs) == 2
    assert evs[0].triggered_by == Trigger.RETRY_FAILED_ALLOC
    assert evs[1].triggered_by == Trigger.ALLOC_FAILURE
    assert evs[0].wait_until == base + 60 * SECOND
    assert evs[1].wait_until == base + 68 * SECOND
    ids = {a.id: res.attribute_updates[a.id].followup_eval_id for a in allocs}
    assert ids[allocs[0].id] == ids[allocs[1].id] == evs[0].id
    assert ids[allocs[2].id] == evs[1].id


def test_followup_eval_reschedules_its_allocs_now():
    job = mock.job(count=1)
    job.task_groups[0].reschedule_policy.CopyFrom(
        pb.ReschedulePolicy(delay=5 * structs.MINUTE, delay_function="constant", unlimited=True)
    )
    bad = failed_alloc(job, finished=NOW - 10 * SECOND)
    bad.followup_eval_id = "eval-followup"
    res = reconcile(job, [bad], eval_id="eval-followup")
    assert len(res.place) == 1 and res.place[0].reschedule
    # another eval does not duplicate the pending follow-up
    res2 = reconcile(job, [bad], eval_id="other")
    assert not res2.place and not res2.followup_evals()


def test_reschedule_attempts_exhausted_within_interval():
    job = mock.job(count=1)
    job.task_groups[0].reschedule_policy.CopyFrom(
        pb.ReschedulePolicy(attempts=2, interval=structs.HOUR, delay=0, delay_function="constant")
    )
    bad = failed_alloc(job)
    for t in (NOW - 20 * structs.MINUTE, NOW - 10 * structs.MINUTE):
        bad.reschedule_tracker.events.add(reschedule_time=t, prev_alloc_id="x", delay=0)
    res = reconcile(job, [bad])
    assert not res.place
    assert not res.followup_evals()
    # the failed alloc still holds its slot: nothing is placed for it
    assert res.desired_tg_updates["web"].ignore == 1


def test_reschedule_attempts_outside_interval_do_not_count():
    job = mock.job(count=1)
    job.task_groups[0].reschedule_policy.CopyFrom(
        pb.ReschedulePolicy(
            attempts=1, interval=10 * structs.MINUTE, delay=0, delay_function="constant"
        )
    )
    bad = failed_alloc(job)
    bad.reschedule_tracker.events.add(reschedule_time=NOW - 2 * structs.HOUR, delay=0)
    res = reconcile(job, [bad])
    assert len(res.place) == 1


def test_reschedule_disabled_policy_never_reschedules():
    job = mock.job(count=1)
    job.task_groups[0].reschedule_policy.CopyFrom(pb.ReschedulePolicy(attempts=0, unlimited=False))
    res = reconcile(job, [failed_alloc(job)])
    assert not res.place and not res.followup_evals()


def test_force_reschedule_transition_reschedules_now():
    job = mock.job(count=1)
    job.task_groups[0].reschedule_policy.CopyFrom(pb.ReschedulePolicy(attempts=0))
    bad = failed_alloc(job)
    bad.desired_transition.force_reschedule = True
    res = reconcile(job, [bad])
    assert len(res.place) == 1 and res.place[0].reschedule


def test_already_rescheduled_failed_alloc_is_not_rescheduled_again():
    job = mock.job(count=1)
    job.task_groups[0].reschedule_policy.CopyFrom(
        pb.ReschedulePolicy(delay=0, delay_function="constant", unlimited=True)
    )
    bad = failed_alloc(job)
    replacement = mock.alloc(job, mock.node(), index=0)
    bad.next_allocation = replacement.id
    bad.desired_status = DesiredStatus.STOP
    res = reconcile(job, [bad, replacement])
    assert not res.place and not res.stop


def test_service_completed_alloc_is_replaced():
    job = mock.job(count=2)
    allocs = make_allocs(job, 2)
    allocs[1].client_status = ClientStatus.COMPLETE
    res = reconcile(job, allocs)
    assert [idx(p.name) for p in res.place] == [1]
    assert not res.place[0].reschedule


def test_batch_completed_allocs_are_not_replaced():
    job = mock.batch_job(count=3)
    allocs = make_allocs(job, 3, client_status=ClientStatus.COMPLETE)
    for a in allocs:
        a.task_states["web"].CopyFrom(pb.TaskState(state="dead", finished_at=NOW - SECOND))
    res = reconcile(job, allocs, batch=True)
    assert not res.place and not res.stop


def test_batch_server_stopped_complete_alloc_is_ignored():
    """Classification rule 3: a server-terminal alloc that is not
    reconnecting is ignored (counted as such, not as running)."""
    job = mock.batch_job(count=2)
    allocs = make_allocs(job, 1, client_status=ClientStatus.COMPLETE)
    stopped = make_allocs(
        job, 1, start=1, client_status=ClientStatus.COMPLETE, desired_status=DesiredStatus.STOP
    )
    res = reconcile(job, allocs + stopped, batch=True)
    assert res.desired_tg_updates["web"].ignore >= 1
    assert not res.stop


def test_batch_failed_alloc_is_rescheduled():
    job = mock.batch_job(count=2)
    job.task_groups[0].reschedule_policy.CopyFrom(
        pb.ReschedulePolicy(
            attempts=1, interval=24 * structs.HOUR, delay=0, delay_function="constant"
        )
    )
    done = make_allocs(job, 1, client_status=ClientStatus.COMPLETE)
    bad = failed_alloc(job, index=1)
    res = reconcile(job, done + [bad], batch=True)
    assert [prev_id(p) for p in res.place] == [bad.id]
    assert res.place[0].reschedule


def test_batch_terminal_allocs_of_older_version_are_ignored():
    job = mock.batch_job(count=2)
    old = make_allocs(job, 2, client_status=ClientStatus.COMPLETE)
    job.version += 1
    job.job_modify_index += 5
    res = reconcile(job, old, batch=True)
    assert len(res.place) == 2
    assert res.desired_tg_updates["web"].ignore == 2


def test_batch_desired_stop_failed_is_ignored_not_replaced():
    job = mock.batch_job(count=1)
    a = failed_alloc(job)
    a.desired_status = DesiredStatus.STOP
    res = reconcile(job, [a], batch=True)
    # user stopped it; batch semantics keep the slot empty unless marked
    assert not res.stop


# ----------------------------------------------------------------- stop_after_client_disconnect


def test_lost_alloc_with_stop_after_client_disconnect_delays_replacement():
    job = mock.job(count=1)
    job.task_groups[0].stop_after_client_disconnect = 60 * SECOND
    down = mock.node(status=NodeStatus.DOWN)
    a = make_allocs(job, 1, node=down)[0]
    res = reconcile(job, [a], tainted={down.id: down})
    assert not res.place
    evs = res.followup_evals()
    assert len(evs) == 1
    assert evs[0].triggered_by == Trigger.ALLOC_FAILURE
    kill = 5 * SECOND
    assert evs[0].wait_until == NOW + 60 * SECOND + kill
    (stop,) = res.stop
    assert stop.client_status == ClientStatus.LOST
    assert stop.followup_eval_id == evs[0].id


def test_disconnect_block_stop_on_client_after_maps_the_same():
    job = mock.job(count=1)
    job.task_groups[0].disconnect.stop_on_client_after = 30 * SECOND
    job.task_groups[0].tasks[0].kill_timeout = 20 * SECOND
    down = mock.node(status=NodeStatus.DOWN)
    a = make_allocs(job, 1, node=down)[0]
    res = reconcile(job, [a], tainted={down.id: down})
    assert res.followup_evals()[0].wait_until == NOW + 50 * SECOND


def test_stop_after_client_disconnect_replaces_once_time_passed():
    job = mock.job(count=1)
    job.task_groups[0].stop_after_client_disconnect = 60 * SECOND
    down = mock.node(status=NodeStatus.DOWN)
    a = make_allocs(job, 1, node=down)[0]
    # marked lost long ago but still non-terminal on the server
    a.alloc_states.add(
        field="client_status", value=ClientStatus.LOST, time=NOW - 10 * structs.MINUTE
    )
    res = reconcile(job, [a], tainted={down.id: down})
    assert len(res.place) == 1
    assert not res.followup_evals()


def test_stop_after_lost_alloc_already_stopped_is_replaced_by_followup():
    """Second pass (the follow-up eval): the lost alloc is stopped and lost;
    the group is short one alloc and places it."""
    job = mock.job(count=1)
    job.task_groups[0].stop_after_client_disconnect = 60 * SECOND
    down = mock.node(status=NodeStatus.DOWN)
    a = make_allocs(
        job, 1, node=down, desired_status=DesiredStatus.STOP, client_status=ClientStatus.LOST
    )[0]
    res = reconcile(job, [a], tainted={down.id: down})
    assert len(res.place) == 1
    assert res.place[0].name == a.name
