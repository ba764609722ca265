"""Namespaces and node pools against a real state service and PostgreSQL:
the built-in objects, the writes and the refusals (each leaving the index
where it was), what a namespace admits of a job, and a node registering
in a pool that does not exist."""

from __future__ import annotations

from collections.abc import Awaitable

import grpc
import pytest

from corral.testing import mock
from corral.v1 import (
    acl_pb2,
    job_pb2,
    job_pb2_grpc,
    namespace_pb2,
    namespace_pb2_grpc,
    node_pb2,
    node_pb2_grpc,
    node_pool_pb2,
    node_pool_pb2_grpc,
    query_pb2,
)
from corral.v1 import structs_pb2 as pb
from services.state.app import StateApp
from services.state.writes.acl import upsert_policies


async def refused(
    state_app: StateApp, call: Awaitable[object], code: grpc.StatusCode, needle: str
) -> None:
    """The call fails with `code`, saying `needle`, and writes nothing."""
    before = await state_app.db.latest_index()
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await call
    assert err.value.code() == code, err.value.details()
    assert needle in (err.value.details() or ""), err.value.details()
    assert await state_app.db.latest_index() == before


def _stubs(
    channel: grpc.aio.Channel,
) -> tuple[
    namespace_pb2_grpc.NamespaceAsyncStub,
    node_pool_pb2_grpc.NodePoolAsyncStub,
    job_pb2_grpc.JobAsyncStub,
]:
    return (
        namespace_pb2_grpc.NamespaceStub(channel),
        node_pool_pb2_grpc.NodePoolStub(channel),
        job_pb2_grpc.JobStub(channel),
    )


async def _upsert_ns(stub: namespace_pb2_grpc.NamespaceAsyncStub, *items: pb.Namespace) -> int:
    resp = await stub.Upsert(namespace_pb2.NamespaceUpsertRequest(namespaces=list(items)))
    return int(resp.index)


async def _upsert_pool(stub: node_pool_pb2_grpc.NodePoolAsyncStub, *items: pb.NodePool) -> int:
    resp = await stub.Upsert(node_pool_pb2.NodePoolUpsertRequest(node_pools=list(items)))
    return int(resp.index)


def _job(job_id: str, namespace: str = "default", pool: str = "") -> pb.Job:
    j = mock.job(job_id=job_id, count=1)
    j.namespace = namespace
    j.node_pool = pool
    return j


# ------------------------------------------------------------ built-ins


async def test_the_built_in_objects_exist(channel: grpc.aio.Channel) -> None:
    namespaces, pools, _ = _stubs(channel)
    listed = await namespaces.List(namespace_pb2.NamespaceListRequest())
    assert "default" in [n.name for n in listed.namespaces]
    got = await namespaces.Get(namespace_pb2.NamespaceGetRequest(name="default"))
    assert got.namespace.description == "Default shared namespace"
    names = [p.name for p in (await pools.List(node_pool_pb2.NodePoolListRequest())).node_pools]
    assert {"all", "default"} <= set(names)


async def test_built_ins_cannot_be_changed_or_deleted(
    state_app: StateApp, channel: grpc.aio.Channel
) -> None:
    namespaces, pools, _ = _stubs(channel)
    for name in ("all", "default"):
        await refused(
            state_app,
            pools.Upsert(node_pool_pb2.NodePoolUpsertRequest(node_pools=[pb.NodePool(name=name)])),
            grpc.StatusCode.INVALID_ARGUMENT,
            f"modifying node pool {name!r} is not allowed",
        )
        await refused(
            state_app,
            pools.Delete(node_pool_pb2.NodePoolDeleteRequest(names=[name])),
            grpc.StatusCode.INVALID_ARGUMENT,
            f"deleting node pool {name!r} is not allowed",
        )
    await refused(
        state_app,
        namespaces.Delete(namespace_pb2.NamespaceDeleteRequest(names=["default"])),
        grpc.StatusCode.INVALID_ARGUMENT,
        "the default namespace cannot be deleted",
    )


# ------------------------------------------------------------ namespaces


async def test_a_job_needs_its_namespace(state_app: StateApp, channel: grpc.aio.Channel) -> None:
    namespaces, _, jobs = _stubs(channel)
    await refused(
        state_app,
        jobs.Register(job_pb2.JobRegisterRequest(job=_job("web", "team-a"))),
        grpc.StatusCode.INVALID_ARGUMENT,
        "job.namespace: job 'web' is in nonexistent namespace 'team-a'",
    )
    index = await _upsert_ns(
        namespaces, pb.Namespace(name="team-a", description="A", meta={"owner": "a"})
    )
    got = await namespaces.Get(namespace_pb2.NamespaceGetRequest(name="team-a"))
    assert got.namespace.create_index == got.namespace.modify_index == index
    assert dict(got.namespace.meta) == {"owner": "a"}
    reg = await jobs.Register(job_pb2.JobRegisterRequest(job=_job("web", "team-a")))
    stored = await jobs.Get(
        job_pb2.JobGetRequest(job_id="web", query=query_pb2.QueryOptions(namespace="team-a"))
    )
    assert reg.eval_id and stored.job.node_pool == "default"


