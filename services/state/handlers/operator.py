"""The public `Operator` service: scheduler configuration and members."""

from __future__ import annotations

from typing import Any

from corral.domain.structs import SchedulerAlgorithm
from corral.runtime.server import GrpcServer
from corral.v1 import operator_pb2, operator_pb2_grpc, state_pb2
from corral.v1 import structs_pb2 as pb
from services.state import query, validate
from services.state.app_context import StateContext

Context = Any
TABLES = ("scheduler_config",)


def default_config() -> pb.SchedulerConfiguration:
    """Nomad's defaults: binpack, preemption on for system jobs only."""
    return pb.SchedulerConfiguration(
        scheduler_algorithm=SchedulerAlgorithm.BINPACK,
        preemption_config=pb.PreemptionConfig(system_scheduler_enabled=True),
    )


class OperatorServicer(operator_pb2_grpc.OperatorServicer):
    def __init__(self, ctx: StateContext) -> None:
        self.ctx = ctx

    async def SchedulerGetConfiguration(
        self, request: operator_pb2.SchedulerGetConfigurationRequest, context: Context
    ) -> operator_pb2.SchedulerConfigurationResponse:
        snap = await query.snapshot_for(self.ctx, request.query, TABLES)
        cfg = snap.scheduler_config
        return operator_pb2.SchedulerConfigurationResponse(
            config=cfg if cfg.modify_index else default_config(),
            index=query.table_index(snap, TABLES),
        )

    async def SchedulerSetConfiguration(
        self, request: operator_pb2.SchedulerSetConfigurationRequest, context: Context
    ) -> operator_pb2.SchedulerConfigurationResponse:
        cfg = pb.SchedulerConfiguration()
        cfg.CopyFrom(request.config)
        cfg.scheduler_algorithm = cfg.scheduler_algorithm or SchedulerAlgorithm.BINPACK
        validate.one_of(
            cfg.scheduler_algorithm,
            (SchedulerAlgorithm.BINPACK, SchedulerAlgorithm.SPREAD),
            "config.scheduler_algorithm",
        )
        async with self.ctx.write() as tx:
            current = await tx.get_scheduler_config()
            if request.cas and current.modify_index != request.config.modify_index:
                return operator_pb2.SchedulerConfigurationResponse(
                    config=current if current.modify_index else default_config(), updated=False
                )
            cfg.create_index = current.create_index
            tx.put_scheduler_config(cfg)
        return operator_pb2.SchedulerConfigurationResponse(config=cfg, updated=True, index=tx.index)

    async def Members(
        self, request: operator_pb2.MembersRequest, context: Context
    ) -> operator_pb2.MembersResponse:
        rows = await self.ctx.db.members(role=request.role)
        return operator_pb2.MembersResponse(
            members=[state_pb2.Member.FromString(p) for p, _ in rows]
        )


def register(server: GrpcServer, ctx: StateContext) -> None:
    server.add(
        operator_pb2_grpc.add_OperatorServicer_to_server,
        OperatorServicer(ctx),
        operator_pb2.DESCRIPTOR.services_by_name["Operator"].full_name,
    )
