"""Node identity against a real state service and PostgreSQL (issue #15):
every node RPC needs the node's own secret, a node touches only its own
allocs, a node id cannot be taken over by re-registering it, and no read
path ever returns a node's secret (the state stores only its hash).

Each refusal is checked with the census: same index, same rows."""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator
from dataclasses import dataclass

import grpc
import pytest

from corral.domain.structs import ClientStatus, copy_msg, new_id
from corral.security import transport
from corral.testing import mock
from corral.v1 import (
    event_pb2,
    event_pb2_grpc,
    node_pb2,
    node_pb2_grpc,
    state_pb2,
    state_pb2_grpc,
)
from corral.v1 import structs_pb2 as pb
from services.state.app import StateApp, StateSettings
from services.state.config import HeartbeatSettings
from tests.integration.state.helpers import census
from tests.wait import until

# no node misses its TTL while a test runs: the census must not move by itself
SLOW = HeartbeatSettings(min_ttl=600.0, grace=60.0, failover_ttl=600.0)


@dataclass
class Stubs:
    node: node_pb2_grpc.NodeAsyncStub
    state: state_pb2_grpc.StateAsyncStub
    event: event_pb2_grpc.EventAsyncStub


@pytest.fixture
async def app(fresh_pg_dsn: str) -> AsyncIterator[StateApp]:
    a = StateApp(StateSettings(dsn=fresh_pg_dsn, heartbeat=SLOW))
    await a.start()
    await until(lambda: a.heartbeats.enabled)
    try:
        yield a
    finally:
        await a.stop()


@pytest.fixture
async def stubs(app: StateApp) -> AsyncIterator[Stubs]:
    async with transport.dial(app.server.bound_address) as ch:
        yield Stubs(
            node_pb2_grpc.NodeStub(ch), state_pb2_grpc.StateStub(ch), event_pb2_grpc.EventStub(ch)
        )


async def ready_node(app: StateApp, nodes: node_pb2_grpc.NodeAsyncStub) -> pb.Node:
    """A node registered and made ready over the client RPCs, as an agent does."""
    node = mock.node(status="initializing")
    await nodes.Register(node_pb2.NodeRegisterRequest(node=node))
    resp = await nodes.UpdateStatus(
        node_pb2.NodeUpdateStatusRequest(node_id=node.id, status="ready", secret_id=node.secret_id)
    )
    await app.feed.wait_for_index(resp.index, 10)
    return node


async def running_alloc(app: StateApp, node: pb.Node, job_id: str) -> pb.Allocation:
    job = mock.job(job_id=job_id, count=1)
    alloc = mock.alloc(job, node, client_status=ClientStatus.RUNNING)
    async with app.db.write() as tx:
        tx.put_job(job)
        alloc.alloc_modify_index = tx.index
        tx.put_alloc(alloc)
    await app.feed.wait_for_index(tx.index, 10)
    return alloc


async def refused(call: object, code: grpc.StatusCode, needle: str) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await call  # type: ignore[misc]
    assert err.value.code() == code, err.value.details()
    assert needle in (err.value.details() or ""), err.value.details()


def stored_status(app: StateApp, alloc_id: str) -> str:
    a = app.feed.snapshot().alloc_by_id(alloc_id)
    assert a is not None
    return a.client_status


@pytest.mark.parametrize("secret", ["", "not-the-secret"])
async def test_every_node_rpc_needs_the_nodes_own_secret(
    app: StateApp, stubs: Stubs, secret: str
) -> None:
    """Issue #15: an empty secret skipped the check, and another node's
    allocs were read and failed with it. Empty or wrong, every client RPC
    is now PERMISSION_DENIED and writes nothing."""
    node = await ready_node(app, stubs.node)
    alloc = await running_alloc(app, node, "victim")
    why = "secret_id is required" if not secret else "secret id does not match"
    before = await census(app.db)

    await refused(
        stubs.node.GetClientAllocs(
            node_pb2.NodeClientAllocsRequest(node_id=node.id, secret_id=secret)
        ),
        grpc.StatusCode.PERMISSION_DENIED,
        why,
    )
    failed = pb.Allocation(id=alloc.id, node_id=node.id, client_status=ClientStatus.FAILED)
    await refused(
        stubs.node.UpdateAlloc(node_pb2.NodeUpdateAllocRequest(allocs=[failed], secret_id=secret)),
        grpc.StatusCode.PERMISSION_DENIED,
        why,
    )
    for status in ("down", "ready"):
        await refused(
            stubs.node.UpdateStatus(
                node_pb2.NodeUpdateStatusRequest(node_id=node.id, status=status, secret_id=secret)
            ),
            grpc.StatusCode.PERMISSION_DENIED,
            why,
        )
    # re-registering the node with made-up resources
    takeover = copy_msg(node)
    takeover.secret_id = secret
    takeover.node_resources.cpu = 10_000_000
    await refused(
        stubs.node.Register(node_pb2.NodeRegisterRequest(node=takeover)),
        grpc.StatusCode.PERMISSION_DENIED,
        "secret_id is required" if not secret else why,
    )

    assert await census(app.db) == before
    assert stored_status(app, alloc.id) == ClientStatus.RUNNING
    stored = app.feed.snapshot().node_by_id(node.id)
    assert stored is not None and stored.node_resources.cpu == node.node_resources.cpu


