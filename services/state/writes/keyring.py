"""Keyring writes (Nomad's Keyring.Rotate/Update/Delete and the state
store's root-key transitions), each in an indexed write transaction deciding
on the `root_keys` rows it reads.

Root keys are not in the in-memory state (no scheduler needs them): these
write their table with SQL of their own and record one change-log event per
key (topic `RootKey`, key only), which stamps the `root_keys` table index
and tells every state process's keyring to look again.

A key's life (Nomad's): `active` (encrypts new variables, signs new
identities) → `inactive` when another is rotated in, still decrypting and
verifying what it made; with a full rotation `rekeying` until the state
leader has re-encrypted its variables, then `inactive`. A `prepublished`
key is in the JWKS before the state leader activates it at its publish time.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

from corral.domain import topics
from corral.domain.errors import FailedPrecondition, InvalidArgument, NotFound
from corral.domain.topics import EventType
from corral.security import keyring as kr
from corral.v1 import structs_pb2 as pb
from services.state.db.database import WriteTx

#: the columns `meta_from_row` reads
META_COLUMNS = "key_id, algorithm, state, create_time, publish_time, create_index, modify_index"


def new_material() -> kr.RootKeyMaterial:
    """A fresh root key (an RSA key takes tens of ms: make it before the
    transaction, not under the index lock)."""
    return kr.RootKeyMaterial.generate(str(uuid.uuid4()))


def meta_from_row(row: Sequence[Any]) -> pb.RootKeyMeta:
    """A RootKeyMeta from the `META_COLUMNS` of a row."""
    return pb.RootKeyMeta(
        key_id=row[0],
        algorithm=row[1],
        state=row[2],
        create_time=int(row[3]),
        publish_time=int(row[4]),
        create_index=int(row[5]),
        modify_index=int(row[6]),
    )


async def keys(tx: WriteTx) -> list[pb.RootKeyMeta]:
    cur = await tx.conn.execute(
        f"SELECT {META_COLUMNS} FROM root_keys ORDER BY create_index, key_id"
    )
    return [meta_from_row(r) for r in await cur.fetchall()]


async def insert(
    tx: WriteTx,
    material: kr.RootKeyMaterial,
    kek: kr.KeyEncryptionKey,
    *,
    state: str,
    publish_time: int = 0,
) -> pb.RootKeyMeta:
    wrapped, wrapped_rsa = material.wrapped(kek)
    meta = pb.RootKeyMeta(
        key_id=material.key_id,
        algorithm=kr.ALGORITHM_AES256_GCM,
        state=state,
        create_time=tx.now,
        publish_time=publish_time,
        create_index=tx.index,
        modify_index=tx.index,
    )
    await tx.conn.execute(
        "INSERT INTO root_keys (key_id, algorithm, state, create_time, publish_time, "
        "create_index, modify_index, kek_id, wrapped_key, wrapped_rsa_key, public_key) "
        "VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)",
        (
            meta.key_id,
            meta.algorithm,
            meta.state,
            meta.create_time,
            meta.publish_time,
            meta.create_index,
            meta.modify_index,
            kek.kek_id,
            wrapped,
            wrapped_rsa,
            material.public_key_der(),
        ),
    )
    tx.record(topics.ROOT_KEY.event(meta.key_id, EventType.ROOT_KEY_UPSERTED))
    return meta


async def set_state(tx: WriteTx, key_id: str, state: str, *, publish_time: int = 0) -> None:
    await tx.conn.execute(
        "UPDATE root_keys SET state = %s, publish_time = %s, modify_index = %s WHERE key_id = %s",
        (state, publish_time, tx.index, key_id),
    )
    tx.record(topics.ROOT_KEY.event(key_id, EventType.ROOT_KEY_UPSERTED))


async def initialize(
    tx: WriteTx, kek: kr.KeyEncryptionKey, material: kr.RootKeyMaterial | None = None
) -> kr.RootKeyMaterial | None:
    """The keyring's first key (Nomad's initializeKeyring), when the table
    is empty; None when it already has keys."""
    cur = await tx.conn.execute("SELECT 1 FROM root_keys LIMIT 1")
    if await cur.fetchone() is not None:
        return None
    material = material or new_material()
    await insert(tx, material, kek, state=kr.STATE_ACTIVE)
    return material


async def rotate(
    tx: WriteTx,
    material: kr.RootKeyMaterial,
    kek: kr.KeyEncryptionKey,
    *,
    full: bool,
    publish_time: int,
) -> pb.RootKeyMeta:
    """Add `material` as the new active key (or prepublished until
    `publish_time`). The key it replaces becomes inactive, or rekeying
    with `full` (then inactive keys too, so every variable ends up under
    the new key, as Nomad's UpsertRootKey with rekey)."""
    if full and publish_time:
        raise InvalidArgument(
            "publish_time", "a key cannot be prepublished and full rotated at the same time"
        )
    if publish_time and publish_time <= tx.now:
        raise InvalidArgument("publish_time", "must be in the future")
    if publish_time:
        return await insert(
            tx, material, kek, state=kr.STATE_PREPUBLISHED, publish_time=publish_time
        )
    await _retire_others(tx, rekey=full)
    return await insert(tx, material, kek, state=kr.STATE_ACTIVE)


async def _retire_others(tx: WriteTx, *, rekey: bool) -> None:
    for key in await keys(tx):
        if key.state == kr.STATE_ACTIVE:
            await set_state(tx, key.key_id, kr.STATE_REKEYING if rekey else kr.STATE_INACTIVE)
        elif key.state == kr.STATE_INACTIVE and rekey:
            await set_state(tx, key.key_id, kr.STATE_REKEYING)


async def activate_due(tx: WriteTx) -> pb.RootKeyMeta | None:
    """Activate the prepublished key whose publish time came first, if it
    has come (the old active key becomes inactive)."""
    due = [
        k for k in await keys(tx) if k.state == kr.STATE_PREPUBLISHED and k.publish_time <= tx.now
    ]
    if not due:
        return None
    key = min(due, key=lambda k: (k.publish_time, k.create_index))
    await _retire_others(tx, rekey=False)
    await set_state(tx, key.key_id, kr.STATE_ACTIVE)
    key.state, key.publish_time, key.modify_index = kr.STATE_ACTIVE, 0, tx.index
    return key


async def delete(tx: WriteTx, key_id: str, *, force: bool) -> None:
    """Delete a key that is not active (Nomad's Keyring.Delete); refused
    while variables are encrypted with it, unless `force`."""
    if not key_id:
        raise InvalidArgument("key_id", "root key ID is required")
    cur = await tx.conn.execute("SELECT state FROM root_keys WHERE key_id = %s", (key_id,))
    row = await cur.fetchone()
    if row is None:
        raise NotFound(f"root key {key_id!r} not found")
    if row[0] in (kr.STATE_ACTIVE, kr.STATE_PREPUBLISHED):
        raise FailedPrecondition(f"{row[0]} root key cannot be deleted - call rotate first")
    cur = await tx.conn.execute("SELECT 1 FROM variables WHERE key_id = %s LIMIT 1", (key_id,))
    if await cur.fetchone() is not None and not force:
        raise FailedPrecondition("root key in use, cannot delete (variables are encrypted with it)")
    await tx.conn.execute("DELETE FROM root_keys WHERE key_id = %s", (key_id,))
    tx.record(topics.ROOT_KEY.event(key_id, EventType.ROOT_KEY_DELETED, deleted=True))
