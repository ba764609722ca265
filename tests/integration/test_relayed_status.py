"""A role that relays a call to another server (the broker writing a
worker's eval to the state) answers the other server's verdict on the
request with its status and message, not INTERNAL; a fault of its own
stays INTERNAL with nothing of the exception's text."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest

from corral.domain.errors import InvalidArgument
from corral.runtime.server import GrpcServer
from corral.security import transport
from corral.v1 import eval_pb2, eval_pb2_grpc

SERVICE = "corral.v1.Eval"


class Back(eval_pb2_grpc.EvalServicer):
    """Refuses every Stats call as a state refuses a bad write."""

    async def Stats(self, request: eval_pb2.BrokerStatsRequest, context: Any) -> Any:
        raise InvalidArgument("evals[0].status", "unknown status 'bogus'")


class Front(eval_pb2_grpc.EvalServicer):
    """Relays Stats to the back server; fails on its own when told."""

    def __init__(self, back: str) -> None:
        self.channel = transport.dial(back)
        self.own_fault = False

    async def Stats(self, request: eval_pb2.BrokerStatsRequest, context: Any) -> Any:
        if self.own_fault:
            raise RuntimeError("secret-ish detail of a bug")
        return await eval_pb2_grpc.EvalStub(self.channel).Stats(request, timeout=10)


@pytest.fixture
async def front() -> AsyncIterator[tuple[str, Front]]:
    back = GrpcServer("127.0.0.1:0", name="back")
    back.add(eval_pb2_grpc.add_EvalServicer_to_server, Back(), SERVICE)  # type: ignore[abstract]
    await back.start()
    relay = Front(back.bound_address)  # type: ignore[abstract]
    srv = GrpcServer("127.0.0.1:0", name="front")
    srv.add(eval_pb2_grpc.add_EvalServicer_to_server, relay, SERVICE)
    await srv.start()
    yield srv.bound_address, relay
    await srv.stop(grace=0)
    await relay.channel.close()
    await back.stop(grace=0)


async def test_relayed_refusal_keeps_its_status(front: tuple[str, Front]) -> None:
    address, _ = front
    async with transport.dial(address) as channel:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await eval_pb2_grpc.EvalStub(channel).Stats(eval_pb2.BrokerStatsRequest(), timeout=10)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "evals[0].status" in (err.value.details() or "")


async def test_own_fault_stays_internal(front: tuple[str, Front]) -> None:
    address, relay = front
    relay.own_fault = True
    async with transport.dial(address) as channel:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await eval_pb2_grpc.EvalStub(channel).Stats(eval_pb2.BrokerStatsRequest(), timeout=10)
    assert err.value.code() == grpc.StatusCode.INTERNAL
    assert "secret-ish" not in (err.value.details() or "")
