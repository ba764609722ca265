"""The optimistic overlay on StateStore-built snapshots, and the plan queue."""

from __future__ import annotations

import asyncio

import pytest

from corral.domain import topics
from corral.domain.errors import Unavailable
from corral.domain.plan_commit import applied_plan
from corral.domain.store import StateSnapshot, StateStore
from corral.domain.structs import ClientStatus, DesiredStatus, EvalStatus, Trigger, new_id
from corral.testing import mock
from corral.v1 import state_pb2
from corral.v1 import structs_pb2 as pb
from services.planner.evaluate import evaluate_plan
from services.planner.overlay import Overlay, plan_change_batch
from services.planner.plan_queue import ERR_DISABLED, ERR_FLUSHED, PlanQueue

TABLES = {"nodes": 3, "allocs": 4}


def base(nodes: list[pb.Node], jobs: list[pb.Job], allocs: list[pb.Allocation]) -> StateSnapshot:
    return StateStore.build(10, nodes=nodes, jobs=jobs, allocs=allocs, table_indexes=TABLES)


def place_plan(job: pb.Job, allocs: list[pb.Allocation]) -> pb.Plan:
    plan = pb.Plan(eval_id=new_id(), eval_token="t", job=job)
    for a in allocs:
        plan.node_allocation[a.node_id].allocs.append(a)
    return plan


def write_of(snap: StateSnapshot, plan: pb.Plan) -> state_pb2.AppliedPlan:
    ev = evaluate_plan(snap, plan)
    return applied_plan(snap, plan, ev.result, now=1)


def pending_allocs(job: pb.Job, node: pb.Node, n: int, start: int = 0) -> list[pb.Allocation]:
    return [
        mock.alloc(job, node, index=start + i, client_status=ClientStatus.PENDING) for i in range(n)
    ]


def test_two_plans_racing_for_last_capacity_second_is_rejected_on_overlay() -> None:
    node, job = mock.node(), mock.job()
    replica = base([node], [job], pending_allocs(job, node, 6))
    overlay = Overlay()
    first = place_plan(job, pending_allocs(job, node, 1, 10))
    second = place_plan(job, pending_allocs(job, node, 1, 20))

    snap = overlay.snapshot(replica)
    ev1 = evaluate_plan(snap, first)
    assert not ev1.partial
    overlay.add(applied_plan(snap, first, ev1.result, now=1))

    ev2 = evaluate_plan(overlay.snapshot(replica), second)
    assert ev2.partial and ev2.result.rejected_nodes == [node.id]
    # the bare replica would have let it in: the overlay is what stops it
    assert not evaluate_plan(replica, second).partial
    # the overlay moves no index: refresh comes from the replica's tables
    assert overlay.snapshot(replica).index == replica.index == 10


def test_entries_stay_until_the_replica_reaches_their_commit_index() -> None:
    node, job = mock.node(), mock.job()
    replica = base([node], [job], [])
    overlay = Overlay()
    plan = place_plan(job, pending_allocs(job, node, 1))
    entry = overlay.add(write_of(overlay.snapshot(replica), plan))
    alloc_id = plan.node_allocation[node.id].allocs[0].id

    # the replica moves on without the plan (it is still in flight)
    store = StateStore(replica)
    store.apply(pb.ChangeBatch(index=11, events=[pb.Event(topic=topics.NODE.name, node=node)]))
    assert overlay.snapshot(store.snapshot()).alloc_by_id(alloc_id) is not None
    assert len(overlay) == 1

    overlay.committed(entry, 12)
    store.apply(pb.ChangeBatch(index=12, events=[pb.Event(topic=topics.NODE.name, node=node)]))
    # index 12 reached but (in this test) without the alloc: the entry is
    # dropped because the replica is trusted from its commit index on
    snap = overlay.snapshot(store.snapshot())
    assert len(overlay) == 0 and snap.alloc_by_id(alloc_id) is None


def test_committed_entry_beyond_the_replica_is_reapplied_on_rebase() -> None:
    node, job = mock.node(), mock.job()
    replica = base([node], [job], [])
    overlay = Overlay()
    plan = place_plan(job, pending_allocs(job, node, 1))
    entry = overlay.add(write_of(overlay.snapshot(replica), plan))
    overlay.committed(entry, 15)
    store = StateStore(replica)
    store.apply(pb.ChangeBatch(index=14, events=[pb.Event(topic=topics.NODE.name, node=node)]))
    snap = overlay.snapshot(store.snapshot())
    assert snap.index == 14 and len(snap.allocs_by_node(node.id)) == 1


def test_stop_and_preemption_diffs_merge_onto_the_newest_alloc() -> None:
    node, job = mock.node(), mock.job()
    a, b = mock.alloc(job, node, index=0), mock.alloc(job, node, index=1)
    snap = base([node], [job], [a, b])
    write = state_pb2.AppliedPlan(eval_id="e", namespace="default", job_id=job.id)
    write.stops.add(alloc_id=a.id, desired_description="node lost", client_status="lost")
    write.preemptions.add(alloc_id=b.id, preempted_by_allocation="p1", desired_status="evict")
    store = StateStore(snap)
    store.apply(plan_change_batch(snap, write, now=1), stamp_tables=False)
    after = store.snapshot()
    sa, sb = after.alloc_by_id(a.id), after.alloc_by_id(b.id)
    assert sa is not None and sb is not None
    assert (sa.desired_status, sa.client_status) == (DesiredStatus.STOP, ClientStatus.LOST)
    assert (sb.desired_status, sb.preempted_by_allocation) == (DesiredStatus.EVICT, "p1")
    assert sa.resources.cpu == a.resources.cpu  # the rest of the alloc is kept
    assert snap.alloc_by_id(a.id).desired_status == DesiredStatus.RUN  # type: ignore[union-attr]


