"""Bad input to the internal write RPCs: a clear status naming the field,
and nothing written (the index does not move)."""

from __future__ import annotations

import grpc
import pytest

from corral.security import transport
from corral.v1 import state_pb2, state_pb2_grpc
from corral.v1 import structs_pb2 as pb
from services.state.app import StateApp
from tests.integration.state.helpers import pending_eval


async def _expect_invalid(call: object, needle: str) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await call  # type: ignore[misc]
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert needle in (err.value.details() or ""), err.value.details()


@pytest.mark.parametrize(
    ("mutate", "needle"),
    [
        (lambda e: setattr(e, "id", ""), "evals[0].id: is required"),
        (lambda e: setattr(e, "job_id", ""), "evals[0].job_id: is required"),
        (lambda e: setattr(e, "status", "exploded"), "evals[0].status: unknown value 'exploded'"),
        (lambda e: setattr(e, "type", "quantum"), "evals[0].type: unknown value 'quantum'"),
        (lambda e: setattr(e, "triggered_by", "whim"), "evals[0].triggered_by"),
        (lambda e: setattr(e, "priority", -3), "evals[0].priority"),
        (lambda e: setattr(e, "wait", -1), "evals[0].wait"),
    ],
)
async def test_upsert_evals_rejects_bad_evals(
    state_app: StateApp,
    state_stub: state_pb2_grpc.StateAsyncStub,
    broker_leader: str,
    mutate: object,
    needle: str,
) -> None:
    before = await state_app.db.latest_index()
    ev = pending_eval()
    mutate(ev)  # type: ignore[operator]
    good = pending_eval()
    await _expect_invalid(
        state_stub.UpsertEvals(
            state_pb2.UpsertEvalsRequest(leader_id=broker_leader, evals=[ev, good])
        ),
        needle,
    )
    assert await state_app.db.latest_index() == before


async def test_upsert_evals_rejects_oversized_batches(
    state_app: StateApp, state_stub: state_pb2_grpc.StateAsyncStub, broker_leader: str
) -> None:
    before = await state_app.db.latest_index()
    evals = [pending_eval() for _ in range(100_001)]
    await _expect_invalid(
        state_stub.UpsertEvals(state_pb2.UpsertEvalsRequest(leader_id=broker_leader, evals=evals)),
        "more than",
    )
    await _expect_invalid(
        state_stub.UpsertEvals(state_pb2.UpsertEvalsRequest(leader_id=broker_leader)),
        "must not be empty",
    )
    assert await state_app.db.latest_index() == before


async def test_apply_plans_rejects_negative_resources_and_missing_ids(
    state_app: StateApp, state_stub: state_pb2_grpc.StateAsyncStub, planner_leader: str
) -> None:
    before = await state_app.db.latest_index()
    alloc = pb.Allocation(
        id="a1", job_id="web", node_id="n1", eval_id="e1", task_group="web", desired_status="run"
    )
    alloc.resources.memory_mb = -5
    plan = state_pb2.AppliedPlan(eval_id="e1", job_id="web", namespace="default", allocs=[alloc])
    await _expect_invalid(
        state_stub.ApplyPlans(state_pb2.ApplyPlansRequest(leader_id=planner_leader, plans=[plan])),
        "plans[0].allocs[0].resources.memory_mb: must not be negative",
    )
    plan.allocs[0].resources.memory_mb = 5
    plan.allocs[0].node_id = ""
    await _expect_invalid(
        state_stub.ApplyPlans(state_pb2.ApplyPlansRequest(leader_id=planner_leader, plans=[plan])),
        "plans[0].allocs[0].node_id",
    )
    plan.allocs[0].node_id = "n1"
    plan.allocs[0].desired_status = "maybe"
    await _expect_invalid(
        state_stub.ApplyPlans(state_pb2.ApplyPlansRequest(leader_id=planner_leader, plans=[plan])),
        "desired_status: unknown value",
    )
    plan.allocs[0].desired_status = "run"
    assert await state_app.db.latest_index() == before
    # placing needs a job; only a plan for a purged job comes without one
    plan.job_id = ""
    await _expect_invalid(
        state_stub.ApplyPlans(state_pb2.ApplyPlansRequest(leader_id=planner_leader, plans=[plan])),
        "plans[0].job_id: is required for a plan that places allocs",
    )
    assert await state_app.db.latest_index() == before


async def test_subscribe_rejects_unknown_topics(state_stub: state_pb2_grpc.StateAsyncStub) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        async for _ in state_stub.Subscribe(state_pb2.SubscribeRequest(topics=["Weather"])):
            pass
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT


async def test_garbage_collect_deletes_and_feeds_deletions(
    state_app: StateApp, state_stub: state_pb2_grpc.StateAsyncStub
) -> None:
    ev = pending_eval("gc", status="complete")
    async with state_app.db.write() as tx:
        tx.put_eval(ev)
    await state_app.feed.wait_for_index(tx.index, 10)
    assert state_app.feed.snapshot().eval_by_id(ev.id) is not None
    resp = await state_stub.GarbageCollect(
        state_pb2.GarbageCollectRequest(eval_ids=[ev.id, "missing"])
    )
    snap = await state_app.feed.wait_for_index(resp.index, 10)
    assert snap.eval_by_id(ev.id) is None
    batch = (await state_app.db.read_log(resp.index - 1, 1))[0]
    assert [(e.topic, e.deleted) for e in batch.events] == [("Evaluation", True)]
    await _expect_invalid(
        state_stub.GarbageCollect(state_pb2.GarbageCollectRequest()), "must not be empty"
    )


async def test_refused_public_writes_consume_no_index(state_app: StateApp) -> None:
    """A write the state refuses (here from the batcher's own transaction:
    an unknown job, an unknown node) takes no index and adds no change-log
    row, even when a hundred of them arrive together."""
    import asyncio

    from corral.v1 import job_pb2, job_pb2_grpc, node_pb2, node_pb2_grpc

    before = await state_app.db.latest_index()
    async with transport.dial(state_app.server.bound_address) as ch:
        jobs, nodes = job_pb2_grpc.JobStub(ch), node_pb2_grpc.NodeStub(ch)
        calls = [
            jobs.Deregister(job_pb2.JobDeregisterRequest(job_id=f"nope-{i}")) for i in range(50)
        ] + [
            nodes.UpdateAlloc(
                node_pb2.NodeUpdateAllocRequest(
                    allocs=[pb.Allocation(id=f"a-{i}", node_id=f"n-{i}", client_status="running")],
                    secret_id="a-secret",
                )
            )
            for i in range(50)
        ]
        results = await asyncio.gather(*calls, return_exceptions=True)
    codes = {r.code() for r in results if isinstance(r, grpc.aio.AioRpcError)}
    assert codes == {grpc.StatusCode.NOT_FOUND}, results[:3]
    assert len([r for r in results if isinstance(r, grpc.aio.AioRpcError)]) == 100
    assert await state_app.db.latest_index() == before
    async with state_app.db.read() as conn:
        cur = await conn.execute("SELECT count(*) FROM change_log WHERE index > %s", (before,))
        row = await cur.fetchone()
    assert row is not None and row[0] == 0
