"""The plan applier against a real state service and PostgreSQL: racing
plans, down nodes, all-at-once plans, preemption, group commit and failed
writes. Every test ends with the invariant checker (the `core` fixture)."""

from __future__ import annotations

import asyncio

import pytest

from corral.domain.errors import Aborted, InvalidArgument
from corral.domain.structs import (
    ClientStatus,
    DesiredStatus,
    EvalStatus,
    NodeStatus,
    Trigger,
    copy_msg,
    new_id,
)
from corral.testing import mock
from corral.testing.invariants import check_state, errors
from corral.v1 import structs_pb2 as pb
from services.state.app import StateApp
from tests.integration.planner.conftest import PlannerCore, seed

# mock nodes: 4000 MHz - 100 reserved; mock allocs: 500 MHz -> 7 fit per node


def plan_for(
    job: pb.Job, place: list[pb.Allocation], *, snapshot_index: int, all_at_once: bool = False
) -> pb.Plan:
    plan = pb.Plan(
        eval_id=new_id(),
        eval_token="token",
        priority=job.priority,
        job=job,
        snapshot_index=snapshot_index,
        all_at_once=all_at_once,
    )
    for a in place:
        if not a.eval_id:
            a.eval_id = plan.eval_id
        plan.node_allocation[a.node_id].allocs.append(a)
    return plan


def new_allocs(job: pb.Job, node: pb.Node, n: int, start: int = 0) -> list[pb.Allocation]:
    return [
        mock.alloc(job, node, index=start + i, client_status=ClientStatus.PENDING) for i in range(n)
    ]


async def stored_allocs(state_addr: str, job: pb.Job) -> list[pb.Allocation]:
    from corral.testing.invariants import fetch_snapshot

    snap = await fetch_snapshot(state_addr)
    return snap.allocs_by_job(job.namespace, job.id)


async def test_two_plans_racing_for_the_last_capacity(
    state_app: StateApp, state_addr: str, core: PlannerCore
) -> None:
    node, job = mock.node(), mock.job()
    index = await seed(state_app, nodes=[node], jobs=[job], allocs=new_allocs(job, node, 6))
    first = plan_for(job, new_allocs(job, node, 1, 10), snapshot_index=index)
    second = plan_for(job, new_allocs(job, node, 1, 20), snapshot_index=index)

    r1, r2 = await asyncio.gather(core.submit(first), core.submit(second))

    assert r1.alloc_index > index and r1.refresh_index == 0
    assert (
        list(r1.node_allocation[node.id].allocs)[0].id
        == first.node_allocation[node.id].allocs[0].id
    )
    assert list(r2.rejected_nodes) == [node.id] and not r2.node_allocation
    assert r2.refresh_index >= r1.alloc_index
    # what the worker does next: wait for the refresh index and look again
    snap = await core.replica.wait_for_index(r2.refresh_index, 10)
    live = [a for a in snap.allocs_by_node(node.id) if a.desired_status == DesiredStatus.RUN]
    assert len(live) == 7
    assert not errors(await check_state(state_addr))


async def test_plan_to_a_down_node_is_rejected(
    state_app: StateApp, state_addr: str, core: PlannerCore
) -> None:
    down, job = mock.node(status=NodeStatus.DOWN), mock.job()
    index = await seed(state_app, nodes=[down], jobs=[job])
    result = await core.submit(plan_for(job, new_allocs(job, down, 1), snapshot_index=index))
    assert list(result.rejected_nodes) == [down.id]
    assert result.alloc_index == 0 and result.refresh_index >= index
    assert await stored_allocs(state_addr, job) == []


async def test_all_at_once_plan_with_one_bad_node_commits_nothing(
    state_app: StateApp, state_addr: str, core: PlannerCore
) -> None:
    good, full, job = mock.node(), mock.node(), mock.job()
    other = mock.job()
    index = await seed(
        state_app, nodes=[good, full], jobs=[job, other], allocs=new_allocs(other, full, 7)
    )
    plan = plan_for(
        job,
        [*new_allocs(job, good, 3), *new_allocs(job, full, 1, 3)],
        snapshot_index=index,
        all_at_once=True,
    )
    result = await core.submit(plan)
    assert list(result.rejected_nodes) == [full.id]
    assert not result.node_allocation and result.alloc_index == 0
    assert await stored_allocs(state_addr, job) == []

    # the same plan without all-at-once commits the good node's part
    plan.all_at_once = False
    partial = await core.submit(plan)
    assert len(partial.node_allocation[good.id].allocs) == 3
    assert partial.alloc_index > index and partial.refresh_index >= partial.alloc_index
    assert len(await stored_allocs(state_addr, job)) == 3


