"""State.ApplyPlans: what a committed plan writes, merged the way Nomad's
FSM merges plan results."""

from __future__ import annotations

from corral.structs import ClientStatus, DesiredStatus
from corral.testing import mock
from corral.v1 import state_pb2, state_pb2_grpc
from corral.v1 import structs_pb2 as pb
from services.state.app import StateApp


async def _seed(app: StateApp, job_id: str) -> tuple[pb.Job, pb.Node]:
    job = mock.job(job_id=job_id, count=2)
    node = mock.node()
    async with app.db.write() as tx:
        tx.put_job(job)
        tx.put_node(node)
    return job, node


async def test_group_commit_places_each_plan_at_its_own_index(
    state_app: StateApp, state_stub: state_pb2_grpc.StateAsyncStub
) -> None:
    job, node = await _seed(state_app, "gc-job")
    plans = [
        state_pb2.AppliedPlan(
            eval_id=f"e{i}",
            namespace="default",
            job_id=job.id,
            allocs=[mock.alloc(job, node, index=i, client_status=ClientStatus.PENDING)],
        )
        for i in range(3)
    ]
    resp = await state_stub.ApplyPlans(state_pb2.ApplyPlansRequest(plans=plans))
    assert len(resp.indexes) == 3 and list(resp.indexes) == list(
        range(resp.indexes[0], resp.indexes[0] + 3)
    )
    snap = await state_app.feed.wait_for_index(resp.indexes[-1], 10)
    for plan, index in zip(plans, resp.indexes, strict=True):
        stored = snap.alloc_by_id(plan.allocs[0].id)
        assert stored is not None
        assert stored.create_index == index == stored.alloc_modify_index
        assert stored.client_status == ClientStatus.PENDING
    placed = snap.job_by_id("default", job.id)
    assert placed is not None and placed.status == "running"


async def test_replacement_links_next_allocation_and_lost_stop_records_alloc_state(
    state_app: StateApp, state_stub: state_pb2_grpc.StateAsyncStub
) -> None:
    job, node = await _seed(state_app, "link-job")
    original = mock.alloc(job, node, client_status=ClientStatus.RUNNING)
    first = await state_stub.ApplyPlans(
        state_pb2.ApplyPlansRequest(
            plans=[
                state_pb2.AppliedPlan(
                    eval_id="e1", namespace="default", job_id=job.id, allocs=[original]
                )
            ]
        )
    )
    replacement = mock.alloc(job, node)
    replacement.previous_allocation = original.id
    plan = state_pb2.AppliedPlan(
        eval_id="e2",
        namespace="default",
        job_id=job.id,
        allocs=[replacement],
        stops=[
            pb.AllocStop(
                alloc_id=original.id,
                desired_description="alloc is lost since its node is down",
                client_status="lost",
            )
        ],
    )
    resp = await state_stub.ApplyPlans(state_pb2.ApplyPlansRequest(plans=[plan]))
    snap = await state_app.feed.wait_for_index(resp.indexes[0], 10)
    old = snap.alloc_by_id(original.id)
    assert old is not None
    assert old.next_allocation == replacement.id
    assert old.desired_status == DesiredStatus.STOP and old.client_status == ClientStatus.LOST
    assert [(s.field, s.value) for s in old.alloc_states] == [("client_status", "lost")]
    assert old.create_index == first.indexes[0]


async def test_in_place_update_keeps_client_fields(
    state_app: StateApp, state_stub: state_pb2_grpc.StateAsyncStub
) -> None:
    job, node = await _seed(state_app, "inplace-job")
    alloc = mock.alloc(job, node)
    r1 = await state_stub.ApplyPlans(
        state_pb2.ApplyPlansRequest(
            plans=[
                state_pb2.AppliedPlan(
                    eval_id="e1", namespace="default", job_id=job.id, allocs=[alloc]
                )
            ]
        )
    )
    # the client reports running with task states
    async with state_app.db.write() as tx:
        cur = (await tx.get_allocs([alloc.id]))[alloc.id]
        cur.client_status = ClientStatus.RUNNING
        cur.task_states["web"].state = "running"
        tx.put_alloc(cur)
    update = mock.alloc(job, node)
    update.id = alloc.id
    update.job_version = 1
    update.client_status = ClientStatus.PENDING  # the scheduler's stale copy
    r2 = await state_stub.ApplyPlans(
        state_pb2.ApplyPlansRequest(
            plans=[
                state_pb2.AppliedPlan(
                    eval_id="e2", namespace="default", job_id=job.id, allocs=[update]
                )
            ]
        )
    )
    snap = await state_app.feed.wait_for_index(r2.indexes[0], 10)
    stored = snap.alloc_by_id(alloc.id)
    assert stored is not None
    assert stored.job_version == 1
    assert stored.client_status == ClientStatus.RUNNING
    assert stored.task_states["web"].state == "running"
    assert stored.create_index == r1.indexes[0]


async def test_fenced_plan_from_a_non_leader_is_refused(
    state_app: StateApp, state_stub: state_pb2_grpc.StateAsyncStub
) -> None:
    import grpc
    import pytest

    from corral.leader import LeaderElection

    job, node = await _seed(state_app, "fenced-job")
    plan = state_pb2.AppliedPlan(
        eval_id="e1", namespace="default", job_id=job.id, allocs=[mock.alloc(job, node)]
    )
    before = await state_app.db.latest_index()
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await state_stub.ApplyPlans(
            state_pb2.ApplyPlansRequest(plans=[plan], leader_id="10.9.9.9:1")
        )
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "not the planner leader" in (err.value.details() or "")
    assert await state_app.db.latest_index() == before

    election = LeaderElection(state_app.db.dsn, "planner", "10.9.9.9:1")
    assert await election._campaign()
    try:
        resp = await state_stub.ApplyPlans(
            state_pb2.ApplyPlansRequest(plans=[plan], leader_id="10.9.9.9:1")
        )
        assert resp.indexes[0] == before + 1
    finally:
        await election.stop()