async def test_a_new_node_needs_a_secret(app: StateApp, stubs: Stubs) -> None:
    before = await census(app.db)
    node = mock.node()
    node.secret_id = ""
    await refused(
        stubs.node.Register(node_pb2.NodeRegisterRequest(node=node)),
        grpc.StatusCode.PERMISSION_DENIED,
        "node.secret_id is required",
    )
    node.secret_id = "x" * 129
    await refused(
        stubs.node.Register(node_pb2.NodeRegisterRequest(node=node)),
        grpc.StatusCode.INVALID_ARGUMENT,
        "node.secret_id: must be at most 128 characters",
    )
    node.secret_id = "s"
    node.secret_hash = "0" * 64  # the state's to set
    await refused(
        stubs.node.Register(node_pb2.NodeRegisterRequest(node=node)),
        grpc.StatusCode.INVALID_ARGUMENT,
        "node.secret_hash",
    )
    assert await census(app.db) == before


async def test_a_node_re_registers_with_its_own_secret(app: StateApp, stubs: Stubs) -> None:
    node = await ready_node(app, stubs.node)
    again = copy_msg(node)
    again.attributes["driver.docker"] = "1"
    resp = await stubs.node.Register(node_pb2.NodeRegisterRequest(node=again))
    snap = await app.feed.wait_for_index(resp.index, 10)
    stored = snap.node_by_id(node.id)
    assert stored is not None and stored.attributes["driver.docker"] == "1"
    assert stored.status == "ready"


async def test_a_node_updates_and_reads_only_its_own_allocs(app: StateApp, stubs: Stubs) -> None:
    """Issue #15: node A set node B's allocs to complete. A's own secret
    proves A, not B: B's alloc is refused (alone or beside one of A's) and
    A cannot read B's allocs."""
    a, b = await ready_node(app, stubs.node), await ready_node(app, stubs.node)
    mine, theirs = await running_alloc(app, a, "job-a"), await running_alloc(app, b, "job-b")
    before = await census(app.db)

    # B's alloc claimed as A's (the node id is taken from the updates)
    forged = pb.Allocation(id=theirs.id, node_id=a.id, client_status=ClientStatus.COMPLETE)
    own = pb.Allocation(id=mine.id, node_id=a.id, client_status=ClientStatus.COMPLETE)
    for updates in ([forged], [own, forged]):
        await refused(
            stubs.node.UpdateAlloc(
                node_pb2.NodeUpdateAllocRequest(allocs=updates, secret_id=a.secret_id)
            ),
            grpc.StatusCode.PERMISSION_DENIED,
            f"alloc {theirs.id} is not on node {a.id}",
        )
    # B's node id with A's secret
    as_b = pb.Allocation(id=theirs.id, node_id=b.id, client_status=ClientStatus.COMPLETE)
    await refused(
        stubs.node.UpdateAlloc(
            node_pb2.NodeUpdateAllocRequest(allocs=[as_b], secret_id=a.secret_id)
        ),
        grpc.StatusCode.PERMISSION_DENIED,
        "secret id does not match",
    )
    await refused(
        stubs.node.GetClientAllocs(
            node_pb2.NodeClientAllocsRequest(node_id=b.id, secret_id=a.secret_id)
        ),
        grpc.StatusCode.PERMISSION_DENIED,
        "secret id does not match",
    )
    assert await census(app.db) == before
    assert stored_status(app, theirs.id) == stored_status(app, mine.id) == ClientStatus.RUNNING

    # A's own update and read go through
    resp = await stubs.node.UpdateAlloc(
        node_pb2.NodeUpdateAllocRequest(allocs=[own], secret_id=a.secret_id)
    )
    await app.feed.wait_for_index(resp.index, 10)
    assert stored_status(app, mine.id) == ClientStatus.COMPLETE
    got = await stubs.node.GetClientAllocs(
        node_pb2.NodeClientAllocsRequest(node_id=a.id, secret_id=a.secret_id)
    )
    assert list(got.allocs) == [mine.id]


