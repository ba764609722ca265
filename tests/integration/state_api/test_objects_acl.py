"""Namespaces, node pools and scaling policies with ACLs on, as Nomad
decides: namespace reads filtered by the token's namespace rules and writes
for management tokens; `node_pool` rules for every pool call; scaling
policies for list-scaling-policies (or list-jobs and read-job); Job.Scale
for scale-job or submit-job; Job.ScaleStatus for read-job or
read-job-scaling."""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc
import pytest

from corral.testing import mock
from corral.v1 import (
    acl_pb2,
    acl_pb2_grpc,
    job_pb2,
    job_pb2_grpc,
    namespace_pb2,
    namespace_pb2_grpc,
    node_pool_pb2,
    node_pool_pb2_grpc,
    query_pb2,
    scaling_pb2,
    scaling_pb2_grpc,
)
from corral.v1 import structs_pb2 as pb
from services.state.app import StateApp
from tests.callers import user_channel
from tests.integration.state_api.test_scaling import scaled

ACL_ENABLED = True

POLICIES = {
    "team-reader": 'namespace "team" { policy = "read" }',
    "submitter": 'namespace "team" { capabilities = ["submit-job"] }',
    "autoscaler": 'namespace "team" { policy = "scale" }',
    "pool-reader": 'node_pool "gpu" { policy = "read" }\nnode { policy = "read" }',
    "pool-writer": 'node_pool "gpu-*" { policy = "write" }',
    "pool-denied": 'node_pool "*" { policy = "write" }\nnode_pool "gpu" { policy = "deny" }',
}


class World:
    def __init__(self, app: StateApp) -> None:
        self.address = app.server.bound_address
        self.channels: list[grpc.aio.Channel] = []
        self.tokens: dict[str, str] = {}

    def channel(self, who: str) -> grpc.aio.Channel:
        ch = user_channel(self.address, self.tokens.get(who, ""))
        self.channels.append(ch)
        return ch


@pytest.fixture(scope="module")
async def world(state_app: StateApp) -> AsyncIterator[World]:
    w = World(state_app)
    boot = await acl_pb2_grpc.ACLStub(w.channel("")).Bootstrap(acl_pb2.ACLBootstrapRequest())
    w.tokens["management"] = boot.token.secret_id
    mgmt = w.channel("management")
    await namespace_pb2_grpc.NamespaceStub(mgmt).Upsert(
        namespace_pb2.NamespaceUpsertRequest(
            namespaces=[pb.Namespace(name="team"), pb.Namespace(name="hidden")]
        )
    )
    await node_pool_pb2_grpc.NodePoolStub(mgmt).Upsert(
        node_pool_pb2.NodePoolUpsertRequest(node_pools=[pb.NodePool(name="gpu")])
    )
    acls = acl_pb2_grpc.ACLStub(mgmt)
    await acls.UpsertPolicies(
        acl_pb2.ACLUpsertPoliciesRequest(
            policies=[acl_pb2.ACLPolicy(name=n, rules=r) for n, r in POLICIES.items()]
        )
    )
    for name in POLICIES:
        resp = await acls.CreateToken(acl_pb2.ACLCreateTokenRequest(name=name, policies=[name]))
        w.tokens[name] = resp.token.secret_id
    job = scaled("web", vertical=False)
    job.namespace = "team"
    await job_pb2_grpc.JobStub(mgmt).Register(job_pb2.JobRegisterRequest(job=job))
    try:
        yield w
    finally:
        for ch in w.channels:
            await ch.close()


async def _denied(call: object) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await call  # type: ignore[misc]
    assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED, err.value.details()


TEAM = query_pb2.QueryOptions(namespace="team")


async def test_namespaces_shown_by_the_tokens_rules(world: World) -> None:
    reader = namespace_pb2_grpc.NamespaceStub(world.channel("team-reader"))
    listed = await reader.List(namespace_pb2.NamespaceListRequest())
    assert [n.name for n in listed.namespaces] == ["team"]
    await reader.Get(namespace_pb2.NamespaceGetRequest(name="team"))
    await _denied(reader.Get(namespace_pb2.NamespaceGetRequest(name="hidden")))
    await _denied(
        reader.Upsert(namespace_pb2.NamespaceUpsertRequest(namespaces=[pb.Namespace(name="x")]))
    )
    await _denied(reader.Delete(namespace_pb2.NamespaceDeleteRequest(names=["hidden"])))
    anonymous = namespace_pb2_grpc.NamespaceStub(world.channel(""))
    assert not (await anonymous.List(namespace_pb2.NamespaceListRequest())).namespaces
    mgmt = namespace_pb2_grpc.NamespaceStub(world.channel("management"))
    everything = await mgmt.List(namespace_pb2.NamespaceListRequest())
    assert {"default", "hidden", "team"} <= {n.name for n in everything.namespaces}


