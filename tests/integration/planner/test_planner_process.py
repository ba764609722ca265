"""Planner processes (`python -m services.planner`) with a real broker process
and an in-process state service on the module's PostgreSQL: the token check
(made in the planner with the broker's key, issue 30), a plan whose worker's
lease lapsed refused, a standby's answer, and a crash between evaluate and apply
(`CORRAL_PLANNER_FAULT=exit-before-apply`) that commits nothing while the
retry after a restart succeeds."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from corral.domain.errors import LEADER_METADATA_KEY
from corral.domain.structs import ClientStatus, EvalStatus, JobType, Trigger, new_id
from corral.security import transport
from corral.testing import mock
from corral.testing.invariants import check_state, errors, fetch_snapshot
from corral.v1 import eval_pb2, eval_pb2_grpc, plan_pb2, plan_pb2_grpc
from corral.v1 import structs_pb2 as pb
from services.planner.applier import FAULT_EXIT_STATUS
from services.state.app import StateApp
from tests.cluster import Cluster, Proc
from tests.integration.planner.conftest import seed

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture
async def channels() -> AsyncIterator[dict[str, grpc.aio.Channel]]:
    opened: dict[str, grpc.aio.Channel] = {}
    yield opened
    for ch in opened.values():
        await ch.close()


def plan_stub(channels: dict[str, grpc.aio.Channel], address: str) -> plan_pb2_grpc.PlanAsyncStub:
    if address not in channels:
        channels[address] = transport.dial(address)
    return plan_pb2_grpc.PlanStub(channels[address])


async def wait_leader(stub: plan_pb2_grpc.PlanAsyncStub, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            stats = await stub.Stats(plan_pb2.PlanStatsRequest(), timeout=5)
            if stats.enabled:
                return
        except grpc.aio.AioRpcError:
            pass
        await asyncio.sleep(0.1)
    raise TimeoutError("planner did not become leader")


async def outstanding_eval(
    state_app: StateApp, cluster: Cluster, job: pb.Job, node: pb.Node, worker_id: str = ""
) -> tuple[pb.Evaluation, str, int]:
    """Seed a node, a job and its pending eval; dequeue it from the broker
    (under `worker_id`'s lease, which nothing renews, when given)."""
    ev = pb.Evaluation(
        id=new_id(),
        namespace=job.namespace,
        priority=job.priority,
        type=JobType.SERVICE,
        triggered_by=Trigger.JOB_REGISTER,
        job_id=job.id,
        status=EvalStatus.PENDING,
    )
    index = await seed(state_app, nodes=[node], jobs=[job])
    async with state_app.db.write() as tx:
        tx.put_eval(ev)
    async with transport.dial(cluster.broker_addr) as ch:
        stub = eval_pb2_grpc.EvalStub(ch)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            resp = await stub.Dequeue(
                eval_pb2.EvalDequeueRequest(
                    schedulers=[JobType.SERVICE],
                    timeout_ms=1000,
                    scheduler_version=1,
                    worker_id=worker_id,
                ),
                timeout=10,
            )
            if resp.eval.id == ev.id:
                return resp.eval, resp.token, max(index, tx.index)
            if resp.eval.id:  # some other test's eval: hand it back
                await stub.Nack(eval_pb2.EvalAckRequest(eval_id=resp.eval.id, token=resp.token))
    raise TimeoutError("eval never dequeued")


def placement_plan(
    ev: pb.Evaluation, token: str, job: pb.Job, node: pb.Node, index: int, first: int = 0
) -> pb.Plan:
    """Two placements, named `first` and `first + 1` (a second plan takes
    other names: two live allocs sharing one are a checker error)."""
    plan = pb.Plan(
        eval_id=ev.id, eval_token=token, priority=ev.priority, job=job, snapshot_index=index
    )
    for i in range(first, first + 2):
        a = mock.alloc(job, node, index=i, client_status=ClientStatus.PENDING, eval_id=ev.id)
        plan.node_allocation[node.id].allocs.append(a)
    return plan


async def test_token_check_standby_and_commit(
    state_app: StateApp,
    state_addr: str,
    cluster: Cluster,
    channels: dict[str, grpc.aio.Channel],
) -> None:
    leader = await cluster.start_async("planner", name="planner-a")
    standby: Proc | None = None
    try:
        stub = plan_stub(channels, leader.address)
        await wait_leader(stub)
        standby = await cluster.start_async("planner", name="planner-b")
        node, job = mock.node(), mock.job()
        ev, token, index = await outstanding_eval(state_app, cluster, job, node)

        # a stale token is refused before anything is queued
        stale = placement_plan(ev, "not-" + token, job, node, index)
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stub.Submit(plan_pb2.PlanSubmitRequest(plan=stale), timeout=30)
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION

        # a standby points at the leader
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await plan_stub(channels, standby.address).Submit(
                plan_pb2.PlanSubmitRequest(plan=stale), timeout=30
            )
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
        md = dict(err.value.trailing_metadata() or ())
        assert md.get(LEADER_METADATA_KEY) == leader.address

        # a malformed plan names the field
        bad = placement_plan(ev, token, job, node, index)
        bad.node_allocation[node.id].allocs[0].id = ""
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stub.Submit(plan_pb2.PlanSubmitRequest(plan=bad), timeout=30)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert f"plan.node_allocation[{node.id}].allocs[0].id" in (err.value.details() or "")

        good = placement_plan(ev, token, job, node, index)
        resp = await stub.Submit(plan_pb2.PlanSubmitRequest(plan=good), timeout=30)
        assert resp.index == resp.result.alloc_index > index
        assert len(resp.result.node_allocation[node.id].allocs) == 2
        stats = await stub.Stats(plan_pb2.PlanStatsRequest())
        assert stats.enabled and stats.plans_applied >= 1 and stats.commits >= 1

        # the leader goes away: the standby takes over and commits the next plan
        await cluster.stop_async(leader.name)
        taken_over = plan_stub(channels, standby.address)
        await wait_leader(taken_over)
        more = placement_plan(ev, token, job, node, resp.index, first=2)
        resp2 = await taken_over.Submit(plan_pb2.PlanSubmitRequest(plan=more), timeout=30)
        assert resp2.index > resp.index
    finally:
        await cluster.stop_async(leader.name)
        if standby is not None:
            await cluster.stop_async(standby.name)
    assert not errors(await check_state(state_addr))


async def test_a_plan_after_its_workers_lease_lapsed_is_refused(
    state_app: StateApp,
    state_addr: str,
    cluster: Cluster,
    channels: dict[str, grpc.aio.Channel],
) -> None:
    """No call to the broker in Plan.Submit, and still: the broker revokes
    the token of a worker whose lease lapsed at the planner before it
    redelivers the eval, and the planner refuses the late plan."""
    leader = await cluster.start_async("planner", name="planner-fenced")
    try:
        stub = plan_stub(channels, leader.address)
        await wait_leader(stub)
        node, job = mock.node(), mock.job()
        ev, token, index = await outstanding_eval(state_app, cluster, job, node, "lapsing")
        async with transport.dial(cluster.broker_addr) as ch:
            broker = eval_pb2_grpc.EvalStub(ch)

            async def redelivered() -> bool:
                got = await broker.Dequeue(
                    eval_pb2.EvalDequeueRequest(
                        schedulers=[JobType.SERVICE], timeout_ms=200, scheduler_version=1
                    )
                )
                if got.eval.id and got.eval.id != ev.id:
                    await broker.Nack(eval_pb2.EvalAckRequest(eval_id=got.eval.id, token=got.token))
                return got.eval.id == ev.id

            deadline = time.monotonic() + 30
            while not await redelivered():  # the lease (5 s) lapses, the eval comes back
                assert time.monotonic() < deadline, "the lapsed worker's eval never came back"
        late = placement_plan(ev, token, job, node, index)
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stub.Submit(plan_pb2.PlanSubmitRequest(plan=late), timeout=30)
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "no longer outstanding" in (err.value.details() or "")
        assert "lost its lease" in cluster.log("broker")
    finally:
        await cluster.stop_async(leader.name)
    snap = await fetch_snapshot(state_addr)
    assert snap.allocs_by_job(job.namespace, job.id) == []


async def test_crash_between_evaluate_and_apply_commits_nothing(
    state_app: StateApp,
    state_addr: str,
    cluster: Cluster,
    channels: dict[str, grpc.aio.Channel],
) -> None:
    faulty = await cluster.start_async(
        "planner", name="planner-faulty", env={"CORRAL_PLANNER_FAULT": "exit-before-apply"}
    )
    try:
        stub = plan_stub(channels, faulty.address)
        await wait_leader(stub)
        node, job = mock.node(), mock.job()
        ev, token, index = await outstanding_eval(state_app, cluster, job, node)
        plan = placement_plan(ev, token, job, node, index)
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stub.Submit(plan_pb2.PlanSubmitRequest(plan=plan), timeout=30)
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
        assert await cluster.wait_exit(faulty.name, 15) == FAULT_EXIT_STATUS
    finally:
        await cluster.stop_async(faulty.name)
    snap = await fetch_snapshot(state_addr)
    assert snap.allocs_by_job(job.namespace, job.id) == []

    restarted = await cluster.start_async("planner", name="planner-restarted")
    try:
        stub = plan_stub(channels, restarted.address)
        await wait_leader(stub)
        resp = await stub.Submit(plan_pb2.PlanSubmitRequest(plan=plan), timeout=30)
        assert resp.result.alloc_index > index and not resp.result.rejected_nodes
    finally:
        await cluster.stop_async(restarted.name)
    snap = await fetch_snapshot(state_addr)
    assert len(snap.allocs_by_job(job.namespace, job.id)) == 2
    assert not errors(await check_state(state_addr))
