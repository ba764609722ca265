"""Seed 003 end to end on the harness: disconnect, reconnect (in both
orders of heartbeat and alloc update), failed reconnect, expiry, and
stop_after_client_disconnect follow-ups, with the state the plans leave
behind."""

from __future__ import annotations

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
from tests.unit.scheduler.test_generic_sched import (
    live_allocs,
    planned,
    register,
    run,
    stops,
)

LOST_AFTER = 10 * MINUTE


def setup(
    *, replace: bool = True, delay: int = 0
) -> tuple[Harness, list[pb.Node], pb.Job, pb.Allocation]:
    h = Harness()
    nodes = [mock.node() for _ in range(3)]
    h.upsert_nodes(*nodes)
    job = mock.job(count=1)
    tg = job.task_groups[0]
    tg.max_client_disconnect = LOST_AFTER
    if not replace:
        tg.disconnect.replace = False
    tg.reschedule_policy.CopyFrom(
        pb.ReschedulePolicy(delay=delay, delay_function="constant", unlimited=True)
    )
    job = register(h, job)
    a = mock.alloc(job, nodes[0])
    a.alloc_states.add(field="client_status", value="running", time=structs.now_ns() - MINUTE)
    # placed with the best possible score: best_score keeps it on reconnect
    a.metrics.score_meta_data.add(node_id=nodes[0].id, norm_score=1.0)
    h.upsert_allocs(a)
    return h, nodes, job, h.alloc(a.id)


def set_node(h: Harness, node: pb.Node, status: str) -> None:
    n = structs.copy_msg(h.node(node.id))
    n.status = status
    h.upsert_nodes(n)


def client_update(h: Harness, alloc_id: str, status: str) -> None:
    """What Node.UpdateAlloc writes: the client status, no AllocState."""
    a = structs.copy_msg(h.alloc(alloc_id))
    a.client_status = status
    h.upsert_allocs(a)


def disconnect(h, nodes, job, a):
    set_node(h, nodes[0], NodeStatus.DISCONNECTED)
    run(h, job, Trigger.NODE_UPDATE, node_id=nodes[0].id)
    (rep,) = [x for x in planned(h.last_plan()) if x.id != a.id]
    return rep


def test_disconnect_marks_unknown_places_replacement_and_schedules_timeout():
    h, nodes, job, a = setup()
    before = structs.now_ns()
    rep = disconnect(h, nodes, job, a)

    stored = h.alloc(a.id)
    assert stored.client_status == ClientStatus.UNKNOWN
    assert stored.desired_status == DesiredStatus.RUN
    assert structs.last_client_state(stored) == ClientStatus.UNKNOWN
    assert stored.next_allocation == rep.id
    assert rep.previous_allocation == a.id and rep.name == a.name
    assert rep.node_id != nodes[0].id

    (timeout,) = [e for e in h.create_evals if e.triggered_by == Trigger.MAX_DISCONNECT_TIMEOUT]
    assert before + LOST_AFTER <= timeout.wait_until <= structs.now_ns() + LOST_AFTER
    assert stored.followup_eval_id == timeout.id
    assert h.last_eval().status == EvalStatus.COMPLETE


def test_disconnect_again_is_a_noop():
    h, nodes, job, a = setup()
    disconnect(h, nodes, job, a)
    plans = len(h.plans)
    run(h, job, Trigger.NODE_UPDATE)
    assert len(h.plans) == plans


def test_reconnect_after_heartbeat_keeps_original_and_stops_replacement():
    h, nodes, job, a = setup()
    rep = disconnect(h, nodes, job, a)
    client_update(h, rep.id, ClientStatus.RUNNING)
    set_node(h, nodes[0], NodeStatus.READY)
    client_update(h, a.id, ClientStatus.RUNNING)
    run(h, job, Trigger.RECONNECT)

    plan = h.last_plan()
    assert [(s.alloc_id, s.desired_description) for s in stops(plan)] == [
        (rep.id, util.ALLOC_RECONNECTED)
    ]
    stored = h.alloc(a.id)
    assert structs.last_client_state(stored) == ClientStatus.RUNNING  # persisted by the plan
    assert h.alloc(rep.id).desired_status == DesiredStatus.STOP
    assert [x.id for x in live_allocs(h, job)] == [a.id]

    # the reconnect is recorded: a later eval changes nothing
    n = len(h.plans)
    run(h, job, Trigger.NODE_UPDATE)
    assert len(h.plans) == n


