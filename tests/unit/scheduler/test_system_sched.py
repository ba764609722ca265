"""The system scheduler on the in-memory harness (seed 004, Nomad's
scheduler_system_test.go): one alloc per feasible node."""

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
from corral.v1 import structs_pb2 as pb
from services.worker.scheduler import util
from tests.unit.scheduler.test_generic_sched import (
    cluster,
    live_allocs,
    planned,
    register,
    run,
    stops,
)


def system_allocs(h, job, nodes):
    allocs = [mock.alloc(job, n) for n in nodes]
    h.upsert_allocs(*allocs)
    return allocs


def test_register_places_one_alloc_per_node():
    h, nodes = cluster(10)
    job = register(h, mock.system_job())
    run(h, job)
    allocs = planned(h.last_plan())
    assert sorted(a.node_id for a in allocs) == sorted(n.id for n in nodes)
    assert {a.name for a in allocs} == {f"{job.id}.web[0]"}
    final = h.last_eval()
    assert final.status == EvalStatus.COMPLETE
    assert dict(final.queued_allocations) == {"web": 0}
    assert not h.create_evals


def test_register_twice_is_a_noop():
    h, _ = cluster(3)
    job = register(h, mock.system_job())
    run(h, job)
    run(h, job)
    assert len(h.plans) == 1


def test_only_nodes_of_job_datacenters():
    h, nodes = cluster(2)
    h.upsert_nodes(mock.node(datacenter="dc2"))
    job = register(h, mock.system_job())
    run(h, job)
    assert {a.node_id for a in planned(h.last_plan())} == {n.id for n in nodes}


def test_new_node_gets_an_alloc():
    h, nodes = cluster(3)
    job = register(h, mock.system_job())
    system_allocs(h, job, nodes)
    new = mock.node()
    h.upsert_nodes(new)
    run(h, job, Trigger.NODE_UPDATE, node_id=new.id)
    (a,) = planned(h.last_plan())
    assert a.node_id == new.id


def test_nodes_failing_constraints_are_filtered_silently():
    h, nodes = cluster(3)
    windows = mock.node(attributes={"kernel.name": "windows"})
    h.upsert_nodes(windows)
    job = register(h, mock.system_job())
    run(h, job)
    assert {a.node_id for a in planned(h.last_plan())} == {n.id for n in nodes}
    final = h.last_eval()
    assert not final.failed_tg_allocs
    assert dict(final.queued_allocations) == {"web": 0}
    assert not h.create_evals


def test_all_nodes_filtered_reports_metrics_without_blocking():
    h, _ = cluster(2, attributes={"kernel.name": "windows"})
    job = register(h, mock.system_job())
    run(h, job)
    final = h.last_eval()
    assert "web" in final.failed_tg_allocs
    assert final.failed_tg_allocs["web"].nodes_filtered > 0
    assert not h.create_evals


def test_filter_metrics_count_every_filtered_node():
    """Each node is selected on its own; the group's failure metrics add
    up every node's filter counts (Nomad's TestSystemSched_JobConstraint_AllFiltered)."""
    h, _ = cluster(2)
    job = mock.system_job()
    unique = pb.Constraint(l_target="${node.unique.name}", r_target="elsewhere", operand="==")
    job.constraints.append(unique)
    job = register(h, job)
    run(h, job)
    m = h.last_eval().failed_tg_allocs["web"]
    assert m.nodes_filtered == 2 and m.nodes_evaluated == 2
    assert dict(m.constraint_filtered) == {"${node.unique.name} == elsewhere": 2}


def test_filter_metrics_count_class_cached_nodes():
    """A node skipped because its computed class already failed counts too,
    under the constraint its class failed (Nomad's feasibility wrapper counts
    it as 'computed class ineligible'; every filtered node names its reason
    here): three nodes failing one constraint report it three times."""
    h, _ = cluster(3, attributes={"kernel.name": "windows"})
    job = register(h, mock.system_job())
    run(h, job)
    m = h.last_eval().failed_tg_allocs["web"]
    assert m.nodes_filtered == 3
    assert dict(m.constraint_filtered) == {"${attr.kernel.name} = linux": 3}