def test_in_place_update_keeps_the_client_status() -> None:
    node, job = mock.node(), mock.job()
    a = mock.alloc(job, node, client_status=ClientStatus.RUNNING)
    snap = base([node], [job], [a])
    upd = pb.Allocation()
    upd.CopyFrom(a)
    upd.client_status = ""
    write = state_pb2.AppliedPlan(eval_id="e", namespace="default", job_id=job.id, allocs=[upd])
    batch = plan_change_batch(snap, write, now=1)
    assert batch.events[0].allocation.client_status == ClientStatus.RUNNING
    upd.client_status = ClientStatus.UNKNOWN  # the scheduler may force unknown/lost
    write = state_pb2.AppliedPlan(eval_id="e", namespace="default", job_id=job.id, allocs=[upd])
    assert plan_change_batch(snap, write, now=1).events[0].allocation.client_status == "unknown"


def test_discard_forgets_everything_and_starts_a_new_generation() -> None:
    node, job = mock.node(), mock.job()
    replica = base([node], [job], [])
    overlay = Overlay()
    plan = place_plan(job, pending_allocs(job, node, 1))
    overlay.add(write_of(overlay.snapshot(replica), plan))
    gen = overlay.generation
    overlay.discard()
    assert overlay.generation == gen + 1 and len(overlay) == 0
    assert overlay.snapshot(replica).allocs_by_node(node.id) == []


def test_applied_plan_carries_stops_preemptions_and_one_eval_per_preempted_job() -> None:
    node, job, low = mock.node(), mock.job(priority=70), mock.job(priority=20)
    victims = [mock.alloc(low, node, index=i) for i in range(2)]
    snap = base([node], [job, low], victims)
    plan = place_plan(job, pending_allocs(job, node, 1))
    for v in victims:
        plan.node_preemptions[node.id].stops.add(alloc_id=v.id, preempted_by_allocation="x")
    ev = evaluate_plan(snap, plan)
    write = applied_plan(snap, plan, ev.result, now=123)
    assert [p.desired_status for p in write.preemptions] == ["evict", "evict"]
    assert len(write.evals) == 1
    e = write.evals[0]
    assert (e.job_id, e.priority, e.triggered_by, e.status) == (
        low.id,
        20,
        Trigger.PREEMPTION,
        EvalStatus.PENDING,
    )


# ---------------------------------------------------------------- plan queue


async def test_queue_orders_by_priority_then_arrival() -> None:
    q = PlanQueue()
    q.set_enabled(True)
    order = [("a", 50), ("b", 70), ("c", 50), ("d", 70), ("e", 10)]
    for eval_id, prio in order:
        q.enqueue(pb.Plan(eval_id=eval_id, priority=prio))
    got = [p.plan.eval_id for p in await q.dequeue(10)]
    assert got == ["b", "d", "a", "c", "e"]


async def test_queue_disabled_refuses_and_disabling_flushes_waiters() -> None:
    q = PlanQueue()
    with pytest.raises(Unavailable, match=ERR_DISABLED):
        q.enqueue(pb.Plan(eval_id="x"))
    q.set_enabled(True)
    pending = q.enqueue(pb.Plan(eval_id="x"))
    q.set_enabled(False)
    with pytest.raises(Unavailable, match=ERR_FLUSHED):
        await pending.future
    assert len(q) == 0


async def test_queue_skips_plans_whose_submitter_gave_up() -> None:
    q = PlanQueue()
    q.set_enabled(True)
    gone = q.enqueue(pb.Plan(eval_id="gone"))
    q.enqueue(pb.Plan(eval_id="kept"))
    gone.future.cancel()
    got = await asyncio.wait_for(q.dequeue(10), 1)
    assert [p.plan.eval_id for p in got] == ["kept"]


async def test_batches_stop_before_passing_the_alloc_bound_but_take_one_big_plan() -> None:
    q = PlanQueue()
    q.set_enabled(True)
    node, job = mock.node(), mock.job()

    def sized(n: int, eval_id: str) -> pb.Plan:
        plan = place_plan(job, pending_allocs(job, node, n))
        plan.eval_id = eval_id
        return plan

    for eval_id, n in (("big", 8), ("a", 2), ("b", 2), ("c", 2)):
        q.enqueue(sized(n, eval_id))
    assert [p.plan.eval_id for p in q.pop_ready(10, max_size=5)] == ["big"]
    assert [p.plan.eval_id for p in q.pop_ready(10, max_size=5)] == ["a", "b"]
    assert q.pop_ready(10, max_size=1, take_one=False) == []
    assert [p.plan.eval_id for p in q.pop_ready(10, max_size=5)] == ["c"]
