"""State.ApplyPlans: what a committed plan writes, merged the way Nomad's
FSM merges plan results."""

from __future__ import annotations

from corral.domain.structs import ClientStatus, DesiredStatus, copy_msg
from corral.testing import mock
from corral.v1 import state_pb2, state_pb2_grpc
from corral.v1 import structs_pb2 as pb
from services.state.app import StateApp


async def _seed(app: StateApp, job_id: str) -> tuple[pb.Job, pb.Node]:
    job = mock.job(job_id=job_id, count=2)
    node = mock.node()
    async with app.db.write() as tx:
        tx.put_job(job)
        tx.put_node(copy_msg(node))
    return job, node


async def test_group_commit_places_each_plan_at_its_own_index(
    state_app: StateApp,
    state_stub: state_pb2_grpc.StateAsyncStub,
    planner_leader: str,
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
    resp = await state_stub.ApplyPlans(
        state_pb2.ApplyPlansRequest(leader_id=planner_leader, plans=plans)
    )
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
    state_app: StateApp,
    state_stub: state_pb2_grpc.StateAsyncStub,
    planner_leader: str,
) -> None:
    job, node = await _seed(state_app, "link-job")
    original = mock.alloc(job, node, client_status=ClientStatus.RUNNING)
    first = await state_stub.ApplyPlans(
        state_pb2.ApplyPlansRequest(
            leader_id=planner_leader,
            plans=[
                state_pb2.AppliedPlan(
                    eval_id="e1", namespace="default", job_id=job.id, allocs=[original]
                )
            ],
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
    resp = await state_stub.ApplyPlans(
        state_pb2.ApplyPlansRequest(leader_id=planner_leader, plans=[plan])
    )
    snap = await state_app.feed.wait_for_index(resp.indexes[0], 10)
    old = snap.alloc_by_id(original.id)
    assert old is not None
    assert old.next_allocation == replacement.id
    assert old.desired_status == DesiredStatus.STOP and old.client_status == ClientStatus.LOST
    assert [(s.field, s.value) for s in old.alloc_states] == [("client_status", "lost")]
    assert old.create_index == first.indexes[0]


async def test_in_place_update_keeps_client_fields(
    state_app: StateApp,
    state_stub: state_pb2_grpc.StateAsyncStub,
    planner_leader: str,
) -> None:
    job, node = await _seed(state_app, "inplace-job")
    alloc = mock.alloc(job, node)
    r1 = await state_stub.ApplyPlans(
        state_pb2.ApplyPlansRequest(
            leader_id=planner_leader,
            plans=[
                state_pb2.AppliedPlan(
                    eval_id="e1", namespace="default", job_id=job.id, allocs=[alloc]
                )
            ],
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
            leader_id=planner_leader,
            plans=[
                state_pb2.AppliedPlan(
                    eval_id="e2", namespace="default", job_id=job.id, allocs=[update]
                )
            ],
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
    state_app: StateApp,
    state_stub: state_pb2_grpc.StateAsyncStub,
    planner_leader: str,
) -> None:
    """Only the planner leader writes plans: another address, or none, is
    refused with nothing written."""
    import grpc
    import pytest

    job, node = await _seed(state_app, "fenced-job")
    plan = state_pb2.AppliedPlan(
        eval_id="e1", namespace="default", job_id=job.id, allocs=[mock.alloc(job, node)]
    )
    before = await state_app.db.latest_index()
    for leader_id in ("10.9.9.9:1", ""):
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await state_stub.ApplyPlans(
                state_pb2.ApplyPlansRequest(plans=[plan], leader_id=leader_id)
            )
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "not the planner leader" in (err.value.details() or "")
        assert await state_app.db.latest_index() == before

    resp = await state_stub.ApplyPlans(
        state_pb2.ApplyPlansRequest(plans=[plan], leader_id=planner_leader)
    )
    assert resp.indexes[0] == before + 1


async def test_applying_a_plan_bumps_its_evals_modify_index(
    state_app: StateApp,
    state_stub: state_pb2_grpc.StateAsyncStub,
    planner_leader: str,
) -> None:
    from tests.integration.state.helpers import pending_eval

    job, node = await _seed(state_app, "bump-job")
    ev = pending_eval(job.id)
    async with state_app.db.write() as tx:
        tx.put_eval(ev)
    plan = state_pb2.AppliedPlan(
        eval_id=ev.id, namespace="default", job_id=job.id, allocs=[mock.alloc(job, node)]
    )
    resp = await state_stub.ApplyPlans(
        state_pb2.ApplyPlansRequest(leader_id=planner_leader, plans=[plan])
    )
    snap = await state_app.feed.wait_for_index(resp.indexes[0], 10)
    stored = snap.eval_by_id(ev.id)
    assert stored is not None
    assert stored.modify_index == resp.indexes[0] > stored.create_index
    assert stored.status == "pending"  # only the index moves


async def test_a_purged_jobs_plan_stops_its_allocs(
    state_app: StateApp,
    state_stub: state_pb2_grpc.StateAsyncStub,
    planner_leader: str,
) -> None:
    from services.state.writes.jobs import deregister_job

    job, node = await _seed(state_app, "purged-job")
    alloc = mock.alloc(job, node)
    await state_stub.ApplyPlans(
        state_pb2.ApplyPlansRequest(
            leader_id=planner_leader,
            plans=[
                state_pb2.AppliedPlan(
                    eval_id="e1", namespace="default", job_id=job.id, allocs=[alloc]
                )
            ],
        )
    )
    async with state_app.db.write() as tx:
        _, ev = await deregister_job(tx, "default", job.id, purge=True)
    late = mock.alloc(job, node, index=1)
    plan = state_pb2.AppliedPlan(
        eval_id=ev.id,
        namespace="default",
        job_id=job.id,
        stops=[pb.AllocStop(alloc_id=alloc.id, desired_description="alloc not needed")],
        allocs=[late],  # placed on a snapshot from before the purge
    )
    resp = await state_stub.ApplyPlans(
        state_pb2.ApplyPlansRequest(leader_id=planner_leader, plans=[plan])
    )
    snap = await state_app.feed.wait_for_index(resp.indexes[0], 10)
    stopped = snap.alloc_by_id(alloc.id)
    assert stopped is not None and stopped.desired_status == DesiredStatus.STOP
    assert snap.alloc_by_id(late.id) is None
    assert snap.job_by_id("default", job.id) is None
    stored_ev = snap.eval_by_id(ev.id)
    assert stored_ev is not None and stored_ev.modify_index == resp.indexes[0]