def test_exhausted_node_creates_blocked_eval_for_that_node():
    h, nodes = cluster(3)
    job = register(h, mock.system_job(cpu=3000))
    hog = mock.alloc(mock.job(cpu=3000), nodes[0])
    h.upsert_allocs(hog)
    run(h, job)
    placed_on = {a.node_id for a in planned(h.last_plan())}
    assert placed_on == {nodes[1].id, nodes[2].id}
    final = h.last_eval()
    assert final.failed_tg_allocs["web"].nodes_exhausted == 1
    (blocked,) = h.create_evals
    assert blocked.status == EvalStatus.BLOCKED
    assert blocked.node_id == nodes[0].id
    assert blocked.status_description == util.BLOCKED_EVAL_FAILED_PLACEMENTS
    assert final.status == EvalStatus.COMPLETE


def test_released_system_blocked_eval_still_failing_blocks_anew_for_the_node():
    """Nomad's system scheduler never reblocks: its blocked evals are per
    node, so a released one that still cannot place completes and a new
    blocked eval names the node that is still full (the tracker keeps the
    newer one per job)."""
    h, nodes = cluster(2)
    job = register(h, mock.system_job(cpu=3000))
    h.upsert_allocs(mock.alloc(mock.job(cpu=3000), nodes[0]))
    ev = mock.eval_for(job, triggered_by=Trigger.QUEUED_ALLOCS, node_id=nodes[0].id)
    h.process(job.type, ev)
    assert not h.reblock_evals
    (blocked,) = h.create_evals
    assert blocked.node_id == nodes[0].id and blocked.previous_eval == ev.id
    final = h.last_eval()
    assert final.id == ev.id and final.status == EvalStatus.COMPLETE


def test_job_deregister_stops_all():
    h, nodes = cluster(3)
    job = register(h, mock.system_job())
    allocs = system_allocs(h, job, nodes)
    job.stop = True
    job = register(h, job)
    run(h, job, Trigger.JOB_DEREGISTER)
    assert {s.alloc_id for s in stops(h.last_plan())} == {a.id for a in allocs}


def test_purged_job_stops_all():
    h, nodes = cluster(2)
    job = mock.system_job()
    allocs = system_allocs(h, job, nodes)
    run(h, job, Trigger.JOB_DEREGISTER)
    plan = h.last_plan()
    assert not plan.HasField("job")
    assert {s.alloc_id for s in stops(plan)} == {a.id for a in allocs}
    assert {h.alloc(a.id).desired_status for a in allocs} == {DesiredStatus.STOP}


def test_node_down_marks_lost_without_replacement():
    h, nodes = cluster(3)
    job = register(h, mock.system_job())
    allocs = system_allocs(h, job, nodes)
    down = structs.copy_msg(nodes[0])
    down.status = NodeStatus.DOWN
    h.upsert_nodes(down)
    run(h, job, Trigger.NODE_UPDATE, node_id=down.id)
    (s,) = stops(h.last_plan())
    assert s.alloc_id == allocs[0].id
    assert s.client_status == ClientStatus.LOST
    assert s.desired_description == util.ALLOC_LOST
    assert not planned(h.last_plan())


def test_drain_migrate_stops_alloc_without_replacement_on_node():
    h, nodes = cluster(2)
    job = register(h, mock.system_job())
    allocs = system_allocs(h, job, nodes)
    draining = structs.copy_msg(nodes[0])
    draining.drain = True
    draining.scheduling_eligibility = structs.Eligibility.INELIGIBLE
    h.upsert_nodes(draining)
    m = structs.copy_msg(allocs[0])
    m.desired_transition.migrate = True
    h.upsert_allocs(m)
    run(h, job, Trigger.NODE_DRAIN, node_id=draining.id)
    (s,) = stops(h.last_plan())
    assert s.alloc_id == m.id and s.desired_description == util.ALLOC_NODE_TAINTED
    assert not planned(h.last_plan())


def test_ineligible_node_keeps_alloc_unless_job_changed():
    h, nodes = cluster(2)
    job = register(h, mock.system_job())
    allocs = system_allocs(h, job, nodes)
    inel = structs.copy_msg(nodes[0])
    inel.scheduling_eligibility = structs.Eligibility.INELIGIBLE
    h.upsert_nodes(inel)
    run(h, job, Trigger.NODE_UPDATE)
    assert not h.plans
    job.task_groups[0].tasks[0].env["X"] = "1"
    job = register(h, job)
    run(h, job)
    stopped = {s.alloc_id: s.desired_description for s in stops(h.last_plan())}
    assert stopped[allocs[0].id] == util.ALLOC_NOT_NEEDED
    assert allocs[0].node_id not in {a.node_id for a in planned(h.last_plan())}


