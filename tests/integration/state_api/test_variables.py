"""Variables on a real state (issue 28): Nomad's Variables.Apply semantics
(set, check-and-set, delete, locks), reads and lists, items encrypted at
rest (read straight from PostgreSQL), keyring rotation keeping old
variables readable and a full rotation re-encrypting them, events."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import grpc
import psycopg
import pytest

from corral.security import keyring as kr
from corral.v1 import (
    event_pb2,
    event_pb2_grpc,
    keyring_pb2,
    keyring_pb2_grpc,
    namespace_pb2,
    namespace_pb2_grpc,
    query_pb2,
    variables_pb2,
    variables_pb2_grpc,
)
from corral.v1 import structs_pb2 as pb
from services.state.app import StateApp
from tests.wait import until


@pytest.fixture(scope="module")
async def stub(channel: grpc.aio.Channel) -> variables_pb2_grpc.VariablesAsyncStub:
    return variables_pb2_grpc.VariablesStub(channel)


@pytest.fixture(scope="module")
async def keys(channel: grpc.aio.Channel) -> keyring_pb2_grpc.KeyringAsyncStub:
    return keyring_pb2_grpc.KeyringStub(channel)


@pytest.fixture
async def db(pg_dsn: str) -> AsyncIterator[psycopg.AsyncConnection[tuple[Any, ...]]]:
    conn = await psycopg.AsyncConnection.connect(pg_dsn, autocommit=True)
    try:
        yield conn
    finally:
        await conn.close()


def var(path: str, items: dict[str, str] | None = None, **meta: Any) -> pb.Variable:
    v = pb.Variable(metadata=pb.VariableMetadata(path=path, **meta))
    v.items.update(items or {})
    return v


async def put(
    stub: variables_pb2_grpc.VariablesAsyncStub,
    path: str,
    items: dict[str, str],
    *,
    op: str = "set",
    namespace: str = "",
    **meta: Any,
) -> variables_pb2.VariablesApplyResponse:
    return await stub.Apply(
        variables_pb2.VariablesApplyRequest(
            op=op, variable=var(path, items, **meta), namespace=namespace
        )
    )


async def read(
    stub: variables_pb2_grpc.VariablesAsyncStub, path: str, namespace: str = ""
) -> variables_pb2.VariablesReadResponse:
    return await stub.Read(
        variables_pb2.VariablesReadRequest(
            path=path, query=query_pb2.QueryOptions(namespace=namespace)
        )
    )


async def test_put_get_list_delete(stub: variables_pb2_grpc.VariablesAsyncStub) -> None:
    written = await put(stub, "app/db", {"user": "admin", "password": "s3cret"})
    assert written.result == "ok"
    assert dict(written.output.items) == {"user": "admin", "password": "s3cret"}
    meta = written.output.metadata
    assert meta.namespace == "default" and meta.path == "app/db"
    assert meta.create_index == meta.modify_index == written.index
    assert meta.create_time and meta.modify_time == meta.create_time

    got = await read(stub, "app/db")
    assert got.found and dict(got.variable.items) == {"user": "admin", "password": "s3cret"}
    assert got.meta.index == meta.modify_index

    again = await put(stub, "app/db", {"user": "admin", "password": "n3w"})
    assert again.output.metadata.create_index == meta.create_index
    assert again.output.metadata.modify_index > meta.modify_index

    await put(stub, "app/cache", {"url": "redis://"})
    await put(stub, "other/x", {"a": "b"})
    listed = await stub.List(
        variables_pb2.VariablesListRequest(query=query_pb2.QueryOptions(prefix="app/"))
    )
    assert [v.path for v in listed.variables] == ["app/cache", "app/db"]
    assert all(not v.HasField("lock") for v in listed.variables)

    gone = await stub.Apply(
        variables_pb2.VariablesApplyRequest(op="delete", variable=var("app/cache"))
    )
    assert gone.result == "ok" and not gone.HasField("output")
    assert not (await read(stub, "app/cache")).found
    # deleting what is not there is fine, and writes nothing
    again_gone = await stub.Apply(
        variables_pb2.VariablesApplyRequest(op="delete", variable=var("app/cache"))
    )
    assert again_gone.result == "ok" and again_gone.index == gone.index


async def test_check_and_set(stub: variables_pb2_grpc.VariablesAsyncStub) -> None:
    created = await put(stub, "cas/one", {"k": "1"}, op="cas", modify_index=0)
    assert created.result == "ok"
    index = created.output.metadata.modify_index
    # cas=0 on an existing variable: conflict, with the current variable
    exists = await put(stub, "cas/one", {"k": "2"}, op="cas", modify_index=0)
    assert exists.result == "conflict"
    assert exists.conflict.metadata.modify_index == index
    assert dict(exists.conflict.items) == {"k": "1"}
    stale = await put(stub, "cas/one", {"k": "2"}, op="cas", modify_index=index - 1)
    assert stale.result == "conflict" and stale.conflict.metadata.modify_index == index
    ok = await put(stub, "cas/one", {"k": "2"}, op="cas", modify_index=index)
    assert ok.result == "ok"
    # a check index on a variable that does not exist: a conflict with nothing
    missing = await put(stub, "cas/none", {"k": "1"}, op="cas", modify_index=7)
    assert missing.result == "conflict"
    assert missing.conflict.metadata.path == "cas/none"
    assert missing.conflict.metadata.modify_index == 0 and not missing.conflict.items
    # delete-cas
    new_index = ok.output.metadata.modify_index
    refused = await stub.Apply(
        variables_pb2.VariablesApplyRequest(
            op="delete-cas", variable=var("cas/one", modify_index=new_index - 1)
        )
    )
    assert refused.result == "conflict" and (await read(stub, "cas/one")).found
    deleted = await stub.Apply(
        variables_pb2.VariablesApplyRequest(
            op="delete-cas", variable=var("cas/one", modify_index=new_index)
        )
    )
    assert deleted.result == "ok" and not (await read(stub, "cas/one")).found


@pytest.mark.parametrize(
    ("path", "problem"),
    [
        ("", "requires path"),
        ("a.b", "invalid path"),
        ("a b", "invalid path"),
        ("x" * 129, "invalid path"),
        ("nomad", "reserved top-level"),
        ("nomad/other", 'only paths at "nomad/jobs"'),
        ("nomad/job-templates", "reserved directory"),
        ("nomad/job-templates/a/b", "reserved directory"),
    ],
)
async def test_invalid_paths(
    stub: variables_pb2_grpc.VariablesAsyncStub, path: str, problem: str
) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await put(stub, path, {"a": "b"})
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert problem in (err.value.details() or "")


async def test_valid_reserved_paths(stub: variables_pb2_grpc.VariablesAsyncStub) -> None:
    for path in ("nomad/jobs", "nomad/jobs/web/g/t", "nomad/job-templates/x", "a-b_c~d/e"):
        assert (await put(stub, path, {"a": "b"})).result == "ok"


async def test_bad_requests(stub: variables_pb2_grpc.VariablesAsyncStub) -> None:
    cases: list[tuple[dict[str, Any], str]] = [
        ({"op": "set", "variable": var("e")}, "empty variables"),
        ({"op": "set", "variable": var("big", {"k": "v" * 65536})}, "64KiB"),
        ({"op": "bogus", "variable": var("e", {"a": "b"})}, "op"),
        ({"op": "set", "variable": var("e", {"a": "b"}), "namespace": "*"}, "wildcard"),
        (
            {"op": "set", "variable": var("e", {"a": "b"}, lock=pb.VariableLock(ttl=10**10))},
            "lock definition",
        ),
        ({"op": "lock-release", "variable": var("e")}, "missing lock"),
        (
            {"op": "lock-acquire", "variable": var("e", lock=pb.VariableLock(ttl=10**9))},
            "TTL must be between",
        ),
    ]
    for kwargs, problem in cases:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stub.Apply(variables_pb2.VariablesApplyRequest(**kwargs))  # type: ignore[arg-type]
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, kwargs
        assert problem in (err.value.details() or ""), (kwargs, err.value.details())
    # items of exactly 64 KiB are fine
    assert (await put(stub, "big", {"k": "v" * (65536 - 1)})).result == "ok"


async def test_namespaces(
    stub: variables_pb2_grpc.VariablesAsyncStub, channel: grpc.aio.Channel
) -> None:
    namespaces = namespace_pb2_grpc.NamespaceStub(channel)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await put(stub, "ns/shared", {"where": "prod"}, namespace="prod")
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "nonexistent namespace 'prod'" in (err.value.details() or "")
    await namespaces.Upsert(
        namespace_pb2.NamespaceUpsertRequest(namespaces=[pb.Namespace(name="prod")])
    )
    await put(stub, "ns/shared", {"where": "default"})
    await put(stub, "ns/shared", {"where": "prod"}, namespace="prod")
    assert (await read(stub, "ns/shared", "prod")).variable.items["where"] == "prod"
    assert (await read(stub, "ns/shared")).variable.items["where"] == "default"
    everywhere = await stub.List(
        variables_pb2.VariablesListRequest(
            query=query_pb2.QueryOptions(namespace="*", prefix="ns/")
        )
    )
    assert [(v.namespace, v.path) for v in everywhere.variables] == [
        ("default", "ns/shared"),
        ("prod", "ns/shared"),
    ]
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await read(stub, "ns/shared", "*")
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    # a namespace holding variables is not deleted, as Nomad's
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await namespaces.Delete(namespace_pb2.NamespaceDeleteRequest(names=["prod"]))
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "contains at least one variable" in (err.value.details() or "")
    await stub.Apply(
        variables_pb2.VariablesApplyRequest(
            op="delete", variable=var("ns/shared"), namespace="prod"
        )
    )
    await namespaces.Delete(namespace_pb2.NamespaceDeleteRequest(names=["prod"]))


async def test_list_pages(stub: variables_pb2_grpc.VariablesAsyncStub) -> None:
    for i in range(5):
        await put(stub, f"page/{i}", {"i": str(i)})
    seen: list[str] = []
    token = ""
    while True:
        resp = await stub.List(
            variables_pb2.VariablesListRequest(
                query=query_pb2.QueryOptions(prefix="page/", per_page=2, next_token=token)
            )
        )
        seen += [v.path for v in resp.variables]
        token = resp.meta.next_token
        if not token:
            break
        assert token.startswith("default.page/")
    assert seen == [f"page/{i}" for i in range(5)]


async def test_blocking_read(stub: variables_pb2_grpc.VariablesAsyncStub) -> None:
    first = await put(stub, "block/me", {"v": "1"})
    index = first.output.metadata.modify_index
    waiting = asyncio.ensure_future(
        stub.Read(
            variables_pb2.VariablesReadRequest(
                path="block/me", query=query_pb2.QueryOptions(min_index=index, wait_ms=20_000)
            )
        )
    )
    await put(stub, "block/other", {"v": "x"})  # another variable does not wake it
    await asyncio.sleep(0.2)
    assert not waiting.done()
    second = await put(stub, "block/me", {"v": "2"})
    got = await asyncio.wait_for(waiting, 10)
    assert got.variable.items["v"] == "2"
    assert got.meta.index == second.output.metadata.modify_index


async def test_items_are_ciphertext_on_disk(
    stub: variables_pb2_grpc.VariablesAsyncStub,
    db: psycopg.AsyncConnection[tuple[Any, ...]],
) -> None:
    secret = "correct-horse-battery-staple"
    await put(stub, "disk/secret", {"password": secret, "user": "svc-account"})
    cur = await db.execute(
        "SELECT key_id, data FROM variables WHERE namespace = 'default' AND path = 'disk/secret'"
    )
    row = await cur.fetchone()
    assert row is not None
    key_id, data = row
    raw = bytes(data)
    assert secret.encode() not in raw and b"svc-account" not in raw and b"password" not in raw
    # nor anywhere else in the database: the change log holds metadata only
    cur = await db.execute("SELECT payload FROM change_log")
    assert not any(secret.encode() in bytes(r[0]) for r in await cur.fetchall())
    # the key's material is wrapped too
    cur = await db.execute(
        "SELECT wrapped_key, wrapped_rsa_key FROM root_keys WHERE key_id = %s", (key_id,)
    )
    wrapped = await cur.fetchone()
    assert wrapped is not None and all(len(bytes(w)) > 28 for w in wrapped)


async def test_lock_lifecycle(
    stub: variables_pb2_grpc.VariablesAsyncStub,
    state_app: StateApp,
    db: psycopg.AsyncConnection[tuple[Any, ...]],
) -> None:
    acquired = await stub.Apply(
        variables_pb2.VariablesApplyRequest(
            op="lock-acquire", variable=var("locks/leader", {"holder": "a"})
        )
    )
    assert acquired.result == "ok"
    lock = acquired.output.metadata.lock
    assert lock.id and lock.ttl == 15 * 10**9 and lock.lock_delay == 15 * 10**9
    # someone else cannot take it, write or delete it
    other = await stub.Apply(
        variables_pb2.VariablesApplyRequest(op="lock-acquire", variable=var("locks/leader"))
    )
    assert other.result == "conflict" and other.conflict.metadata.path == "locks/leader"
    assert not other.conflict.metadata.HasField("lock") or not other.conflict.metadata.lock.id
    assert (await put(stub, "locks/leader", {"holder": "b"})).result == "conflict"
    gone = await stub.Apply(
        variables_pb2.VariablesApplyRequest(op="delete", variable=var("locks/leader"))
    )
    assert gone.result == "conflict" and (await read(stub, "locks/leader")).found
    # the holder can write it (the lock stays)
    mine = await put(stub, "locks/leader", {"holder": "a2"}, lock=pb.VariableLock(id=lock.id))
    assert mine.result == "ok" and mine.output.metadata.lock.id == lock.id
    renewed = await stub.RenewLock(
        variables_pb2.VariablesRenewLockRequest(path="locks/leader", lock_id=lock.id)
    )
    assert renewed.variable.lock.id == lock.id
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.RenewLock(
            variables_pb2.VariablesRenewLockRequest(path="locks/leader", lock_id="not-mine")
        )
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "locked variable" in (err.value.details() or "")
    wrong = await stub.Apply(
        variables_pb2.VariablesApplyRequest(
            op="lock-release", variable=var("locks/leader", lock=pb.VariableLock(id="nope"))
        )
    )
    assert wrong.result == "conflict"
    released = await stub.Apply(
        variables_pb2.VariablesApplyRequest(
            op="lock-release", variable=var("locks/leader", lock=pb.VariableLock(id=lock.id))
        )
    )
    assert released.result == "ok" and not released.output.metadata.HasField("lock")
    got = await read(stub, "locks/leader")
    assert dict(got.variable.items) == {"holder": "a2"} and not got.variable.metadata.lock.id
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.RenewLock(
            variables_pb2.VariablesRenewLockRequest(path="locks/leader", lock_id=lock.id)
        )
    assert "doesn't hold a lock" in (err.value.details() or "")


async def test_lock_expires_after_ttl_and_delay(
    stub: variables_pb2_grpc.VariablesAsyncStub,
    state_app: StateApp,
    db: psycopg.AsyncConnection[tuple[Any, ...]],
) -> None:
    acquired = await stub.Apply(
        variables_pb2.VariablesApplyRequest(
            op="lock-acquire",
            variable=var("locks/lease", lock=pb.VariableLock(ttl=10 * 10**9, lock_delay=10**9)),
        )
    )
    lock_id = acquired.output.metadata.lock.id
    assert await state_app.keyring_leader.reap_locks() == 0  # its lease runs
    # the lease ran out (its clock is the database's: move it back 2 TTLs)
    await db.execute(
        "UPDATE variables SET lock_expires = clock_timestamp() - interval '1 second' "
        "WHERE path = 'locks/lease'"
    )
    # ... a renewal is too late now, but the lock delay still holds it
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.RenewLock(
            variables_pb2.VariablesRenewLockRequest(path="locks/lease", lock_id=lock_id)
        )
    assert "locked variable" in (err.value.details() or "")
    taken = await stub.Apply(
        variables_pb2.VariablesApplyRequest(op="lock-acquire", variable=var("locks/lease"))
    )
    assert taken.result == "conflict"
    await db.execute(
        "UPDATE variables SET lock_expires = clock_timestamp() - interval '2 seconds' "
        "WHERE path = 'locks/lease'"
    )
    assert await state_app.keyring_leader.reap_locks() == 1
    assert not (await read(stub, "locks/lease")).variable.metadata.lock.id
    again = await stub.Apply(
        variables_pb2.VariablesApplyRequest(op="lock-acquire", variable=var("locks/lease"))
    )
    assert again.result == "ok" and again.output.metadata.lock.id != lock_id


async def test_rotation_keeps_old_variables_readable(
    stub: variables_pb2_grpc.VariablesAsyncStub,
    keys: keyring_pb2_grpc.KeyringAsyncStub,
    db: psycopg.AsyncConnection[tuple[Any, ...]],
    state_app: StateApp,
) -> None:
    before = await put(stub, "rot/old", {"v": "under the old key"})
    listed = await keys.List(keyring_pb2.KeyringListRequest())
    old = next(k for k in listed.keys if k.state == "active")
    rotated = await keys.Rotate(keyring_pb2.KeyringRotateRequest())
    assert rotated.key.state == "active" and rotated.key.key_id != old.key_id
    states = {k.key_id: k.state for k in (await keys.List(keyring_pb2.KeyringListRequest())).keys}
    assert states[old.key_id] == "inactive" and states[rotated.key.key_id] == "active"
    assert (await read(stub, "rot/old")).variable.items["v"] == "under the old key"
    await put(stub, "rot/new", {"v": "new"})
    cur = await db.execute(
        "SELECT path, key_id FROM variables WHERE path IN ('rot/old', 'rot/new') ORDER BY path"
    )
    assert await cur.fetchall() == [("rot/new", rotated.key.key_id), ("rot/old", old.key_id)]
    # an inactive key in use cannot be deleted without force
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await keys.Delete(keyring_pb2.KeyringDeleteRequest(key_id=old.key_id))
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await keys.Delete(keyring_pb2.KeyringDeleteRequest(key_id=rotated.key.key_id))
    assert "cannot be deleted" in (err.value.details() or "")

    # a full rotation re-encrypts every variable with the new key, in the
    # background on the leader; no variable's modify index moves
    full = await keys.Rotate(keyring_pb2.KeyringRotateRequest(full=True))
    await state_app.keyring_leader.rekey()

    async def rekeyed() -> bool:
        cur = await db.execute(
            "SELECT count(*) FROM variables WHERE key_id <> %s", (full.key.key_id,)
        )
        row = await cur.fetchone()
        return row is not None and row[0] == 0

    await until(rekeyed, timeout=30)
    after = await read(stub, "rot/old")
    assert after.variable.items["v"] == "under the old key"
    assert after.variable.metadata.modify_index == before.output.metadata.modify_index
    states = {k.key_id: k.state for k in (await keys.List(keyring_pb2.KeyringListRequest())).keys}
    assert states[old.key_id] == "inactive" and states[rotated.key.key_id] == "inactive"
    assert states[full.key.key_id] == "active"
    # now unused, the old key can go
    await keys.Delete(keyring_pb2.KeyringDeleteRequest(key_id=old.key_id))
    assert old.key_id not in {
        k.key_id for k in (await keys.List(keyring_pb2.KeyringListRequest())).keys
    }


async def test_prepublished_key_activates_at_its_time(
    keys: keyring_pb2_grpc.KeyringAsyncStub, state_app: StateApp
) -> None:
    import time

    soon = time.time_ns() + 3_000_000_000
    pre = await keys.Rotate(keyring_pb2.KeyringRotateRequest(publish_time=soon))
    assert pre.key.state == "prepublished" and pre.key.publish_time == soon
    public = await keys.ListPublic(keyring_pb2.KeyringListPublicRequest())
    assert pre.key.key_id in {k.key_id for k in public.keys}

    async def active() -> bool:
        await state_app.keyring_leader.rotate_if_due()
        listed = await keys.List(keyring_pb2.KeyringListRequest())
        return any(k.key_id == pre.key.key_id and k.state == "active" for k in listed.keys)

    await until(active, timeout=30)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await keys.Rotate(keyring_pb2.KeyringRotateRequest(full=True, publish_time=soon + 10**12))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT


async def test_variable_events(
    stub: variables_pb2_grpc.VariablesAsyncStub, channel: grpc.aio.Channel
) -> None:
    events = event_pb2_grpc.EventStub(channel)
    start = (await put(stub, "ev/a", {"x": "first-value-1"})).index
    call = events.Stream(
        event_pb2.EventStreamRequest(
            from_index=start, topics=[event_pb2.EventTopic(topic="Variable")]
        )
    )
    await put(stub, "ev/a", {"x": "second-value-2"})
    await stub.Apply(variables_pb2.VariablesApplyRequest(op="delete", variable=var("ev/a")))
    seen: list[pb.Event] = []
    async for resp in call:
        seen += list(resp.events)
        if len(seen) >= 2:
            break
    call.cancel()
    assert [e.type for e in seen] == ["VariableUpdated", "VariableUpdated"]
    assert [e.deleted for e in seen] == [False, True]
    assert all(e.topic == "Variable" and e.key == "ev/a" for e in seen)
    assert all(e.variable.path == "ev/a" and not e.variable.lock.id for e in seen)
    assert not any(b"-value-" in e.SerializeToString() for e in seen)


async def test_decrypt_refuses_a_moved_ciphertext(
    stub: variables_pb2_grpc.VariablesAsyncStub,
    db: psycopg.AsyncConnection[tuple[Any, ...]],
) -> None:
    """A blob copied to another path does not decrypt there (the namespace
    and path are bound into the AES-GCM associated data)."""
    await put(stub, "moved/src", {"k": "v"})
    await put(stub, "moved/dst", {"k": "other"})
    await db.execute(
        "UPDATE variables SET data = (SELECT data FROM variables WHERE path = 'moved/src'), "
        "key_id = (SELECT key_id FROM variables WHERE path = 'moved/src') "
        "WHERE path = 'moved/dst'"
    )
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await read(stub, "moved/dst")
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "cannot be decrypted" in (err.value.details() or "")
    assert kr.ALGORITHM_AES256_GCM == "aes256-gcm"