async def test_preemption_frees_capacity_in_the_same_index(
    state_app: StateApp, state_addr: str, core: PlannerCore
) -> None:
    node = mock.node()
    low, high = mock.job(priority=20), mock.job(priority=80)
    victims = new_allocs(low, node, 7)
    index = await seed(state_app, nodes=[node], jobs=[low, high], allocs=victims)
    (placed,) = new_allocs(high, node, 1)
    plan = plan_for(high, [placed], snapshot_index=index)
    plan.node_preemptions[node.id].stops.add(
        alloc_id=victims[0].id, preempted_by_allocation=placed.id
    )
    result = await core.submit(plan)
    assert result.refresh_index == 0 and result.alloc_index > index
    assert [s.alloc_id for s in result.node_preemptions[node.id].stops] == [victims[0].id]

    snap = await core.replica.wait_for_index(result.alloc_index, 10)
    evicted = snap.alloc_by_id(victims[0].id)
    new = snap.alloc_by_id(placed.id)
    assert evicted is not None and new is not None
    assert evicted.desired_status == DesiredStatus.EVICT
    assert evicted.preempted_by_allocation == placed.id
    assert evicted.modify_index == new.create_index == result.alloc_index
    # one preemption eval for the victim's job, in the same index
    evals = [
        e for e in snap.evals_by_job(low.namespace, low.id) if e.triggered_by == Trigger.PREEMPTION
    ]
    assert len(evals) == 1
    assert evals[0].status == EvalStatus.PENDING and evals[0].create_index == result.alloc_index

    # without the preemption the same placement would not have fit
    (another,) = new_allocs(high, node, 1, 1)
    refused = await core.submit(plan_for(high, [another], snapshot_index=result.alloc_index))
    assert list(refused.rejected_nodes) == [node.id]


async def test_waiting_plans_are_group_committed_each_at_its_own_index(
    state_app: StateApp, state_addr: str, core: PlannerCore
) -> None:
    nodes = [mock.node() for _ in range(3)]
    job = mock.job()
    index = await seed(state_app, nodes=nodes, jobs=[job])
    await core.replica.wait_for_index(index, 10)
    commits = core.applier.stats.commits
    plans = [
        plan_for(job, new_allocs(job, nodes[i % 3], 1, i), snapshot_index=index) for i in range(12)
    ]
    # queued without yielding: the applier finds all twelve waiting
    pendings = [core.queue.enqueue(p) for p in plans]
    results = await asyncio.wait_for(asyncio.gather(*(p.future for p in pendings)), 30)

    assert core.applier.stats.commits == commits + 1
    indexes = [r.alloc_index for r in results]
    assert indexes == list(range(indexes[0], indexes[0] + 12))
    assert all(r.refresh_index == 0 for r in results)
    snap = await core.replica.wait_for_index(indexes[-1], 10)
    for plan, r in zip(plans, results, strict=True):
        (a,) = [x for lst in plan.node_allocation.values() for x in lst.allocs]
        stored = snap.alloc_by_id(a.id)
        assert stored is not None and stored.create_index == r.alloc_index


async def test_group_commit_evaluates_each_plan_against_the_ones_before_it(
    state_app: StateApp, state_addr: str, core: PlannerCore
) -> None:
    node, job = mock.node(), mock.job()
    index = await seed(state_app, nodes=[node], jobs=[job])
    await core.replica.wait_for_index(index, 10)
    plans = [plan_for(job, new_allocs(job, node, 3, 3 * i), snapshot_index=index) for i in range(3)]
    pendings = [core.queue.enqueue(p) for p in plans]
    r = await asyncio.wait_for(asyncio.gather(*(p.future for p in pendings)), 30)
    assert r[0].alloc_index and r[1].alloc_index and r[1].alloc_index == r[0].alloc_index + 1
    assert list(r[2].rejected_nodes) == [node.id] and r[2].alloc_index == 0
    assert r[2].refresh_index >= r[1].alloc_index


