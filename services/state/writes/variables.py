"""Variable writes (Nomad's Variables.Apply and the state store's VarSet,
VarSetCAS, VarDelete, VarDeleteCAS, VarLockAcquire, VarLockRelease), each
in an indexed write transaction deciding on the row it reads in it.

Items are encrypted with the keyring's active key (read in the same
transaction) before they reach the table; the change-log event carries
metadata only, never items, and never a lock's id (whoever may list a path
sees its events; the id is the holder's proof).

A conflict is an answer, not an error (Nomad's VarOpResultConflict): a
check-and-set index that does not match, a variable locked by someone
else. Nothing is written then, and no index is taken.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from datetime import datetime

from corral.domain import topics
from corral.domain.errors import FailedPrecondition, InvalidArgument, NotFound
from corral.domain.topics import EventType
from corral.domain.variables import (
    DEFAULT_LOCK_DELAY,
    DEFAULT_LOCK_TTL,
    MAX_LOCK_TTL,
    MAX_VARIABLE_SIZE,
    MIN_LOCK_TTL,
    SECOND,
    items_size,
    path_problem,
)
from corral.security import keyring as kr
from corral.v1 import structs_pb2 as pb
from corral.v1 import variables_pb2
from services.state import validate
from services.state.db.database import Database, WriteTx
from services.state.keyring import Keyring
from services.state.variables import StoredVariable, encode_items, get
from services.state.writes import keyring as key_writes

OP_SET = "set"
OP_CAS = "cas"
OP_DELETE = "delete"
OP_DELETE_CAS = "delete-cas"
OP_LOCK_ACQUIRE = "lock-acquire"
OP_LOCK_RELEASE = "lock-release"
OPS = (OP_SET, OP_CAS, OP_DELETE, OP_DELETE_CAS, OP_LOCK_ACQUIRE, OP_LOCK_RELEASE)

RESULT_OK = "ok"
RESULT_CONFLICT = "conflict"
RESULT_REDACTED = "conflict-redacted"

MAX_LOCK_DELAY = 24 * 3600 * SECOND
MAX_LOCK_ID = 64
#: a lock not renewed within this many TTLs is lost (Nomad's grace)
LOCK_GRACE_FACTOR = 2

LOCKED = "attempting to modify locked variable"
NO_LOCK = "variable doesn't hold a lock"
NO_VARIABLE = "variable doesn't exist"


def check_path(path: str, field_: str = "path") -> None:
    problem = path_problem(path)
    if problem is not None:
        raise InvalidArgument(field_, problem)


@dataclass(frozen=True)
class Request:
    """A validated Variables.Apply request."""

    op: str
    namespace: str
    path: str
    items: dict[str, str] = field(default_factory=dict)
    modify_index: int = 0
    lock_id: str = ""
    lock_ttl: int = 0
    lock_delay: int = 0


def validate_apply(req: variables_pb2.VariablesApplyRequest) -> Request:
    """Every field of an Apply checked before any transaction (Nomad's
    canonicalizeAndValidate); the first problem names its field."""
    validate.one_of(req.op, OPS, "op")
    namespace = req.namespace or "default"
    if namespace == "*":
        raise InvalidArgument("namespace", 'can not target wildcard ("*") namespace')
    validate.namespace(namespace, "namespace")
    meta = req.variable.metadata
    if meta.namespace and meta.namespace != namespace:
        raise InvalidArgument(
            "variable.metadata.namespace",
            f"{meta.namespace!r} differs from the request's namespace {namespace!r}",
        )
    check_path(meta.path, "variable.metadata.path")
    items = dict(req.variable.items)
    lock = meta.lock if meta.HasField("lock") else None
    lock_id = lock.id if lock is not None else ""
    if len(lock_id) > MAX_LOCK_ID or "\x00" in lock_id:
        raise InvalidArgument("variable.metadata.lock.id", f"at most {MAX_LOCK_ID} characters")
    size = items_size(items)
    if size > MAX_VARIABLE_SIZE:
        raise InvalidArgument("variable.items", "variables are limited to 64KiB in total size")
    ttl = delay = 0
    if req.op in (OP_SET, OP_CAS):
        if not items:
            raise InvalidArgument("variable.items", "empty variables are invalid")
        if lock is not None and (lock.ttl or lock.lock_delay):
            raise InvalidArgument(
                "variable.metadata.lock", "variable should not contain lock definition"
            )
    elif req.op == OP_LOCK_ACQUIRE:
        ttl = lock.ttl if lock is not None and lock.ttl else DEFAULT_LOCK_TTL
        delay = lock.lock_delay if lock is not None and lock.lock_delay else DEFAULT_LOCK_DELAY
        if ttl < 0 or delay < 0:
            raise InvalidArgument("variable.metadata.lock", "Lock delay and TTL must be positive")
        if not MIN_LOCK_TTL <= ttl <= MAX_LOCK_TTL:
            raise InvalidArgument(
                "variable.metadata.lock.ttl", "TTL must be between 10 seconds and 24 hours"
            )
        if delay > MAX_LOCK_DELAY:
            raise InvalidArgument("variable.metadata.lock.lock_delay", "must be at most 24 hours")
    elif req.op == OP_LOCK_RELEASE:
        if not lock_id:
            raise InvalidArgument("variable.metadata.lock.id", "missing lock information")
        if items:
            raise InvalidArgument(
                "variable.items", "lock release operation doesn't take variable items"
            )
    return Request(
        op=req.op,
        namespace=namespace,
        path=meta.path,
        items=items,
        modify_index=meta.modify_index,
        lock_id=lock_id,
        lock_ttl=ttl,
        lock_delay=delay,
    )


@dataclass(frozen=True)
class Outcome:
    """What an Apply did: `written` is the variable as written (None after a
    delete or a conflict); on a conflict, `conflict` is the current
    variable's metadata (namespace and path only when there is none, or
    when it is locked by someone else, as Nomad's zero value) and
    `current` the stored variable whose items a reader may see."""

    result: str
    written: StoredVariable | None = None
    conflict: pb.VariableMetadata | None = None
    current: StoredVariable | None = None


def _zero(r: Request, *, lock: bool = False) -> Outcome:
    meta = pb.VariableMetadata(namespace=r.namespace, path=r.path)
    if lock:
        meta.lock.SetInParent()  # Nomad's release conflict shows an empty lock
    return Outcome(RESULT_CONFLICT, conflict=meta)


def _against(cur: StoredVariable) -> Outcome:
    return Outcome(RESULT_CONFLICT, conflict=cur.metadata(with_lock=False), current=cur)


def _cas_conflict(r: Request, cur: StoredVariable | None) -> Outcome | None:
    """Nomad's varSetCASTxn / svDeleteCASTxn checks (index 0 = only if it
    does not exist)."""
    if cur is None:
        return None if r.modify_index == 0 else _zero(r)
    if r.modify_index == 0 or r.modify_index != cur.modify_index:
        return _against(cur)
    return None


async def apply(tx: WriteTx, keyring: Keyring, r: Request) -> Outcome:
    if r.op in (OP_SET, OP_CAS, OP_LOCK_ACQUIRE) and await tx.get_namespace(r.namespace) is None:
        raise InvalidArgument("namespace", f"nonexistent namespace {r.namespace!r}")
    cur = await get(tx.conn, r.namespace, r.path)
    if r.op in (OP_SET, OP_CAS):
        if r.op == OP_CAS:
            conflict = _cas_conflict(r, cur)
            if conflict is not None:
                return conflict
        held = cur is not None and cur.lock_id
        if (held and r.lock_id != cur.lock_id) or (r.lock_id and not held):  # type: ignore[union-attr]
            return _zero(r)  # locked by someone else, or a lock no longer held
        return Outcome(RESULT_OK, written=await _write(tx, keyring, r, cur, keep_lock=True))
    if r.op in (OP_DELETE, OP_DELETE_CAS):
        if r.op == OP_DELETE_CAS:
            conflict = _cas_conflict(r, cur)
            if conflict is not None:
                return conflict
        if cur is None:
            return Outcome(RESULT_OK)
        if cur.lock_id and r.lock_id != cur.lock_id:
            return _zero(r)
        await tx.conn.execute(
            "DELETE FROM variables WHERE namespace = %s AND path = %s", (r.namespace, r.path)
        )
        _event(tx, cur.metadata(with_lock=False), deleted=True)
        return Outcome(RESULT_OK)
    if r.op == OP_LOCK_ACQUIRE:
        if cur is not None and cur.lock_id and r.lock_id != cur.lock_id:
            return _zero(r)
        return Outcome(RESULT_OK, written=await _write(tx, keyring, r, cur, keep_lock=False))
    # lock-release
    if cur is None:
        raise NotFound(NO_VARIABLE)
    if not cur.lock_id:
        raise FailedPrecondition(NO_LOCK)
    if r.lock_id != cur.lock_id:
        return _zero(r, lock=True)
    return Outcome(RESULT_OK, written=await release(tx, cur))


async def _write(
    tx: WriteTx, keyring: Keyring, r: Request, cur: StoredVariable | None, *, keep_lock: bool
) -> StoredVariable:
    material = await keyring.active_for_write(tx)
    data = material.encrypt(encode_items(r.items), kr.variable_context(r.namespace, r.path))
    lock_id: str | None
    lock_expires: datetime | None
    if keep_lock:
        lock_id = cur.lock_id if cur is not None else None
        ttl = cur.lock_ttl if cur is not None else 0
        delay = cur.lock_delay if cur is not None else 0
        lock_expires = cur.lock_expires if cur is not None else None
    else:
        lock_id, ttl, delay, lock_expires = (
            r.lock_id or str(uuid.uuid4()),
            r.lock_ttl,
            r.lock_delay,
            None,
        )
    written = StoredVariable(
        namespace=r.namespace,
        path=r.path,
        key_id=material.key_id,
        data=data,
        create_index=cur.create_index if cur is not None else tx.index,
        modify_index=tx.index,
        create_time=cur.create_time if cur is not None else tx.now,
        modify_time=tx.now,
        lock_id=lock_id,
        lock_ttl=ttl,
        lock_delay=delay,
        lock_expires=lock_expires,
    )
    await tx.conn.execute(
        "INSERT INTO variables (namespace, path, key_id, data, create_index, modify_index, "
        "create_time, modify_time, lock_id, lock_ttl, lock_delay, lock_expires) "
        "VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s) "
        "ON CONFLICT (namespace, path) DO UPDATE SET key_id = excluded.key_id, "
        "data = excluded.data, modify_index = excluded.modify_index, "
        "modify_time = excluded.modify_time, lock_id = excluded.lock_id, "
        "lock_ttl = excluded.lock_ttl, lock_delay = excluded.lock_delay, "
        "lock_expires = excluded.lock_expires",
        (
            written.namespace,
            written.path,
            written.key_id,
            written.data,
            written.create_index,
            written.modify_index,
            written.create_time,
            written.modify_time,
            written.lock_id,
            written.lock_ttl,
            written.lock_delay,
            written.lock_expires,
        ),
    )
    if not keep_lock:
        # the lock's lease runs on the database's clock, the same for every
        # state process (Nomad doubles the TTL as the holder's grace)
        await tx.conn.execute(
            "UPDATE variables SET lock_expires = clock_timestamp() + "
            "make_interval(secs => %s) WHERE namespace = %s AND path = %s",
            (ttl * LOCK_GRACE_FACTOR / SECOND, r.namespace, r.path),
        )
    _event(tx, written.metadata(with_lock=False))
    return written


async def release(tx: WriteTx, cur: StoredVariable) -> StoredVariable:
    """Remove the lock from a variable, its items untouched."""
    await tx.conn.execute(
        "UPDATE variables SET lock_id = NULL, lock_ttl = 0, lock_delay = 0, lock_expires = NULL, "
        "modify_index = %s, modify_time = %s WHERE namespace = %s AND path = %s",
        (tx.index, tx.now, cur.namespace, cur.path),
    )
    out = StoredVariable(
        namespace=cur.namespace,
        path=cur.path,
        key_id=cur.key_id,
        data=cur.data,
        create_index=cur.create_index,
        modify_index=tx.index,
        create_time=cur.create_time,
        modify_time=tx.now,
    )
    _event(tx, out.metadata(with_lock=False))
    return out


def _event(tx: WriteTx, meta: pb.VariableMetadata, *, deleted: bool = False) -> None:
    tx.record(topics.VARIABLE.event(meta, EventType.VARIABLE_UPDATED, deleted=deleted))


# --------------------------------------------------------------- lock leases


async def renew_lock(db: Database, namespace: str, path: str, lock_id: str) -> StoredVariable:
    """Extend a held lock's lease (Nomad's Variables.RenewLock). Not an
    indexed write: the lease is bookkeeping on the database's clock, as
    Nomad's renewals are timer resets on its leader, not Raft writes."""
    check_path(path)
    if not lock_id:
        raise InvalidArgument("lock_id", "missing lock ID")
    renewed = await db.bookkeeping(
        "UPDATE variables SET lock_expires = clock_timestamp() + "
        "make_interval(secs => lock_ttl * %s / 1e9) "
        "WHERE namespace = %s AND path = %s AND lock_id = %s "
        "AND lock_expires > clock_timestamp() RETURNING namespace",
        (LOCK_GRACE_FACTOR, namespace, path, lock_id),
    )
    found = await get(db, namespace, path)
    if found is None:
        raise NotFound(NO_VARIABLE)
    if not found.lock_id:
        raise FailedPrecondition(NO_LOCK)
    if not renewed:
        raise FailedPrecondition(LOCKED)
    return found


