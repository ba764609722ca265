"""evaluate_plan on StateStore-built snapshots: every rule of Nomad's
evaluatePlan / evaluateNodePlan (nomad-semantics.md §4)."""

from __future__ import annotations

from corral.domain.store import StateSnapshot, StateStore
from corral.domain.structs import (
    ClientStatus,
    DesiredStatus,
    Eligibility,
    NodeStatus,
    new_id,
)
from corral.testing import mock
from corral.v1 import structs_pb2 as pb
from services.planner.evaluate import (
    REASON_DISCONNECTED,
    REASON_DOWN,
    REASON_INELIGIBLE,
    REASON_NODE_MISSING,
    REASON_NOT_READY,
    evaluate_node_plan,
    evaluate_plan,
)

TABLES = {"nodes": 7, "allocs": 11, "evals": 40, "jobs": 30}


def snap_of(
    nodes: list[pb.Node],
    jobs: list[pb.Job],
    allocs: list[pb.Allocation] = (),  # type: ignore[assignment]
) -> StateSnapshot:
    return StateStore.build(50, nodes=nodes, jobs=jobs, allocs=allocs, table_indexes=TABLES)


def plan_for(
    job: pb.Job,
    *,
    place: list[pb.Allocation] = (),  # type: ignore[assignment]
    stop: list[pb.Allocation] = (),  # type: ignore[assignment]
    preempt: list[pb.Allocation] = (),  # type: ignore[assignment]
    all_at_once: bool = False,
) -> pb.Plan:
    plan = pb.Plan(eval_id=new_id(), eval_token="t", priority=50, job=job, all_at_once=all_at_once)
    for a in place:
        plan.node_allocation[a.node_id].allocs.append(a)
    for a in stop:
        plan.node_update[a.node_id].stops.add(alloc_id=a.id, desired_description="stopped")
    for a in preempt:
        plan.node_preemptions[a.node_id].stops.add(alloc_id=a.id, preempted_by_allocation="x")
    return plan


def new_allocs(job: pb.Job, node: pb.Node, n: int, start: int = 0) -> list[pb.Allocation]:
    return [
        mock.alloc(job, node, index=start + i, client_status=ClientStatus.PENDING) for i in range(n)
    ]


# mock nodes: 4000 MHz - 100 reserved; mock allocs: 500 MHz -> 7 fit, 8 do not


def test_plan_that_fits_is_committed_whole() -> None:
    node, job = mock.node(), mock.job()
    snap = snap_of([node], [job])
    plan = plan_for(job, place=new_allocs(job, node, 7))
    ev = evaluate_plan(snap, plan)
    assert not ev.partial
    assert ev.result.refresh_index == 0
    assert len(ev.result.node_allocation[node.id].allocs) == 7
    assert not ev.is_noop()


def test_over_capacity_node_is_rejected_with_the_dimension() -> None:
    node, job = mock.node(), mock.job()
    snap = snap_of([node], [job])
    plan = plan_for(job, place=new_allocs(job, node, 8))
    assert evaluate_node_plan(snap, plan, node.id) == "cpu"
    ev = evaluate_plan(snap, plan)
    assert ev.partial and list(ev.result.rejected_nodes) == [node.id]
    assert node.id not in ev.result.node_allocation
    assert ev.is_noop()


def test_existing_non_terminal_allocs_count_terminal_do_not() -> None:
    node, job = mock.node(), mock.job()
    running = new_allocs(job, node, 6)
    done = mock.alloc(job, node, index=10, client_status=ClientStatus.COMPLETE)
    stopped = mock.alloc(job, node, index=11, desired_status=DesiredStatus.STOP)
    snap = snap_of([node], [job], [*running, done, stopped])
    assert (
        evaluate_node_plan(snap, plan_for(job, place=new_allocs(job, node, 1, 20)), node.id) == ""
    )
    assert (
        evaluate_node_plan(snap, plan_for(job, place=new_allocs(job, node, 2, 20)), node.id)
        == "cpu"
    )


def test_stops_and_preemptions_in_the_plan_free_capacity() -> None:
    node, job = mock.node(), mock.job()
    running = new_allocs(job, node, 7)
    snap = snap_of([node], [job], running)
    extra = new_allocs(job, node, 1, 20)
    assert evaluate_node_plan(snap, plan_for(job, place=extra), node.id) == "cpu"
    assert evaluate_node_plan(snap, plan_for(job, place=extra, stop=running[:1]), node.id) == ""
    assert evaluate_node_plan(snap, plan_for(job, place=extra, preempt=running[:1]), node.id) == ""


def test_update_of_an_existing_alloc_replaces_it_not_adds() -> None:
    node, job = mock.node(), mock.job()
    running = new_allocs(job, node, 7)
    snap = snap_of([node], [job], running)
    bigger = pb.Allocation()
    bigger.CopyFrom(running[0])
    bigger.resources.cpu += 300  # 7*500 + 300 = 3800 <= 3900
    assert evaluate_node_plan(snap, plan_for(job, place=[bigger]), node.id) == ""