async def test_an_unchanged_upsert_writes_nothing(
    state_app: StateApp, channel: grpc.aio.Channel
) -> None:
    namespaces, _, _ = _stubs(channel)
    await _upsert_ns(namespaces, pb.Namespace(name="steady"))
    before = await state_app.db.latest_index()
    again = await _upsert_ns(namespaces, pb.Namespace(name="steady"))
    assert again == before == await state_app.db.latest_index()


@pytest.mark.parametrize(
    ("ns", "needle"),
    [
        (pb.Namespace(name="bad_name"), "namespaces[0].name: invalid namespace 'bad_name'"),
        (pb.Namespace(name="d", description="x" * 300), "description: invalid namespace"),
        (
            pb.Namespace(
                name="d",
                node_pool_config=pb.NamespaceNodePoolConfiguration(default="no-such-pool"),
            ),
            "node pool 'no-such-pool' does not exist",
        ),
    ],
)
async def test_bad_namespaces_are_refused(
    state_app: StateApp, channel: grpc.aio.Channel, ns: pb.Namespace, needle: str
) -> None:
    namespaces, _, _ = _stubs(channel)
    await refused(
        state_app,
        namespaces.Upsert(namespace_pb2.NamespaceUpsertRequest(namespaces=[ns])),
        grpc.StatusCode.INVALID_ARGUMENT,
        needle,
    )


async def test_a_namespace_holding_live_jobs_is_not_deleted(
    state_app: StateApp, channel: grpc.aio.Channel
) -> None:
    namespaces, _, jobs = _stubs(channel)
    await _upsert_ns(namespaces, pb.Namespace(name="busy"))
    await jobs.Register(job_pb2.JobRegisterRequest(job=_job("api", "busy")))
    await refused(
        state_app,
        namespaces.Delete(namespace_pb2.NamespaceDeleteRequest(names=["busy"])),
        grpc.StatusCode.FAILED_PRECONDITION,
        "namespace 'busy' contains at least one non-terminal job 'api'",
    )
    # stopped with nothing placed, the job is dead: the namespace may go
    await jobs.Deregister(job_pb2.JobDeregisterRequest(job_id="api", namespace="busy"))
    await namespaces.Delete(namespace_pb2.NamespaceDeleteRequest(names=["busy"]))
    await refused(
        state_app,
        namespaces.Get(namespace_pb2.NamespaceGetRequest(name="busy")),
        grpc.StatusCode.NOT_FOUND,
        "namespace 'busy' not found",
    )
    await refused(
        state_app,
        namespaces.Delete(namespace_pb2.NamespaceDeleteRequest(names=["busy"])),
        grpc.StatusCode.NOT_FOUND,
        "namespace 'busy' not found",
    )


async def test_node_pool_config_of_a_namespace(
    state_app: StateApp, channel: grpc.aio.Channel
) -> None:
    namespaces, pools, jobs = _stubs(channel)
    await _upsert_pool(pools, pb.NodePool(name="gpu"), pb.NodePool(name="batch-1"))
    cfg = pb.NamespaceNodePoolConfiguration(default="gpu", allowed=pb.StringList(values=[]))
    await _upsert_ns(namespaces, pb.Namespace(name="ml", node_pool_config=cfg))
    # no pool named: the namespace's default
    await jobs.Register(job_pb2.JobRegisterRequest(job=_job("train", "ml")))
    got = await jobs.Get(
        job_pb2.JobGetRequest(job_id="train", query=query_pb2.QueryOptions(namespace="ml"))
    )
    assert got.job.node_pool == "gpu"
    # an empty allowed list: the default pool only
    await refused(
        state_app,
        jobs.Register(job_pb2.JobRegisterRequest(job=_job("other", "ml", "batch-1"))),
        grpc.StatusCode.INVALID_ARGUMENT,
        "node pool 'batch-1' is not allowed in namespace 'ml'",
    )
    await refused(
        state_app,
        jobs.Register(job_pb2.JobRegisterRequest(job=_job("other", "ml", "nowhere"))),
        grpc.StatusCode.INVALID_ARGUMENT,
        "job 'other' is in nonexistent node pool 'nowhere'",
    )
    # a pool a namespace names as its default is not deleted
    await jobs.Deregister(job_pb2.JobDeregisterRequest(job_id="train", namespace="ml", purge=True))
    await refused(
        state_app,
        pools.Delete(node_pool_pb2.NodePoolDeleteRequest(names=["gpu"])),
        grpc.StatusCode.FAILED_PRECONDITION,
        "node pool 'gpu' is the default node pool of namespace(s) ml",
    )
    denied = pb.NamespaceNodePoolConfiguration(denied=pb.StringList(values=["batch-*"]))
    await _upsert_ns(namespaces, pb.Namespace(name="ml", node_pool_config=denied))
    await refused(
        state_app,
        jobs.Register(job_pb2.JobRegisterRequest(job=_job("other", "ml", "batch-1"))),
        grpc.StatusCode.INVALID_ARGUMENT,
        "node pool 'batch-1' is not allowed in namespace 'ml'",
    )
    await jobs.Register(job_pb2.JobRegisterRequest(job=_job("other", "ml", "gpu")))


