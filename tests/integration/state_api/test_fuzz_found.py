"""Input the fuzz test (tests/fuzz) found answered with the wrong status:
each is now refused with the status naming the problem, and writes
nothing."""

from __future__ import annotations

import grpc
import pytest

from corral import structs
from corral.testing import mock
from corral.v1 import node_pb2, node_pb2_grpc
from corral.v1 import structs_pb2 as pb
from services.state.app import StateApp


async def _refused(state_app: StateApp, call: object, needle: str) -> None:
    before = await state_app.db.latest_index()
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await call  # type: ignore[misc]
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, err.value.details()
    assert needle in (err.value.details() or ""), err.value.details()
    assert await state_app.db.latest_index() == before


async def test_a_drain_deadline_past_any_time_is_refused(
    state_app: StateApp, channel: grpc.aio.Channel
) -> None:
    """A deadline of 7.4e18 ns made now + deadline overflow int64: INTERNAL
    ("Value out of range") from the write."""
    nodes = node_pb2_grpc.NodeStub(channel)
    node = mock.node()
    await nodes.Register(node_pb2.NodeRegisterRequest(node=node))
    huge = pb.DrainStrategy(deadline=7_427_928_804_145_758_231)
    await _refused(
        state_app,
        nodes.UpdateDrain(node_pb2.NodeUpdateDrainRequest(node_id=node.id, drain_strategy=huge)),
        "drain_strategy.deadline: must be at most 876000 hours",
    )
    # the longest deadline allowed is still a valid time
    longest = pb.DrainStrategy(deadline=100 * 365 * 24 * structs.HOUR)
    resp = await nodes.UpdateDrain(
        node_pb2.NodeUpdateDrainRequest(node_id=node.id, drain_strategy=longest)
    )
    assert resp.index > 0


async def test_a_status_echoing_a_huge_id_still_reaches_the_caller(
    state_app: StateApp, channel: grpc.aio.Channel
) -> None:
    """NOT_FOUND "node '<10,000 characters>' not found" made a trailer over
    the client's metadata limit: the caller got RESOURCE_EXHAUSTED ("received
    metadata size exceeds hard limit") and never the status."""
    nodes = node_pb2_grpc.NodeStub(channel)
    for node_id in ("é" * 5_000, "x" * 10_000, "😀" * 3_000):
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await nodes.Get(node_pb2.NodeGetRequest(node_id=node_id))
        assert err.value.code() == grpc.StatusCode.NOT_FOUND, err.value.details()
        details = err.value.details() or ""
        assert details.startswith("node '") and details.endswith(" ... (truncated)"), details
