"""Slow and abusive readers (issue 26): subscribers of `Event.Stream` and
`State.Subscribe` that stop reading cost the state a bounded amount of
memory and are dropped after `--stream-stall-timeout`, naming the index to
resubscribe from; a reader that keeps reading is unaffected. Before, each
stuck event stream queued up to 1,024 change batches of its own (read from
the change log when it started behind): three stuck readers and 60 MB of
changes grew the state by 110 MB (21 MB now), and they were never dropped."""

from __future__ import annotations

import asyncio
import contextlib
import random
import urllib.request
from collections.abc import Callable
from typing import Any

import grpc
import psutil
import pytest

from corral.security import transport
from corral.testing import mock
from corral.v1 import (
    event_pb2,
    event_pb2_grpc,
    node_pb2,
    node_pb2_grpc,
    query_pb2,
    state_pb2,
    state_pb2_grpc,
)
from tests.cluster import Cluster
from tests.wait import until

STALL_S = 3.0
WRITES = 200
META_ENTRIES = 12  # x 16 KiB of meta: a ~200 KB change batch per write
STUCK_EVENT_STREAMS = 4
#: what the state may grow by while the stuck readers exist: its own ring
#: and encodings (~30 MB), gRPC's and one change-log page per stuck reader
GROWTH_BOUND_MB = 50


def rss_mb(c: Cluster) -> float:
    popen = c.procs["state"].popen
    assert popen is not None
    return psutil.Process(popen.pid).memory_info().rss / 2**20


def metric_lines(c: Cluster) -> list[str]:
    with urllib.request.urlopen(f"http://{c.procs['state'].info['metrics']}/metrics") as r:
        body: bytes = r.read()
    return body.decode().splitlines()


def waiting_calls(c: Cluster) -> float:
    """The state's `corral_state_waiting_calls` gauge."""
    for line in metric_lines(c):
        if line.startswith("corral_state_waiting_calls "):
            return float(line.split()[1])
    raise AssertionError("corral_state_waiting_calls is not exported")


def streams_dropped(c: Cluster) -> float:
    """`corral_state_streams_dropped_total`, summed over its RPCs."""
    return sum(
        float(line.split()[-1])
        for line in metric_lines(c)
        if line.startswith("corral_state_streams_dropped_total{")
    )


async def ended_by_the_server(call: Any, timeout: float) -> grpc.aio.AioRpcError:
    """Read a stream to its end (within `timeout`): the status it ended with."""

    async def drain() -> grpc.aio.AioRpcError:
        try:
            async for _ in call:
                pass
        except grpc.aio.AioRpcError as exc:
            return exc
        raise AssertionError("the stream ended without a status")

    return await asyncio.wait_for(drain(), timeout)


async def test_a_stuck_subscriber_grows_nothing_and_is_dropped(
    make_cluster: Callable[..., Cluster],
) -> None:
    c = make_cluster()
    c.start("state", "--stream-stall-timeout", str(STALL_S), "--metrics-listen", "127.0.0.1:0")
    node = mock.node()
    async with transport.dial(c.state_addr) as ch:
        nodes = node_pb2_grpc.NodeStub(ch)
        events = event_pb2_grpc.EventStub(ch)
        first = await nodes.Register(node_pb2.NodeRegisterRequest(node=node))

        # readers that never read: event streams from the start of the log
        # (served from the change-log table, each with batches of its own),
        # and a replica's change-feed subscription
        stuck: list[Any] = [
            events.Stream(event_pb2.EventStreamRequest(from_index=1))
            for _ in range(STUCK_EVENT_STREAMS)
        ]
        stuck_feed = state_pb2_grpc.StateStub(ch).Subscribe(
            state_pb2.SubscribeRequest(from_index=first.index)
        )
        # and one that reads everything
        seen: list[int] = []
        reader = events.Stream(
            event_pb2.EventStreamRequest(
                from_index=first.index, topics=[event_pb2.EventTopic(topic="Node")]
            )
        )

        async def read() -> None:
            async for resp in reader:
                seen.extend(resp.index for e in resp.events if e.key == node.id)

        reading = asyncio.create_task(read())
        calls: list[Any] = [*stuck, stuck_feed, reader]
        for call in calls:
            await call.wait_for_connection()
        before = rss_mb(c)

        rng = random.Random(26)
        for i in range(WRITES):
            node.meta.clear()
            for k in range(META_ENTRIES):
                node.meta[f"blob{k}"] = rng.randbytes(8 * 1024).hex()  # 16 KiB, incompressible
            node.meta["write"] = str(i)
            await nodes.Register(node_pb2.NodeRegisterRequest(node=node))
        grown = rss_mb(c) - before
        assert grown < GROWTH_BOUND_MB, f"the state grew {grown:.0f} MB with stuck readers"

        # the reader that reads got every write, while the others were stuck
        await until(lambda: len(seen) >= WRITES, what="every write at the reading subscriber")
        # the stuck ones are dropped, each told where to resubscribe from.
        # Wait for the server to have dropped all of them before reading any:
        # reading a stream whose stall clock has not run out yet revives it
        # (on a loaded machine the writes can end within the stall timeout)
        await until(
            lambda: streams_dropped(c) >= len(stuck) + 1,
            timeout=STALL_S * 4 + 60,
            what="the stuck readers dropped by the state",
        )
        for call in (*stuck, stuck_feed):
            err = await ended_by_the_server(call, timeout=STALL_S * 4 + 30)
            assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, err
            assert "took nothing for 3 s; dropped. Resubscribe from index" in (
                err.details() or ""
            ), err.details()
        assert not reading.done()  # the reading subscriber goes on
        reading.cancel()
        with contextlib.suppress(asyncio.CancelledError, grpc.aio.AioRpcError):
            await reading
    assert "Traceback" not in c.log("state")


