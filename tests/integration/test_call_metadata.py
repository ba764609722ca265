"""Both kinds of channel carry the caller's tokens as call metadata
(`corral.security.transport`): the asyncio channels of the roles and the
blocking channel of the CLI, on unary and streaming calls alike."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from pydantic import SecretStr

from corral.runtime.server import GrpcServer
from corral.runtime.settings import SecuritySettings
from corral.security import transport
from corral.security.acl import TOKEN_METADATA_KEY
from corral.v1 import event_pb2, event_pb2_grpc, operator_pb2, operator_pb2_grpc

SEEN: list[dict[str, str]] = []


class Operator(operator_pb2_grpc.OperatorServicer):
    async def Members(
        self, request: operator_pb2.MembersRequest, context: Any
    ) -> operator_pb2.MembersResponse:
        SEEN.append(dict(context.invocation_metadata()))
        return operator_pb2.MembersResponse()


class Events(event_pb2_grpc.EventServicer):
    async def Stream(
        self, request: event_pb2.EventStreamRequest, context: Any
    ) -> AsyncIterator[event_pb2.EventStreamResponse]:
        SEEN.append(dict(context.invocation_metadata()))
        yield event_pb2.EventStreamResponse(heartbeat=True)


@pytest.fixture
async def address() -> AsyncIterator[str]:
    srv = GrpcServer("127.0.0.1:0", name="test")
    srv.add(
        operator_pb2_grpc.add_OperatorServicer_to_server,
        Operator(),  # type: ignore[abstract]  # the test calls Members only
        operator_pb2.DESCRIPTOR.services_by_name["Operator"].full_name,
    )
    srv.add(
        event_pb2_grpc.add_EventServicer_to_server,
        Events(),
        event_pb2.DESCRIPTOR.services_by_name["Event"].full_name,
    )
    await srv.start()
    try:
        yield srv.bound_address
    finally:
        await srv.stop(0)


SETTINGS = SecuritySettings(server_token=SecretStr("srv-token"))


async def test_asyncio_channels_carry_the_tokens(address: str) -> None:
    SEEN.clear()
    async with transport.dial(address, token="acl-1", settings=SETTINGS) as channel:
        await operator_pb2_grpc.OperatorStub(channel).Members(operator_pb2.MembersRequest())
        async for _ in event_pb2_grpc.EventStub(channel).Stream(event_pb2.EventStreamRequest()):
            break
    assert [m[TOKEN_METADATA_KEY] for m in SEEN] == ["acl-1", "acl-1"]
    assert all(transport.SERVER_TOKEN_METADATA_KEY in m for m in SEEN)


async def test_blocking_channels_carry_the_tokens(address: str) -> None:
    SEEN.clear()

    def calls() -> None:
        channel = transport.dial_sync(address, token="acl-2", settings=SETTINGS)
        try:
            operator_pb2_grpc.OperatorStub(channel).Members(operator_pb2.MembersRequest())
            stream = event_pb2_grpc.EventStub(channel).Stream(event_pb2.EventStreamRequest())
            next(iter(stream))
            stream.cancel()
        finally:
            channel.close()

    await asyncio.get_running_loop().run_in_executor(None, calls)
    assert [m[TOKEN_METADATA_KEY] for m in SEEN] == ["acl-2", "acl-2"]
    assert all(m[transport.SERVER_TOKEN_METADATA_KEY] == "srv-token" for m in SEEN)
