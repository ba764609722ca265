"""Operator snapshots on a real state (issue 31): a save taken while writes
go on holds exactly what was committed at its index; a restore into an
empty state gives the same objects (jobs, variables, ACL tokens) at an
index above both; a damaged archive, another schema revision or an
oversized one is refused and changes nothing; a replica and an event
stream subscribed before a restore, and another state process on the same
database, see the restored state afterwards."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import io
import tarfile
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import grpc
import pytest

from corral.domain import snapshot_archive as archive
from corral.runtime.replica import Replica
from corral.security import transport
from corral.security.transport import REGION_METADATA_KEY
from corral.testing import mock
from corral.v1 import (
    acl_pb2,
    acl_pb2_grpc,
    event_pb2,
    event_pb2_grpc,
    job_pb2,
    job_pb2_grpc,
    operator_pb2,
    operator_pb2_grpc,
    variables_pb2,
    variables_pb2_grpc,
)
from corral.v1 import structs_pb2 as pb
from services.state import backup
from services.state.app import StateApp
from tests.callers import user_channel
from tests.integration.state_api.settings import state_settings
from tests.wait import until

ACL_ENABLED = True


@pytest.fixture(scope="module")
async def token(state_app: StateApp) -> str:
    async with user_channel(state_app.server.bound_address) as ch:
        resp = await acl_pb2_grpc.ACLStub(ch).Bootstrap(acl_pb2.ACLBootstrapRequest())
    return str(resp.token.secret_id)


@pytest.fixture(scope="module")
async def channel(state_app: StateApp, token: str) -> AsyncIterator[grpc.aio.Channel]:
    """Calls with the bootstrap (management) token."""
    async with user_channel(state_app.server.bound_address, token) as ch:
        yield ch


def new_job(job_id: str) -> pb.Job:
    j = mock.job(job_id=job_id, count=1)
    for name in ("version", "create_index", "modify_index", "job_modify_index", "status"):
        j.ClearField(name)  # type: ignore[arg-type]
    return j


async def save(channel: grpc.aio.Channel) -> tuple[bytes, operator_pb2.SnapshotSaveResponse]:
    stream = operator_pb2_grpc.OperatorStub(channel).SnapshotSave(
        operator_pb2.SnapshotSaveRequest()
    )
    head: operator_pb2.SnapshotSaveResponse | None = None
    data = bytearray()
    async for msg in stream:
        if head is None:
            head = msg
        else:
            data += msg.data
    assert head is not None
    assert len(data) == head.size and hashlib.sha256(data).hexdigest() == head.sha256
    return bytes(data), head


async def restore(
    channel: grpc.aio.Channel,
    data: bytes,
    chunk: int = 64 * 1024,
    metadata: tuple[tuple[str, str], ...] = (),
) -> operator_pb2.SnapshotRestoreResponse:
    async def requests() -> AsyncIterator[operator_pb2.SnapshotRestoreRequest]:
        for at in range(0, max(len(data), 1), chunk):  # an empty body: one empty message
            yield operator_pb2.SnapshotRestoreRequest(data=data[at : at + chunk])

    call = operator_pb2_grpc.OperatorStub(channel).SnapshotRestore(requests(), metadata=metadata)
    answers = [r async for r in call]
    assert len(answers) == 1
    return answers[0]


def meta_of(data: bytes, tmp: Path) -> archive.Meta:
    path = tmp / "in.tar.gz"
    path.write_bytes(data)
    return archive.extract(path, tmp / "x", 1 << 30).meta


def counts(meta: archive.Meta) -> dict[str, int]:
    return {t.name: t.rows for t in meta.tables}


async def test_save_with_writes_going_on_is_consistent(
    channel: grpc.aio.Channel, tmp_path: Path
) -> None:
    """Registrations run throughout the save: the snapshot holds exactly
    the jobs (and their evals) committed at or below its index."""
    jobs = job_pb2_grpc.JobStub(channel)
    committed: list[int] = []
    stop = asyncio.Event()

    async def writer() -> None:
        n = 0
        while not stop.is_set():
            resp = await jobs.Register(job_pb2.JobRegisterRequest(job=new_job(f"busy-{n}")))
            committed.append(resp.index)
            n += 1

    task = asyncio.create_task(writer())
    await until(lambda: len(committed) >= 5, timeout=30, what="writes under way")
    data, head = await save(channel)
    await until(lambda: max(committed) > head.index, timeout=30, what="writes after the save")
    stop.set()
    await task
    meta = meta_of(data, tmp_path)
    assert meta.index == head.index
    at_snapshot = sum(1 for i in committed if i <= meta.index)
    assert 0 < at_snapshot < len(committed)
    assert counts(meta)["jobs"] == at_snapshot
    assert counts(meta)["evals"] == at_snapshot
    assert meta.keyring_sha256 or counts(meta)["root_keys"] == 0


async def _state_objects(app: StateApp) -> dict[str, dict[str, bytes]]:
    snap = app.feed.snapshot()
    return {
        "jobs": {f"{j.namespace}/{j.id}": j.SerializeToString() for j in snap.iter_jobs()},
        "evals": {e.id: e.SerializeToString() for e in snap.evals.values()},
    }


async def test_restore_into_an_empty_state_gives_the_same_objects(
    state_app: StateApp,
    channel: grpc.aio.Channel,
    token: str,
    fresh_pg_dsn: str,
    tmp_path: Path,
) -> None:
    variables = variables_pb2_grpc.VariablesStub(channel)
    var = pb.Variable(metadata=pb.VariableMetadata(path="app/db"))
    var.items.update({"password": "hunter2"})
    await variables.Apply(variables_pb2.VariablesApplyRequest(op="set", variable=var))
    await job_pb2_grpc.JobStub(channel).Register(
        job_pb2.JobRegisterRequest(job=new_job("restored"))
    )
    created = await acl_pb2_grpc.ACLStub(channel).CreateToken(
        acl_pb2.ACLCreateTokenRequest(name="ci", type="management")
    )
    data, head = await save(channel)
    before = await _state_objects(state_app)

    empty = StateApp(state_settings(fresh_pg_dsn, acl=True))
    await empty.start()
    try:
        async with transport.dial(empty.server.bound_address) as server_ch:
            # the empty cluster wrote a little of its own (its namespaces, ...)
            own_index = await empty.db.latest_index()
            resp = await restore(server_ch, data)
        assert resp.snapshot_index == head.index
        assert resp.index > head.index and resp.index > own_index
        assert empty.feed.index >= resp.index
        assert await _state_objects(empty) == before
        # the tokens came along: the saved cluster's secret works on the new one
        async with user_channel(empty.server.bound_address, created.token.secret_id) as ch:
            got = await variables_pb2_grpc.VariablesStub(ch).Read(
                variables_pb2.VariablesReadRequest(path="app/db")
            )
            assert dict(got.variable.items) == {"password": "hunter2"}
            me = await acl_pb2_grpc.ACLStub(ch).TokenSelf(acl_pb2.ACLTokenSelfRequest())
            assert me.token.accessor_id == created.token.accessor_id
        async with user_channel(empty.server.bound_address, token) as ch:
            # and the state keeps taking writes, above the restore's index
            reg = await job_pb2_grpc.JobStub(ch).Register(
                job_pb2.JobRegisterRequest(job=new_job("after-restore"))
            )
            assert reg.index > resp.index
    finally:
        await empty.stop()


async def _refused(
    state_app: StateApp,
    channel: grpc.aio.Channel,
    data: bytes,
    metadata: tuple[tuple[str, str], ...] = (),
) -> tuple[grpc.StatusCode, str]:
    index = await state_app.db.latest_index()
    jobs = len(state_app.feed.snapshot().jobs)
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await restore(channel, data, metadata=metadata)
    assert await state_app.db.latest_index() == index
    assert len(state_app.feed.snapshot().jobs) == jobs
    return info.value.code(), info.value.details() or ""


def _rebuilt(data: bytes, edit: Callable[[str, bytes], bytes], *, resum: bool) -> bytes:
    """The archive with members edited; with `resum`, SHA256SUMS follows."""
    members: dict[str, bytes] = {}
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        for info in tar:
            f = tar.extractfile(info)
            assert f is not None
            members[info.name] = edit(info.name, f.read())
    if resum:
        members[archive.SUMS] = "".join(
            f"{hashlib.sha256(b).hexdigest()}  {n}\n"
            for n, b in members.items()
            if n != archive.SUMS
        ).encode()
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz") as tar:
        for name, body in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(body)
            tar.addfile(info, io.BytesIO(body))
    return out.getvalue()


async def test_damaged_other_revision_and_oversized_snapshots_are_refused(
    state_app: StateApp, channel: grpc.aio.Channel
) -> None:
    data, _ = await save(channel)

    def flip_jobs(name: str, body: bytes) -> bytes:
        if name == archive.table_member("jobs") and body:
            return body[:-3] + bytes([body[-3] ^ 0xFF]) + body[-2:]
        return body

    code, details = await _refused(state_app, channel, _rebuilt(data, flip_jobs, resum=False))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "checksum mismatch" in details
    # a table edited and SHA256SUMS made to match: meta.json's checksum still differs
    code, details = await _refused(state_app, channel, _rebuilt(data, flip_jobs, resum=True))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "table jobs" in details

    def other_revision(name: str, body: bytes) -> bytes:
        if name == archive.META:
            meta = archive.Meta.from_json(body)
            meta.schema_revision = "0001"
            return meta.to_json()
        return body

    code, details = await _refused(state_app, channel, _rebuilt(data, other_revision, resum=True))
    assert code == grpc.StatusCode.FAILED_PRECONDITION and "schema revision '0001'" in details
    # a bidirectional stream is not forwarded: another region's is refused here
    other = ((REGION_METADATA_KEY, "elsewhere"),)
    code, details = await _refused(state_app, channel, data, other)
    assert code == grpc.StatusCode.FAILED_PRECONDITION and "region 'elsewhere'" in details
    code, details = await _refused(state_app, channel, b"")
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "snapshot: is empty" in details
    code, details = await _refused(state_app, channel, b"not a snapshot at all")
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "not a readable snapshot" in details
    limit = state_app.ctx.snapshot_max_bytes
    state_app.ctx.snapshot_max_bytes = len(data) - 1
    try:
        code, details = await _refused(state_app, channel, data)
    finally:
        state_app.ctx.snapshot_max_bytes = limit
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED and "--snapshot-max-bytes" in details


async def test_a_replica_an_event_stream_and_a_follower_reload_after_a_restore(
    state_app: StateApp, channel: grpc.aio.Channel, pg_dsn: str
) -> None:
    """Taken, then changed, then restored: the replica (subscribed all
    along) drops what came after the snapshot, the event stream open
    across the restore ends with OUT_OF_RANGE (its reader starts over), and
    another state process on the same database reloads too."""
    jobs = job_pb2_grpc.JobStub(channel)
    await jobs.Register(job_pb2.JobRegisterRequest(job=new_job("kept")))
    data, head = await save(channel)
    follower = StateApp(state_settings(pg_dsn, acl=True))
    await follower.start()
    replica = Replica(state_app.server.bound_address, name="snapshot-test")
    await replica.start()
    resets: list[int] = []
    restores: list[int] = []
    replica.add_listener(
        lambda _b, _s: None,
        lambda s: resets.append(s.index),
        lambda s: restores.append(s.index),
    )
    events = event_pb2_grpc.EventStub(channel).Stream(
        event_pb2.EventStreamRequest(topics=[event_pb2.EventTopic(topic="Job", key="*")])
    )
    try:
        late = await jobs.Register(job_pb2.JobRegisterRequest(job=new_job("after-save")))
        await replica.wait_for_index(late.index, 30)
        assert replica.snapshot().job_by_id("default", "after-save") is not None
        bootstraps = replica.bootstraps
        resp = await restore(channel, data)
        assert resp.index > late.index
        snap = await replica.wait_for_index(resp.index, 30)
        assert replica.bootstraps == bootstraps + 1
        # told it was a restore (the broker starts over on that), not a reset
        assert restores and restores[0] >= resp.index and resets == []
        assert snap.job_by_id("default", "after-save") is None
        assert snap.job_by_id("default", "kept") is not None
        assert state_app.feed.snapshot().job_by_id("default", "after-save") is None
        followed = await follower.feed.wait_for_index(resp.index, 30)
        assert followed.job_by_id("default", "after-save") is None
        assert followed.job_by_id("default", "kept") is not None
        with pytest.raises(grpc.aio.AioRpcError) as info:
            async with asyncio.timeout(30):
                async for _ in events:
                    pass
        assert info.value.code() == grpc.StatusCode.OUT_OF_RANGE
        assert "snapshot restore" in (info.value.details() or "")
        # writes go on above the restore, and the replica follows them
        again = await jobs.Register(job_pb2.JobRegisterRequest(job=new_job("after-restore")))
        snap = await replica.wait_for_index(again.index, 30)
        assert snap.job_by_id("default", "after-restore") is not None
    finally:
        events.cancel()
        with contextlib.suppress(Exception):
            await replica.stop()
        await follower.stop()


async def test_every_table_of_the_schema_is_saved_or_named_as_not_state(
    state_app: StateApp,
) -> None:
    """A table a migration adds is in a snapshot unless it is named as
    membership or the feed's own (backup.NOT_STATE): none is forgotten."""
    async with state_app.db.read() as conn:
        cur = await conn.execute(
            "SELECT table_name FROM information_schema.tables "
            "WHERE table_schema = 'public' AND table_name <> 'alembic_version'"
        )
        in_database = {str(r[0]) for r in await cur.fetchall()}
    saved = {t.name for t in backup.state_tables()}
    assert in_database == saved | backup.NOT_STATE
    assert not saved & backup.NOT_STATE