async def due_locks(db: Database, limit: int = 100) -> list[tuple[str, str, str]]:
    """(namespace, path, lock id) of locks whose lease and lock delay ran
    out: the state leader removes them."""
    async with db.read() as conn:
        cur = await conn.execute(
            "SELECT namespace, path, lock_id FROM variables WHERE lock_id IS NOT NULL AND "
            "lock_expires + make_interval(secs => lock_delay / 1e9) <= clock_timestamp() "
            "LIMIT %s",
            (limit,),
        )
        return [(r[0], r[1], r[2]) for r in await cur.fetchall()]


async def release_expired(tx: WriteTx, namespace: str, path: str, lock_id: str) -> bool:
    """Remove a lock whose lease and delay ran out, if it still does (read
    in this transaction); whether it did."""
    cur = await tx.conn.execute(
        "SELECT 1 FROM variables WHERE namespace = %s AND path = %s AND lock_id = %s AND "
        "lock_expires + make_interval(secs => lock_delay / 1e9) <= clock_timestamp()",
        (namespace, path, lock_id),
    )
    if await cur.fetchone() is None:
        return False
    found = await get(tx.conn, namespace, path)
    if found is None:
        return False
    await release(tx, found)
    return True


# -------------------------------------------------------------------- rekey

#: variables re-encrypted per write transaction of a full rotation
REKEY_BATCH = 100


