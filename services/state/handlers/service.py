"""The `ServiceRegistration` service (proto/corral/v1/service.proto):
Nomad's native service catalog. Reads are served from the feed's snapshot
with blocking queries on the `service_registrations` table; the clients'
writes and an operator's delete go through `writes/services.py`."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from corral.domain import services
from corral.domain.errors import InvalidArgument
from corral.domain.structs import DEFAULT_NAMESPACE
from corral.runtime.server import GrpcServer
from corral.security import access
from corral.v1 import service_pb2, service_pb2_grpc, state_pb2
from corral.v1 import structs_pb2 as pb
from services.state import query, validate
from services.state.app_context import StateContext
from services.state.node_identity import require_secret
from services.state.writes import services as writes

Context = Any
TABLES = ("service_registrations",)


def _sorted(regs: list[pb.ServiceRegistration]) -> list[pb.ServiceRegistration]:
    return sorted(regs, key=lambda r: (r.namespace, r.id))


class ServiceRegistrationServicer(service_pb2_grpc.ServiceRegistrationServicer):
    def __init__(self, ctx: StateContext) -> None:
        self.ctx = ctx

    async def List(
        self, request: service_pb2.ServiceListRequest, context: Context
    ) -> service_pb2.ServiceListResponse:
        """Nomad's ServiceRegistration.List: per namespace, every service
        name with the union of its instances' tags; with `*` only the
        namespaces the caller may read (none is an empty answer, not an
        error). `prefix` keeps the names starting with it."""
        wanted = request.query.namespace or DEFAULT_NAMESPACE
        if wanted != "*":
            access.require_service_read(wanted)
        snap = await query.snapshot_for(self.ctx, request.query, TABLES)
        regs = snap.service_registrations(None if wanted == "*" else wanted)
        by_ns: dict[str, dict[str, list[pb.ServiceRegistration]]] = defaultdict(
            lambda: defaultdict(list)
        )
        readable: dict[str, bool] = {}
        for r in regs:
            ns = r.namespace or DEFAULT_NAMESPACE
            if ns not in readable:
                readable[ns] = wanted != "*" or access.may_read_services(ns)
            if readable[ns] and r.service_name.startswith(request.query.prefix):
                by_ns[ns][r.service_name].append(r)
        out = [
            service_pb2.ServiceNamespaceStub(
                namespace=ns,
                services=[
                    service_pb2.ServiceStub(service_name=name, tags=services.tags_union(items))
                    for name, items in sorted(names.items())
                ],
            )
            for ns, names in sorted(by_ns.items())
        ]
        return service_pb2.ServiceListResponse(namespaces=out, meta=query.meta(snap, TABLES))

    async def GetService(
        self, request: service_pb2.ServiceGetRequest, context: Context
    ) -> service_pb2.ServiceGetResponse:
        """Nomad's GetService: the instances of one service, paged by id;
        `choose` then keeps a stable subset of the page."""
        if not request.service_name:
            raise InvalidArgument("service_name", "is required")
        namespace = request.query.namespace or DEFAULT_NAMESPACE
        if namespace != "*":
            access.require_service_read(namespace)
        if request.choose:
            try:
                services.choose([], request.choose)
            except ValueError as exc:
                raise InvalidArgument("choose", str(exc)) from None
        snap = await query.snapshot_for(self.ctx, request.query, TABLES)
        regs = (
            []  # as Nomad: a lookup by name is within one namespace
            if namespace == "*"
            else snap.services_by_name(namespace, request.service_name)
        )
        regs = [
            r
            for r in regs
            if (not request.tag or request.tag in r.tags) and r.id.startswith(request.query.prefix)
        ]
        page, token = query.paginate(regs, lambda r: r.id, request.query)
        if request.choose:
            page = services.choose(page, request.choose)
        return service_pb2.ServiceGetResponse(
            registrations=page, meta=query.meta(snap, TABLES, token)
        )

    async def ListByJob(
        self, request: service_pb2.ServiceListByJobRequest, context: Context
    ) -> service_pb2.ServiceRegistrationsResponse:
        """Nomad's Job.GetServiceRegistrations (read-job checked by the rule)."""
        if not request.job_id:
            raise InvalidArgument("job_id", "is required")
        namespace = request.query.namespace or DEFAULT_NAMESPACE
        if namespace == "*":
            raise InvalidArgument("query.namespace", "name the job's namespace, not *")
        snap = await query.snapshot_for(self.ctx, request.query, TABLES)
        regs = _sorted(snap.services_by_job(namespace, request.job_id))
        return service_pb2.ServiceRegistrationsResponse(
            registrations=regs, meta=query.meta(snap, TABLES)
        )

    async def ListByAlloc(
        self, request: service_pb2.ServiceListByAllocRequest, context: Context
    ) -> service_pb2.ServiceRegistrationsResponse:
        """Nomad's Alloc.GetServiceRegistrations: read-job in the alloc's
        namespace."""
        snap = await query.snapshot_for(self.ctx, request.query, TABLES)
        alloc_id = query.resolve_prefix(list(snap.allocs.keys()), request.alloc_id, "alloc")
        access.require_namespace(snap.allocs[alloc_id].namespace, access.READ_JOB)
        regs = _sorted(snap.services_by_alloc(alloc_id))
        return service_pb2.ServiceRegistrationsResponse(
            registrations=regs, meta=query.meta(snap, TABLES)
        )

    async def DeleteByID(
        self, request: service_pb2.ServiceDeleteByIDRequest, context: Context
    ) -> state_pb2.WriteResponse:
        namespace = request.namespace or DEFAULT_NAMESPACE
        writes.validate_id(request.id, "id")
        access.require_any_capability(namespace, (access.SUBMIT_JOB, access.DELETE_SERVICE))
        async with self.ctx.write() as tx:
            await writes.delete_by_id(tx, namespace, request.id)
        return state_pb2.WriteResponse(index=tx.index)

    async def Upsert(
        self, request: service_pb2.ServiceUpsertRequest, context: Context
    ) -> state_pb2.WriteResponse:
        validate.require_id(request.node_id, "node_id")
        require_secret(request.secret_id, request.node_id)
        writes.validate_registrations(request.registrations)
        done = await self.ctx.batcher.submit(
            lambda tx: writes.upsert(tx, request.node_id, request.secret_id, request.registrations),
            nodes=[request.node_id],
            allocs=sorted({r.alloc_id for r in request.registrations}),
        )
        return state_pb2.WriteResponse(index=done.index)

    async def Deregister(
        self, request: service_pb2.ServiceDeregisterRequest, context: Context
    ) -> state_pb2.WriteResponse:
        validate.require_id(request.node_id, "node_id")
        require_secret(request.secret_id, request.node_id)
        if not request.ids:
            raise InvalidArgument("ids", "must not be empty")
        for i, reg_id in enumerate(request.ids):
            writes.validate_id(reg_id, f"ids[{i}]")
        namespace = request.namespace or DEFAULT_NAMESPACE
        done = await self.ctx.batcher.submit(
            lambda tx: writes.deregister(
                tx, request.node_id, request.secret_id, namespace, request.ids
            ),
            nodes=[request.node_id],
        )
        return state_pb2.WriteResponse(index=done.index)


def register(server: GrpcServer, ctx: StateContext) -> None:
    server.add(
        service_pb2_grpc.add_ServiceRegistrationServicer_to_server,
        ServiceRegistrationServicer(ctx),
        service_pb2.DESCRIPTOR.services_by_name["ServiceRegistration"].full_name,
    )
