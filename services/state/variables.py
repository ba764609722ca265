"""Variables as stored (`variables` table): rows, reads, and turning a row
into what a caller may see (metadata, or items decrypted by the keyring).

Variables are not part of the in-memory state (no scheduler needs them,
and the items are ciphertext the replicas could not read anyway): every
read goes to the table, and every write's change-log event (topic
`Variable`, metadata only) stamps the `variables` table index the feed's
snapshot keeps, which is what blocking queries wait on.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg

from corral.domain.errors import FailedPrecondition
from corral.security import keyring as kr
from corral.v1 import structs_pb2 as pb
from services.state.db.database import Database
from services.state.keyring import Keyring

TABLE = "variables"
COLUMNS = (
    "namespace, path, key_id, data, create_index, modify_index, create_time, modify_time, "
    "lock_id, lock_ttl, lock_delay, lock_expires"
)
#: list reads fetch this many rows at a time while filtering them by ACL
LIST_CHUNK = 500


@dataclass(frozen=True)
class StoredVariable:
    namespace: str
    path: str
    key_id: str
    data: bytes
    create_index: int
    modify_index: int
    create_time: int
    modify_time: int
    lock_id: str | None = None
    lock_ttl: int = 0
    lock_delay: int = 0
    lock_expires: datetime | None = None

    @classmethod
    def from_row(cls, row: Sequence[Any]) -> StoredVariable:
        return cls(
            namespace=row[0],
            path=row[1],
            key_id=row[2],
            data=bytes(row[3]),
            create_index=int(row[4]),
            modify_index=int(row[5]),
            create_time=int(row[6]),
            modify_time=int(row[7]),
            lock_id=row[8],
            lock_ttl=int(row[9]),
            lock_delay=int(row[10]),
            lock_expires=row[11],
        )

    def lock(self) -> pb.VariableLock | None:
        if not self.lock_id:
            return None
        return pb.VariableLock(id=self.lock_id, ttl=self.lock_ttl, lock_delay=self.lock_delay)

    def metadata(self, *, with_lock: bool) -> pb.VariableMetadata:
        meta = pb.VariableMetadata(
            namespace=self.namespace,
            path=self.path,
            create_index=self.create_index,
            modify_index=self.modify_index,
            create_time=self.create_time,
            modify_time=self.modify_time,
        )
        lock = self.lock()
        if with_lock and lock is not None:
            meta.lock.CopyFrom(lock)
        return meta


def encode_items(items: dict[str, str] | Any) -> bytes:
    """What is encrypted: the items as JSON (Nomad encrypts the same)."""
    return json.dumps(dict(items), separators=(",", ":"), sort_keys=True).encode()


async def decrypt_items(keyring: Keyring, var: StoredVariable) -> dict[str, str]:
    material = await keyring.material(var.key_id)
    try:
        clear = material.decrypt(var.data, kr.variable_context(var.namespace, var.path))
    except kr.KeyringError as exc:
        raise FailedPrecondition(f"variable {var.path!r} cannot be decrypted: {exc}") from None
    items = json.loads(clear)
    if items is None:  # a lock variable acquired without items
        return {}
    return {str(k): str(v) for k, v in items.items()}


async def decrypted(keyring: Keyring, var: StoredVariable, *, with_lock: bool) -> pb.Variable:
    out = pb.Variable(metadata=var.metadata(with_lock=with_lock))
    out.items.update(await decrypt_items(keyring, var))
    return out


async def get(
    source: Database | psycopg.AsyncConnection[Any], namespace: str, path: str
) -> StoredVariable | None:
    """One variable (through a transaction's connection, or the pool)."""
    sql = f"SELECT {COLUMNS} FROM variables WHERE namespace = %s AND path = %s"
    if isinstance(source, Database):
        async with source.read() as conn:
            cur = await conn.execute(sql, (namespace, path))
            row = await cur.fetchone()
    else:
        cur = await source.execute(sql, (namespace, path))
        row = await cur.fetchone()
    return StoredVariable.from_row(row) if row else None


async def scan(
    db: Database,
    namespace: str,
    prefix: str,
    after: tuple[str, str] | None,
    limit: int,
    *,
    inclusive: bool = True,
) -> list[StoredVariable]:
    """Up to `limit` variables in (namespace, path) order (byte order) from
    `after`, of `namespace` ("*" = all) whose path starts with `prefix`.
    Metadata only: `data` is not read."""
    op = ">=" if inclusive else ">"
    like = prefix.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
    start_ns, start_path = after if after is not None else ("", "")
    async with db.read() as conn:
        cur = await conn.execute(
            "SELECT namespace, path, key_id, ''::bytea, create_index, modify_index, create_time, "
            "modify_time, lock_id, lock_ttl, lock_delay, lock_expires FROM variables "
            "WHERE (%s = '*' OR namespace = %s) AND path LIKE %s "
            f'AND (namespace COLLATE "C", path COLLATE "C") {op} (%s, %s) '
            'ORDER BY namespace COLLATE "C", path COLLATE "C" LIMIT %s',
            (namespace, namespace, like, start_ns, start_path, limit),
        )
        return [StoredVariable.from_row(r) for r in await cur.fetchall()]


async def any_in_namespace(conn: psycopg.AsyncConnection[Any], namespace: str) -> bool:
    """Whether a namespace still holds variables (a namespace with some
    cannot be deleted, as in Nomad)."""
    cur = await conn.execute("SELECT 1 FROM variables WHERE namespace = %s LIMIT 1", (namespace,))
    return await cur.fetchone() is not None