def test_missing_node_is_rejected_but_stop_only_node_is_not_checked() -> None:
    node, job = mock.node(), mock.job()
    ghost = mock.node()
    existing = mock.alloc(job, ghost)
    snap = snap_of([node], [job], [existing])
    plan = plan_for(job, place=new_allocs(job, ghost, 1))
    assert evaluate_node_plan(snap, plan, ghost.id) == REASON_NODE_MISSING
    stop_only = plan_for(job, stop=[existing])
    ev = evaluate_plan(snap, stop_only)
    assert not ev.partial
    assert [s.alloc_id for s in ev.result.node_update[ghost.id].stops] == [existing.id]


def test_down_node_accepts_only_lost_or_unknown_without_replace() -> None:
    node, job = mock.node(status=NodeStatus.DOWN), mock.job()
    snap = snap_of([node], [job])
    (a,) = new_allocs(job, node, 1)
    assert evaluate_node_plan(snap, plan_for(job, place=[a]), node.id) == REASON_DOWN
    a.client_status = ClientStatus.LOST
    assert evaluate_node_plan(snap, plan_for(job, place=[a]), node.id) == ""
    a.client_status = ClientStatus.UNKNOWN  # group replaces on disconnect (default)
    assert evaluate_node_plan(snap, plan_for(job, place=[a]), node.id) == REASON_DOWN
    keep = pb.Job()
    keep.CopyFrom(job)
    keep.task_groups[0].disconnect.replace = False
    snap2 = snap_of([node], [keep])
    assert evaluate_node_plan(snap2, plan_for(keep, place=[a]), node.id) == ""


def test_disconnected_node_accepts_only_unknown_updates() -> None:
    node, job = mock.node(status=NodeStatus.DISCONNECTED), mock.job()
    snap = snap_of([node], [job])
    (a,) = new_allocs(job, node, 1)
    assert evaluate_node_plan(snap, plan_for(job, place=[a]), node.id) == REASON_DISCONNECTED
    a.client_status = ClientStatus.UNKNOWN
    assert evaluate_node_plan(snap, plan_for(job, place=[a]), node.id) == ""


def test_initializing_node_is_not_ready() -> None:
    node, job = mock.node(status=NodeStatus.INITIALIZING), mock.job()
    snap = snap_of([node], [job])
    plan = plan_for(job, place=new_allocs(job, node, 1))
    assert evaluate_node_plan(snap, plan, node.id) == REASON_NOT_READY


def test_ineligible_or_draining_node_takes_in_place_updates_only() -> None:
    job = mock.job()
    for mark in ("ineligible", "drain"):
        node = mock.node()
        if mark == "ineligible":
            node.scheduling_eligibility = Eligibility.INELIGIBLE
        else:
            node.drain = True
        running = new_allocs(job, node, 2)
        snap = snap_of([node], [job], running)
        updated = pb.Allocation()
        updated.CopyFrom(running[0])
        updated.desired_description = "in-place update"
        assert evaluate_node_plan(snap, plan_for(job, place=[updated]), node.id) == ""
        fresh = new_allocs(job, node, 1, 5)
        assert evaluate_node_plan(snap, plan_for(job, place=fresh), node.id) == REASON_INELIGIBLE


def test_in_place_update_allowed_on_a_full_node() -> None:
    node, job = mock.node(), mock.job()
    node.node_resources.cpu = 1000  # now over-committed by the 7 running allocs
    running = new_allocs(job, node, 7)
    snap = snap_of([node], [job], running)
    updated = pb.Allocation()
    updated.CopyFrom(running[3])
    assert evaluate_node_plan(snap, plan_for(job, place=[updated]), node.id) == ""


def test_static_port_collision_is_rejected() -> None:
    node, job = mock.node(), mock.job()
    (a,) = new_allocs(job, node, 1)
    a.resources.networks.add(reserved_ports=[pb.Port(label="http", value=8080)])
    snap = snap_of([node], [job], [a])
    (b,) = new_allocs(job, node, 1, 1)
    b.resources.networks.add(reserved_ports=[pb.Port(label="http", value=8080)])
    reason = evaluate_node_plan(snap, plan_for(job, place=[b]), node.id)
    assert "port collision" in reason and "8080" in reason
    (c,) = new_allocs(job, node, 1, 2)
    c.resources.networks.add(reserved_ports=[pb.Port(label="ssh", value=22)])  # node reserves 22
    assert "port collision" in evaluate_node_plan(snap, plan_for(job, place=[c]), node.id)


def test_device_oversubscription_is_rejected() -> None:
    node, job = mock.node(), mock.job()
    node.node_resources.devices.add(vendor="nvidia", type="gpu", name="t4", instance_ids=["g0"])
    (a,) = new_allocs(job, node, 1)
    a.resources.allocated_devices.add(vendor="nvidia", type="gpu", name="t4", device_ids=["g0"])
    snap = snap_of([node], [job], [a])
    (b,) = new_allocs(job, node, 1, 1)
    b.resources.allocated_devices.add(vendor="nvidia", type="gpu", name="t4", device_ids=["g0"])
    assert evaluate_node_plan(snap, plan_for(job, place=[b]), node.id) == "device oversubscribed"


