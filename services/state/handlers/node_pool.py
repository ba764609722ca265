"""The public `NodePool` service (proto/corral/v1/node_pool.proto): Nomad's
NodePool endpoint. Every call is checked against the token's `node_pool`
rules for the pool it names (lists show only the pools the token may read)."""

from __future__ import annotations

from typing import Any

from corral.domain import node_pools
from corral.domain.errors import InvalidArgument, NotFound
from corral.domain.store import StateSnapshot
from corral.runtime.server import GrpcServer
from corral.security import access, acl
from corral.v1 import node_pool_pb2, node_pool_pb2_grpc
from corral.v1 import structs_pb2 as pb
from services.state import query, stubs
from services.state.app_context import StateContext
from services.state.writes import node_pools as writes

Context = Any
TABLES = ("node_pools",)


def _pool(snap: StateSnapshot, name: str) -> pb.NodePool:
    pool = snap.node_pool_by_name(name) if name else None
    if pool is None:
        raise NotFound(f"node pool {name[:128]!r} not found")
    return pool


class NodePoolServicer(node_pool_pb2_grpc.NodePoolServicer):
    def __init__(self, ctx: StateContext) -> None:
        self.ctx = ctx

    async def List(
        self, request: node_pool_pb2.NodePoolListRequest, context: Context
    ) -> node_pool_pb2.NodePoolListResponse:
        snap = await query.snapshot_for(self.ctx, request.query, TABLES)
        token = access.current_acl()
        found = [
            p
            for name, p in snap.node_pools.items()
            if name.startswith(request.query.prefix)
            and token.allows_node_pool(name, acl.NODE_POOL_READ)
        ]
        page, next_token = query.paginate(found, lambda p: p.name, request.query)
        return node_pool_pb2.NodePoolListResponse(
            node_pools=page, meta=query.meta(snap, TABLES, next_token)
        )

    async def Get(
        self, request: node_pool_pb2.NodePoolGetRequest, context: Context
    ) -> node_pool_pb2.NodePoolResponse:
        access.require_node_pool(request.name, acl.NODE_POOL_READ)
        snap = await query.snapshot_for(self.ctx, request.query, TABLES)
        return node_pool_pb2.NodePoolResponse(
            node_pool=_pool(snap, request.name), meta=query.meta(snap, TABLES)
        )

    async def Upsert(
        self, request: node_pool_pb2.NodePoolUpsertRequest, context: Context
    ) -> node_pool_pb2.NodePoolWriteResponse:
        for pool in request.node_pools:
            access.require_node_pool(pool.name, acl.NODE_POOL_WRITE)
        writes.validate_node_pools(request.node_pools)
        async with self.ctx.write() as tx:
            await writes.upsert_node_pools(tx, request.node_pools)
        return node_pool_pb2.NodePoolWriteResponse(index=tx.index)

    async def Delete(
        self, request: node_pool_pb2.NodePoolDeleteRequest, context: Context
    ) -> node_pool_pb2.NodePoolWriteResponse:
        for name in request.names:
            access.require_node_pool(name, acl.NODE_POOL_DELETE)
        async with self.ctx.write() as tx:
            await writes.delete_node_pools(tx, request.names)
        return node_pool_pb2.NodePoolWriteResponse(index=tx.index)

    async def ListNodes(
        self, request: node_pool_pb2.NodePoolGetRequest, context: Context
    ) -> node_pool_pb2.NodePoolNodesResponse:
        """node:read (the access rule) and node_pool read."""
        access.require_node_pool(request.name, acl.NODE_POOL_READ)
        if request.query.prefix:
            raise InvalidArgument("query.prefix", "prefix argument not allowed")
        tables = ("node_pools", "nodes")
        snap = await query.snapshot_for(self.ctx, request.query, tables)
        pool = _pool(snap, request.name)
        nodes = [n for n in snap.iter_nodes() if node_pools.node_in_pool(n, pool.name)]
        page, token = query.paginate(nodes, lambda n: n.id, request.query)
        return node_pool_pb2.NodePoolNodesResponse(
            nodes=[stubs.node(snap, n) for n in page], meta=query.meta(snap, ("nodes",), token)
        )

    async def ListJobs(
        self, request: node_pool_pb2.NodePoolGetRequest, context: Context
    ) -> node_pool_pb2.NodePoolJobsResponse:
        """node_pool read; the jobs of namespaces the token may list jobs in."""
        access.require_node_pool(request.name, acl.NODE_POOL_READ)
        if request.query.prefix:
            raise InvalidArgument("query.prefix", "prefix argument not allowed")
        tables = ("node_pools", "jobs", "job_summary")
        snap = await query.snapshot_for(self.ctx, request.query, tables)
        pool = _pool(snap, request.name)
        token_acl = access.current_acl()
        jobs = [
            j
            for j in snap.iter_jobs()
            if j.node_pool == pool.name
            and query.namespace_matches(request.query, j.namespace, access.LIST_JOBS)
            and token_acl.allows_namespace(j.namespace, access.LIST_JOBS)
        ]
        page, token = query.paginate(jobs, lambda j: f"{j.namespace}.{j.id}", request.query)
        return node_pool_pb2.NodePoolJobsResponse(
            jobs=[stubs.job(snap, j) for j in page],
            meta=query.meta(snap, ("jobs", "job_summary"), token),
        )


def register(server: GrpcServer, ctx: StateContext) -> None:
    server.add(
        node_pool_pb2_grpc.add_NodePoolServicer_to_server,
        NodePoolServicer(ctx),
        node_pool_pb2.DESCRIPTOR.services_by_name["NodePool"].full_name,
    )
