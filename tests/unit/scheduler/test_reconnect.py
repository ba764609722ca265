"""Disconnected clients (seed 003, semantics §5.3): allocs on a
disconnected node become unknown and are replaced; on reconnect one of the
pair is kept; reconnect logic runs only while the last AllocState is
`unknown`; expired unknown allocs are lost."""

from __future__ import annotations

import pytest

from corral.domain import structs
from corral.domain.structs import MINUTE, SECOND, ClientStatus, DesiredStatus, NodeStatus, Trigger
from corral.testing import mock
from corral.v1 import structs_pb2 as pb
from services.worker.scheduler import util
from services.worker.scheduler.reconcile.reconciler import pick_reconnecting
from tests.unit.scheduler.test_reconcile import NOW, inplace_on_change, reconcile

LOST_AFTER = 5 * MINUTE


def disconnect_job(*, count: int = 1, seed_era: bool = True, delay: int = 0) -> pb.Job:
    job = mock.job(count=count)
    tg = job.task_groups[0]
    if seed_era:
        tg.max_client_disconnect = LOST_AFTER
    else:
        tg.disconnect.lost_after = LOST_AFTER
    tg.reschedule_policy.CopyFrom(
        pb.ReschedulePolicy(delay=delay, delay_function="constant", unlimited=True)
    )
    return job


def node(status: str = NodeStatus.READY) -> pb.Node:
    return mock.node(status=status)


def running(job: pb.Job, n: pb.Node, index: int = 0, **kw) -> pb.Allocation:
    a = mock.alloc(job, n, index=index, **kw)
    a.modify_time = NOW - MINUTE
    a.alloc_states.add(field="client_status", value=ClientStatus.RUNNING, time=NOW - 2 * MINUTE)
    return a


def unknown(
    job: pb.Job,
    n: pb.Node,
    index: int = 0,
    *,
    since: int = NOW - MINUTE,
    status=ClientStatus.UNKNOWN,
) -> pb.Allocation:
    a = running(job, n, index)
    a.client_status = status
    a.alloc_states.add(field="client_status", value=ClientStatus.UNKNOWN, time=since)
    return a


# ----------------------------------------------------------------- disconnect


@pytest.mark.parametrize("seed_era", [True, False])
def test_disconnect_marks_unknown_and_places_replacement(seed_era):
    job = disconnect_job(seed_era=seed_era)
    disc = node(NodeStatus.DISCONNECTED)
    a = running(job, disc)
    res = reconcile(job, [a], tainted={disc.id: disc})

    update = res.disconnect_updates[a.id]
    assert update.client_status == ClientStatus.UNKNOWN
    assert update.client_description == util.ALLOC_UNKNOWN
    assert structs.last_client_state(update) == ClientStatus.UNKNOWN
    assert update.alloc_states[-1].time == NOW
    assert a.client_status == ClientStatus.RUNNING  # snapshot copy untouched

    timeouts = [e for e in res.followup_evals() if e.triggered_by == Trigger.MAX_DISCONNECT_TIMEOUT]
    assert len(timeouts) == 1
    assert timeouts[0].wait_until == NOW + LOST_AFTER
    assert timeouts[0].status_description == util.DISCONNECT_TIMEOUT_FOLLOWUP
    assert update.followup_eval_id == timeouts[0].id

    (place,) = res.place
    assert place.name == a.name and place.reschedule and place.previous_alloc is not None
    assert not res.stop  # the unknown alloc is not stopped
    du = res.desired_tg_updates["web"]
    assert du.disconnect_updates == 1 and du.reschedule_now == 1


def test_disconnect_with_reschedule_delay_creates_reschedule_followup():
    job = disconnect_job(delay=30 * SECOND)
    disc = node(NodeStatus.DISCONNECTED)
    a = running(job, disc)
    res = reconcile(job, [a], tainted={disc.id: disc})
    assert not res.place
    triggers = sorted(e.triggered_by for e in res.followup_evals())
    assert triggers == sorted([Trigger.MAX_DISCONNECT_TIMEOUT, Trigger.RETRY_FAILED_ALLOC])
    resched = next(e for e in res.followup_evals() if e.triggered_by == Trigger.RETRY_FAILED_ALLOC)
    assert resched.wait_until == NOW + 30 * SECOND
    assert res.disconnect_updates[a.id].followup_eval_id == resched.id


def test_disconnect_with_replace_false_does_not_replace():
    job = disconnect_job()
    job.task_groups[0].disconnect.replace = False
    disc = node(NodeStatus.DISCONNECTED)
    a = running(job, disc)
    res = reconcile(job, [a], tainted={disc.id: disc})
    assert a.id in res.disconnect_updates
    assert not res.place


