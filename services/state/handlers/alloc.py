"""The public `Alloc` service: list, get and stop allocations."""

from __future__ import annotations

from typing import Any

from corral.domain.errors import NotFound
from corral.domain.structs import Trigger, copy_msg
from corral.domain.topics import EventType
from corral.runtime.server import GrpcServer
from corral.security import access
from corral.v1 import alloc_pb2, alloc_pb2_grpc
from services.state import query
from services.state.app_context import StateContext
from services.state.writes.jobs import new_eval

Context = Any
TABLES = ("allocs",)


class AllocServicer(alloc_pb2_grpc.AllocServicer):
    def __init__(self, ctx: StateContext) -> None:
        self.ctx = ctx

    async def List(
        self, request: alloc_pb2.AllocListRequest, context: Context
    ) -> alloc_pb2.AllocListResponse:
        snap = await query.snapshot_for(self.ctx, request.query, TABLES)
        node_id = request.node_id
        allocs = query.listing(
            request.query,
            request.job_id,
            snap.allocs_by_job,
            lambda: snap.allocs_by_node(node_id) if node_id else list(snap.allocs.values()),
            node_id=node_id,
            client_status=request.client_status,
        )
        page, token = query.paginate_by_creation(allocs, request.query)
        return alloc_pb2.AllocListResponse(allocs=page, meta=query.meta(snap, TABLES, token))

    async def Get(
        self, request: alloc_pb2.AllocGetRequest, context: Context
    ) -> alloc_pb2.AllocGetResponse:
        snap = await query.snapshot_for(self.ctx, request.query, TABLES)
        alloc_id = query.resolve_prefix(list(snap.allocs.keys()), request.alloc_id, "alloc")
        access.require_namespace(snap.allocs[alloc_id].namespace, access.READ_JOB)
        return alloc_pb2.AllocGetResponse(
            alloc=snap.allocs[alloc_id], meta=query.meta(snap, TABLES)
        )

    async def Stop(
        self, request: alloc_pb2.AllocStopRequest, context: Context
    ) -> alloc_pb2.AllocStopResponse:
        """Nomad's Alloc.Stop: mark the alloc to migrate and evaluate its job;
        the scheduler stops it and places a replacement."""
        snap = self.ctx.feed.snapshot()
        alloc_id = query.resolve_prefix(list(snap.allocs.keys()), request.alloc_id, "alloc")
        access.require_namespace(snap.allocs[alloc_id].namespace, "alloc-lifecycle")
        async with self.ctx.write() as tx:
            alloc = (await tx.get_allocs([alloc_id])).get(alloc_id)
            if alloc is None:
                raise NotFound(f"alloc {alloc_id!r} not found")
            job = await tx.get_job(alloc.namespace, alloc.job_id)
            if job is None:
                raise NotFound(f"job {alloc.job_id!r} of alloc {alloc_id} not found")
            alloc = copy_msg(alloc)
            alloc.desired_transition.migrate = True
            alloc.desired_transition.no_shutdown_delay = request.no_shutdown_delay
            tx.put_alloc(alloc, EventType.ALLOCATION_UPDATE_DESIRED_STATUS)
            ev = new_eval(job, Trigger.ALLOC_STOP)
            tx.put_eval(ev)
        return alloc_pb2.AllocStopResponse(eval_id=ev.id, index=tx.index)


def register(server: GrpcServer, ctx: StateContext) -> None:
    server.add(
        alloc_pb2_grpc.add_AllocServicer_to_server,
        AllocServicer(ctx),
        alloc_pb2.DESCRIPTOR.services_by_name["Alloc"].full_name,
    )