def test_in_place_update():
    h, nodes = cluster(3)
    job = register(h, mock.system_job())
    allocs = system_allocs(h, job, nodes)
    job.task_groups[0].restart_policy.attempts = 7
    job = register(h, job)
    run(h, job)
    assert not stops(h.last_plan())
    assert {a.id for a in planned(h.last_plan())} == {a.id for a in allocs}


def test_destructive_update_all_at_once_without_update_block():
    h, nodes = cluster(4)
    job = register(h, mock.system_job())
    allocs = system_allocs(h, job, nodes)
    job.task_groups[0].tasks[0].env["X"] = "1"
    job = register(h, job)
    run(h, job)
    assert {s.alloc_id for s in stops(h.last_plan())} == {a.id for a in allocs}
    new = planned(h.last_plan())
    assert len(new) == 4 and {a.previous_allocation for a in new} == {a.id for a in allocs}
    assert not h.create_evals


def test_rolling_update_with_max_parallel_and_stagger():
    h, nodes = cluster(10)
    job = mock.system_job()
    job.update.CopyFrom(pb.UpdateStrategy(max_parallel=3, stagger=20 * SECOND))
    job = register(h, job)
    system_allocs(h, job, nodes)
    job.task_groups[0].tasks[0].env["X"] = "1"
    job = register(h, job)
    ev = run(h, job)
    assert len(stops(h.last_plan())) == 3
    assert len(planned(h.last_plan())) == 3
    (rolling,) = h.create_evals
    assert rolling.triggered_by == Trigger.ROLLING_UPDATE
    assert rolling.wait == 20 * SECOND and rolling.previous_eval == ev.id
    assert h.last_eval().next_eval == rolling.id
    annotations_free = h.last_plan().annotations
    assert annotations_free.ByteSize() == 0

    # following rolling evals finish the job: 3 + 3 + 3 + 1
    for _ in range(3):
        nxt = h.create_evals[-1]
        h.process(job.type, nxt)
    updated = [a for a in live_allocs(h, job) if a.job_modify_index == job.job_modify_index]
    assert len(updated) == 10


def test_disconnected_node_marks_unknown_and_does_not_replace():
    h, nodes = cluster(2)
    job = mock.system_job()
    job.task_groups[0].max_client_disconnect = 10 * MINUTE
    job = register(h, job)
    allocs = system_allocs(h, job, nodes)
    disc = structs.copy_msg(nodes[0])
    disc.status = NodeStatus.DISCONNECTED
    h.upsert_nodes(disc)
    run(h, job, Trigger.NODE_UPDATE, node_id=disc.id)
    (upd,) = planned(h.last_plan())
    assert upd.id == allocs[0].id and upd.client_status == ClientStatus.UNKNOWN
    assert structs.last_client_state(upd) == ClientStatus.UNKNOWN
    assert not stops(h.last_plan())
    assert h.alloc(allocs[0].id).client_status == ClientStatus.UNKNOWN


def test_disconnected_node_without_lost_after_is_lost():
    h, nodes = cluster(2)
    job = register(h, mock.system_job())
    allocs = system_allocs(h, job, nodes)
    disc = structs.copy_msg(nodes[0])
    disc.status = NodeStatus.DISCONNECTED
    h.upsert_nodes(disc)
    run(h, job, Trigger.NODE_UPDATE)
    (s,) = stops(h.last_plan())
    assert s.alloc_id == allocs[0].id and s.client_status == ClientStatus.LOST


def test_reconnect_records_alloc_state():
    h, nodes = cluster(2)
    job = mock.system_job()
    job.task_groups[0].max_client_disconnect = 10 * MINUTE
    job = register(h, job)
    a = mock.alloc(job, nodes[0])
    a.alloc_states.add(field="client_status", value="unknown", time=structs.now_ns() - MINUTE)
    b = mock.alloc(job, nodes[1])
    h.upsert_allocs(a, b)
    run(h, job, Trigger.RECONNECT)
    (upd,) = planned(h.last_plan())
    assert upd.id == a.id
    assert structs.last_client_state(upd) == ClientStatus.RUNNING
    assert structs.last_client_state(h.alloc(a.id)) == ClientStatus.RUNNING
    # the next eval sees a normal running alloc
    run(h, job, Trigger.NODE_UPDATE)
    assert len(h.plans) == 1


