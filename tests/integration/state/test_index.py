"""The index: strictly increasing, gap-free, commit order equals index order."""

from __future__ import annotations

import asyncio
import threading

import psycopg
import pytest

from corral.v1 import structs_pb2 as pb
from services.state.db.database import Database
from tests.integration.state.helpers import pending_eval

WRITERS = 4
WRITES_PER_WRITER = 40


def _writer(dsn: str, out: list[int], errors: list[BaseException]) -> None:
    async def run() -> None:
        db = Database(dsn, pool_size=1)
        try:
            for _ in range(WRITES_PER_WRITER):
                async with db.write() as tx:
                    tx.put_eval(pending_eval())
                out.append(tx.index)
        finally:
            await db.close()

    try:
        asyncio.run(run())
    except BaseException as exc:  # surfaced by the test
        errors.append(exc)


def test_concurrent_writers_commit_in_index_order(fresh_pg_dsn: str) -> None:
    """Several writers race; a reader polling the change log must never see
    index N committed while an index below N is missing (what a sequence
    would allow), and every writer sees its own indexes strictly increase."""
    results: list[list[int]] = [[] for _ in range(WRITERS)]
    errors: list[BaseException] = []
    threads = [
        threading.Thread(target=_writer, args=(fresh_pg_dsn, results[i], errors))
        for i in range(WRITERS)
    ]
    gaps: list[tuple[int, int]] = []
    stop = threading.Event()

    def reader() -> None:
        with psycopg.connect(fresh_pg_dsn, autocommit=True) as conn:
            while not stop.is_set():
                row = conn.execute(
                    "SELECT count(*), coalesce(max(index), 0) FROM change_log"
                ).fetchone()
                assert row is not None
                count, top = int(row[0]), int(row[1])
                if count != top:
                    gaps.append((count, top))

    r = threading.Thread(target=reader)
    r.start()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    stop.set()
    r.join()

    assert not errors, errors
    assert not gaps, f"reader saw a gap in committed indexes: {gaps[:5]}"
    everything = sorted(i for res in results for i in res)
    assert everything == list(range(1, WRITERS * WRITES_PER_WRITER + 1))
    for res in results:
        assert res == sorted(res) and len(set(res)) == len(res)


async def test_group_commit_takes_consecutive_indexes(fresh_pg_dsn: str) -> None:
    db = Database(fresh_pg_dsn)
    try:
        async with db.write(count=3) as tx:
            for i in tx.indexes:
                tx.put_eval(pending_eval(), index=i)
        assert tx.indexes == [1, 2, 3]
        batches = await db.read_log(0)
        assert [b.index for b in batches] == [1, 2, 3]
        assert all(len(b.events) == 1 and b.events[0].index == b.index for b in batches)
    finally:
        await db.close()


async def test_failed_transaction_leaves_no_index_and_no_rows(fresh_pg_dsn: str) -> None:
    db = Database(fresh_pg_dsn)
    try:
        with pytest.raises(RuntimeError):
            async with db.write() as tx:
                tx.put_eval(pending_eval())
                raise RuntimeError("injected failure mid-transaction")
        assert await db.latest_index() == 0
        async with db.write() as tx:
            ev = pending_eval()
            tx.put_eval(ev)
        assert tx.index == 1
        async with db.write() as tx2:
            got = await tx2.get_eval(ev.id)
            assert got is not None and got.create_index == 1
            tx2.put_eval(pb.Evaluation(id=got.id, job_id="web", status="complete"))
        assert tx2.index == 2
    finally:
        await db.close()