def test_rejected_node_loses_its_stops_and_placements_others_commit() -> None:
    good, bad, job = mock.node(), mock.node(), mock.job()
    on_bad = new_allocs(job, bad, 7)
    on_good = new_allocs(job, good, 1, 50)
    snap = snap_of([good, bad], [job], [*on_bad, *on_good])
    plan = plan_for(job, place=[*new_allocs(job, good, 2, 10), *new_allocs(job, bad, 2, 20)])
    plan.node_update[bad.id].stops.add(alloc_id=on_bad[0].id)
    plan.node_update[good.id].stops.add(alloc_id=on_good[0].id)
    ev = evaluate_plan(snap, plan)
    assert ev.partial and list(ev.result.rejected_nodes) == [bad.id]
    assert bad.id not in ev.result.node_allocation and bad.id not in ev.result.node_update
    assert len(ev.result.node_allocation[good.id].allocs) == 2
    assert len(ev.result.node_update[good.id].stops) == 1
    # refresh index = newest write to nodes or allocs, not other tables
    assert ev.result.refresh_index == max(TABLES["nodes"], TABLES["allocs"])


def test_all_at_once_plan_with_one_bad_node_commits_nothing() -> None:
    good, bad, job = mock.node(), mock.node(status=NodeStatus.DOWN), mock.job()
    existing = mock.alloc(job, good, index=99)
    snap = snap_of([good, bad], [job], [existing])
    plan = plan_for(
        job,
        place=[*new_allocs(job, good, 2), *new_allocs(job, bad, 1, 5)],
        stop=[existing],
        all_at_once=True,
    )
    plan.deployment.CopyFrom(pb.Deployment(id=new_id(), job_id=job.id, status="running"))
    plan.deployment_updates.add(deployment_id="d-old", status="cancelled")
    ev = evaluate_plan(snap, plan)
    r = ev.result
    assert ev.partial and list(r.rejected_nodes) == [bad.id]
    assert not r.node_allocation and not r.node_update and not r.node_preemptions
    assert not r.HasField("deployment") and not r.deployment_updates
    assert r.refresh_index == 11
    assert ev.is_noop()


def test_preemptions_are_filtered_to_still_live_allocs() -> None:
    node, job, low = mock.node(), mock.job(), mock.job(priority=10)
    live = mock.alloc(low, node, index=0)
    gone = mock.alloc(low, node, index=1, client_status=ClientStatus.COMPLETE)
    snap = snap_of([node], [job, low], [live, gone])
    plan = plan_for(job, place=new_allocs(job, node, 1), preempt=[live, gone])
    plan.node_preemptions[node.id].stops.add(alloc_id=new_id())  # never existed
    ev = evaluate_plan(snap, plan)
    assert [s.alloc_id for s in ev.result.node_preemptions[node.id].stops] == [live.id]


def test_partial_commit_trims_placed_canaries_to_those_placed() -> None:
    good, bad, job = mock.node(), mock.node(), mock.job()
    snap = snap_of([good], [job])
    (c1,) = new_allocs(job, good, 1)
    (c2,) = new_allocs(job, bad, 1, 1)
    plan = plan_for(job, place=[c1, c2])
    d = plan.deployment
    d.id, d.job_id, d.status = new_id(), job.id, "running"
    d.task_groups["web"].placed_canaries.extend([c1.id, c2.id])
    ev = evaluate_plan(snap, plan)
    assert list(ev.result.deployment.task_groups["web"].placed_canaries) == [c1.id]
    # the plan itself is not changed
    assert list(plan.deployment.task_groups["web"].placed_canaries) == [c1.id, c2.id]


def test_plan_with_nothing_is_noop_deployment_alone_is_not() -> None:
    node, job = mock.node(), mock.job()
    snap = snap_of([node], [job])
    assert evaluate_plan(snap, plan_for(job)).is_noop()
    plan = plan_for(job)
    plan.deployment_updates.add(deployment_id="d1", status="successful")
    assert not evaluate_plan(snap, plan).is_noop()


def test_evaluation_does_not_touch_the_plan_maps() -> None:
    node, job = mock.node(), mock.job()
    snap = snap_of([node], [job])
    plan = plan_for(job, place=new_allocs(job, node, 1))
    evaluate_plan(snap, plan)
    assert list(plan.node_update) == [] and list(plan.node_preemptions) == []


def test_down_node_rule_reads_the_stored_job_when_the_plan_sends_a_reference() -> None:
    node, job = mock.node(status=NodeStatus.DOWN), mock.job()
    job.task_groups[0].disconnect.replace = False
    snap = snap_of([node], [job])
    (a,) = new_allocs(job, node, 1)
    a.client_status = ClientStatus.UNKNOWN
    ref = pb.Job(id=job.id, namespace=job.namespace)
    plan = plan_for(ref, place=[a])
    assert evaluate_node_plan(snap, plan, node.id) == ""
