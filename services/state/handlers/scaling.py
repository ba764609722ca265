"""The public `Scaling` service (proto/corral/v1/scaling.proto): Nomad's
Scaling endpoint, what nomad-autoscaler's Nomad policy source reads. Access
as Nomad: list-scaling-policies (read-scaling-policy for one policy), or
list-jobs and read-job, in the policy's namespace."""

from __future__ import annotations

from typing import Any

from corral.domain.errors import NotFound, PermissionDenied
from corral.runtime.server import GrpcServer
from corral.security import access
from corral.v1 import scaling_pb2, scaling_pb2_grpc
from corral.v1 import structs_pb2 as pb
from services.state import query
from services.state.app_context import StateContext

Context = Any
TABLES = ("scaling_policy",)


def stub(p: pb.ScalingPolicy) -> scaling_pb2.ScalingPolicyListStub:
    return scaling_pb2.ScalingPolicyListStub(
        id=p.id,
        enabled=p.enabled,
        type=p.type,
        target=p.target,
        create_index=p.create_index,
        modify_index=p.modify_index,
    )


class ScalingServicer(scaling_pb2_grpc.ScalingServicer):
    def __init__(self, ctx: StateContext) -> None:
        self.ctx = ctx

    async def ListPolicies(
        self, request: scaling_pb2.ScalingPolicyListRequest, context: Context
    ) -> scaling_pb2.ScalingPolicyListResponse:
        wanted = request.query.namespace or "default"
        if wanted != "*" and not access.may_read_scaling_policies(
            wanted, access.LIST_SCALING_POLICIES
        ):
            raise PermissionDenied(
                f"Permission denied: list-scaling-policies in namespace {wanted!r}"
            )
        snap = await query.snapshot_for(self.ctx, request.query, TABLES)
        if request.job and wanted != "*":
            candidates = snap.scaling_policies_by_job(wanted, request.job)
        else:
            candidates = list(snap.scaling_policies.values())
        found = []
        for p in candidates:
            namespace = p.target.get("Namespace", "default")
            if wanted == "*":
                if not access.may_read_scaling_policies(namespace, access.LIST_SCALING_POLICIES):
                    continue
            elif namespace != wanted:
                continue
            if request.job and p.target.get("Job") != request.job:
                continue
            if not p.type.startswith(request.type) or not p.id.startswith(request.query.prefix):
                continue
            found.append(p)
        page, token = query.paginate(found, lambda p: p.id, request.query)
        return scaling_pb2.ScalingPolicyListResponse(
            policies=[stub(p) for p in page], meta=query.meta(snap, TABLES, token)
        )

    async def GetPolicy(
        self, request: scaling_pb2.ScalingPolicyGetRequest, context: Context
    ) -> scaling_pb2.ScalingPolicyResponse:
        snap = await query.snapshot_for(self.ctx, request.query, TABLES)
        policy = snap.scaling_policy_by_id(request.id) if request.id else None
        if policy is None:
            raise NotFound(f"scaling policy {request.id[:64]!r} not found")
        namespace = policy.target.get("Namespace", "default")
        if not access.may_read_scaling_policies(namespace, access.READ_SCALING_POLICY):
            # not naming the policy's namespace: it would tell a caller who
            # may not read it where the policy lives
            raise PermissionDenied(
                "Permission denied: read-scaling-policy in the policy's namespace"
            )
        return scaling_pb2.ScalingPolicyResponse(policy=policy, meta=query.meta(snap, TABLES))


def register(server: GrpcServer, ctx: StateContext) -> None:
    server.add(
        scaling_pb2_grpc.add_ScalingServicer_to_server,
        ScalingServicer(ctx),
        scaling_pb2.DESCRIPTOR.services_by_name["Scaling"].full_name,
    )