def test_unknown_alloc_still_disconnected_is_ignored_and_expired_is_lost():
    h, nodes = cluster(2)
    job = mock.system_job()
    job.task_groups[0].max_client_disconnect = 10 * MINUTE
    job = register(h, job)
    disc = structs.copy_msg(nodes[0])
    disc.status = NodeStatus.DISCONNECTED
    h.upsert_nodes(disc)
    a = mock.alloc(job, nodes[0], client_status=ClientStatus.UNKNOWN)
    a.alloc_states.add(field="client_status", value="unknown", time=structs.now_ns() - MINUTE)
    b = mock.alloc(job, nodes[1])
    h.upsert_allocs(a, b)
    run(h, job, Trigger.NODE_UPDATE)
    assert not h.plans
    expired = structs.copy_msg(a)
    expired.alloc_states[0].time = structs.now_ns() - 11 * MINUTE
    h.upsert_allocs(expired)
    run(h, job, Trigger.MAX_DISCONNECT_TIMEOUT)
    (s,) = stops(h.last_plan())
    assert s.alloc_id == a.id and s.client_status == ClientStatus.LOST


def test_max_attempts_five_and_no_blocked_eval():
    h, nodes = cluster(1)
    job = register(h, mock.system_job())
    h.reject_nodes.add(nodes[0].id)
    run(h, job)
    assert len(h.plans) == 5
    assert h.last_eval().status == EvalStatus.FAILED
    assert h.last_eval().status_description == "maximum attempts reached (5)"
    assert not h.create_evals


def test_progress_resets_attempts():
    h, nodes = cluster(2)
    job = register(h, mock.system_job())
    h.reject_nodes.add(nodes[0].id)
    h.reject_plans = 5
    run(h, job)
    # the first plan placed on the other node (progress: the count resets),
    # then four rejected retries, then success on the sixth plan; without
    # the reset the fifth rejection would have failed the eval
    assert len(h.plans) == 6
    assert h.last_eval().status == EvalStatus.COMPLETE
    assert len(live_allocs(h, job)) == 2


def test_system_rejects_periodic_trigger():
    h, _ = cluster(1)
    job = register(h, mock.system_job())
    run(h, job, Trigger.PERIODIC_JOB)
    assert h.last_eval().status == EvalStatus.FAILED
    assert not h.plans


def test_alloc_for_removed_group_is_stopped():
    h, nodes = cluster(2)
    job = register(h, mock.system_job())
    allocs = system_allocs(h, job, nodes)
    job.task_groups[0].name = "other"
    job = register(h, job)
    run(h, job)
    assert {s.alloc_id for s in stops(h.last_plan())} == {a.id for a in allocs}
    assert {a.name for a in planned(h.last_plan())} == {f"{job.id}.other[0]"}


def test_datacenter_removed_from_job_stops_its_allocs():
    h, nodes = cluster(2)
    dc2 = mock.node(datacenter="dc2")
    h.upsert_nodes(dc2)
    job = mock.system_job(datacenters=("dc1", "dc2"))
    job = register(h, job)
    allocs = system_allocs(h, job, [*nodes, dc2])
    del job.datacenters[:]
    job.datacenters.append("dc1")
    job = register(h, job)
    run(h, job)
    stopped = {s.alloc_id for s in stops(h.last_plan())}
    assert stopped == {allocs[2].id}


def test_queued_allocations_with_multiple_task_groups():
    h, nodes = cluster(3)
    job = mock.system_job()
    tg2 = structs.copy_msg(job.task_groups[0])
    tg2.name = "sidecar"
    tg2.constraints.add(l_target="${node.unique.id}", r_target=nodes[0].id, operand="=")
    job.task_groups.append(tg2)
    job = register(h, job)
    run(h, job)
    by_group: dict[str, int] = {}
    for a in planned(h.last_plan()):
        by_group[a.task_group] = by_group.get(a.task_group, 0) + 1
    assert by_group == {"web": 3, "sidecar": 1}
    assert dict(h.last_eval().queued_allocations) == {"web": 0, "sidecar": 0}
    assert not h.create_evals


def test_node_update_with_nothing_to_do_is_a_noop():
    h, nodes = cluster(2)
    job = register(h, mock.system_job())
    system_allocs(h, job, nodes)
    run(h, job, Trigger.NODE_UPDATE, node_id=nodes[0].id)
    assert not h.plans
    assert h.last_eval().status == EvalStatus.COMPLETE


def test_alloc_update_before_heartbeat_is_left_alone():
    """Seed 003 on a system job: running again while the node is still
    disconnected: no second disconnect, nothing lost, nothing placed."""
    h, nodes = cluster(2)
    job = mock.system_job()
    job.task_groups[0].max_client_disconnect = 10 * MINUTE
    job = register(h, job)
    disc = structs.copy_msg(nodes[0])
    disc.status = NodeStatus.DISCONNECTED
    h.upsert_nodes(disc)
    a = mock.alloc(job, nodes[0])
    a.alloc_states.add(field="client_status", value="unknown", time=structs.now_ns() - MINUTE)
    h.upsert_allocs(a, mock.alloc(job, nodes[1]))
    run(h, job, Trigger.RECONNECT)
    assert not h.plans