async def test_node_pool_rules(world: World) -> None:
    reader = node_pool_pb2_grpc.NodePoolStub(world.channel("pool-reader"))
    listed = await reader.List(node_pool_pb2.NodePoolListRequest())
    assert [p.name for p in listed.node_pools] == ["gpu"]
    await reader.Get(node_pool_pb2.NodePoolGetRequest(name="gpu"))
    await reader.ListNodes(node_pool_pb2.NodePoolGetRequest(name="gpu"))
    await _denied(reader.Get(node_pool_pb2.NodePoolGetRequest(name="default")))
    await _denied(
        reader.Upsert(node_pool_pb2.NodePoolUpsertRequest(node_pools=[pb.NodePool(name="gpu")]))
    )
    writer = node_pool_pb2_grpc.NodePoolStub(world.channel("pool-writer"))
    await writer.Upsert(
        node_pool_pb2.NodePoolUpsertRequest(node_pools=[pb.NodePool(name="gpu-2", description="b")])
    )
    await _denied(
        writer.Upsert(node_pool_pb2.NodePoolUpsertRequest(node_pools=[pb.NodePool(name="cpu")]))
    )
    # ListNodes needs node:read as well
    await _denied(writer.ListNodes(node_pool_pb2.NodePoolGetRequest(name="gpu-2")))
    await writer.Delete(node_pool_pb2.NodePoolDeleteRequest(names=["gpu-2"]))
    denied = node_pool_pb2_grpc.NodePoolStub(world.channel("pool-denied"))
    names = {p.name for p in (await denied.List(node_pool_pb2.NodePoolListRequest())).node_pools}
    assert "gpu" not in names and "default" in names
    await _denied(denied.Get(node_pool_pb2.NodePoolGetRequest(name="gpu")))


async def test_scaling_policy_rules(world: World) -> None:
    autoscaler = scaling_pb2_grpc.ScalingStub(world.channel("autoscaler"))
    listed = await autoscaler.ListPolicies(scaling_pb2.ScalingPolicyListRequest(query=TEAM))
    assert [p.target["Job"] for p in listed.policies] == ["web"]
    got = await autoscaler.GetPolicy(scaling_pb2.ScalingPolicyGetRequest(id=listed.policies[0].id))
    assert got.policy.max == 5
    # read (list-jobs and read-job) may list them too
    reader = scaling_pb2_grpc.ScalingStub(world.channel("team-reader"))
    assert (await reader.ListPolicies(scaling_pb2.ScalingPolicyListRequest(query=TEAM))).policies
    nobody = scaling_pb2_grpc.ScalingStub(world.channel("pool-reader"))
    await _denied(nobody.ListPolicies(scaling_pb2.ScalingPolicyListRequest(query=TEAM)))
    await _denied(nobody.GetPolicy(scaling_pb2.ScalingPolicyGetRequest(id=listed.policies[0].id)))
    everything = await nobody.ListPolicies(
        scaling_pb2.ScalingPolicyListRequest(query=query_pb2.QueryOptions(namespace="*"))
    )
    assert not everything.policies


async def test_scale_and_scale_status_rules(world: World) -> None:
    scaler = job_pb2_grpc.JobStub(world.channel("autoscaler"))
    status = await scaler.ScaleStatus(job_pb2.JobGetRequest(job_id="web", query=TEAM))
    assert status.task_groups["web"].desired == 2
    await scaler.Scale(
        job_pb2.JobScaleRequest(job_id="web", namespace="team", group="web", count=3)
    )
    submitter = job_pb2_grpc.JobStub(world.channel("submitter"))
    await submitter.Scale(
        job_pb2.JobScaleRequest(job_id="web", namespace="team", group="web", count=2)
    )
    await _denied(submitter.ScaleStatus(job_pb2.JobGetRequest(job_id="web", query=TEAM)))
    reader = job_pb2_grpc.JobStub(world.channel("team-reader"))
    await reader.ScaleStatus(job_pb2.JobGetRequest(job_id="web", query=TEAM))
    await _denied(
        reader.Scale(job_pb2.JobScaleRequest(job_id="web", namespace="team", group="web", count=4))
    )
    # a job in a namespace the token has nothing in
    other = mock.job(job_id="x")
    await _denied(
        job_pb2_grpc.JobStub(world.channel("autoscaler")).Register(
            job_pb2.JobRegisterRequest(job=other)
        )
    )
