"""The public `Node` service (proto/corral/v1/node.proto): what clients call
(Register, UpdateStatus — the heartbeat —, UpdateAlloc, GetClientAllocs)
and what operators call (List, Get, UpdateDrain, UpdateEligibility).

Every client call carries the node's secret id: an empty one is refused
before anything is read, a wrong one on the row the write reads (or, for
what is served from the feed's snapshot, through `ctx.node_secrets`); see
services/state/node_identity.py."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from typing import Any

import grpc

from corral.domain import structs
from corral.domain.errors import InvalidArgument, NotFound
from corral.domain.store import StateSnapshot
from corral.domain.structs import NodeStatus
from corral.runtime.rpc import LeaderChannel
from corral.runtime.server import GrpcServer
from corral.security import access
from corral.v1 import node_pb2, node_pb2_grpc
from corral.v1 import structs_pb2 as pb
from services.state import identities, query, stubs, validate
from services.state.app_context import StateContext
from services.state.heartbeat import Heartbeats
from services.state.node_identity import redact, require_secret
from services.state.writes import nodes as writes

Context = Any
TABLES = ("nodes",)
#: how long a standby relays heartbeats to the leader it last looked up
LEADER_LOOKUP_S = 1.0
LeaderAddress = Callable[[], Awaitable[str]]


class NodeServicer(node_pb2_grpc.NodeServicer):
    def __init__(
        self, ctx: StateContext, heartbeats: Heartbeats, leader_address: LeaderAddress
    ) -> None:
        self.ctx = ctx
        self.heartbeats = heartbeats
        self.leader_address = leader_address
        #: a standby's channel to the leader for relayed heartbeats, one per
        #: leader address, held between heartbeats (dialing one per call
        #: cost a connection, and with TLS a handshake, per heartbeat)
        self._relay: LeaderChannel | None = None
        self._relay_stubs: dict[str, node_pb2_grpc.NodeAsyncStub] = {}
        #: the last leader address looked up, and when (`_leader`)
        self._leader_seen: tuple[str, float] = ("", 0.0)

    @property
    def relayed_to(self) -> list[str]:
        """The leader addresses this standby holds a channel to."""
        return list(self._relay_stubs)

    async def close(self) -> None:
        if self._relay is not None:
            await self._relay.close()
        self._relay = None
        self._relay_stubs.clear()

    def _leader_stub(self, leader: str) -> node_pb2_grpc.NodeAsyncStub:
        stub = self._relay_stubs.get(leader)
        if stub is None:
            if self._relay is None:
                self._relay = LeaderChannel([leader])
            stub = self._relay_stubs[leader] = node_pb2_grpc.NodeStub(self._relay.channel(leader))
        return stub

    def _ttl_response(self, ttl: float | None = None, **kw: Any) -> node_pb2.NodeUpdateResponse:
        ttl = self.heartbeats.ttl() if ttl is None else ttl
        return node_pb2.NodeUpdateResponse(
            heartbeat_ttl_ms=int(ttl * 1000), num_nodes=len(self.ctx.feed.snapshot().nodes), **kw
        )

    async def Register(
        self, request: node_pb2.NodeRegisterRequest, context: Context
    ) -> node_pb2.NodeUpdateResponse:
        writes.validate_node(request.node)
        done = await self.ctx.batcher.submit(
            lambda tx: writes.register_node(tx, request.node), nodes=[request.node.id]
        )
        node, evals = done.value
        resp = self._ttl_response(
            eval_ids=[e.id for e in evals],
            eval_create_index=done.index if evals else 0,
            node_modify_index=done.index,
            index=done.index,
        )
        if node.status != NodeStatus.DOWN:
            self.heartbeats.reset(node.id, resp.heartbeat_ttl_ms / 1000)
        return resp

    async def Deregister(
        self, request: node_pb2.NodeDeregisterRequest, context: Context
    ) -> node_pb2.NodeUpdateResponse:
        validate.require_id(request.node_id, "node_id")
        async with self.ctx.write() as tx:
            node = await tx.get_node(request.node_id)
            if node is None:
                raise NotFound(f"node {request.node_id} not found")
            tx.delete_node(node)
            evals = await writes.node_evals(tx, node)
        self.heartbeats.forget(request.node_id)
        return node_pb2.NodeUpdateResponse(
            eval_ids=[e.id for e in evals],
            eval_create_index=tx.index if evals else 0,
            node_modify_index=tx.index,
            index=tx.index,
        )

    async def Evaluate(
        self, request: node_pb2.NodeEvaluateRequest, context: Context
    ) -> node_pb2.NodeUpdateResponse:
        validate.require_id(request.node_id, "node_id")
        async with self.ctx.write() as tx:
            node = await tx.get_node(request.node_id)
            if node is None:
                raise NotFound(f"node {request.node_id} not found")
            evals = await writes.node_evals(tx, node)
        return node_pb2.NodeUpdateResponse(
            eval_ids=[e.id for e in evals],
            eval_create_index=tx.index if evals else 0,
            node_modify_index=node.modify_index,
            index=tx.index,
        )

    async def UpdateStatus(
        self, request: node_pb2.NodeUpdateStatusRequest, context: Context
    ) -> node_pb2.NodeUpdateResponse:
        validate.require_id(request.node_id, "node_id")
        validate.one_of(
            request.status, (NodeStatus.INITIALIZING, NodeStatus.READY, NodeStatus.DOWN), "status"
        )
        require_secret(request.secret_id, request.node_id)
        if not self.heartbeats.enabled:
            forwarded = await self._forward(request, context)
            if forwarded is not None:
                return forwarded
        # A status change is decided inside the write transaction on the
        # committed row, never on the local snapshot: a burst of changes for
        # one node must each be written (or found to change nothing) against
        # the newest state. The one exception is the steady heartbeat
        # (`_still_ready`), which changes nothing and only resets the timer.
        seen = self.ctx.feed.snapshot().node_by_id(request.node_id)
        ttl = self.heartbeats.ttl()
        if seen is not None and seen.status != NodeStatus.DOWN:
            # only the node itself may keep its timer alive
            await self.ctx.node_secrets.check(seen, request.secret_id)
            still = self._still_ready(request)
            # the call itself proves the node alive, however long its batch waits
            self.heartbeats.reset(seen.id, ttl)
            if still is not None:
                return self._ttl_response(
                    ttl, node_modify_index=still.modify_index, index=self.ctx.feed.index
                )
        done = await self.ctx.batcher.submit(
            lambda tx: writes.update_status(
                tx, request.node_id, request.status, secret_id=request.secret_id
            ),
            nodes=[request.node_id],
        )
        node, evals, _ = done.value
        resp = self._ttl_response(
            ttl,
            eval_ids=[e.id for e in evals],
            eval_create_index=done.index if evals else 0,
            node_modify_index=node.modify_index,
            index=done.index,
        )
        if node.status == NodeStatus.DOWN:
            self.heartbeats.forget(node.id)
        elif seen is None or seen.status == NodeStatus.DOWN:
            self.heartbeats.reset(node.id, ttl)  # not reset above
        return resp

    def _still_ready(self, request: node_pb2.NodeUpdateStatusRequest) -> pb.Node | None:
        """The node when this heartbeat changes nothing and so needs no
        write (Nomad's Node.UpdateStatus only resets the timer then): it
        reports `ready`, this process's replica holds it `ready`, and its
        timer here is running. On the leader (the only process with timers)
        every write that takes a node out of `ready` is either the timer's
        own expiry, which stops the timer before it writes (so an expiry in
        flight sends the heartbeat through the write, ordered after it), or
        visible in this replica before it returns. Anything else (a node
        initializing, disconnected or down, the seed-003 rule, a node with
        no timer) is decided on the committed row by the write."""
        if request.status != NodeStatus.READY or not self.heartbeats.running(request.node_id):
            return None
        node = self.ctx.feed.snapshot().node_by_id(request.node_id)
        return node if node is not None and node.status == NodeStatus.READY else None

    async def _leader(self) -> str:
        """The leader's address, looked up (a query on PostgreSQL's locks)
        at most once per `LEADER_LOOKUP_S` rather than per relayed
        heartbeat. A stale answer is harmless: a former leader still
        serving relays the heartbeat on to its successor, and one that is
        gone fails the relay, which makes the next heartbeat look again."""
        address, at = self._leader_seen
        now = time.monotonic()
        if not address or now - at > LEADER_LOOKUP_S:
            address = await self.leader_address()
            self._leader_seen = (address, now)
        return address

    async def _forward(
        self, request: node_pb2.NodeUpdateStatusRequest, context: Context
    ) -> node_pb2.NodeUpdateResponse | None:
        """Heartbeat timers live on the leader: relay the heartbeat there.
        None when the leader cannot be reached (this process then handles
        it); the leader's own refusal (unknown node, wrong secret) is the
        caller's answer."""
        leader = await self._leader()
        if not leader or leader == self.ctx.address:
            return None
        try:
            resp: node_pb2.NodeUpdateResponse = await self._leader_stub(leader).UpdateStatus(
                request, timeout=10
            )
            resp.leader_address = leader
        except grpc.aio.AioRpcError as exc:
            if exc.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                self._leader_seen = ("", 0.0)  # look it up again next time
                return None
            await context.abort(exc.code(), exc.details() or "")
            raise  # abort raises; this keeps the type checker informed
        # the caller reads from this process next: it must show the leader's write
        await self.ctx.feed.wait_visible(resp.index)
        return resp

    async def UpdateAlloc(
        self, request: node_pb2.NodeUpdateAllocRequest, context: Context
    ) -> node_pb2.NodeUpdateAllocResponse:
        if not request.allocs:
            raise InvalidArgument("allocs", "must not be empty")
        node_id = request.allocs[0].node_id
        require_secret(request.secret_id, node_id)
        for i, a in enumerate(request.allocs):
            validate.require_id(a.id, f"allocs[{i}].id")
            if not a.node_id:
                raise InvalidArgument(f"allocs[{i}].node_id", "missing node ID")
            validate.require_id(a.node_id, f"allocs[{i}].node_id")
            if a.node_id != node_id:
                raise InvalidArgument(
                    f"allocs[{i}].node_id", "all allocs of one update must be on one node"
                )
            validate.one_of(a.client_status, structs.ClientStatus.ALL, f"allocs[{i}].client_status")
        snap = self.ctx.feed.snapshot()
        known = [snap.alloc_by_id(a.id) for a in request.allocs]
        done = await self.ctx.batcher.submit(
            lambda tx: writes.update_allocs(tx, request.allocs, request.secret_id),
            allocs=[a.id for a in request.allocs],
            nodes=[node_id],
            jobs={(a.namespace, a.job_id) for a in known if a is not None},
        )
        _, evals = done.value
        return node_pb2.NodeUpdateAllocResponse(index=done.index, eval_ids=[e.id for e in evals])

    async def GetClientAllocs(
        self, request: node_pb2.NodeClientAllocsRequest, context: Context
    ) -> node_pb2.NodeClientAllocsResponse:
        validate.require_id(request.node_id, "node_id")
        require_secret(request.secret_id, request.node_id)
        loop = asyncio.get_running_loop()
        wait = request.wait_ms / 1000 if request.wait_ms > 0 else query.DEFAULT_WAIT_S
        deadline = loop.time() + min(wait, query.MAX_WAIT_S)
        with contextlib.ExitStack() as holding:
            snap, allocs, index = await self._client_allocs(request, deadline, holding)
        resp = node_pb2.NodeClientAllocsResponse(index=index)
        jobs: dict[tuple[str, str, int], pb.Job] = {}
        for a in allocs:
            resp.allocs[a.id] = a.alloc_modify_index
            if request.min_index == 0:
                if structs.alloc_client_terminal(a):
                    continue  # seed 003: a reconnecting client must not restart finished work
            elif a.alloc_modify_index <= request.min_index:
                # the client has it: its previous answer (index >= this
                # alloc's) carried it. Nomad's client pulls only the allocs
                # whose modify index moved, too (`Alloc.GetAllocs`); sending
                # every live alloc of the node again, with its job, on each
                # change was most of a placement's bytes (issue 30's ledger)
                continue
            resp.full_allocs.append(a)
            job = snap.job_by_version(a.namespace, a.job_id, a.job_version)
            if job is not None:
                jobs[(a.namespace, a.job_id, a.job_version)] = job
        resp.jobs.extend(jobs.values())
        return resp

    async def _client_allocs(
        self,
        request: node_pb2.NodeClientAllocsRequest,
        deadline: float,
        holding: contextlib.ExitStack,
    ) -> tuple[StateSnapshot, list[pb.Allocation], int]:
        """The node's allocs once newer than `request.min_index` (or at the
        deadline): the snapshot, the allocs and their index. While it waits
        it holds one of the node's waiting calls (`CallLimits.node_waiting`),
        taken after the secret was checked: nobody else can use up a node's
        share."""
        loop = asyncio.get_running_loop()
        checked = -1  # the node incarnation (create index) whose secret was checked
        waiting = False
        while True:
            snap = self.ctx.feed.snapshot()
            node = snap.node_by_id(request.node_id)
            if node is None:
                raise NotFound(f"node {request.node_id} not found")
            if node.create_index != checked:
                await self.ctx.node_secrets.check(node, request.secret_id)
                checked = node.create_index
            allocs = snap.allocs_by_node(request.node_id)
            newest = max((a.alloc_modify_index for a in allocs), default=0)
            index = max(newest, 1)
            if not request.min_index or newest > request.min_index:
                return snap, allocs, index
            remaining = deadline - loop.time()
            if remaining <= 0 or self.ctx.shutting_down.is_set():
                return snap, allocs, index
            if not waiting:
                holding.enter_context(self.ctx.limits.node_waiting(request.node_id))
                waiting = True
            await self.ctx.feed.wait_node(request.node_id, min(remaining, 30.0))

    async def SignIdentities(
        self, request: node_pb2.NodeSignIdentitiesRequest, context: Context
    ) -> node_pb2.NodeSignIdentitiesResponse:
        """Workload identities for this node's tasks (services/state/identities.py)."""
        validate.require_id(request.node_id, "node_id")
        require_secret(request.secret_id, request.node_id)
        validate.at_most(
            len(request.identities), identities.MAX_REQUESTS, "identities", "identities"
        )
        self.ctx.keyring.require()
        node = self.ctx.feed.snapshot().node_by_id(request.node_id)
        if node is None:
            raise NotFound(f"node {request.node_id} not found")
        await self.ctx.node_secrets.check(node, request.secret_id)
        return await self.ctx.identities.sign(request.node_id, request.identities)

    async def List(
        self, request: node_pb2.NodeListRequest, context: Context
    ) -> node_pb2.NodeListResponse:
        snap = await query.snapshot_for(self.ctx, request.query, TABLES)
        nodes = [
            n
            for n in snap.iter_nodes()
            if n.id.startswith(request.query.prefix)
            and (not request.status or n.status == request.status)
        ]
        page, token = query.paginate(nodes, lambda n: n.id, request.query)
        return node_pb2.NodeListResponse(
            nodes=[stubs.node(snap, n, resources=request.resources) for n in page],
            meta=query.meta(snap, TABLES, token),
        )

    async def Get(
        self, request: node_pb2.NodeGetRequest, context: Context
    ) -> node_pb2.NodeGetResponse:
        snap = await query.snapshot_for(self.ctx, request.query, TABLES)
        node_id = query.resolve_prefix(list(snap.nodes.keys()), request.node_id, "node")
        node = pb.Node()
        node.CopyFrom(snap.nodes[node_id])
        redact(node)  # the feed holds no secret; never shown to operators either way
        return node_pb2.NodeGetResponse(node=node, meta=query.meta(snap, TABLES))

    async def Allocations(
        self, request: node_pb2.NodeGetRequest, context: Context
    ) -> node_pb2.NodeAllocationsResponse:
        tables = ("allocs",)
        snap = await query.snapshot_for(self.ctx, request.query, tables)
        node_id = query.resolve_prefix(list(snap.nodes.keys()), request.node_id, "node")
        allocs = snap.allocs_by_node(node_id)
        if not request.all:
            allocs = [a for a in allocs if not structs.alloc_terminal(a)]
        # node:read shows the node, not every namespace's work on it: as
        # Nomad's Node.GetAllocs, only allocs of namespaces the caller may
        # read-job in (the access rule checked node:read)
        allocs = [a for a in allocs if access.may_read_namespace(a.namespace)]
        allocs.sort(key=lambda a: (a.create_index, a.id))
        return node_pb2.NodeAllocationsResponse(allocs=allocs, meta=query.meta(snap, tables))

    async def UpdateDrain(
        self, request: node_pb2.NodeUpdateDrainRequest, context: Context
    ) -> node_pb2.NodeUpdateResponse:
        strategy = request.drain_strategy if request.HasField("drain_strategy") else None
        if strategy is not None:
            validate.drain_strategy(strategy, "drain_strategy")
        snap = self.ctx.feed.snapshot()
        node_id = query.resolve_prefix(list(snap.nodes.keys()), request.node_id, "node")
        async with self.ctx.write() as tx:
            await writes.set_drain(tx, node_id, strategy, request.mark_eligible)
        return node_pb2.NodeUpdateResponse(index=tx.index, node_modify_index=tx.index)

    async def UpdateEligibility(
        self, request: node_pb2.NodeUpdateEligibilityRequest, context: Context
    ) -> node_pb2.NodeUpdateResponse:
        snap = self.ctx.feed.snapshot()
        node_id = query.resolve_prefix(list(snap.nodes.keys()), request.node_id, "node")
        async with self.ctx.write() as tx:
            _, evals = await writes.set_eligibility(tx, node_id, request.eligibility)
        return node_pb2.NodeUpdateResponse(
            index=tx.index, node_modify_index=tx.index, eval_ids=[e.id for e in evals]
        )


def register(
    server: GrpcServer, ctx: StateContext, heartbeats: Heartbeats, leader_address: LeaderAddress
) -> NodeServicer:
    servicer = NodeServicer(ctx, heartbeats, leader_address)
    server.add(
        node_pb2_grpc.add_NodeServicer_to_server,
        servicer,
        node_pb2.DESCRIPTOR.services_by_name["Node"].full_name,
    )
    return servicer
