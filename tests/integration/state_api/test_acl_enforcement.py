"""ACL enforcement on the public API (issue 15): each capability allows
exactly what it names. A state that enforces ACLs; tokens of one policy
each call every RPC of a matrix, and the answer is PERMISSION_DENIED
exactly where the policy does not grant the RPC's capability. Objects of
another namespace stay out of reach, lists and the event stream show only
what the token may read, and a refused write leaves the index where it was."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
import pytest
from pydantic import SecretStr

from corral.security import transport
from corral.testing import mock
from corral.v1 import (
    acl_pb2,
    acl_pb2_grpc,
    alloc_pb2,
    alloc_pb2_grpc,
    event_pb2,
    event_pb2_grpc,
    job_pb2,
    job_pb2_grpc,
    node_pb2,
    node_pb2_grpc,
    operator_pb2,
    operator_pb2_grpc,
    query_pb2,
)
from corral.v1 import structs_pb2 as pb
from services.state.app import StateApp
from tests.callers import bootstrap_tokens, user_channel

POLICIES = {
    "reader": 'namespace "default" { policy = "read" }',
    "submitter": 'namespace "default" { capabilities = ["submit-job"] }',
    "dispatcher": 'namespace "default" { capabilities = ["dispatch-job"] }',
    "other-writer": 'namespace "other" { policy = "write" }',
    "node-reader": 'node { policy = "read" }',
    "node-writer": 'node { policy = "write" }',
    "operator-reader": 'operator { policy = "read" }',
    "operator-writer": 'operator { policy = "write" }',
    "denied-default": 'namespace "*" { policy = "read" }\nnamespace "default" { policy = "deny" }',
}


#: the package's `state_app` enforces ACLs for this module (conftest.py)
ACL_ENABLED = True


class World:
    """Ids of what the management token made, and a channel per token."""

    def __init__(self, app: StateApp) -> None:
        self.app = app
        self.address = app.server.bound_address
        self.channels: list[grpc.aio.Channel] = []
        self.tokens: dict[str, str] = {}
        self.node_id = ""
        self.alloc_id = ""
        self.other_alloc_id = ""

    def channel(self, token: str) -> grpc.aio.Channel:
        ch = user_channel(self.address, token)
        self.channels.append(ch)
        return ch


@pytest.fixture(scope="module")
async def world(state_app: StateApp) -> AsyncIterator[World]:
    w = World(state_app)
    mgmt = await bootstrap_tokens(w.channel, POLICIES, w.tokens)
    jobs = job_pb2_grpc.JobStub(mgmt)
    node = mock.node()
    node.secret_id = "node-secret-0123456789"
    await node_pb2_grpc.NodeStub(mgmt).Register(node_pb2.NodeRegisterRequest(node=node))
    w.node_id = node.id
    for namespace in ("default", "other"):
        job = mock.job(job_id="web", count=1)
        job.namespace = namespace
        await jobs.Register(job_pb2.JobRegisterRequest(job=job))
        dispatchable = mock.job(job_id="batchy", count=1, job_type="batch")
        dispatchable.namespace = namespace
        dispatchable.parameterized.payload = "optional"
        await jobs.Register(job_pb2.JobRegisterRequest(job=dispatchable))
    w.alloc_id, w.other_alloc_id = await _place(state_app, node)
    try:
        yield w
    finally:
        for ch in w.channels:
            await ch.close()


async def _place(app: StateApp, node: pb.Node) -> tuple[str, str]:
    """An alloc of `web` in each namespace, written straight to the database."""
    ids = []
    async with app.db.write() as tx:
        for namespace in ("default", "other"):
            job = await tx.get_job(namespace, "web")
            assert job is not None
            alloc = mock.alloc(job, node)
            tx.put_alloc(alloc, "AllocationUpdated")
            ids.append(alloc.id)
    await app.feed.wait_for_index(await app.db.latest_index(), 30)
    return ids[0], ids[1]


Call = Callable[[grpc.aio.Channel, World], Awaitable[Any]]

#: (name, call) for the matrix; each call acts in namespace "default"
CALLS: list[tuple[str, Call]] = [
    ("job-get", lambda ch, w: job_pb2_grpc.JobStub(ch).Get(job_pb2.JobGetRequest(job_id="web"))),
    ("job-list", lambda ch, w: job_pb2_grpc.JobStub(ch).List(job_pb2.JobListRequest())),
    (
        "job-register",
        lambda ch, w: job_pb2_grpc.JobStub(ch).Register(
            job_pb2.JobRegisterRequest(job=mock.job(job_id="web", count=2))
        ),
    ),
    (
        "job-dispatch",
        lambda ch, w: job_pb2_grpc.JobStub(ch).Dispatch(
            job_pb2.JobDispatchRequest(job_id="batchy")
        ),
    ),
    (
        "alloc-get",
        lambda ch, w: alloc_pb2_grpc.AllocStub(ch).Get(
            alloc_pb2.AllocGetRequest(alloc_id=w.alloc_id)
        ),
    ),
    ("node-list", lambda ch, w: node_pb2_grpc.NodeStub(ch).List(node_pb2.NodeListRequest())),
    (
        "node-eligibility",
        lambda ch, w: node_pb2_grpc.NodeStub(ch).UpdateEligibility(
            node_pb2.NodeUpdateEligibilityRequest(node_id=w.node_id, eligibility="eligible")
        ),
    ),
    (
        "operator-get",
        lambda ch, w: operator_pb2_grpc.OperatorStub(ch).SchedulerGetConfiguration(
            operator_pb2.SchedulerGetConfigurationRequest()
        ),
    ),
    (
        "operator-set",
        lambda ch, w: _set_same_config(operator_pb2_grpc.OperatorStub(ch), w),
    ),
]  # fmt: skip


async def _set_same_config(stub: operator_pb2_grpc.OperatorAsyncStub, w: World) -> Any:
    mgmt = operator_pb2_grpc.OperatorStub(w.channel(w.tokens["management"]))
    cfg = await mgmt.SchedulerGetConfiguration(operator_pb2.SchedulerGetConfigurationRequest())
    return await stub.SchedulerSetConfiguration(
        operator_pb2.SchedulerSetConfigurationRequest(config=cfg.config)
    )


#: what each token may do of CALLS (everything else: PERMISSION_DENIED)
ALLOWED = {
    "management": {name for name, _ in CALLS},
    "reader": {"job-get", "job-list", "alloc-get"},
    "submitter": {"job-register"},
    "dispatcher": {"job-dispatch"},
    "other-writer": set(),
    "node-reader": {"node-list"},
    "node-writer": {"node-list", "node-eligibility"},
    "operator-reader": {"operator-get"},
    "operator-writer": {"operator-get", "operator-set"},
    "denied-default": set(),
    "anonymous": set(),
}


async def _denied(call: Awaitable[Any]) -> bool:
    try:
        await call
    except grpc.aio.AioRpcError as exc:
        if exc.code() == grpc.StatusCode.PERMISSION_DENIED:
            return True
        # allowed through the gate; the handler's answer is its own business
        assert exc.code() != grpc.StatusCode.INTERNAL, exc.details()
    return False


@pytest.mark.parametrize("token", sorted(ALLOWED))
async def test_each_token_may_do_exactly_what_its_policy_grants(
    world: World, state_app: StateApp, token: str
) -> None:
    ch = world.channel(world.tokens.get(token, ""))
    for name, call in CALLS:
        before = await state_app.db.latest_index()
        denied = await _denied(call(ch, world))
        assert denied == (name not in ALLOWED[token]), f"{token} {name}"
        if denied:
            assert await state_app.db.latest_index() == before, f"{token} {name} wrote"


async def test_a_token_of_another_namespace_sees_only_that_namespace(world: World) -> None:
    ch = world.channel(world.tokens["other-writer"])
    jobs = job_pb2_grpc.JobStub(ch)
    everything = query_pb2.QueryOptions(namespace="*")
    listed = await jobs.List(job_pb2.JobListRequest(query=everything))
    assert {(j.namespace, j.id) for j in listed.jobs} == {("other", "web"), ("other", "batchy")}
    other = query_pb2.QueryOptions(namespace="other")
    assert (await jobs.Get(job_pb2.JobGetRequest(job_id="web", query=other))).job.namespace == (
        "other"
    )
    allocs = alloc_pb2_grpc.AllocStub(ch)
    listed_allocs = await allocs.List(alloc_pb2.AllocListRequest(query=everything))
    assert [a.id for a in listed_allocs.allocs] == [world.other_alloc_id]
    assert await _denied(allocs.Get(alloc_pb2.AllocGetRequest(alloc_id=world.alloc_id)))
    assert not await _denied(allocs.Get(alloc_pb2.AllocGetRequest(alloc_id=world.other_alloc_id)))
    assert await _denied(allocs.Stop(alloc_pb2.AllocStopRequest(alloc_id=world.alloc_id)))


async def test_the_event_stream_shows_only_readable_namespaces(
    world: World, state_app: StateApp
) -> None:
    start = await state_app.db.latest_index()
    mgmt = job_pb2_grpc.JobStub(world.channel(world.tokens["management"]))
    for namespace in ("default", "other"):
        job = mock.job(job_id="streamed", count=1)
        job.namespace = namespace
        last = await mgmt.Register(job_pb2.JobRegisterRequest(job=job))
    seen: list[str] = []
    stream = event_pb2_grpc.EventStub(world.channel(world.tokens["other-writer"])).Stream(
        event_pb2.EventStreamRequest(from_index=start)
    )

    async def read() -> None:
        async for resp in stream:
            seen.extend(e.namespace for e in resp.events)
            if resp.index >= last.index:
                return

    try:
        await asyncio.wait_for(read(), 30)
    finally:
        stream.cancel()
    assert seen and set(seen) == {"other"}


async def test_a_server_acts_for_the_cluster_without_a_token(world: World) -> None:
    """The broker launches periodic children and promotes canaries through the
    public API: a server identity (here the server token) holds every
    capability, and a forged one holds none."""
    async with transport.dial(world.address) as ch:
        for name, call in CALLS:
            assert not await _denied(call(ch, world)), name
    forged = transport.current().model_copy(update={"server_token": SecretStr("forged")})
    async with transport.dial(world.address, settings=forged) as ch:
        assert await _denied(CALLS[0][1](ch, world))


async def test_node_allocations_show_only_namespaces_the_token_may_read(world: World) -> None:
    """Issue 26, finding 3: node:read shows the node, and of its allocs only
    those of namespaces where the token has read-job, as Nomad's
    Node.GetAllocs (before, every namespace's allocs on the node)."""
    acls = acl_pb2_grpc.ACLStub(world.channel(world.tokens["management"]))
    made = await acls.CreateToken(
        acl_pb2.ACLCreateTokenRequest(
            name="node-and-other", policies=["node-reader", "other-writer"]
        )
    )
    both = node_pb2_grpc.NodeStub(world.channel(made.token.secret_id))
    request = node_pb2.NodeGetRequest(node_id=world.node_id, all=True)
    shown = await both.Allocations(request)
    assert [a.id for a in shown.allocs] == [world.other_alloc_id]
    # node:read alone: the node's allocs of no namespace
    node_only = node_pb2_grpc.NodeStub(world.channel(world.tokens["node-reader"]))
    assert list((await node_only.Allocations(request)).allocs) == []
    # without node:read at all, refused as before
    reader = node_pb2_grpc.NodeStub(world.channel(world.tokens["reader"]))
    assert await _denied(reader.Allocations(request))
    everything = node_pb2_grpc.NodeStub(world.channel(world.tokens["management"]))
    all_ids = {a.id for a in (await everything.Allocations(request)).allocs}
    assert all_ids == {world.alloc_id, world.other_alloc_id}


async def test_scale_and_periodic_force_take_nomads_alternatives(world: World) -> None:
    """Nomad's Job.Scale takes scale-job or submit-job, Periodic.Force
    dispatch-job or submit-job: a token with the other one is not refused
    at the door (the handler answers on its own terms)."""
    from corral.v1 import periodic_pb2, periodic_pb2_grpc

    scale = job_pb2.JobScaleRequest(job_id="web", group="web", count=1)
    submitter = job_pb2_grpc.JobStub(world.channel(world.tokens["submitter"]))
    assert not await _denied(submitter.Scale(scale))
    dispatcher = job_pb2_grpc.JobStub(world.channel(world.tokens["dispatcher"]))
    assert await _denied(dispatcher.Scale(scale))
    force = periodic_pb2.PeriodicForceRequest(job_id="web")
    for token in ("dispatcher", "submitter"):
        stub = periodic_pb2_grpc.PeriodicStub(world.channel(world.tokens[token]))
        assert not await _denied(stub.Force(force)), token
    reader = periodic_pb2_grpc.PeriodicStub(world.channel(world.tokens["reader"]))
    assert await _denied(reader.Force(force))


async def test_a_refusal_on_an_object_named_by_id_does_not_say_where_it_lives(
    world: World,
) -> None:
    """Found by issue 26's namespace audit: refusing an alloc named by id
    said "read-job in namespace 'default'", telling a token of another
    namespace where the object lives."""
    allocs = alloc_pb2_grpc.AllocStub(world.channel(world.tokens["other-writer"]))
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await allocs.Get(alloc_pb2.AllocGetRequest(alloc_id=world.alloc_id))
    assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "default" not in (refused.value.details() or "")
