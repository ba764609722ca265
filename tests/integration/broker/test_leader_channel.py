"""`corral.runtime.rpc.LeaderChannel` against real in-process gRPC servers: a standby
answering NotLeader is followed to the leader it names, a dead address is
rotated past, other errors are not retried, and with no leader the retry
budget ends in UNAVAILABLE."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc
import pytest

from corral.domain.errors import InvalidArgument, NotLeader
from corral.runtime.rpc import LeaderChannel
from corral.runtime.server import GrpcServer
from corral.v1 import eval_pb2, eval_pb2_grpc


class FakeEval(eval_pb2_grpc.EvalServicer):
    """Answers Stats as a leader (naming itself) or as a standby."""

    def __init__(self) -> None:
        self.leader = ""  # '' = I am the leader; else the leader I name
        self.me = ""
        self.fail_invalid = False
        self.calls = 0

    async def Stats(self, request: eval_pb2.BrokerStatsRequest, context: Any) -> Any:
        self.calls += 1
        if self.fail_invalid:
            raise InvalidArgument("x", "bad")
        if self.leader:
            raise NotLeader("broker", "" if self.leader == "-" else self.leader)
        return eval_pb2.BrokerStats(enabled=True, leader_address=self.me)


@pytest.fixture
async def servers() -> AsyncIterator[list[tuple[GrpcServer, FakeEval]]]:
    out = []
    for i in range(2):
        srv = GrpcServer("127.0.0.1:0", name=f"fake{i}")
        svc = FakeEval()  # type: ignore[abstract]  # only Stats is served
        srv.add(
            eval_pb2_grpc.add_EvalServicer_to_server,
            svc,
            eval_pb2.DESCRIPTOR.services_by_name["Eval"].full_name,
        )
        await srv.start()
        svc.me = srv.bound_address
        out.append((srv, svc))
    yield out
    for srv, _ in out:
        await srv.stop(grace=0)


STATS: Callable[[grpc.aio.Channel], Any] = lambda c: eval_pb2_grpc.EvalStub(c).Stats  # noqa: E731


async def test_follows_the_leader_a_standby_names(
    servers: list[tuple[GrpcServer, FakeEval]],
) -> None:
    (standby, s_svc), (leader, l_svc) = servers
    s_svc.leader = leader.bound_address
    ch = LeaderChannel([standby.bound_address])
    try:
        resp = await ch.call(STATS, eval_pb2.BrokerStatsRequest(), timeout=5)
        assert resp.leader_address == leader.bound_address
        assert ch.address == leader.bound_address
        # the next call goes straight to the leader
        await ch.call(STATS, eval_pb2.BrokerStatsRequest(), timeout=5)
        assert (s_svc.calls, l_svc.calls) == (1, 2)
        # leadership moves: the old leader now names the other
        l_svc.leader, s_svc.leader = standby.bound_address, ""
        resp = await ch.call(STATS, eval_pb2.BrokerStatsRequest(), timeout=5)
        assert resp.leader_address == standby.bound_address
    finally:
        await ch.close()


async def test_rotates_past_a_dead_address_and_a_leaderless_standby(
    servers: list[tuple[GrpcServer, FakeEval]],
) -> None:
    (standby, s_svc), (leader, _) = servers
    s_svc.leader = "-"  # election under way: no address to give
    dead = GrpcServer("127.0.0.1:0", name="dead")
    await dead.start()
    dead_addr = dead.bound_address
    await dead.stop(grace=0)
    ch = LeaderChannel([dead_addr, standby.bound_address, leader.bound_address])
    try:
        resp = await ch.call(STATS, eval_pb2.BrokerStatsRequest(), timeout=2)
        assert resp.leader_address == leader.bound_address
        assert s_svc.calls == 1
    finally:
        await ch.close()


async def test_other_errors_are_not_retried(
    servers: list[tuple[GrpcServer, FakeEval]],
) -> None:
    (srv, svc), _ = servers
    svc.fail_invalid = True
    ch = LeaderChannel([srv.bound_address])
    try:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await ch.call(STATS, eval_pb2.BrokerStatsRequest(), timeout=2)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert svc.calls == 1
    finally:
        await ch.close()


async def test_no_leader_ends_in_unavailable_after_the_budget(
    servers: list[tuple[GrpcServer, FakeEval]],
) -> None:
    (a, a_svc), (b, b_svc) = servers
    a_svc.leader = b_svc.leader = "-"
    ch = LeaderChannel([a.bound_address, b.bound_address], retry_budget=0.5)
    try:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await ch.call(STATS, eval_pb2.BrokerStatsRequest(), timeout=2)
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
        assert a_svc.calls >= 1 and b_svc.calls >= 1
    finally:
        await ch.close()
