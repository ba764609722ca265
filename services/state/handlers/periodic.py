"""The public `Periodic` service (proto/corral/v1/periodic.proto).

The periodic dispatcher runs beside the broker leader, so a forced launch
must happen there (Nomad forwards `Periodic.Force` to its leader): this
servicer relays the call to it (services/state/relay.py).
"""

from __future__ import annotations

from typing import Any

from corral.domain.errors import InvalidArgument
from corral.runtime.server import GrpcServer
from corral.v1 import periodic_pb2, periodic_pb2_grpc
from services.state.app_context import StateContext
from services.state.relay import to_broker_leader

Context = Any


class PeriodicServicer(periodic_pb2_grpc.PeriodicServicer):
    def __init__(self, ctx: StateContext) -> None:
        self.ctx = ctx

    async def Force(
        self, request: periodic_pb2.PeriodicForceRequest, context: Context
    ) -> periodic_pb2.PeriodicForceResponse:
        if not request.job_id:
            raise InvalidArgument("job_id", "is required")
        resp: periodic_pb2.PeriodicForceResponse = await to_broker_leader(
            self.ctx,
            lambda c: periodic_pb2_grpc.PeriodicStub(c).Force,
            request,
            timeout=30,
            no_broker="periodic launches happen on its leader",
            failed="periodic force failed",
        )
        return resp


def register(server: GrpcServer, ctx: StateContext) -> None:
    server.add(
        periodic_pb2_grpc.add_PeriodicServicer_to_server,
        PeriodicServicer(ctx),
        periodic_pb2.DESCRIPTOR.services_by_name["Periodic"].full_name,
    )