async def test_failed_write_fails_its_group_and_commits_nothing(
    state_app: StateApp, state_addr: str, core: PlannerCore
) -> None:
    node, job = mock.node(), mock.job()
    index = await seed(state_app, nodes=[node], jobs=[job])
    await core.replica.wait_for_index(index, 10)
    good = plan_for(job, new_allocs(job, node, 1), snapshot_index=index)
    bad_alloc = new_allocs(job, node, 1, 1)[0]
    bad = plan_for(job, [bad_alloc], snapshot_index=index)
    bad.node_allocation[node.id].allocs[0].desired_status = "bogus"  # the state refuses it
    gen = core.applier.overlay.generation

    pg, pb_ = core.queue.enqueue(good), core.queue.enqueue(bad)
    done = await asyncio.wait_for(asyncio.gather(pg.future, pb_.future, return_exceptions=True), 30)
    assert isinstance(done[0], Aborted), done[0]
    assert isinstance(done[1], InvalidArgument) and "desired_status" in str(done[1])
    assert core.applier.overlay.generation > gen
    assert await stored_allocs(state_addr, job) == []

    # resubmitted alone (as the worker does on ABORTED), the good plan commits
    result = await core.submit(good)
    assert result.alloc_index > index
    assert len(await stored_allocs(state_addr, job)) == 1


async def test_placements_for_a_missing_job_are_dropped_not_failed(
    state_app: StateApp, state_addr: str, core: PlannerCore
) -> None:
    # Nomad: a job purged after the scheduler's snapshot gets no new allocs,
    # and the plan (and its group) still commits rather than failing.
    node, job, ghost = mock.node(), mock.job(), mock.job()
    index = await seed(state_app, nodes=[node], jobs=[job])
    await core.replica.wait_for_index(index, 10)
    ok, missing = (
        core.queue.enqueue(plan_for(job, new_allocs(job, node, 1), snapshot_index=index)),
        core.queue.enqueue(plan_for(ghost, new_allocs(ghost, node, 1), snapshot_index=index)),
    )
    done = await asyncio.wait_for(
        asyncio.gather(ok.future, missing.future, return_exceptions=True), 30
    )
    assert isinstance(done[0], pb.PlanResult) and done[0].alloc_index > index
    assert isinstance(done[1], pb.PlanResult) and done[1].alloc_index > index
    assert len(await stored_allocs(state_addr, job)) == 1
    assert await stored_allocs(state_addr, ghost) == []


async def test_stop_only_plan_on_a_down_node_commits(
    state_app: StateApp, state_addr: str, core: PlannerCore
) -> None:
    node, job = mock.node(), mock.job()
    running = new_allocs(job, node, 2)
    await seed(state_app, nodes=[node], jobs=[job], allocs=running)
    down = copy_msg(node)
    down.status = NodeStatus.DOWN
    index = await seed(state_app, nodes=[down])
    plan = plan_for(job, [], snapshot_index=index)
    for a in running:
        plan.node_update[node.id].stops.add(
            alloc_id=a.id, desired_description="node down", client_status=ClientStatus.LOST
        )
    result = await core.submit(plan)
    assert result.alloc_index > index and not result.rejected_nodes
    snap = await core.replica.wait_for_index(result.alloc_index, 10)
    for a in running:
        s = snap.alloc_by_id(a.id)
        assert s is not None and (s.desired_status, s.client_status) == ("stop", "lost")


async def test_leadership_loss_flushes_waiting_plans(state_addr: str, core: PlannerCore) -> None:
    from corral.domain.errors import Unavailable

    pending = core.queue.enqueue(pb.Plan(eval_id="e", job=pb.Job(id="j"), snapshot_index=10**9))
    await asyncio.sleep(0.05)  # the applier now waits for index 10**9
    core.task.cancel()
    with pytest.raises(Unavailable, match="plan queue flushed"):
        await asyncio.wait_for(pending.future, 10)