def test_alloc_update_before_heartbeat_places_nothing_then_reconnects():
    h, nodes, job, a = setup()
    rep = disconnect(h, nodes, job, a)
    client_update(h, rep.id, ClientStatus.RUNNING)
    client_update(h, a.id, ClientStatus.RUNNING)  # node still disconnected
    n = len(h.plans)
    run(h, job, Trigger.RECONNECT)
    assert len(h.plans) == n, "no spurious replacement, no second disconnect"
    assert len(live_allocs(h, job)) == 2

    set_node(h, nodes[0], NodeStatus.READY)
    run(h, job, Trigger.NODE_UPDATE)
    assert [s.alloc_id for s in stops(h.last_plan())] == [rep.id]


def test_reconnect_keep_replacement_strategy():
    h, nodes, job, a = setup()
    job.task_groups[0].disconnect.reconcile = "keep_replacement"
    job = register(h, job)
    rep = disconnect(h, nodes, job, a)
    set_node(h, nodes[0], NodeStatus.READY)
    client_update(h, a.id, ClientStatus.RUNNING)
    run(h, job, Trigger.RECONNECT)
    stopped = {s.alloc_id: s.desired_description for s in stops(h.last_plan())}
    assert stopped == {a.id: util.ALLOC_NOT_NEEDED}
    assert rep.id in {x.id for x in live_allocs(h, job)}


def test_reconnect_failed_is_stopped_replacement_kept():
    h, nodes, job, a = setup()
    rep = disconnect(h, nodes, job, a)
    set_node(h, nodes[0], NodeStatus.READY)
    client_update(h, a.id, ClientStatus.FAILED)
    run(h, job, Trigger.RECONNECT)
    (s,) = stops(h.last_plan())
    assert s.alloc_id == a.id and s.client_status == ClientStatus.FAILED
    assert s.desired_description == util.ALLOC_RESCHEDULED
    assert [x.id for x in live_allocs(h, job)] == [rep.id]


def updated_while_away(
    h: Harness, nodes: list[pb.Node], job: pb.Job, a: pb.Allocation
) -> tuple[pb.Job, pb.Allocation]:
    """The node disconnects and `a` is replaced; then a destructive job
    update replaces the running replacement only (it runs the new version).
    The job as updated, and the replacement."""
    rep = disconnect(h, nodes, job, a)
    client_update(h, rep.id, ClientStatus.RUNNING)
    job.task_groups[0].tasks[0].env["V"] = "2"
    job = register(h, job)
    newer = structs.copy_msg(h.alloc(rep.id))
    newer.job_version = job.version
    newer.job_modify_index = job.job_modify_index
    h.upsert_allocs(newer)
    return job, rep


def test_job_update_while_disconnected_then_reconnect_keeps_newer_replacement():
    h, nodes, job, a = setup()
    job, rep = updated_while_away(h, nodes, job, a)
    set_node(h, nodes[0], NodeStatus.READY)
    client_update(h, a.id, ClientStatus.RUNNING)
    run(h, job, Trigger.RECONNECT)
    stopped = {s.alloc_id: s.desired_description for s in stops(h.last_plan())}
    assert stopped == {a.id: util.ALLOC_NOT_NEEDED}
    assert [x.id for x in live_allocs(h, job)] == [rep.id]


def test_expired_unknown_alloc_becomes_lost_at_timeout():
    h, nodes, job, a = setup()
    rep = disconnect(h, nodes, job, a)
    (timeout,) = [e for e in h.create_evals if e.triggered_by == Trigger.MAX_DISCONNECT_TIMEOUT]
    # time passes: age the unknown AllocState past lost_after
    aged = structs.copy_msg(h.alloc(a.id))
    aged.alloc_states[-1].time -= LOST_AFTER + SECOND
    h.upsert_allocs(aged)
    h.process(job.type, timeout)
    (s,) = stops(h.last_plan())
    assert s.alloc_id == a.id and s.client_status == ClientStatus.LOST
    assert not planned(h.last_plan())  # the replacement already runs
    assert [x.id for x in live_allocs(h, job)] == [rep.id]


def test_disconnect_with_replace_false_waits_for_the_node():
    h, nodes, job, a = setup(replace=False)
    set_node(h, nodes[0], NodeStatus.DISCONNECTED)
    run(h, job, Trigger.NODE_UPDATE)
    (upd,) = planned(h.last_plan())
    assert upd.id == a.id and upd.client_status == ClientStatus.UNKNOWN
    assert len(live_allocs(h, job)) == 1


