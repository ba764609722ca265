"""The public `Namespace` service (proto/corral/v1/namespace.proto): Nomad's
Namespace endpoint. Reads come from this process's snapshot and show only
the namespaces the caller's token may see; writes need a management token
(the access rule) and decide in their transaction."""

from __future__ import annotations

from typing import Any

from corral.domain.errors import NotFound, PermissionDenied
from corral.runtime.server import GrpcServer
from corral.security import access
from corral.v1 import namespace_pb2, namespace_pb2_grpc
from services.state import query
from services.state.app_context import StateContext
from services.state.writes import namespaces as writes

Context = Any
TABLES = ("namespaces",)


class NamespaceServicer(namespace_pb2_grpc.NamespaceServicer):
    def __init__(self, ctx: StateContext) -> None:
        self.ctx = ctx

    async def List(
        self, request: namespace_pb2.NamespaceListRequest, context: Context
    ) -> namespace_pb2.NamespaceListResponse:
        snap = await query.snapshot_for(self.ctx, request.query, TABLES)
        acl = access.current_acl()
        found = [
            ns
            for name, ns in snap.namespaces.items()
            if name.startswith(request.query.prefix) and acl.allows_any_in_namespace(name)
        ]
        page, token = query.paginate(found, lambda ns: ns.name, request.query)
        return namespace_pb2.NamespaceListResponse(
            namespaces=page, meta=query.meta(snap, TABLES, token)
        )

    async def Get(
        self, request: namespace_pb2.NamespaceGetRequest, context: Context
    ) -> namespace_pb2.NamespaceResponse:
        if not access.current_acl().allows_any_in_namespace(request.name):
            raise PermissionDenied(f"Permission denied: namespace {request.name!r}")
        snap = await query.snapshot_for(self.ctx, request.query, TABLES)
        ns = snap.namespace_by_name(request.name) if request.name else None
        if ns is None:
            shown = request.name[:128]
            raise NotFound(f"namespace {shown!r} not found")
        return namespace_pb2.NamespaceResponse(namespace=ns, meta=query.meta(snap, TABLES))

    async def Upsert(
        self, request: namespace_pb2.NamespaceUpsertRequest, context: Context
    ) -> namespace_pb2.NamespaceWriteResponse:
        writes.validate_namespaces(request.namespaces)
        async with self.ctx.write() as tx:
            await writes.upsert_namespaces(tx, request.namespaces)
        return namespace_pb2.NamespaceWriteResponse(index=tx.index)

    async def Delete(
        self, request: namespace_pb2.NamespaceDeleteRequest, context: Context
    ) -> namespace_pb2.NamespaceWriteResponse:
        async with self.ctx.write() as tx:
            await writes.delete_namespaces(tx, request.names)
        return namespace_pb2.NamespaceWriteResponse(index=tx.index)


def register(server: GrpcServer, ctx: StateContext) -> None:
    server.add(
        namespace_pb2_grpc.add_NamespaceServicer_to_server,
        NamespaceServicer(ctx),
        namespace_pb2.DESCRIPTOR.services_by_name["Namespace"].full_name,
    )