def test_disconnect_without_lost_after_is_lost():
    job = mock.job(count=1)
    disc = node(NodeStatus.DISCONNECTED)
    a = running(job, disc)
    res = reconcile(job, [a], tainted={disc.id: disc})
    assert [s.client_status for s in res.stop] == [ClientStatus.LOST]
    assert len(res.place) == 1 and res.place[0].lost
    assert not res.disconnect_updates


def test_pending_alloc_on_disconnected_node_is_lost():
    job = disconnect_job()
    disc = node(NodeStatus.DISCONNECTED)
    a = running(job, disc)
    a.client_status = ClientStatus.PENDING
    res = reconcile(job, [a], tainted={disc.id: disc})
    assert [s.client_status for s in res.stop] == [ClientStatus.LOST]
    assert len(res.place) == 1


def test_still_disconnected_unknown_alloc_and_replacement_are_left_alone():
    job = disconnect_job()
    disc, ready = node(NodeStatus.DISCONNECTED), node()
    a = unknown(job, disc)
    rep = running(job, ready)
    a.next_allocation = rep.id
    rep.previous_allocation = a.id
    res = reconcile(job, [a, rep], tainted={disc.id: disc})
    assert not res.place and not res.stop and not res.disconnect_updates
    assert not res.followup_evals()


def test_unknown_alloc_does_not_count_toward_scale_down():
    job = disconnect_job(count=2)
    disc, ready = node(NodeStatus.DISCONNECTED), node()
    a = unknown(job, disc, 0)
    allocs = [a, running(job, ready, 0), running(job, ready, 1)]
    res = reconcile(job, allocs, tainted={disc.id: disc})
    assert not res.stop


def test_expired_unknown_alloc_is_lost():
    job = disconnect_job()
    disc = node(NodeStatus.DISCONNECTED)
    a = unknown(job, disc, since=NOW - LOST_AFTER - SECOND)
    res = reconcile(job, [a], tainted={disc.id: disc})
    assert [(s.alloc.id, s.client_status) for s in res.stop] == [(a.id, ClientStatus.LOST)]
    assert len(res.place) == 1 and res.place[0].lost


def test_expired_unknown_alloc_with_replacement_is_lost_without_new_placement():
    job = disconnect_job()
    disc, ready = node(NodeStatus.DISCONNECTED), node()
    a = unknown(job, disc, since=NOW - LOST_AFTER - SECOND)
    rep = running(job, ready)
    a.next_allocation = rep.id
    res = reconcile(job, [a, rep], tainted={disc.id: disc})
    assert [s.client_status for s in res.stop] == [ClientStatus.LOST]
    assert not res.place


def test_node_down_with_replace_false_keeps_unknown_alloc():
    job = disconnect_job()
    job.task_groups[0].disconnect.replace = False
    down = node(NodeStatus.DOWN)
    a = unknown(job, down)
    res = reconcile(job, [a], tainted={down.id: down})
    assert not res.stop and not res.place


# ----------------------------------------------------------------- reconnect


def reconnect_pair(job, *, orig_status=ClientStatus.RUNNING, rep_status=ClientStatus.RUNNING):
    back, other = node(), node()
    orig = unknown(job, back, status=orig_status)
    rep = running(job, other)
    rep.client_status = rep_status
    orig.next_allocation = rep.id
    rep.previous_allocation = orig.id
    return back, orig, rep


def test_reconnect_running_keeps_original_by_default():
    job = disconnect_job()
    _, orig, rep = reconnect_pair(job)
    res = reconcile(job, [orig, rep])
    assert [(s.alloc.id, s.description) for s in res.stop] == [(rep.id, util.ALLOC_RECONNECTED)]
    update = res.reconnect_updates[orig.id]
    assert structs.last_client_state(update) == ClientStatus.RUNNING
    assert len(update.alloc_states) == len(orig.alloc_states) + 1
    assert not res.place
    assert res.desired_tg_updates["web"].reconnect_updates == 1


def test_reconnect_best_score_prefers_better_running_replacement():
    job = disconnect_job()
    _, orig, rep = reconnect_pair(job)
    orig.metrics.score_meta_data.add(node_id=orig.node_id, norm_score=0.2)
    rep.metrics.score_meta_data.add(node_id=rep.node_id, norm_score=0.9)
    res = reconcile(job, [orig, rep])
    assert [(s.alloc.id, s.description) for s in res.stop] == [(orig.id, util.ALLOC_NOT_NEEDED)]
    assert not res.reconnect_updates
    assert not res.place


def test_reconnect_best_score_keeps_original_if_replacement_not_running():
    job = disconnect_job()
    _, orig, rep = reconnect_pair(job, rep_status=ClientStatus.PENDING)
    orig.metrics.score_meta_data.add(node_id=orig.node_id, norm_score=0.2)
    rep.metrics.score_meta_data.add(node_id=rep.node_id, norm_score=0.9)
    res = reconcile(job, [orig, rep])
    assert [s.alloc.id for s in res.stop] == [rep.id]