def test_disconnect_with_reschedule_delay_replaces_later():
    h, nodes, job, a = setup(delay=30 * SECOND)
    set_node(h, nodes[0], NodeStatus.DISCONNECTED)
    run(h, job, Trigger.NODE_UPDATE)
    (upd,) = planned(h.last_plan())
    assert upd.id == a.id
    triggers = sorted(e.triggered_by for e in h.create_evals)
    assert triggers == sorted([Trigger.MAX_DISCONNECT_TIMEOUT, Trigger.RETRY_FAILED_ALLOC])
    resched = next(e for e in h.create_evals if e.triggered_by == Trigger.RETRY_FAILED_ALLOC)
    assert h.alloc(a.id).followup_eval_id == resched.id
    h.create_evals.clear()
    h.process(job.type, resched)
    (rep,) = [x for x in planned(h.last_plan()) if x.id != a.id]
    assert rep.previous_allocation == a.id


def test_stop_after_client_disconnect_followup_then_replacement():
    h = Harness()
    nodes = [mock.node() for _ in range(2)]
    h.upsert_nodes(*nodes)
    job = mock.job(count=1)
    job.task_groups[0].stop_after_client_disconnect = 90 * SECOND
    job = register(h, job)
    a = mock.alloc(job, nodes[0])
    h.upsert_allocs(a)
    set_node(h, nodes[0], NodeStatus.DOWN)
    before = structs.now_ns()
    run(h, job, Trigger.NODE_UPDATE)

    (s,) = stops(h.last_plan())
    assert s.alloc_id == a.id and s.client_status == ClientStatus.LOST
    assert not planned(h.last_plan())
    (follow,) = h.create_evals
    assert follow.triggered_by == Trigger.ALLOC_FAILURE
    assert follow.wait_until >= before + 90 * SECOND + 5 * SECOND
    assert h.alloc(a.id).followup_eval_id == follow.id
    assert h.last_eval().next_eval == follow.id

    h.process(job.type, follow)
    (rep,) = planned(h.last_plan())
    assert rep.node_id == nodes[1].id and rep.name == a.name


def test_reconnect_eval_while_node_initializing_plans_nothing_on_that_node():
    """Seed 003 order: heartbeat (node initializing), alloc update, reconnect
    eval, next heartbeat (ready). The planner refuses alloc updates for a
    node that is not ready, so the reconnect eval plans none there (it would
    be rejected until the eval failed): it keeps the original and stops the
    replacement, and the node's ready eval records the reconnect."""
    h, nodes, job, a = setup()
    rep = disconnect(h, nodes, job, a)
    client_update(h, rep.id, ClientStatus.RUNNING)
    set_node(h, nodes[0], NodeStatus.INITIALIZING)
    client_update(h, a.id, ClientStatus.RUNNING)
    run(h, job, Trigger.RECONNECT)
    plan = h.last_plan()
    assert nodes[0].id not in plan.node_allocation, "nothing planned on the initializing node"
    assert not planned(plan)
    assert [(s.alloc_id, s.desired_description) for s in stops(plan)] == [
        (rep.id, util.ALLOC_RECONNECTED)
    ]
    assert h.last_eval().status == EvalStatus.COMPLETE
    assert [x.id for x in live_allocs(h, job)] == [a.id]
    assert structs.last_client_state(h.alloc(a.id)) == ClientStatus.UNKNOWN

    set_node(h, nodes[0], NodeStatus.READY)
    run(h, job, Trigger.NODE_UPDATE, node_id=nodes[0].id)
    plan = h.last_plan()
    assert not stops(plan)
    assert [x.id for x in planned(plan)] == [a.id]
    assert structs.last_client_state(h.alloc(a.id)) == ClientStatus.RUNNING
    assert h.last_eval().status == EvalStatus.COMPLETE
    n = len(h.plans)
    run(h, job, Trigger.NODE_UPDATE)
    assert len(h.plans) == n


def test_reconnect_while_initializing_after_a_job_update_keeps_the_newer_replacement():
    """The job changed while the node was away and the replacement runs the
    new version: the reconnect eval stops the original (no update of it,
    no third copy), though its node is still initializing."""
    h, nodes, job, a = setup()
    job, rep = updated_while_away(h, nodes, job, a)
    set_node(h, nodes[0], NodeStatus.INITIALIZING)
    client_update(h, a.id, ClientStatus.RUNNING)
    run(h, job, Trigger.RECONNECT)
    plan = h.last_plan()
    assert not planned(plan)
    assert [(s.alloc_id, s.desired_description) for s in stops(plan)] == [
        (a.id, util.ALLOC_NOT_NEEDED)
    ]
    assert [x.id for x in live_allocs(h, job)] == [rep.id]
    assert h.last_eval().status == EvalStatus.COMPLETE