async def test_next_plan_is_evaluated_while_the_previous_one_is_written(
    state_app: StateApp, state_addr: str, core: PlannerCore
) -> None:
    node, job = mock.node(), mock.job()
    index = await seed(state_app, nodes=[node], jobs=[job], allocs=new_allocs(job, node, 6))
    await core.replica.wait_for_index(index, 10)
    core.client.gate.clear()
    core.client.waiting.clear()
    first = core.queue.enqueue(plan_for(job, new_allocs(job, node, 1, 10), snapshot_index=index))
    await asyncio.wait_for(core.client.waiting.wait(), 10)  # first is being written
    evaluated = core.applier.stats.nodes_rejected
    second = core.queue.enqueue(plan_for(job, new_allocs(job, node, 1, 20), snapshot_index=index))
    # the second is evaluated on the overlay holding the first, before it commits
    for _ in range(200):
        if core.applier.stats.nodes_rejected > evaluated:
            break
        await asyncio.sleep(0.01)
    assert core.applier.stats.nodes_rejected == evaluated + 1
    assert not first.future.done() and not second.future.done()
    core.client.gate.set()
    r1 = await asyncio.wait_for(first.future, 10)
    r2 = await asyncio.wait_for(second.future, 10)
    assert r1.alloc_index > index and list(r2.rejected_nodes) == [node.id]
    assert r2.refresh_index >= r1.alloc_index


async def test_failed_write_fails_the_plans_evaluated_on_top_of_it(
    state_app: StateApp, state_addr: str, core: PlannerCore
) -> None:
    node, job = mock.node(), mock.job()
    index = await seed(state_app, nodes=[node], jobs=[job], allocs=new_allocs(job, node, 5))
    await core.replica.wait_for_index(index, 10)
    victim = new_allocs(job, node, 1, 50)[0]
    await seed(state_app, allocs=[victim])
    index = await seed(state_app, nodes=[node])
    core.client.gate.clear()
    core.client.waiting.clear()
    # plan 1 stops an alloc, with a client status the state will refuse
    one = plan_for(job, [], snapshot_index=index)
    one.node_update[node.id].stops.add(alloc_id=victim.id, client_status="bogus")
    p1 = core.queue.enqueue(one)
    await asyncio.wait_for(core.client.waiting.wait(), 10)
    # plan 2 fits only because plan 1 stopped the victim (node holds 6 + 1 = 7)
    rejected = core.applier.stats.nodes_rejected
    p2 = core.queue.enqueue(plan_for(job, new_allocs(job, node, 2, 20), snapshot_index=index))
    for _ in range(200):  # evaluated (and fitting, thanks to plan 1) before plan 1 commits
        if len(core.applier.overlay) == 2:
            break
        await asyncio.sleep(0.01)
    assert len(core.applier.overlay) == 2 and core.applier.stats.nodes_rejected == rejected
    core.client.gate.set()
    done = await asyncio.wait_for(asyncio.gather(p1.future, p2.future, return_exceptions=True), 10)
    assert isinstance(done[0], InvalidArgument), done[0]
    assert isinstance(done[1], Aborted), done[1]
    live = [a for a in await stored_allocs(state_addr, job) if a.desired_status == "run"]
    assert len(live) == 6 and victim.id in {a.id for a in live}


@pytest.mark.parametrize("leader_id", ["127.0.0.1:1", ""])
async def test_fenced_write_from_a_deposed_leader_commits_nothing(
    state_app: StateApp, state_addr: str, core: PlannerCore, planner_leader: str, leader_id: str
) -> None:
    """A planner that holds no leader lock (or names none) writes nothing:
    its plans are flushed and the worker retries the real leader."""
    from corral.domain.errors import Unavailable

    node, job = mock.node(), mock.job()
    index = await seed(state_app, nodes=[node], jobs=[job])
    core.client.leader_id = leader_id
    try:
        with pytest.raises(Unavailable, match="plan queue flushed"):
            await core.submit(plan_for(job, new_allocs(job, node, 1), snapshot_index=index))
    finally:
        core.client.leader_id = planner_leader
    assert await stored_allocs(state_addr, job) == []
