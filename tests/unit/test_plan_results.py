"""The plan merge (`corral.domain.plan_results.merge_plan`) rule by rule, on plain
dictionaries standing in for the stored objects."""

from __future__ import annotations

from corral.domain.plan_results import merge_plan, plan_reads
from corral.domain.structs import ClientStatus, DeploymentStatus, DesiredStatus, copy_msg
from corral.testing import mock
from corral.v1 import state_pb2
from corral.v1 import structs_pb2 as pb

INDEX, NOW = 50, 7_000


def merge(
    plan: state_pb2.AppliedPlan,
    allocs: list[pb.Allocation] = (),  # type: ignore[assignment]
    deployments: list[pb.Deployment] = (),  # type: ignore[assignment]
    *,
    job: pb.Job | None = None,
    ev: pb.Evaluation | None = None,
):
    by_id = {a.id: a for a in allocs}
    deps = {d.id: d for d in deployments}
    return merge_plan(
        plan, job=job, alloc=by_id.get, deployment=deps.get, ev=ev, index=INDEX, now=NOW
    )


def stored(a: pb.Allocation, index: int = 10) -> pb.Allocation:
    a = copy_msg(a)
    a.create_index = a.modify_index = a.alloc_modify_index = index
    a.create_time = a.modify_time = 1
    return a


def test_a_new_placement_is_created_at_the_index_pending() -> None:
    job, node = mock.job(), mock.node()
    a = mock.alloc(job, node)
    a.client_status = ""
    out = merge(state_pb2.AppliedPlan(job_id=job.id, allocs=[a]), job=job).allocs[a.id]
    assert (out.create_index, out.modify_index, out.alloc_modify_index) == (INDEX,) * 3
    assert (out.create_time, out.modify_time) == (NOW, NOW)
    assert out.client_status == ClientStatus.PENDING


def test_placements_for_a_missing_or_stopped_job_are_dropped_updates_are_not() -> None:
    job, node = mock.job(), mock.node()
    old = stored(mock.alloc(job, node))
    new = mock.alloc(job, node, index=1)
    plan = state_pb2.AppliedPlan(job_id=job.id, allocs=[new, old])
    stopped = copy_msg(job)
    stopped.stop = True
    for current in (None, stopped):
        out = merge(plan, [old], job=current)
        assert list(out.allocs) == [old.id] and out.dropped == [new.id]


def test_in_place_update_keeps_client_fields_unless_lost_or_unknown() -> None:
    job, node = mock.job(), mock.node()
    old = stored(mock.alloc(job, node, client_status=ClientStatus.RUNNING))
    old.task_states["web"].state = "running"
    old.client_description = "all tasks running"
    old.next_allocation = "successor"
    upd = copy_msg(old)
    upd.task_states.clear()
    upd.client_status = ClientStatus.PENDING
    upd.next_allocation = ""
    upd.job_version = 3
    out = merge(state_pb2.AppliedPlan(job_id=job.id, allocs=[upd]), [old], job=job).allocs[old.id]
    assert out.job_version == 3
    assert (out.client_status, out.client_description) == (
        ClientStatus.RUNNING,
        "all tasks running",
    )
    assert out.task_states["web"].state == "running"
    assert out.next_allocation == "successor"
    assert (out.create_index, out.create_time, out.modify_index) == (10, 1, INDEX)

    upd.client_status = ClientStatus.UNKNOWN
    out = merge(state_pb2.AppliedPlan(job_id=job.id, allocs=[upd]), [old], job=job).allocs[old.id]
    assert out.client_status == ClientStatus.UNKNOWN


def test_replacement_links_its_predecessor_which_is_also_stopped() -> None:
    job, node = mock.job(), mock.node()
    old = stored(mock.alloc(job, node, client_status=ClientStatus.RUNNING))
    new = mock.alloc(job, node, index=1)
    new.previous_allocation = old.id
    plan = state_pb2.AppliedPlan(job_id=job.id, allocs=[new])
    plan.stops.add(alloc_id=old.id, desired_description="lost", client_status="lost")
    out = merge(plan, [old], job=job).allocs[old.id]
    assert out.next_allocation == new.id
    assert (out.desired_status, out.client_status) == (DesiredStatus.STOP, ClientStatus.LOST)
    assert [(s.field, s.value, s.time) for s in out.alloc_states] == [
        ("client_status", "lost", NOW)
    ]
    assert out.modify_index == out.alloc_modify_index == INDEX