async def test_waiting_calls_are_bounded_per_connection(
    make_cluster: Callable[..., Cluster],
) -> None:
    """Blocking queries and streams one connection holds at once are
    bounded (`--max-waiting-per-connection`): one more is RESOURCE_EXHAUSTED
    at once, another connection is unaffected, and a freed slot is taken
    again. Client-alloc queries are bounded per node instead (a simulator
    carries thousands of nodes on one connection). Before, every one of
    them waited: a client could hold any number."""
    c = make_cluster()
    c.start("state", "--max-waiting-per-connection", "2", "--metrics-listen", "127.0.0.1:0")
    node = mock.node()
    # channels of one process share their connection unless told otherwise
    own = [("grpc.use_local_subchannel_pool", 1)]
    async with (
        transport.dial(c.state_addr) as ch,
        transport.dial(c.state_addr, options=own) as other,
    ):
        nodes = node_pb2_grpc.NodeStub(ch)
        index = (await nodes.Register(node_pb2.NodeRegisterRequest(node=node))).index
        blocking = node_pb2.NodeListRequest(query=query_pb2.QueryOptions(min_index=index))
        held = [asyncio.ensure_future(nodes.List(blocking)) for _ in range(2)]
        await until(lambda: waiting_calls(c) == 2, what="two blocking queries held")
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            await nodes.List(blocking)
        assert raised.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "at most 2 at once" in (raised.value.details() or "")
        # a stream is a waiting call too
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            async for _ in event_pb2_grpc.EventStub(ch).Stream(event_pb2.EventStreamRequest()):
                pass
        assert raised.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert not any(h.done() for h in held)  # the two held ones still wait
        # another connection has its own share
        elsewhere = asyncio.ensure_future(node_pb2_grpc.NodeStub(other).List(blocking))
        # a write answers every waiting query; the slots are free again
        node.meta["changed"] = "1"
        await nodes.Register(node_pb2.NodeRegisterRequest(node=node))
        for answered in await asyncio.gather(*held, elsewhere):
            assert answered.meta.index > index
        assert (await nodes.List(node_pb2.NodeListRequest())).nodes  # not blocking: no slot

        # client-alloc queries: at most 4 per node, whatever the connection
        allocs = node_pb2.NodeClientAllocsRequest(
            node_id=node.id, secret_id=node.secret_id, min_index=1_000_000, wait_ms=60_000
        )
        waiting = [asyncio.ensure_future(nodes.GetClientAllocs(allocs)) for _ in range(4)]
        await until(lambda: waiting_calls(c) == 4, what="four client-alloc queries held")
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            await nodes.GetClientAllocs(allocs)
        assert raised.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "this node already holds 4 waiting calls" in (raised.value.details() or "")
        assert not any(w.done() for w in waiting)
        for w in waiting:
            w.cancel()