def two_replaced() -> tuple[
    Harness, list[pb.Node], pb.Job, list[pb.Allocation], list[pb.Allocation]
]:
    """Two originals on node 0 (placed with the best possible score, so
    best_score would keep them) whose node disconnected: unknown, each
    replaced at once by an alloc now running elsewhere."""
    h = Harness()
    nodes = [mock.node() for _ in range(3)]
    h.upsert_nodes(*nodes)
    job = mock.job(count=2)
    tg = job.task_groups[0]
    tg.disconnect.lost_after = LOST_AFTER
    tg.reschedule_policy.CopyFrom(
        pb.ReschedulePolicy(delay=0, delay_function="constant", unlimited=True)
    )
    job = register(h, job)
    originals = [mock.alloc(job, nodes[0], index=i) for i in range(2)]
    for o in originals:
        o.metrics.score_meta_data.add(node_id=nodes[0].id, norm_score=1.0)
    h.upsert_allocs(*originals)
    set_node(h, nodes[0], NodeStatus.DISCONNECTED)
    run(h, job, Trigger.NODE_UPDATE, node_id=nodes[0].id)
    replacements = [x for x in live_allocs(h, job) if x.node_id != nodes[0].id]
    assert len(replacements) == 2
    for r in replacements:
        client_update(h, r.id, ClientStatus.RUNNING)
    return h, nodes, job, originals, replacements


def test_failed_originals_with_running_replacements_are_stopped_without_new_copies():
    """Two allocs of a node come back failed while their replacements run:
    both originals are stopped (client failed) and nothing is placed, so
    each name runs exactly once."""
    h, nodes, job, originals, replacements = two_replaced()

    set_node(h, nodes[0], NodeStatus.INITIALIZING)
    for o in originals:
        client_update(h, o.id, ClientStatus.FAILED)
    run(h, job, Trigger.RECONNECT)
    plan = h.last_plan()
    assert not planned(plan), "no third copy of a name"
    assert sorted((s.alloc_id, s.client_status) for s in stops(plan)) == sorted(
        (o.id, ClientStatus.FAILED) for o in originals
    )
    assert h.last_eval().status == EvalStatus.COMPLETE

    set_node(h, nodes[0], NodeStatus.READY)
    run(h, job, Trigger.NODE_UPDATE, node_id=nodes[0].id)
    live = live_allocs(h, job)
    assert sorted(x.id for x in live) == sorted(r.id for r in replacements)
    assert sorted(x.name for x in live) == sorted(o.name for o in originals)


def test_failed_originals_after_the_heartbeat_eval_keep_their_replacements():
    """Issue 33 (TestReconciler_Disconnected_Client,
    stop-original-failed-on-reconnect) in the order a real client brings:
    the heartbeat makes the node initializing and its node-update eval runs
    before the client has reported its allocs, which are still unknown.
    That eval leaves them and their running replacements alone (it cannot
    know whether they still run); when they come back failed they are
    stopped, the replacements kept and nothing placed: 4 allocs."""
    h, nodes, job, originals, replacements = two_replaced()

    set_node(h, nodes[0], NodeStatus.INITIALIZING)
    n = len(h.plans)
    run(h, job, Trigger.NODE_UPDATE, node_id=nodes[0].id)
    assert len(h.plans) == n, "nothing decided before the client reports"
    assert h.last_eval().status == EvalStatus.COMPLETE

    for o in originals:
        client_update(h, o.id, ClientStatus.FAILED)
    run(h, job, Trigger.RECONNECT)
    plan = h.last_plan()
    assert not planned(plan)
    assert sorted((s.alloc_id, s.client_status, s.desired_description) for s in stops(plan)) == (
        sorted((o.id, ClientStatus.FAILED, util.ALLOC_RESCHEDULED) for o in originals)
    )
    set_node(h, nodes[0], NodeStatus.READY)
    run(h, job, Trigger.NODE_UPDATE, node_id=nodes[0].id)
    assert sorted(x.id for x in live_allocs(h, job)) == sorted(r.id for r in replacements)
    assert len(h.snapshot().allocs_by_job(job.namespace, job.id)) == 4


def test_running_original_reported_after_the_heartbeat_eval_is_reconnected():
    """The same order with the original still running: the heartbeat's
    eval leaves the pair alone, the client's report decides it."""
    h, nodes, job, a = setup()
    rep = disconnect(h, nodes, job, a)
    client_update(h, rep.id, ClientStatus.RUNNING)
    set_node(h, nodes[0], NodeStatus.INITIALIZING)
    n = len(h.plans)
    run(h, job, Trigger.NODE_UPDATE, node_id=nodes[0].id)
    assert len(h.plans) == n
    assert len(live_allocs(h, job)) == 2

    client_update(h, a.id, ClientStatus.RUNNING)
    run(h, job, Trigger.RECONNECT)
    assert [(s.alloc_id, s.desired_description) for s in stops(h.last_plan())] == [
        (rep.id, util.ALLOC_RECONNECTED)
    ]
    assert [x.id for x in live_allocs(h, job)] == [a.id]