def test_stops_force_only_lost_or_unknown_and_skip_collected_allocs() -> None:
    job, node = mock.job(), mock.node()
    old = stored(mock.alloc(job, node, client_status=ClientStatus.RUNNING))
    old.desired_description = "was running"
    plan = state_pb2.AppliedPlan(job_id=job.id)
    plan.stops.add(alloc_id=old.id, client_status="complete", followup_eval_id="f1")
    plan.stops.add(alloc_id="collected")
    out = merge(plan, [old], job=job)
    assert list(out.allocs) == [old.id]
    a = out.allocs[old.id]
    assert a.client_status == ClientStatus.RUNNING and not a.alloc_states
    assert (a.desired_status, a.desired_description, a.followup_eval_id) == ("stop", "", "f1")


def test_preemption_evicts_and_names_the_preempting_alloc() -> None:
    job, node = mock.job(), mock.node()
    victim = stored(mock.alloc(job, node))
    plan = state_pb2.AppliedPlan(job_id=job.id)
    plan.preemptions.add(alloc_id=victim.id, preempted_by_allocation="p1")
    a = merge(plan, [victim], job=job).allocs[victim.id]
    assert (a.desired_status, a.preempted_by_allocation) == (DesiredStatus.EVICT, "p1")


def test_deployment_keeps_client_counters_and_updates_touch_active_ones_only() -> None:
    old = pb.Deployment(id="d1", status=DeploymentStatus.RUNNING, create_index=5, create_time=2)
    old.task_groups["web"].healthy_allocs = 3
    old.task_groups["web"].placed_allocs = 4
    old.task_groups["db"].desired_total = 1
    planned = pb.Deployment(id="d1", status=DeploymentStatus.RUNNING)
    planned.task_groups["web"].desired_total = 5
    done = pb.Deployment(id="d2", status=DeploymentStatus.SUCCESSFUL)
    plan = state_pb2.AppliedPlan(job_id="j", deployment=planned)
    plan.deployment_updates.add(deployment_id="d1", status="paused", status_description="p")
    plan.deployment_updates.add(deployment_id="d2", status="failed")
    plan.deployment_updates.add(deployment_id="missing", status="failed")
    out = merge(plan, deployments=[old, done]).deployments
    assert list(out) == ["d1"]
    d = out["d1"]
    assert (d.create_index, d.create_time, d.modify_index, d.modify_time) == (5, 2, INDEX, NOW)
    web = d.task_groups["web"]
    assert (web.desired_total, web.healthy_allocs, web.placed_allocs) == (5, 3, 4)
    assert d.task_groups["db"].desired_total == 1
    assert (d.status, d.status_description) == ("paused", "p")


def test_the_plans_eval_gets_the_plans_index() -> None:
    ev = pb.Evaluation(id="e1", modify_index=3, create_index=3)
    out = merge(state_pb2.AppliedPlan(eval_id="e1"), ev=ev)
    assert out.eval is not None and out.eval.modify_index == INDEX
    assert out.eval.create_index == 3 and ev.modify_index == 3  # inputs untouched
    assert merge(state_pb2.AppliedPlan(eval_id="e1")).eval is None


def test_reads_name_every_alloc_and_deployment_once() -> None:
    plan = state_pb2.AppliedPlan(
        allocs=[pb.Allocation(id="a", previous_allocation="b")],
        deployment=pb.Deployment(id="d"),
    )
    plan.stops.add(alloc_id="b")
    plan.preemptions.add(alloc_id="c")
    plan.deployment_updates.add(deployment_id="d")
    reads = plan_reads(plan)
    assert (reads.alloc_ids, reads.deployment_ids) == (["a", "b", "c"], ["d"])