@pytest.mark.parametrize(
    ("strategy", "kept"),
    [("keep_original", "orig"), ("keep_replacement", "rep"), ("longest_running", "orig")],
)
def test_reconnect_strategies(strategy, kept):
    job = disconnect_job(seed_era=False)
    job.task_groups[0].disconnect.reconcile = strategy
    _, orig, rep = reconnect_pair(job)
    orig.task_states["web"].CopyFrom(pb.TaskState(state="running", started_at=NOW - 10 * MINUTE))
    rep.task_states["web"].CopyFrom(pb.TaskState(state="running", started_at=NOW - MINUTE))
    res = reconcile(job, [orig, rep])
    stopped = {s.alloc.id for s in res.stop}
    if kept == "orig":
        assert stopped == {rep.id}
        assert orig.id in res.reconnect_updates
    else:
        assert stopped == {orig.id}
        assert not res.reconnect_updates


def test_longest_running_prefers_the_one_that_started():
    job = disconnect_job(seed_era=False)
    job.task_groups[0].disconnect.reconcile = "longest_running"
    tg = job.task_groups[0]
    orig, rep = mock.alloc(job, node()), mock.alloc(job, node())
    rep.task_states["web"].CopyFrom(pb.TaskState(state="running", started_at=NOW))
    assert pick_reconnecting(tg, orig, rep) is rep


def test_reconnect_newer_job_version_replacement_wins():
    job = disconnect_job()
    _, orig, rep = reconnect_pair(job)
    job.version += 1
    job.job_modify_index += 10
    rep.job_version = job.version
    rep.job_modify_index = job.job_modify_index
    job.task_groups[0].disconnect.reconcile = "keep_original"
    res = reconcile(job, [orig, rep], update_fn=inplace_on_change)
    assert {s.alloc.id for s in res.stop} == {orig.id}
    assert not res.reconnect_updates


def test_reconnect_of_older_job_version_is_stopped():
    job = disconnect_job()
    _, orig, rep = reconnect_pair(job)
    job.version += 1
    job.job_modify_index += 10
    rep.job_version = job.version
    rep.job_modify_index = job.job_modify_index
    res = reconcile(job, [orig, rep])
    assert [(s.alloc.id, s.description) for s in res.stop] == [(orig.id, util.ALLOC_NOT_NEEDED)]


def test_reconnect_failed_is_stopped_and_slot_refilled():
    job = disconnect_job()
    job.task_groups[0].disconnect.replace = False
    back = node()
    orig = unknown(job, back, status=ClientStatus.FAILED)
    res = reconcile(job, [orig])
    (stop,) = res.stop
    assert stop.alloc.id == orig.id
    assert stop.client_status == ClientStatus.FAILED
    assert stop.description == util.ALLOC_RESCHEDULED
    assert len(res.place) == 1


def test_reconnect_failed_with_replacement_keeps_replacement():
    job = disconnect_job()
    _, orig, rep = reconnect_pair(job, orig_status=ClientStatus.FAILED)
    res = reconcile(job, [orig, rep])
    assert [s.alloc.id for s in res.stop] == [orig.id]
    assert not res.place


def test_reconnect_failed_already_stopped_is_ignored():
    job = disconnect_job()
    back = node()
    orig = unknown(job, back, status=ClientStatus.FAILED)
    orig.desired_status = DesiredStatus.STOP
    rep = running(job, node())
    res = reconcile(job, [orig, rep])
    assert not res.stop and not res.place


def test_reconnect_desired_stop_is_stopped():
    job = disconnect_job(count=1)
    back = node()
    orig = unknown(job, back, status=ClientStatus.RUNNING)
    orig.desired_transition.migrate = True
    rep = running(job, node())
    orig.next_allocation = rep.id
    res = reconcile(job, [orig, rep])
    assert [(s.alloc.id, s.description) for s in res.stop] == [(orig.id, util.ALLOC_NOT_NEEDED)]


def test_reconnect_follows_the_replacement_chain():
    job = disconnect_job()
    job.task_groups[0].disconnect.reconcile = "keep_original"
    back = node()
    orig = unknown(job, back, status=ClientStatus.RUNNING)
    r1 = running(job, node())
    r1.client_status = ClientStatus.FAILED
    r1.desired_status = DesiredStatus.STOP
    r2 = running(job, node())
    orig.next_allocation, r1.next_allocation = r1.id, r2.id
    res = reconcile(job, [orig, r1, r2])
    assert {s.alloc.id for s in res.stop} == {r2.id}
    assert orig.id in res.reconnect_updates