async def test_namespace_capabilities(state_app: StateApp, channel: grpc.aio.Channel) -> None:
    namespaces, _, jobs = _stubs(channel)
    caps = pb.NamespaceCapabilities(disabled_task_drivers=["mock"])
    await _upsert_ns(namespaces, pb.Namespace(name="locked", capabilities=caps))
    await refused(
        state_app,
        jobs.Register(job_pb2.JobRegisterRequest(job=_job("m", "locked"))),
        grpc.StatusCode.INVALID_ARGUMENT,
        "task driver(s) 'mock' not allowed in namespace 'locked'",
    )


async def test_an_acl_policy_must_name_namespaces_that_exist(state_app: StateApp) -> None:
    """ACLs are off in this module: the policy write is tried directly."""
    policy = acl_pb2.ACLPolicy(name="p", rules='namespace "ghost" { policy = "read" }')
    with pytest.raises(Exception, match='namespace "ghost" does not exist'):
        async with state_app.ctx.write() as tx:
            await upsert_policies(tx, [policy])
    globbed = acl_pb2.ACLPolicy(name="p", rules='namespace "ghost-*" { policy = "read" }')
    async with state_app.ctx.write() as tx:
        await upsert_policies(tx, [globbed])


# ------------------------------------------------------------ node pools


async def test_a_node_registering_in_a_new_pool_creates_it(
    state_app: StateApp, channel: grpc.aio.Channel
) -> None:
    _, pools, _ = _stubs(channel)
    nodes = node_pb2_grpc.NodeStub(channel)
    node = mock.node()
    node.node_pool = "edge"
    await nodes.Register(node_pb2.NodeRegisterRequest(node=node))
    got = await pools.Get(node_pool_pb2.NodePoolGetRequest(name="edge"))
    assert got.node_pool.name == "edge"
    listed = await pools.ListNodes(node_pool_pb2.NodePoolGetRequest(name="edge"))
    assert [n.id for n in listed.nodes] == [node.id]
    everyone = await pools.ListNodes(node_pool_pb2.NodePoolGetRequest(name="all"))
    assert node.id in [n.id for n in everyone.nodes]
    await refused(
        state_app,
        pools.Delete(node_pool_pb2.NodePoolDeleteRequest(names=["edge"])),
        grpc.StatusCode.FAILED_PRECONDITION,
        f"node pool 'edge' has nodes (node {node.id})",
    )
    bad = mock.node()
    bad.node_pool = "all"
    await refused(
        state_app,
        nodes.Register(node_pb2.NodeRegisterRequest(node=bad)),
        grpc.StatusCode.INVALID_ARGUMENT,
        "node is not allowed to register in node pool 'all'",
    )


async def test_pool_writes_reads_and_refusals(
    state_app: StateApp, channel: grpc.aio.Channel
) -> None:
    _, pools, jobs = _stubs(channel)
    spread = pb.NodePoolSchedulerConfiguration(
        scheduler_algorithm="spread", memory_oversubscription_enabled=True
    )
    index = await _upsert_pool(
        pools, pb.NodePool(name="web-tier", description="Web", scheduler_config=spread)
    )
    got = (await pools.Get(node_pool_pb2.NodePoolGetRequest(name="web-tier"))).node_pool
    assert got.modify_index == index and got.scheduler_config == spread
    await refused(
        state_app,
        pools.Upsert(
            node_pool_pb2.NodePoolUpsertRequest(
                node_pools=[
                    pb.NodePool(
                        name="x",
                        scheduler_config=pb.NodePoolSchedulerConfiguration(
                            scheduler_algorithm="random"
                        ),
                    )
                ]
            )
        ),
        grpc.StatusCode.INVALID_ARGUMENT,
        "unknown algorithm 'random'",
    )
    await jobs.Register(job_pb2.JobRegisterRequest(job=_job("front", pool="web-tier")))
    listed = await pools.ListJobs(node_pool_pb2.NodePoolGetRequest(name="web-tier"))
    assert [j.id for j in listed.jobs] == ["front"]
    await refused(
        state_app,
        pools.Delete(node_pool_pb2.NodePoolDeleteRequest(names=["web-tier"])),
        grpc.StatusCode.FAILED_PRECONDITION,
        "node pool 'web-tier' has non-terminal jobs",
    )
    await jobs.Deregister(job_pb2.JobDeregisterRequest(job_id="front"))
    await pools.Delete(node_pool_pb2.NodePoolDeleteRequest(names=["web-tier"]))
    await refused(
        state_app,
        pools.Get(node_pool_pb2.NodePoolGetRequest(name="web-tier")),
        grpc.StatusCode.NOT_FOUND,
        "node pool 'web-tier' not found",
    )
