"""Per-RPC metrics (corral/runtime/rpc_metrics.py) on a real in-process server and
a channel from `corral.security.transport.dial`: every call counts once on each side,
under its status code, with its latency; a cancelled stream counts as
CANCELLED."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest
from prometheus_client import REGISTRY

from corral.domain.errors import InvalidArgument
from corral.runtime.server import GrpcServer
from corral.security import transport
from corral.v1 import eval_pb2, eval_pb2_grpc, state_pb2, state_pb2_grpc
from corral.v1 import structs_pb2 as pb
from tests.wait import until

SERVICE = "corral.v1.Eval"


class FakeEval(eval_pb2_grpc.EvalServicer):
    """Stats answers, or fails as told."""

    def __init__(self) -> None:
        self.fail: BaseException | None = None

    async def Stats(self, request: eval_pb2.BrokerStatsRequest, context: Any) -> Any:
        if self.fail is not None:
            raise self.fail
        return eval_pb2.BrokerStats(enabled=True)


@pytest.fixture
async def served() -> AsyncIterator[tuple[GrpcServer, FakeEval]]:
    srv = GrpcServer("127.0.0.1:0", name="fake")
    svc = FakeEval()  # type: ignore[abstract]  # only Stats is served
    srv.add(eval_pb2_grpc.add_EvalServicer_to_server, svc, SERVICE)
    await srv.start()
    yield srv, svc
    await srv.stop(grace=0)


def value(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def handled(
    side: str, code: str, method: str = "Stats", service: str = SERVICE, kind: str = "unary"
) -> float:
    return value(
        f"grpc_{side}_handled_total",
        grpc_type=kind,
        grpc_service=service,
        grpc_method=method,
        grpc_code=code,
    )


def latency_count(side: str) -> float:
    return value(
        f"grpc_{side}_handling_seconds_count",
        grpc_type="unary",
        grpc_service=SERVICE,
        grpc_method="Stats",
    )


async def test_unary_calls_count_by_status_on_both_sides(
    served: tuple[GrpcServer, FakeEval],
) -> None:
    srv, svc = served
    before = {
        (side, code): handled(side, code)
        for side in ("server", "client")
        for code in ("OK", "INVALID_ARGUMENT", "INTERNAL")
    }
    latency_before = latency_count("server"), latency_count("client")
    started_before = value(
        "grpc_server_started_total", grpc_type="unary", grpc_service=SERVICE, grpc_method="Stats"
    )
    channel = transport.dial(srv.bound_address)
    stub = eval_pb2_grpc.EvalStub(channel)
    try:
        for _ in range(3):
            await stub.Stats(eval_pb2.BrokerStatsRequest(), timeout=5)
        svc.fail = InvalidArgument("x", "bad")
        with pytest.raises(grpc.aio.AioRpcError) as bad:
            await stub.Stats(eval_pb2.BrokerStatsRequest(), timeout=5)
        assert bad.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        svc.fail = RuntimeError("boom")
        with pytest.raises(grpc.aio.AioRpcError) as internal:
            await stub.Stats(eval_pb2.BrokerStatsRequest(), timeout=5)
        assert internal.value.code() == grpc.StatusCode.INTERNAL
    finally:
        await channel.close()
    # the server records after it sent the status, the client in a done
    # callback: both may land just after the caller saw the answer
    expected = {"OK": 3, "INVALID_ARGUMENT": 1, "INTERNAL": 1}

    def counts() -> dict[tuple[str, str], float]:
        return {key: handled(*key) - before[key] for key in before}

    want = {(side, code): n for side in ("server", "client") for code, n in expected.items()}
    await until(lambda: counts() == want, timeout=5, what="handled counts")
    assert latency_count("server") - latency_before[0] == 5
    assert latency_count("client") - latency_before[1] == 5
    assert (
        value(
            "grpc_server_started_total",
            grpc_type="unary",
            grpc_service=SERVICE,
            grpc_method="Stats",
        )
        - started_before
        == 5
    )


class FakeFeed(state_pb2_grpc.StateServicer):
    """Subscribe sends one batch, then holds the stream open."""

    async def Subscribe(
        self, request: state_pb2.SubscribeRequest, context: Any
    ) -> AsyncIterator[pb.ChangeBatch]:
        yield pb.ChangeBatch(index=1)
        await asyncio.Event().wait()


async def test_a_cancelled_stream_counts_as_cancelled() -> None:
    service = "corral.v1.State"
    srv = GrpcServer("127.0.0.1:0", name="fake-state")
    srv.add(state_pb2_grpc.add_StateServicer_to_server, FakeFeed(), service)  # type: ignore[abstract]
    await srv.start()

    def cancelled(side: str) -> float:
        return handled(side, "CANCELLED", "Subscribe", service, kind="server_stream")

    before = cancelled("client"), cancelled("server")
    channel = transport.dial(srv.bound_address)
    try:
        call = state_pb2_grpc.StateStub(channel).Subscribe(state_pb2.SubscribeRequest())
        first = await call.read()
        assert isinstance(first, pb.ChangeBatch) and first.index == 1
        call.cancel()
        await until(lambda: cancelled("client") == before[0] + 1, timeout=5, what="client count")
        await until(lambda: cancelled("server") == before[1] + 1, timeout=5, what="server count")
    finally:
        await channel.close()
        await srv.stop(grace=0)


async def test_a_stream_handler_that_writes_through_its_context_works() -> None:
    """grpc's own Health/Watch writes with context.write instead of
    yielding; the handler wrapper must await it, not iterate it."""
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    from corral.runtime.server import GrpcServer

    server = GrpcServer("127.0.0.1:0", name="watch")
    await server.start()
    try:
        async with transport.dial(server.bound_address) as ch:
            watch = health_pb2_grpc.HealthStub(ch).Watch(health_pb2.HealthCheckRequest())
            first = await watch.read()
            assert first.status == health_pb2.HealthCheckResponse.SERVING
            watch.cancel()
    finally:
        await server.stop(0)