def test_reconnected_alloc_is_not_reconnected_again():
    """PR #15068: once the reconnect is recorded (last AllocState running),
    later evals see a normal running alloc."""
    job = disconnect_job()
    a = unknown(job, node())
    a.alloc_states.add(field="client_status", value=ClientStatus.RUNNING, time=NOW - SECOND)
    res = reconcile(job, [a])
    assert not res.reconnect_updates and not res.stop and not res.place


def test_running_alloc_with_task_event_only_is_not_reconnecting():
    job = disconnect_job()
    a = running(job, node())
    a.task_states["web"].CopyFrom(
        pb.TaskState(state="running", events=[pb.TaskEvent(type="Reconnected", time=NOW)])
    )
    res = reconcile(job, [a])
    assert not res.reconnect_updates and not res.stop


def test_alloc_update_before_heartbeat_places_no_spurious_replacement():
    """The client pushed `running` while its node is still `disconnected`
    (UpdateAlloc before the heartbeat): neither a disconnect nor a new
    replacement; the replacement already running is kept."""
    job = disconnect_job()
    disc = node(NodeStatus.DISCONNECTED)
    orig = unknown(job, disc, status=ClientStatus.RUNNING)
    rep = running(job, node())
    orig.next_allocation = rep.id
    res = reconcile(job, [orig, rep], tainted={disc.id: disc})
    assert not res.place
    assert not res.stop
    assert not res.disconnect_updates
    assert not res.followup_evals()


def test_alloc_update_before_heartbeat_without_replacement_places_nothing():
    job = disconnect_job()
    job.task_groups[0].disconnect.replace = False
    disc = node(NodeStatus.DISCONNECTED)
    orig = unknown(job, disc, status=ClientStatus.RUNNING)
    res = reconcile(job, [orig], tainted={disc.id: disc})
    assert not res.place and not res.stop and not res.disconnect_updates


# ------------------------------------------------- Nomad's failed-reconnect cases


def _resumable(count: int) -> tuple[pb.Job, list[pb.Allocation]]:
    """Nomad's buildResumableAllocations: `count` running allocs of a group
    with lost_after 5 min, on nodes of their own."""
    job = mock.job(count=count)
    job.task_groups[0].disconnect.lost_after = LOST_AFTER
    return job, [running(job, node(), i) for i in range(count)]


@pytest.mark.parametrize("replaced", [True, False])
def test_nomad_failed_originals_on_reconnect(replaced: bool):
    """TestReconciler_Disconnected_Client: 4 allocs, 2 of them come back
    `failed` from their node. stop-original-failed-on-reconnect (with a
    running replacement each): stop 2, ignore 4, place nothing.
    reschedule-original-failed-if-not-replaced: stop 2, place 2, ignore 2."""
    job, allocs = _resumable(4)
    back = node()
    for a in allocs[:2]:
        a.node_id = back.id
        a.client_status = ClientStatus.FAILED
        a.alloc_states.add(field="client_status", value=ClientStatus.UNKNOWN, time=NOW - MINUTE)
    originals = {a.id for a in allocs[:2]}
    if replaced:
        for a in allocs[:2]:
            rep = running(job, node(), structs.alloc_name_index(a.name))
            rep.previous_allocation = a.id
            a.next_allocation = rep.id
            allocs.append(rep)
    res = reconcile(job, allocs, tainted={back.id: back})
    assert {s.alloc.id for s in res.stop} == originals
    assert all(s.client_status == ClientStatus.FAILED for s in res.stop)
    d = res.desired_tg_updates["web"]
    if replaced:
        assert (d.stop, d.ignore, d.place) == (2, 4, 0)
        assert not res.place
    else:
        assert (d.stop, d.ignore, d.place) == (2, 2, 2)
        assert sorted(p.name for p in res.place) == sorted(a.name for a in allocs[:2])


def test_unknown_alloc_on_a_node_back_but_not_reported_is_left_alone():
    """Issue 33: the node heartbeated (initializing) but has not pushed its
    allocs: an alloc still unknown there is neither reconnected (its
    replacement stopped) nor replaced again; its client's report decides."""
    job = disconnect_job()
    back, orig, rep = reconnect_pair(job, orig_status=ClientStatus.UNKNOWN)
    res = reconcile(job, [orig, rep], initializing=frozenset({back.id}))
    assert not res.stop and not res.place and not res.reconnect_updates
    # without a replacement it still counts: nothing placed for it
    alone = unknown(job, back)
    res = reconcile(job, [alone], initializing=frozenset({back.id}))
    assert not res.stop and not res.place


def test_unknown_alloc_on_an_initializing_node_past_lost_after_is_lost():
    job = disconnect_job()
    back = node(NodeStatus.INITIALIZING)
    orig = unknown(job, back, since=NOW - LOST_AFTER - SECOND)
    res = reconcile(job, [orig], initializing=frozenset({back.id}))
    assert [(s.alloc.id, s.client_status) for s in res.stop] == [(orig.id, ClientStatus.LOST)]
