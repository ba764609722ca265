"""The write batcher: concurrent node writes share transactions, a call that
fails before writing fails alone, one that fails half-way rolls its whole
batch back."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest

from corral.domain.errors import NotFound
from corral.testing import mock
from corral.v1 import structs_pb2 as pb
from services.state.db.database import Database, WriteTx
from services.state.writes.batch import WriteBatcher


def _put(node: pb.Node) -> Callable[[WriteTx], Awaitable[str]]:
    async def op(tx: WriteTx) -> str:
        tx.put_node(node)
        return node.id

    return op


async def test_concurrent_calls_share_transactions(fresh_pg_dsn: str) -> None:
    db = Database(fresh_pg_dsn)
    batcher = WriteBatcher(db, max_batch=64)
    try:
        nodes = [mock.node() for _ in range(200)]
        done = await asyncio.gather(*(batcher.submit(_put(n)) for n in nodes))
        assert [d.value for d in done] == [n.id for n in nodes]
        assert batcher.ops == 200
        # the first call commits alone, the rest queue behind it in batches
        assert batcher.batches < 200
        assert batcher.batches >= 200 // 64
        indexes = {d.index for d in done}
        assert len(indexes) == batcher.batches
        assert await db.latest_index() == max(indexes)
        for n in nodes:
            stored = await db.get_node(n.id)
            assert stored is not None
            assert stored.modify_index in indexes
    finally:
        await db.close()


async def test_failure_before_writing_fails_alone(fresh_pg_dsn: str) -> None:
    db = Database(fresh_pg_dsn)
    batcher = WriteBatcher(db)
    try:
        good = [mock.node() for _ in range(5)]

        async def missing(tx: WriteTx) -> None:
            if await tx.get_node("no-such-node") is None:
                raise NotFound("node no-such-node not found")

        calls: list[Awaitable[object]] = [batcher.submit(_put(n)) for n in good]
        calls.insert(2, batcher.submit(missing))
        results = await asyncio.gather(*calls, return_exceptions=True)
        assert isinstance(results[2], NotFound)
        assert all(not isinstance(r, BaseException) for i, r in enumerate(results) if i != 2)
        for n in good:
            assert await db.get_node(n.id) is not None
    finally:
        await db.close()


async def test_failure_after_writing_rolls_back_the_batch(fresh_pg_dsn: str) -> None:
    db = Database(fresh_pg_dsn)
    batcher = WriteBatcher(db)
    try:
        before = await db.latest_index()
        blocker = asyncio.Event()
        holding = asyncio.Event()

        async def first(tx: WriteTx) -> None:
            holding.set()
            await blocker.wait()  # hold the first batch so the rest queue up

        async def half_done(tx: WriteTx) -> None:
            tx.put_node(mock.node())
            raise RuntimeError("failed after writing")

        a = [mock.node() for _ in range(3)]
        holder = asyncio.ensure_future(batcher.submit(first))
        await asyncio.wait_for(holding.wait(), 10)
        calls: list[Awaitable[object]] = [batcher.submit(_put(a[0])), batcher.submit(half_done)]
        calls.append(batcher.submit(_put(a[1])))
        gathered = asyncio.gather(*calls, return_exceptions=True)
        blocker.set()
        await holder
        results = await gathered
        assert all(isinstance(r, RuntimeError) for r in results)
        for n in a[:2]:
            assert await db.get_node(n.id) is None
        # the holder's batch changed nothing and the other was rolled back:
        # neither consumed an index
        assert await db.latest_index() == before
        # the batcher keeps working after a rolled-back batch
        done = await batcher.submit(_put(a[2]))
        assert done.index == before + 1
    finally:
        await db.close()


@pytest.mark.parametrize("max_batch", [1])
async def test_batch_of_one_is_a_plain_write(fresh_pg_dsn: str, max_batch: int) -> None:
    db = Database(fresh_pg_dsn)
    batcher = WriteBatcher(db, max_batch=max_batch)
    try:
        done = await asyncio.gather(*(batcher.submit(_put(mock.node())) for _ in range(4)))
        assert len({d.index for d in done}) == 4
    finally:
        await db.close()
