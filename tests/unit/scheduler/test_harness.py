"""The in-memory planner: plans are applied to the store at increasing
indexes, partial commits are simulated by rejecting nodes."""

from __future__ import annotations

from corral.domain import structs
from corral.domain.structs import ClientStatus, DesiredStatus, EvalStatus
from corral.testing import mock
from corral.testing.harness import Harness
from corral.v1 import structs_pb2 as pb
from services.worker.scheduler import util
from services.worker.scheduler.interfaces import CorePlanner, Planner


def placed(job: pb.Job, node: pb.Node, **kw) -> pb.Allocation:
    a = mock.alloc(job, node, **kw)
    a.client_status = ClientStatus.PENDING
    return a


def test_harness_is_a_planner_and_core_planner():
    h = Harness()
    assert isinstance(h, Planner)
    assert isinstance(h, CorePlanner)


def test_upserts_assign_increasing_indexes():
    h = Harness()
    n = mock.node()
    i1 = h.upsert_nodes(n)
    job = mock.job()
    i2 = h.upsert_jobs(job)
    assert i2 > i1
    snap = h.snapshot()
    assert h.node(n.id).modify_index == i1
    stored = h.job(job.namespace, job.id)
    assert stored.job_modify_index == i2
    assert snap.table_index("nodes") == i1 and snap.table_index("jobs") == i2


def test_submit_plan_applies_placements_and_stops():
    h = Harness()
    n = mock.node()
    job = mock.job()
    h.upsert_nodes(n)
    h.upsert_jobs(job)
    old = mock.alloc(job, n)
    h.upsert_allocs(old)

    plan = pb.Plan(eval_id="e1", job=job)
    util.append_stopped_alloc(plan, old, util.ALLOC_LOST, ClientStatus.LOST, "follow")
    new = placed(job, n, index=1)
    new.previous_allocation = old.id
    util.append_alloc(plan, new)
    result, snap = h.submit_plan(plan)

    assert snap is None and result.refresh_index == 0
    assert result.alloc_index == h.snapshot().index
    stored_new = h.alloc(new.id)
    assert stored_new.create_index == stored_new.modify_index == result.alloc_index
    stopped = h.alloc(old.id)
    assert stopped.desired_status == DesiredStatus.STOP
    assert stopped.client_status == ClientStatus.LOST
    assert stopped.desired_description == util.ALLOC_LOST
    assert stopped.followup_eval_id == "follow"
    assert structs.last_client_state(stopped) == ClientStatus.LOST
    assert stopped.next_allocation == new.id
    assert len(h.plans) == 1


def test_in_place_update_keeps_create_index():
    h = Harness()
    n = mock.node()
    job = mock.job()
    h.upsert_nodes(n)
    a = mock.alloc(job, n)
    first = h.upsert_allocs(a)
    plan = pb.Plan(eval_id="e1")
    u = structs.copy_msg(a)
    u.followup_eval_id = "f"
    util.append_alloc(plan, u)
    result, _ = h.submit_plan(plan)
    stored = h.alloc(a.id)
    assert stored.create_index == first
    assert stored.modify_index == result.alloc_index > first
    # an update is not a new placement for queued-alloc accounting
    queued = {"web": 1}
    util.adjust_queued_allocations(result, queued)
    assert queued == {"web": 1}


def test_rejected_node_gives_partial_commit_and_refresh():
    h = Harness()
    good, bad = mock.node(), mock.node()
    job = mock.job()
    h.upsert_nodes(good, bad)
    h.upsert_jobs(job)
    h.reject_nodes.add(bad.id)
    plan = pb.Plan(eval_id="e1", job=job)
    a1, a2 = placed(job, good), placed(job, bad, index=1)
    util.append_alloc(plan, a1)
    util.append_alloc(plan, a2)
    result, snap = h.submit_plan(plan)
    assert list(result.rejected_nodes) == [bad.id]
    assert result.refresh_index >= result.alloc_index > 0
    assert snap is not None and snap.index >= result.refresh_index
    assert snap.alloc_by_id(a1.id) is not None
    assert snap.alloc_by_id(a2.id) is None
    full, expected, actual = util.full_commit(plan, result)
    assert (full, expected, actual) == (False, 2, 1)


