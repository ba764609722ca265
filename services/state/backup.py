"""The operator snapshot on the database side: save every table of the
state in one consistent read, and replace them all from a saved archive in
one transaction (Nomad's `operator snapshot save` / `restore`).

Save reads every table of the schema (the models' metadata, less what is
not state: the change log, the counter, the members and the federation's
joined regions) in one REPEATABLE READ READ ONLY transaction, with
PostgreSQL's binary COPY: exact for every column type, streamed to files,
and needing no PostgreSQL client tools on the state's machine. The counter
read in that transaction is the snapshot's index (a writer holds the
counter row until it commits, services/state/db/snapshot.py).

Restore takes the counter's row lock first, so no write interleaves, moves
the index above both the snapshot's and the cluster's, deletes every row
and copies the archive's in, sets every table's index to the new one (a
blocking query of the old state wakes), and replaces the change log with a
single `reset` batch at that index: each state process's feed reloads when
it reads it, and every subscriber of the feed is ended with OUT_OF_RANGE
(services/state/feed.py), which makes replicas and event streams start over
from a snapshot. The archive format is corral/domain/snapshot_archive.py.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import hashlib
import json
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql
from sqlalchemy import Table

from corral.domain import snapshot_archive as archive
from corral.domain.errors import FailedPrecondition, InvalidArgument
from corral.domain.structs import now_ns
from corral.security import keyring as kr
from corral.v1 import structs_pb2 as pb
from services.state.db import models as m
from services.state.db.database import NOTIFY_CHANNEL, Database
from services.state.keyring import NO_KEK, Keyring

#: tables of the schema that are not state: the change log and the counter
#: (a restore writes its own), the processes and joined regions (membership)
NOT_STATE = frozenset({"change_log", "index_counter", "members", "federation_regions"})


def state_tables() -> list[Table]:
    """Every table a snapshot holds, in dependency order."""
    return [t for t in m.Base.metadata.sorted_tables if t.name not in NOT_STATE]


def _copy(table: Table, direction: str) -> sql.Composed:
    columns = sql.SQL(", ").join(sql.Identifier(c.name) for c in table.columns)
    return sql.SQL("COPY {} ({}) {} (FORMAT binary)").format(
        sql.Identifier(table.name), columns, sql.SQL(direction)
    )


async def save(db: Database, keyring: Keyring, region: str, workdir: Path) -> archive.Meta:
    """Dump the state into `workdir` (one file per table, and the keyring),
    then write `workdir/snapshot.tar.gz`; returns its metadata."""
    parts: dict[str, Path] = {}
    async with db.read(repeatable=True) as conn:
        cur = await conn.execute("SELECT value FROM index_counter WHERE id = 1")
        row = await cur.fetchone()
        cur = await conn.execute("SELECT version_num FROM alembic_version")
        rev = await cur.fetchone()
        meta = archive.Meta(
            schema_revision=str(rev[0]) if rev else "",
            index=int(row[0]) if row else 0,
            region=region,
            created=dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        )
        for table in state_tables():
            member = archive.table_member(table.name)
            path = workdir / f"{table.name}.bin"
            digest = hashlib.sha256()
            size = 0
            async with conn.cursor() as tcur:
                async with tcur.copy(_copy(table, "TO STDOUT")) as copy:
                    with path.open("wb") as f:
                        async for data in copy:
                            f.write(data)
                            digest.update(data)
                            size += len(data)
                rows = tcur.rowcount
            meta.tables.append(
                archive.TablePart(
                    name=table.name,
                    columns=[c.name for c in table.columns],
                    rows=max(rows, 0),
                    size=size,
                    sha256=digest.hexdigest(),
                )
            )
            parts[member] = path
        if keyring.configured:
            cur = await conn.execute("SELECT key_id FROM root_keys ORDER BY key_id")
            keys = {
                str(r[0]): (await keyring.material(str(r[0]), conn)).exported()
                for r in await cur.fetchall()
            }
            path = workdir / archive.KEYRING
            path.write_bytes(json.dumps(keys, sort_keys=True).encode())
            meta.keyring_sha256 = archive.sha256_file(path)
            parts[archive.KEYRING] = path
    with (workdir / "snapshot.tar.gz").open("wb") as out:
        await asyncio.to_thread(archive.write, out, meta, parts)
    return meta


async def restore(
    db: Database, keyring: Keyring, path: Path, workdir: Path, max_unpacked: int
) -> tuple[int, archive.Meta]:
    """Replace the state with the archive at `path`; returns the index the
    restore committed at and the archive's metadata. Everything is checked
    before the transaction starts; any failure leaves the state unchanged."""
    try:
        ex = await asyncio.to_thread(archive.extract, path, workdir / "unpacked", max_unpacked)
    except archive.ArchiveError as exc:
        raise InvalidArgument("snapshot", str(exc)) from None
    meta = ex.meta
    current = await db.schema_revision()
    if meta.schema_revision != current:
        raise FailedPrecondition(
            f"the snapshot was taken at schema revision {meta.schema_revision!r}; this "
            f"cluster's state is at {current!r}: restore it into a Corral of the same version"
        )
    tables = state_tables()
    ours = {t.name: [c.name for c in t.columns] for t in tables}
    if {t.name: t.columns for t in meta.tables} != ours:
        raise FailedPrecondition("the snapshot's tables do not match this cluster's schema")
    wrapped = await _rewrapped(ex, keyring) if ex.has_keyring else []
    async with db.transaction() as conn:
        cur = await conn.execute(
            "UPDATE index_counter SET value = greatest(value, %s) + 1 WHERE id = 1 RETURNING value",
            (meta.index,),
        )
        row = await cur.fetchone()
        assert row is not None, "index_counter row missing: run the migrations"
        index = int(row[0])
        for table in reversed(tables):
            await conn.execute(sql.SQL("DELETE FROM {}").format(sql.Identifier(table.name)))
        for table in tables:
            await _copy_in(conn, table, ex, meta)
        for key_id, kek_id, wrapped_key, wrapped_rsa in wrapped:
            await conn.execute(
                "UPDATE root_keys SET kek_id = %s, wrapped_key = %s, wrapped_rsa_key = %s "
                "WHERE key_id = %s",
                (kek_id, wrapped_key, wrapped_rsa, key_id),
            )
        await conn.execute("UPDATE table_indexes SET index = %s", (index,))
        await conn.execute("DELETE FROM change_log")
        batch = pb.ChangeBatch(index=index, time=now_ns(), reset=True)
        await conn.execute(
            "INSERT INTO change_log (index, payload) VALUES (%s, %s)",
            (index, batch.SerializeToString()),
        )
        await conn.execute("SELECT pg_notify(%s, %s)", (NOTIFY_CHANNEL, str(index)))
    if db.on_commit is not None:
        db.on_commit([batch])
    return index, meta


async def _copy_in(
    conn: psycopg.AsyncConnection[Any], table: Table, ex: archive.Extracted, meta: archive.Meta
) -> None:
    part = meta.table(table.name)
    assert part is not None  # the table sets were compared
    async with conn.cursor() as cur:
        async with cur.copy(_copy(table, "FROM STDIN")) as copy:
            for chunk in archive.chunks(ex.part(archive.table_member(table.name))):
                await copy.write(chunk)
        if cur.rowcount >= 0 and cur.rowcount != part.rows:
            raise InvalidArgument(
                "snapshot", f"table {table.name} holds {cur.rowcount} rows, not {part.rows}"
            )


Rewrapped = tuple[str, str, bytes, bytes]


async def _rewrapped(ex: archive.Extracted, keyring: Keyring) -> list[Rewrapped]:
    """The archive's root keys wrapped with this cluster's KEK."""
    if not keyring.configured:
        raise FailedPrecondition(f"the snapshot holds a keyring, but {NO_KEK}")
    kek = keyring.kek
    try:
        keys = json.loads(ex.part(archive.KEYRING).read_bytes())
        if not isinstance(keys, dict):
            raise ValueError("not an object")

        def wrap_all() -> list[Rewrapped]:
            out = []
            for key_id, exported in keys.items():
                material = kr.RootKeyMaterial.imported(str(key_id), exported)
                wrapped_key, wrapped_rsa = material.wrapped(kek)
                out.append((material.key_id, kek.kek_id, wrapped_key, wrapped_rsa))
            return out

        return await asyncio.to_thread(wrap_all)
    except (ValueError, kr.KeyringError) as exc:
        raise InvalidArgument("snapshot", f"its keyring is unreadable ({exc})") from None
