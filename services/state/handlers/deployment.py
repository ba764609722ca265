"""The public `Deployment` service (proto/corral/v1/deployment.proto):
reads from the state's snapshot, operator changes as one transaction each."""

from __future__ import annotations

from typing import Any

from corral.domain import deployments as model
from corral.domain.errors import InvalidArgument
from corral.domain.structs import DeploymentStatus
from corral.runtime.server import GrpcServer
from corral.security import access
from corral.v1 import deployment_pb2, deployment_pb2_grpc
from corral.v1 import structs_pb2 as pb
from services.state import query
from services.state.app_context import StateContext
from services.state.writes import deployments
from services.state.writes.batch import Committed

Context = Any
TABLES = ("deployments",)


def _updated(
    done: Committed[tuple[pb.Deployment, pb.Evaluation | None]],
) -> deployment_pb2.DeploymentUpdateResponse:
    """The answer to every change of a deployment: its index and the eval
    that follows it, if any."""
    _, ev = done.value
    return deployment_pb2.DeploymentUpdateResponse(
        eval_id=ev.id if ev is not None else "",
        eval_create_index=done.index if ev is not None else 0,
        deployment_modify_index=done.index,
        index=done.index,
    )


class DeploymentServicer(deployment_pb2_grpc.DeploymentServicer):
    def __init__(self, ctx: StateContext) -> None:
        self.ctx = ctx

    async def List(
        self, request: deployment_pb2.DeploymentListRequest, context: Context
    ) -> deployment_pb2.DeploymentListResponse:
        snap = await query.snapshot_for(self.ctx, request.query, TABLES)
        if request.job_id:
            candidates = snap.deployments_by_job(
                request.query.namespace or "default", request.job_id
            )
        else:
            candidates = list(snap.deployments.values())
        found = [
            d
            for d in candidates
            if query.namespace_matches(request.query, d.namespace)
            and d.id.startswith(request.query.prefix)
        ]
        page, token = query.paginate_by_creation(found, request.query)
        return deployment_pb2.DeploymentListResponse(
            deployments=page, meta=query.meta(snap, TABLES, token)
        )

    async def Get(
        self, request: deployment_pb2.DeploymentGetRequest, context: Context
    ) -> deployment_pb2.DeploymentGetResponse:
        tables = ("deployments", "allocs")
        snap = await query.snapshot_for(self.ctx, request.query, tables)
        dep_id = query.resolve_prefix(
            list(snap.deployments.keys()), request.deployment_id, "deployment"
        )
        d = snap.deployments[dep_id]
        access.require_namespace(d.namespace, access.READ_JOB)
        allocs = [a for a in snap.allocs_by_job(d.namespace, d.job_id) if a.deployment_id == d.id]
        allocs.sort(key=lambda a: (a.create_index, a.id))
        return deployment_pb2.DeploymentGetResponse(
            deployment=d, allocs=allocs, meta=query.meta(snap, tables)
        )

    def _resolve(self, deployment_id: str) -> str:
        """The deployment's full id, for a caller who may change its job."""
        if not deployment_id:
            raise InvalidArgument("deployment_id", "is required")
        snap = self.ctx.feed.snapshot()
        dep_id = query.resolve_prefix(list(snap.deployments.keys()), deployment_id, "deployment")
        access.require_namespace(snap.deployments[dep_id].namespace, access.SUBMIT_JOB)
        return dep_id

    async def Fail(
        self, request: deployment_pb2.DeploymentFailRequest, context: Context
    ) -> deployment_pb2.DeploymentUpdateResponse:
        dep_id = self._resolve(request.deployment_id)
        done = await self.ctx.batcher.submit(
            lambda tx: deployments.set_status(
                tx, dep_id, DeploymentStatus.FAILED, model.DESC_FAILED_BY_USER
            )
        )
        d, ev, reverted = done.value
        return deployment_pb2.DeploymentUpdateResponse(
            eval_id=ev.id if ev is not None else "",
            eval_create_index=done.index if ev is not None else 0,
            deployment_modify_index=done.index,
            reverted=reverted is not None,
            reverted_job_version=reverted.version if reverted is not None else 0,
            index=done.index,
        )

    async def Pause(
        self, request: deployment_pb2.DeploymentPauseRequest, context: Context
    ) -> deployment_pb2.DeploymentUpdateResponse:
        dep_id = self._resolve(request.deployment_id)
        done = await self.ctx.batcher.submit(
            lambda tx: deployments.pause(tx, dep_id, request.pause)
        )
        return _updated(done)

    async def Promote(
        self, request: deployment_pb2.DeploymentPromoteRequest, context: Context
    ) -> deployment_pb2.DeploymentUpdateResponse:
        dep_id = self._resolve(request.deployment_id)
        groups = [] if request.all else list(request.groups)
        done = await self.ctx.batcher.submit(lambda tx: deployments.promote(tx, dep_id, groups))
        return _updated(done)

    async def SetAllocHealth(
        self, request: deployment_pb2.DeploymentAllocHealthRequest, context: Context
    ) -> deployment_pb2.DeploymentUpdateResponse:
        dep_id = self._resolve(request.deployment_id)
        done = await self.ctx.batcher.submit(
            lambda tx: deployments.set_alloc_health(
                tx, dep_id, list(request.healthy_alloc_ids), list(request.unhealthy_alloc_ids)
            ),
            allocs=[*request.healthy_alloc_ids, *request.unhealthy_alloc_ids],
        )
        return _updated(done)


def register(server: GrpcServer, ctx: StateContext) -> None:
    server.add(
        deployment_pb2_grpc.add_DeploymentServicer_to_server,
        DeploymentServicer(ctx),
        deployment_pb2.DESCRIPTOR.services_by_name["Deployment"].full_name,
    )
