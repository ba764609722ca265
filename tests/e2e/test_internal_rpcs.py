"""Internal RPCs answer servers only (issue 15): on a plaintext cluster the
server token is the proof, and a caller without it, or with a wrong one,
gets PERMISSION_DENIED from every internal RPC of every role, with nothing
written; the public API stays open (ACLs off). A server role without TLS
or a server token refuses to start."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import grpc
import pytest
from pydantic import SecretStr

from corral.domain.structs import new_id
from corral.security import transport
from corral.testing import mock
from corral.v1 import (
    eval_pb2,
    eval_pb2_grpc,
    job_pb2,
    job_pb2_grpc,
    plan_pb2,
    plan_pb2_grpc,
    state_pb2,
    state_pb2_grpc,
    system_pb2,
    system_pb2_grpc,
    worker_pb2_grpc,
)
from tests.cluster import Cluster


def _internal_calls(c: Cluster, channel: Callable[[str], grpc.aio.Channel]) -> list[Any]:
    """(name, coroutine factory) for an internal RPC of each role."""
    state = state_pb2_grpc.StateStub(channel(c.state_addr))
    broker = eval_pb2_grpc.EvalStub(channel(c.broker_addr))
    planner = plan_pb2_grpc.PlanStub(channel(c.planner_addr))
    worker = worker_pb2_grpc.WorkerStub(channel(c.procs["worker"].address))
    job = mock.job()
    alloc = mock.alloc(job, mock.node())
    ev = mock.eval_for(job)
    return [
        ("State.GetIndex", lambda: state.GetIndex(state_pb2.GetIndexRequest())),
        ("State.UpsertEvals", lambda: state.UpsertEvals(state_pb2.UpsertEvalsRequest(evals=[ev]))),
        (
            "State.ApplyPlans",
            lambda: state.ApplyPlans(
                state_pb2.ApplyPlansRequest(
                    plans=[state_pb2.AppliedPlan(job_id=alloc.job_id, allocs=[alloc])]
                )
            ),
        ),
        (
            "State.GarbageCollect",
            lambda: state.GarbageCollect(
                state_pb2.GarbageCollectRequest(jobs=[state_pb2.JobRef(job_id=job.id)])
            ),
        ),
        (
            "State.DecideEval",  # a worker's outcome and ack (issue 30)
            lambda: state.DecideEval(
                state_pb2.DecideEvalRequest(eval_id=ev.id, token="x", outcome=ev)
            ),
        ),
        ("State.Snapshot", lambda: _drain(state.Snapshot(state_pb2.SnapshotRequest()))),
        ("State.Subscribe", lambda: _drain(state.Subscribe(state_pb2.SubscribeRequest()))),
        (
            "State.RegisterMember",
            lambda: state.RegisterMember(
                state_pb2.RegisterMemberRequest(
                    member=state_pb2.Member(id=new_id(), role="worker", address="10.0.0.1:1")
                )
            ),
        ),
        (
            "Eval.Dequeue",
            lambda: broker.Dequeue(
                eval_pb2.EvalDequeueRequest(
                    schedulers=["service"], timeout_ms=10, scheduler_version=1
                )
            ),
        ),
        ("Eval.Ack", lambda: broker.Ack(eval_pb2.EvalAckRequest(eval_id=ev.id, token="x"))),
        (
            "Eval.PlanFence",  # the broker's token signing key: never to a non-server
            lambda: _drain(broker.PlanFence(iter([eval_pb2.PlanFenceConfirm(planner="x")]))),
        ),
        (
            "CoreGC.Force",
            lambda: system_pb2_grpc.CoreGCStub(channel(c.broker_addr)).Force(
                system_pb2.SystemGCRequest(detach=True)
            ),
        ),
        ("Plan.Submit", lambda: planner.Submit(plan_pb2.PlanSubmitRequest())),
        ("Worker.PlanJob", lambda: worker.PlanJob(job_pb2.JobPlanRequest(job=mock.job()))),
    ]


async def _drain(stream: Any) -> None:
    async for _ in stream:
        return


def _start(c: Cluster) -> None:
    c.start("state")
    c.start("broker")
    c.start("planner")
    c.start("worker", "--num-schedulers", "1")


async def test_internal_rpcs_refuse_callers_without_the_server_token(
    make_cluster: Callable[..., Cluster],
) -> None:
    c = make_cluster()
    _start(c)
    server = state_pb2_grpc.StateStub(transport.dial(c.state_addr))
    before = (await server.GetIndex(state_pb2.GetIndexRequest())).index

    anonymous: list[grpc.aio.Channel] = []
    wrong: list[grpc.aio.Channel] = []

    def plain(address: str) -> grpc.aio.Channel:
        anonymous.append(grpc.aio.insecure_channel(address))
        return anonymous[-1]

    def forged(address: str) -> grpc.aio.Channel:
        settings = transport.current().model_copy(
            update={"server_token": SecretStr("not-the-token")}
        )
        wrong.append(transport.dial(address, settings=settings))
        return wrong[-1]

    for make in (plain, forged):
        for name, call in _internal_calls(c, make):
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await call()
            assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED, name
            assert "servers only" in (err.value.details() or ""), name
    for ch in anonymous + wrong:
        await ch.close()

    # nothing written, and the public API still answers without any token
    assert (await server.GetIndex(state_pb2.GetIndexRequest())).index == before
    async with grpc.aio.insecure_channel(c.state_addr) as ch:
        resp = await job_pb2_grpc.JobStub(ch).Register(job_pb2.JobRegisterRequest(job=mock.job()))
    assert resp.index > before


def test_a_server_role_without_tls_or_server_token_refuses_to_start(
    make_cluster: Callable[..., Cluster],
) -> None:
    c = make_cluster(CORRAL_SERVER_TOKEN="")
    with pytest.raises(RuntimeError):
        c.start("state", timeout=60)
    log = c.log("state")
    assert "CORRAL_SERVER_TOKEN" in log
    assert "Traceback" not in log
    assert os.environ["CORRAL_SERVER_TOKEN"] not in log