def _disconnect_then_expire(sched_job: pb.Job) -> None:
    """Seed 003 for system and sysbatch jobs: the node's alloc goes unknown
    with a max-disconnect-timeout follow-up at now + lost_after; when that
    eval runs after the window the alloc is lost, and nothing is placed."""
    h, nodes = cluster(2)
    sched_job.task_groups[0].disconnect.lost_after = 10 * MINUTE
    job = register(h, sched_job)
    allocs = system_allocs(h, job, nodes)
    disc = structs.copy_msg(nodes[0])
    disc.status = NodeStatus.DISCONNECTED
    h.upsert_nodes(disc)
    before = structs.now_ns()
    ev = run(h, job, Trigger.NODE_UPDATE, node_id=disc.id)

    (timeout,) = h.create_evals
    assert timeout.triggered_by == Trigger.MAX_DISCONNECT_TIMEOUT
    assert timeout.status == EvalStatus.PENDING and timeout.type == job.type
    assert timeout.previous_eval == ev.id
    assert before + 10 * MINUTE <= timeout.wait_until <= structs.now_ns() + 10 * MINUTE
    stored = h.alloc(allocs[0].id)
    assert stored.client_status == ClientStatus.UNKNOWN
    assert stored.followup_eval_id == timeout.id
    assert h.last_eval().status == EvalStatus.COMPLETE
    assert h.last_eval().next_eval == timeout.id

    # the window passes with the node still away
    aged = structs.copy_msg(stored)
    aged.alloc_states[-1].time = structs.now_ns() - 10 * MINUTE - SECOND
    h.upsert_allocs(aged)
    h.process(job.type, timeout)
    (s,) = stops(h.last_plan())
    assert s.alloc_id == allocs[0].id and s.client_status == ClientStatus.LOST
    assert not planned(h.last_plan())
    assert h.alloc(allocs[0].id).client_status == ClientStatus.LOST
    assert h.last_eval().id == timeout.id and h.last_eval().status == EvalStatus.COMPLETE
    assert len(h.create_evals) == 1


def test_disconnect_schedules_timeout_that_marks_lost():
    _disconnect_then_expire(mock.system_job())


def test_sysbatch_disconnect_schedules_timeout_that_marks_lost():
    _disconnect_then_expire(mock.sysbatch_job())


def test_disconnect_timeouts_of_one_node_share_one_eval():
    h, nodes = cluster(1)
    job = mock.system_job(count=3)
    job.task_groups[0].disconnect.lost_after = 10 * MINUTE
    job = register(h, job)
    h.upsert_allocs(*[mock.alloc(job, nodes[0], index=i) for i in range(3)])
    disc = structs.copy_msg(nodes[0])
    disc.status = NodeStatus.DISCONNECTED
    h.upsert_nodes(disc)
    run(h, job, Trigger.NODE_UPDATE, node_id=disc.id)
    (timeout,) = h.create_evals
    assert {a.followup_eval_id for a in live_allocs(h, job)} == {timeout.id}


def test_reconnect_on_initializing_node_waits_for_ready():
    """The alloc update came after the heartbeat but before the node is
    ready: the planner would refuse an update there, so the reconnect eval
    plans nothing and completes; the node's ready eval records it."""
    h, nodes = cluster(2)
    job = mock.system_job()
    job.task_groups[0].disconnect.lost_after = 10 * MINUTE
    job = register(h, job)
    a = mock.alloc(job, nodes[0])
    a.alloc_states.add(field="client_status", value="unknown", time=structs.now_ns() - MINUTE)
    h.upsert_allocs(a, mock.alloc(job, nodes[1]))
    init = structs.copy_msg(nodes[0])
    init.status = NodeStatus.INITIALIZING
    h.upsert_nodes(init)
    run(h, job, Trigger.RECONNECT)
    assert not h.plans
    assert h.last_eval().status == EvalStatus.COMPLETE

    ready = structs.copy_msg(init)
    ready.status = NodeStatus.READY
    h.upsert_nodes(ready)
    run(h, job, Trigger.NODE_UPDATE, node_id=ready.id)
    (upd,) = planned(h.last_plan())
    assert upd.id == a.id and structs.last_client_state(upd) == ClientStatus.RUNNING
