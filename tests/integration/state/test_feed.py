"""Snapshots, State.Subscribe and the replica against a real state service."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from corral.runtime.replica import Replica
from corral.security import transport
from corral.v1 import state_pb2, state_pb2_grpc
from services.state.app import StateApp
from tests.integration.state.helpers import pending_eval


async def _write_evals(app: StateApp, n: int, job_id: str = "web") -> list[int]:
    out = []
    for _ in range(n):
        async with app.db.write() as tx:
            tx.put_eval(pending_eval(job_id))
        out.append(tx.index)
    return out


async def _snapshot(stub: state_pb2_grpc.StateAsyncStub) -> tuple[int, int, dict[str, int]]:
    index, evals, tables = 0, 0, {}
    first = True
    async for chunk in stub.Snapshot(state_pb2.SnapshotRequest(chunk_size=7)):
        if first:
            index = chunk.index
            tables = {t.table: t.index for t in chunk.table_indexes}
            first = False
        evals += len(chunk.evals)
    return index, evals, tables


async def test_snapshot_is_consistent_while_writes_continue(
    state_app: StateApp, state_stub: state_pb2_grpc.StateAsyncStub
) -> None:
    await _write_evals(state_app, 20, "snap")
    writing = asyncio.create_task(_write_evals(state_app, 60, "snap"))
    seen = []
    while not writing.done():
        index, evals, tables = await _snapshot(state_stub)
        # every write adds exactly one eval, so a consistent dump at index i
        # holds exactly as many evals as writes up to i
        total_before = await _count_evals_at(state_app, index)
        assert evals == total_before, (index, evals, total_before)
        assert tables.get("evals", 0) <= index
        seen.append(index)
    await writing
    assert seen


async def _count_evals_at(app: StateApp, index: int) -> int:
    batches = await app.db.read_log(0, limit=100_000)
    return sum(1 for b in batches if b.index <= index for e in b.events if e.topic == "Evaluation")


async def test_subscribe_delivers_every_change_once_in_order_across_a_break(
    state_app: StateApp, state_addr: str
) -> None:
    start = state_app.feed.index
    received: list[int] = []
    channel = transport.dial(state_addr)
    stub = state_pb2_grpc.StateStub(channel)
    stream = stub.Subscribe(state_pb2.SubscribeRequest(from_index=start))
    writer = asyncio.create_task(_write_evals(state_app, 30, "sub"))
    async for batch in stream:
        received.append(batch.index)
        if len(received) == 10:
            break
    stream.cancel()
    await channel.close()  # forced break

    channel = transport.dial(state_addr)
    stub = state_pb2_grpc.StateStub(channel)
    written = await writer
    async for batch in stub.Subscribe(state_pb2.SubscribeRequest(from_index=received[-1])):
        received.append(batch.index)
        if batch.index >= written[-1]:
            break
    await channel.close()
    assert received == list(range(start + 1, written[-1] + 1))


async def test_subscribe_too_far_behind_is_out_of_range(
    state_app: StateApp, state_addr: str
) -> None:
    await _write_evals(state_app, 5, "trunc")
    await state_app.truncate_change_log(keep=2)
    async with transport.dial(state_addr) as channel:
        stub = state_pb2_grpc.StateStub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as err:
            async for _ in stub.Subscribe(state_pb2.SubscribeRequest(from_index=0)):
                pass
        assert err.value.code() == grpc.StatusCode.OUT_OF_RANGE
        assert "re-bootstrap" in (err.value.details() or "")


async def test_replica_follows_and_rebootstraps(state_app: StateApp, state_addr: str) -> None:
    replica = Replica(state_addr, name="test")
    await replica.start()
    try:
        assert replica.index == state_app.feed.index
        before = replica.snapshot()
        written = await _write_evals(state_app, 3, "replica")
        snap = await replica.wait_for_index(written[-1], timeout=10)
        assert snap.index >= written[-1]
        assert (
            len(snap.evals_by_job("default", "replica"))
            == len(before.evals_by_job("default", "replica")) + 3
        )
        # the snapshot taken before the writes does not see them
        assert before.index < written[0]
        assert all(e.create_index < written[0] for e in before.evals.values())

        # waiting for an index that never comes times out cleanly
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        with pytest.raises(TimeoutError):
            await replica.wait_for_index(replica.index + 1000, timeout=0.3)
        assert loop.time() - t0 >= 0.3

        # returns as soon as the index arrives, without polling
        target = replica.index + 1
        waiter = asyncio.create_task(replica.wait_for_index(target, timeout=30))
        await asyncio.sleep(0.05)
        assert not waiter.done()
        await _write_evals(state_app, 1, "replica")
        snap = await asyncio.wait_for(waiter, 10)
        assert snap.index >= target
    finally:
        await replica.stop()


async def test_replica_resumes_after_state_restart(pg_dsn: str) -> None:
    from services.state.app import StateSettings

    app = StateApp(StateSettings(dsn=pg_dsn, listen="127.0.0.1:0"))
    address = await app.start()
    replica = Replica(address, name="restart", reconnect_backoff=0.05)
    await replica.start()
    try:
        async with app.db.write() as tx:
            tx.put_eval(pending_eval("restart"))
        await replica.wait_for_index(tx.index, 10)
        bootstraps = replica.bootstraps
        await app.stop()
        app = StateApp(StateSettings(dsn=pg_dsn, listen=address))
        await app.start()
        async with app.db.write() as tx:
            tx.put_eval(pending_eval("restart"))
        snap = await replica.wait_for_index(tx.index, 15)
        assert len(snap.evals_by_job("default", "restart")) >= 2
        assert replica.bootstraps == bootstraps  # resumed from its index, no reload
    finally:
        await replica.stop()
        await app.stop()


@pytest.mark.parametrize("ring_bytes", [0, 2048])
async def test_ring_is_bounded_by_bytes_and_older_batches_come_from_the_log(
    pg_dsn: str, ring_bytes: int
) -> None:
    """The in-memory ring keeps at most `feed_ring_bytes` of serialized
    batches (and always the newest one); a subscriber starting before it is
    served every index from the change-log table, once and in order."""
    from services.state.app import StateSettings

    app = StateApp(StateSettings(dsn=pg_dsn, retention_interval=3600, feed_ring_bytes=ring_bytes))
    address = await app.start()
    try:
        start = app.feed.index
        written = await _write_evals(app, 40, f"ring-{ring_bytes}")
        held, size = app.feed.ring_stats
        assert 1 <= held < 40
        assert held == 1 or size <= ring_bytes
        received: list[int] = []
        async with transport.dial(address) as channel:
            stub = state_pb2_grpc.StateStub(channel)
            async for batch in stub.Subscribe(state_pb2.SubscribeRequest(from_index=start)):
                received.append(batch.index)
                if batch.index >= written[-1]:
                    break
        assert received == list(range(start + 1, written[-1] + 1))
    finally:
        await app.stop()
