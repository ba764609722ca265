"""The service catalog on a real state (issue 28): a client registers the
instances of its own allocs, reads find them by name (with tags, `choose`
and blocking queries), the state removes them when the alloc becomes
client-terminal or the node goes down, and every read and write is
ACL-checked (read-job for reads, the node secret for the client's writes,
submit-job or delete-service-registration for an operator's delete)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc
import pytest

from corral.domain import services
from corral.domain.structs import ClientStatus, NodeStatus
from corral.testing import mock
from corral.v1 import (
    event_pb2,
    event_pb2_grpc,
    job_pb2,
    job_pb2_grpc,
    node_pb2,
    node_pb2_grpc,
    query_pb2,
    service_pb2,
    service_pb2_grpc,
)
from corral.v1 import structs_pb2 as pb
from services.state.app import StateApp, StateSettings
from services.state.writes import nodes as node_writes
from tests.callers import bootstrap_tokens, user_channel
from tests.integration.state_api.settings import state_settings

POLICIES = {
    "reader": 'namespace "default" { policy = "read" }',
    "other-reader": 'namespace "other" { policy = "read" }',
    "deleter": 'namespace "default" { capabilities = ["delete-service-registration"] }',
}


class World:
    def __init__(self, app: StateApp) -> None:
        self.app = app
        self.address = app.server.bound_address
        self.channels: list[grpc.aio.Channel] = []
        self.tokens: dict[str, str] = {}
        self.nodes: list[pb.Node] = []
        self.jobs: dict[str, pb.Job] = {}

    def channel(self, token: str = "") -> grpc.aio.Channel:
        ch = user_channel(self.address, token)
        self.channels.append(ch)
        return ch

    def catalog(self, token: str = "management") -> service_pb2_grpc.ServiceRegistrationAsyncStub:
        return service_pb2_grpc.ServiceRegistrationStub(self.channel(self.tokens.get(token, "")))

    @property
    def node_catalog(self) -> service_pb2_grpc.ServiceRegistrationAsyncStub:
        """What a client agent dials: no ACL token, its node secret per call."""
        return service_pb2_grpc.ServiceRegistrationStub(self.channel(""))

    async def place(self, job_id: str, node: pb.Node, namespace: str = "default") -> pb.Allocation:
        """A running alloc of the job on the node, written straight to the database."""
        async with self.app.db.write() as tx:
            job = await tx.get_job(namespace, job_id)
            assert job is not None
            alloc = mock.alloc(job, node)
            tx.put_alloc(alloc, "AllocationUpdated")
        await self.app.feed.wait_visible(tx.index)
        return alloc


def reg(
    alloc: pb.Allocation, name: str = "web", port: int = 8080, **kw: object
) -> pb.ServiceRegistration:
    service = pb.Service(name=name, port_label="http")
    return pb.ServiceRegistration(
        id=services.registration_id(alloc.id, "web", service),
        service_name=name,
        alloc_id=alloc.id,
        address="10.0.0.7",
        port=port,
        **kw,  # type: ignore[arg-type]
    )


def _settings(pg_dsn: str) -> StateSettings:
    """ACLs on, and heartbeat TTLs far beyond the module's run: the nodes
    here never heartbeat, and one marked down mid-test would lose its
    services for a reason the test is not about."""
    settings = state_settings(pg_dsn, acl=True)
    beats = settings.heartbeat.model_copy(update={"min_ttl": 3600.0})
    return settings.model_copy(update={"heartbeat": beats})


@pytest.fixture(scope="module")
async def state_app(pg_dsn: str) -> AsyncIterator[StateApp]:
    app = StateApp(_settings(pg_dsn))
    await app.start()
    try:
        yield app
    finally:
        await app.stop()


@pytest.fixture(scope="module")
async def world(state_app: StateApp) -> AsyncIterator[World]:
    w = World(state_app)
    mgmt = await bootstrap_tokens(w.channel, POLICIES, w.tokens)
    for _ in range(2):
        node = mock.node()
        await node_pb2_grpc.NodeStub(mgmt).Register(node_pb2.NodeRegisterRequest(node=node))
        w.nodes.append(node)
    jobs = job_pb2_grpc.JobStub(mgmt)
    for namespace in ("default", "other"):
        for job_id in ("web", "api"):
            job = mock.job(job_id=job_id, count=1)
            job.namespace = namespace
            await jobs.Register(job_pb2.JobRegisterRequest(job=job))
    try:
        yield w
    finally:
        for ch in w.channels:
            await ch.close()


async def upsert(w: World, node: pb.Node, *regs: pb.ServiceRegistration) -> int:
    resp = await w.node_catalog.Upsert(
        service_pb2.ServiceUpsertRequest(
            node_id=node.id, secret_id=node.secret_id, registrations=list(regs)
        )
    )
    return resp.index


async def instances(
    w: World, name: str, namespace: str = "default", **kw: object
) -> list[pb.ServiceRegistration]:
    resp = await w.catalog().GetService(
        service_pb2.ServiceGetRequest(
            service_name=name,
            query=query_pb2.QueryOptions(namespace=namespace),
            **kw,  # type: ignore[arg-type]
        )
    )
    return list(resp.registrations)


async def test_a_client_registers_its_allocs_services(world: World) -> None:
    node = world.nodes[0]
    alloc = await world.place("web", node)
    sent = reg(alloc, tags=["v1", "http"], job_id="not-the-job", namespace="other")
    await upsert(world, node, sent)
    (found,) = await instances(world, "web")
    # namespace, job and datacenter are the stored alloc's and node's, not the request's
    assert (found.namespace, found.job_id, found.node_id, found.datacenter) == (
        "default", "web", node.id, node.datacenter,
    )  # fmt: skip
    assert (found.address, found.port, list(found.tags)) == ("10.0.0.7", 8080, ["v1", "http"])
    assert found.create_index == found.modify_index > 0
    # the same instance again is not rewritten
    before = await world.app.db.latest_index()
    await upsert(world, node, sent)
    assert await world.app.db.latest_index() == before
    # a changed port is an update, keeping create_index
    await upsert(world, node, reg(alloc, port=9090, tags=["v1", "http"]))
    (updated,) = await instances(world, "web")
    assert updated.port == 9090 and updated.create_index == found.create_index
    assert updated.modify_index > found.modify_index
    by_alloc = await world.catalog().ListByAlloc(
        service_pb2.ServiceListByAllocRequest(alloc_id=alloc.id[:8])
    )
    assert [r.id for r in by_alloc.registrations] == [found.id]
    by_job = await world.catalog().ListByJob(service_pb2.ServiceListByJobRequest(job_id="web"))
    assert [r.id for r in by_job.registrations] == [found.id]


async def test_a_node_registers_only_its_own_allocs(world: World) -> None:
    mine, other = world.nodes
    alloc = await world.place("api", mine)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await upsert(world, other, reg(alloc, name="api"))
    assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
    wrong = pb.Node(id=mine.id, secret_id="not-the-secret-of-this-node")
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await upsert(world, wrong, reg(alloc, name="api"))
    assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
    # an id that is not the alloc's cannot overwrite another alloc's instance
    forged = reg(alloc, name="api")
    forged.id = "_nomad-task-someone-else-web-api-http"
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await upsert(world, mine, forged)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "alloc" in (err.value.details() or "")
    bad = reg(alloc, name="api")
    bad.address = "0.0.0.0"
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await upsert(world, mine, bad)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert await instances(world, "api") == []


async def test_list_tags_choose_and_blocking_query(world: World) -> None:
    node = world.nodes[1]
    allocs = [await world.place("api", node) for _ in range(4)]
    for i, a in enumerate(allocs):
        await upsert(world, node, reg(a, name="db", port=5000 + i, tags=[f"t{i}", "db"]))
    listed = await world.catalog().List(service_pb2.ServiceListRequest())
    (ns,) = listed.namespaces
    stub = next(s for s in ns.services if s.service_name == "db")
    assert list(stub.tags) == ["db", "t0", "t1", "t2", "t3"]
    assert len(await instances(world, "db", tag="t2")) == 1
    chosen = await instances(world, "db", choose="2|alloc-a")
    again = await instances(world, "db", choose="2|alloc-a")
    assert len(chosen) == 2 and [r.id for r in chosen] == [r.id for r in again]
    expected = services.choose(await instances(world, "db"), "2|alloc-a")
    assert [r.id for r in chosen] == [r.id for r in expected]
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await instances(world, "db", choose="two|x")
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    # a blocking query wakes on a new instance
    first = await world.catalog().GetService(service_pb2.ServiceGetRequest(service_name="db"))
    waiting = asyncio.ensure_future(
        world.catalog().GetService(
            service_pb2.ServiceGetRequest(
                service_name="db",
                query=query_pb2.QueryOptions(min_index=first.meta.index, wait_ms=20_000),
            )
        )
    )
    await asyncio.sleep(0)
    late = await world.place("api", node)
    await upsert(world, node, reg(late, name="db", port=5999))
    woken = await asyncio.wait_for(waiting, 20)
    assert woken.meta.index > first.meta.index
    assert 5999 in {r.port for r in woken.registrations}


async def test_a_terminal_alloc_takes_its_instances_along(world: World) -> None:
    node = world.nodes[0]
    alloc = await world.place("web", node)
    registered = await upsert(world, node, reg(alloc, name="gone-soon"))
    events = event_pb2_grpc.EventStub(world.channel(world.tokens["management"])).Stream(
        event_pb2.EventStreamRequest(
            topics=[event_pb2.EventTopic(topic="Service", key="gone-soon")],
            from_index=registered - 1,
        )
    )
    done = pb.Allocation(id=alloc.id, node_id=node.id, client_status=ClientStatus.COMPLETE)
    await node_pb2_grpc.NodeStub(world.channel()).UpdateAlloc(
        node_pb2.NodeUpdateAllocRequest(allocs=[done], secret_id=node.secret_id)
    )
    assert await instances(world, "gone-soon") == []
    seen: list[tuple[str, bool]] = []
    async for resp in events:
        seen += [(e.type, e.deleted) for e in resp.events]
        if len(seen) >= 2:
            break
    events.cancel()
    assert seen == [("ServiceRegistration", False), ("ServiceDeregistration", True)]
    # a registration arriving after the alloc's terminal update is not kept
    await upsert(world, node, reg(alloc, name="gone-soon"))
    assert await instances(world, "gone-soon") == []


async def test_a_node_going_down_takes_its_instances_along(world: World) -> None:
    node = mock.node()
    mgmt = world.channel(world.tokens["management"])
    await node_pb2_grpc.NodeStub(mgmt).Register(node_pb2.NodeRegisterRequest(node=node))
    alloc = await world.place("web", node)
    await upsert(world, node, reg(alloc, name="on-a-node"))
    assert len(await instances(world, "on-a-node")) == 1
    async with world.app.db.write() as tx:
        await node_writes.update_status(tx, node.id, NodeStatus.DOWN, reason="test")
    await world.app.feed.wait_visible(tx.index)
    assert await instances(world, "on-a-node") == []
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await upsert(world, node, reg(alloc, name="on-a-node"))
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION


async def test_deregister_and_delete(world: World) -> None:
    node = world.nodes[0]
    alloc = await world.place("web", node)
    one, two = reg(alloc, name="pair"), reg(alloc, name="pair", port=1)
    two.id = two.id + "x"
    await upsert(world, node, one, two)
    await world.node_catalog.Deregister(
        service_pb2.ServiceDeregisterRequest(
            node_id=node.id, secret_id=node.secret_id, ids=[one.id, "unknown-id"]
        )
    )
    assert [r.id for r in await instances(world, "pair")] == [two.id]
    with pytest.raises(grpc.aio.AioRpcError) as err:  # only its own node deregisters it
        other = world.nodes[1]
        await world.node_catalog.Deregister(
            service_pb2.ServiceDeregisterRequest(
                node_id=other.id, secret_id=other.secret_id, ids=[two.id]
            )
        )
    assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
    with pytest.raises(grpc.aio.AioRpcError) as err:  # read is not delete
        await world.catalog("reader").DeleteByID(service_pb2.ServiceDeleteByIDRequest(id=two.id))
    assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
    await world.catalog("deleter").DeleteByID(service_pb2.ServiceDeleteByIDRequest(id=two.id))
    assert await instances(world, "pair") == []
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await world.catalog().DeleteByID(service_pb2.ServiceDeleteByIDRequest(id=two.id))
    assert err.value.code() == grpc.StatusCode.NOT_FOUND


async def test_reads_need_read_job_in_the_namespace(world: World) -> None:
    node = world.nodes[1]
    mine = await world.place("web", node, namespace="other")
    await upsert(world, node, reg(mine, name="elsewhere"))
    reader, other = world.catalog("reader"), world.catalog("other-reader")
    for stub in (world.catalog("anonymous"), other):
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stub.List(service_pb2.ServiceListRequest())
        assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stub.GetService(service_pb2.ServiceGetRequest(service_name="web"))
        assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
    # `*` lists what the token may read, nothing else
    everything = query_pb2.QueryOptions(namespace="*")
    seen = await other.List(service_pb2.ServiceListRequest(query=everything))
    assert [ns.namespace for ns in seen.namespaces] == ["other"]
    assert [s.service_name for s in seen.namespaces[0].services] == ["elsewhere"]
    seen = await reader.List(service_pb2.ServiceListRequest(query=everything))
    assert [ns.namespace for ns in seen.namespaces] == ["default"]
    none = await world.catalog("anonymous").List(service_pb2.ServiceListRequest(query=everything))
    assert list(none.namespaces) == []
    found = await other.GetService(
        service_pb2.ServiceGetRequest(
            service_name="elsewhere", query=query_pb2.QueryOptions(namespace="other")
        )
    )
    assert [r.alloc_id for r in found.registrations] == [mine.id]
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await reader.ListByAlloc(service_pb2.ServiceListByAllocRequest(alloc_id=mine.id))
    assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED


async def test_the_catalog_survives_a_state_restart(world: World, pg_dsn: str) -> None:
    """A second state process loads the registrations from the table."""
    fresh = StateApp(_settings(pg_dsn))
    await fresh.start()
    try:
        snap = fresh.feed.snapshot()
        mine = world.app.feed.snapshot()
        assert {k: r.SerializeToString() for k, r in snap.services.items()} == {
            k: r.SerializeToString() for k, r in mine.services.items()
        }
        assert snap.table_index("service_registrations") == mine.table_index(
            "service_registrations"
        )
    finally:
        await fresh.stop()