async def test_only_a_management_token_saves_or_restores(
    state_app: StateApp, channel: grpc.aio.Channel
) -> None:
    """As Nomad: `operator:write` is not enough, for either direction."""
    acl = acl_pb2_grpc.ACLStub(channel)
    await acl.UpsertPolicies(
        acl_pb2.ACLUpsertPoliciesRequest(
            policies=[acl_pb2.ACLPolicy(name="operators", rules='operator { policy = "write" }')]
        )
    )
    made = await acl.CreateToken(acl_pb2.ACLCreateTokenRequest(name="op", policies=["operators"]))
    data, _ = await save(channel)
    async with user_channel(state_app.server.bound_address, made.token.secret_id) as ch:
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await save(ch)
        assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert "management token" in (info.value.details() or "")
        code, details = await _refused(state_app, ch, data)
        assert code == grpc.StatusCode.PERMISSION_DENIED and "management token" in details


async def test_a_keyring_needs_a_kek_where_it_is_restored(
    channel: grpc.aio.Channel, fresh_pg_dsn: str
) -> None:
    """The snapshot's root keys are wrapped with the restoring state's KEK:
    a state without one refuses the restore, naming the setting, and keeps
    its own state."""
    data, _ = await save(channel)
    no_kek = StateApp(state_settings(fresh_pg_dsn, acl=True, kek=False))
    await no_kek.start()
    try:
        async with transport.dial(no_kek.server.bound_address) as server_ch:
            index = await no_kek.db.latest_index()
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await restore(server_ch, data)
        assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "--keyring-kek-file" in (info.value.details() or "")
        assert await no_kek.db.latest_index() == index
    finally:
        await no_kek.stop()