def test_all_at_once_rejects_everything():
    h = Harness()
    good, bad = mock.node(), mock.node()
    job = mock.job()
    h.upsert_nodes(good, bad)
    h.reject_nodes.add(bad.id)
    plan = pb.Plan(eval_id="e1", job=job, all_at_once=True)
    util.append_alloc(plan, placed(job, good))
    util.append_alloc(plan, placed(job, bad, index=1))
    result, snap = h.submit_plan(plan)
    assert snap is not None
    assert not result.node_allocation
    assert not h.snapshot().allocs


def test_reject_plans_limits_rejections():
    h = Harness()
    n = mock.node()
    job = mock.job()
    h.upsert_nodes(n)
    h.upsert_jobs(job)
    h.reject_nodes.add(n.id)
    h.reject_plans = 1
    plan = pb.Plan(eval_id="e1", job=job)
    util.append_alloc(plan, placed(job, n))
    _, snap1 = h.submit_plan(plan)
    _, snap2 = h.submit_plan(plan)
    assert snap1 is not None and snap2 is None
    assert len(h.snapshot().allocs) == 1


def test_preemptions_evict_live_allocs():
    h = Harness()
    n = mock.node()
    job = mock.job()
    h.upsert_nodes(n)
    victim = mock.alloc(job, n)
    h.upsert_allocs(victim)
    plan = pb.Plan(eval_id="e1")
    util.append_preempted_alloc(plan, victim, "new-alloc")
    util.append_alloc(plan, placed(mock.job(), n))
    h.submit_plan(plan)
    stored = h.alloc(victim.id)
    assert stored.desired_status == DesiredStatus.EVICT
    assert stored.preempted_by_allocation == "new-alloc"


def test_placements_for_a_purged_job_are_dropped_and_its_stops_commit():
    h = Harness()
    n = mock.node()
    job = mock.job()
    h.upsert_nodes(n)
    h.upsert_jobs(job)
    running = mock.alloc(job, n)
    h.upsert_allocs(running)
    ev = mock.eval_for(job)
    h.upsert_evals(ev)
    h.delete_jobs([(job.namespace, job.id)])

    plan = pb.Plan(eval_id=ev.id)  # no job: it is gone
    util.append_stopped_alloc(plan, running, util.ALLOC_NOT_NEEDED)
    late = placed(job, n, index=1)
    util.append_alloc(plan, late)
    result, _ = h.submit_plan(plan)

    assert h.alloc(running.id).desired_status == DesiredStatus.STOP
    assert h.snapshot().alloc_by_id(late.id) is None
    # applying the plan bumps its eval's modify index to the plan's index
    assert h.eval(ev.id).modify_index == result.alloc_index


def test_eval_calls_are_recorded_and_stored():
    h = Harness()
    job = mock.job()
    ev = mock.eval_for(job)
    h.create_eval(ev)
    upd = structs.copy_msg(ev)
    upd.status = EvalStatus.COMPLETE
    h.update_eval(upd)
    h.reblock_eval(upd)
    assert [e.id for e in h.create_evals] == [ev.id]
    assert h.last_eval().status == EvalStatus.COMPLETE
    assert len(h.reblock_evals) == 1
    stored = h.eval(ev.id)
    assert stored.status == EvalStatus.COMPLETE
    assert stored.modify_index > stored.create_index


def test_noop_plan_writes_nothing():
    h = Harness()
    before = h.snapshot().index
    result, snap = h.submit_plan(pb.Plan(eval_id="e"))
    assert snap is None and h.snapshot().index == before
    assert result.alloc_index == before


def test_deletes():
    h = Harness()
    n = mock.node()
    job = mock.job()
    h.upsert_nodes(n)
    h.upsert_jobs(job)
    ev = mock.eval_for(job)
    h.upsert_evals(ev)
    a = mock.alloc(job, n, eval_id=ev.id)
    h.upsert_allocs(a)
    h.delete_evals([ev.id], [a.id])
    h.delete_jobs([(job.namespace, job.id)])
    h.delete_nodes([n.id])
    snap = h.snapshot()
    assert snap.eval_by_id(ev.id) is None and snap.alloc_by_id(a.id) is None
    assert snap.job_by_id(job.namespace, job.id) is None and snap.node_by_id(n.id) is None
    assert snap.allocs_by_job(job.namespace, job.id) == []