async def test_updates_of_unknown_allocs_are_ignored_and_move_no_index(
    app: StateApp, stubs: Stubs
) -> None:
    """Issue 26, finding 10: a node reporting alloc ids that do not exist
    (with its correct secret) got OK and moved the index by one per call.
    Each unknown id is ignored, as Nomad's Node.UpdateAlloc does; a call
    naming none that exists writes nothing. Beside a real alloc, the real
    one is updated and the unknown one still ignored."""
    node = await ready_node(app, stubs.node)
    mine = await running_alloc(app, node, "job-a")
    before = await census(app.db)
    ghosts = [
        pb.Allocation(id=new_id(), node_id=node.id, client_status=ClientStatus.COMPLETE)
        for _ in range(3)
    ]
    for _ in range(5):
        resp = await stubs.node.UpdateAlloc(
            node_pb2.NodeUpdateAllocRequest(allocs=ghosts, secret_id=node.secret_id)
        )
        assert not resp.eval_ids
    assert await census(app.db) == before
    assert resp.index == before["index"]

    own = pb.Allocation(id=mine.id, node_id=node.id, client_status=ClientStatus.COMPLETE)
    resp = await stubs.node.UpdateAlloc(
        node_pb2.NodeUpdateAllocRequest(allocs=[ghosts[0], own], secret_id=node.secret_id)
    )
    assert resp.index == before["index"] + 1  # type: ignore[operator]
    assert stored_status(app, mine.id) == ClientStatus.COMPLETE
    assert app.feed.snapshot().alloc_by_id(ghosts[0].id) is None


async def test_no_read_path_returns_a_node_secret(app: StateApp, stubs: Stubs) -> None:
    """Issue #15: node secrets were readable through State.Snapshot and
    Event.Stream. The state keeps only the secret's SHA-256, in its nodes
    table; the change log, snapshots, streams and reads carry neither."""
    async with app.db.write() as tx:  # Event.Stream reads from_index 0 as "from now"
        tx.put_job(mock.job(job_id="before"))
    start = tx.index
    node = await ready_node(app, stubs.node)
    secret, digest = node.secret_id, hashlib.sha256(node.secret_id.encode()).hexdigest()

    async with app.db.read() as conn:
        cur = await conn.execute("SELECT payload FROM nodes WHERE id = %s", (node.id,))
        row = await cur.fetchone()
        assert row is not None
        stored = pb.Node.FromString(row[0])
        cur = await conn.execute("SELECT payload FROM change_log WHERE index > %s", (start,))
        log_rows = [bytes(r[0]) for r in await cur.fetchall()]
    assert stored.secret_id == "" and stored.secret_hash == digest
    assert secret.encode() not in bytes(row[0])
    assert log_rows and all(secret.encode() not in r and digest.encode() not in r for r in log_rows)

    def clean(n: pb.Node) -> bool:
        return n.secret_id == "" and n.secret_hash == ""

    snapshot_nodes = [
        n async for chunk in stubs.state.Snapshot(state_pb2.SnapshotRequest()) for n in chunk.nodes
    ]
    assert [n.id for n in snapshot_nodes] == [node.id] and all(map(clean, snapshot_nodes))

    fed: list[pb.Node] = []
    subscription = stubs.state.Subscribe(state_pb2.SubscribeRequest(from_index=start))
    async for batch in subscription:
        fed.extend(e.node for e in batch.events if e.HasField("node"))
        if batch.index >= await app.db.latest_index():
            break
    subscription.cancel()
    assert fed and all(map(clean, fed))

    streamed: list[pb.Node] = []
    stream = stubs.event.Stream(
        event_pb2.EventStreamRequest(topics=[event_pb2.EventTopic(topic="Node")], from_index=start)
    )
    async for resp in stream:
        streamed.extend(e.node for e in resp.events if e.HasField("node"))
        if resp.index >= await app.db.latest_index():
            break
    stream.cancel()
    assert streamed and all(map(clean, streamed))

    got = await stubs.node.Get(node_pb2.NodeGetRequest(node_id=node.id))
    assert clean(got.node)
    listed = await stubs.node.List(node_pb2.NodeListRequest())
    assert secret not in str(listed) and digest not in str(listed)
    assert clean(app.feed.snapshot().nodes[node.id])  # nor the state's own copy