async def rekey_batch(tx: WriteTx, keyring: Keyring, old_key_id: str) -> int:
    """Re-encrypt up to REKEY_BATCH variables of the rekeying key
    `old_key_id` with the active key (Nomad's rotateVariables); when none is
    left, the old key becomes inactive. How many were re-encrypted.

    Unlike Nomad, a variable's modify index does not move: its items did
    not change, so no check-and-set of a user is broken by a rotation and
    no template re-renders. The transaction records one `RootKey` event."""
    cur = await tx.conn.execute(
        "SELECT namespace, path, data FROM variables WHERE key_id = %s "
        'ORDER BY namespace COLLATE "C", path COLLATE "C" LIMIT %s',
        (old_key_id, REKEY_BATCH),
    )
    rows = await cur.fetchall()
    if not rows:
        await key_writes.set_state(tx, old_key_id, kr.STATE_INACTIVE)
        return 0
    new = await keyring.active_for_write(tx)
    old = await keyring.material(old_key_id, tx.conn)
    for namespace, path, data in rows:
        context = kr.variable_context(namespace, path)
        try:
            clear = old.decrypt(bytes(data), context)
        except kr.KeyringError as exc:
            raise FailedPrecondition(str(exc)) from None
        await tx.conn.execute(
            "UPDATE variables SET key_id = %s, data = %s "
            "WHERE namespace = %s AND path = %s AND key_id = %s",
            (new.key_id, new.encrypt(clear, context), namespace, path, old_key_id),
        )
    tx.record(topics.ROOT_KEY.event(old_key_id, EventType.VARIABLES_REKEYED))
    return len(rows)
