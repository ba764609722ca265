"""The public `Periodic` service (proto/corral/v1/periodic.proto).

The periodic dispatcher runs beside the broker leader, so a forced launch
must happen there (Nomad forwards `Periodic.Force` to its leader). Users
only know the state service's address: this servicer finds the brokers in
the member registry and relays the call to the leader, following a
standby's `corral-leader` answer.
"""

from __future__ import annotations

from typing import Any

import grpc

from corral.domain.errors import CorralError, InvalidArgument, Unavailable
from corral.runtime.rpc import LeaderChannel
from corral.runtime.server import GrpcServer
from corral.v1 import periodic_pb2, periodic_pb2_grpc, state_pb2
from services.state.app_context import StateContext

Context = Any
# how long a relayed call may chase a leader through an election
RELAY_BUDGET_S = 15.0


class _Relayed(CorralError):
    """The broker's answer, passed on with its own status code."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code


async def broker_addresses(ctx: StateContext) -> list[str]:
    """The brokers in the member registry, the last known leader first: where
    a call relayed to the broker leader starts looking."""
    members = [
        state_pb2.Member.FromString(payload)
        for payload, _age in await ctx.db.members(role="broker", max_age_s=30)
    ]
    members.sort(key=lambda m: not m.leader)
    return [m.address for m in members if m.address]


class PeriodicServicer(periodic_pb2_grpc.PeriodicServicer):
    def __init__(self, ctx: StateContext) -> None:
        self.ctx = ctx

    async def Force(
        self, request: periodic_pb2.PeriodicForceRequest, context: Context
    ) -> periodic_pb2.PeriodicForceResponse:
        if not request.job_id:
            raise InvalidArgument("job_id", "is required")
        addresses = await broker_addresses(self.ctx)
        if not addresses:
            raise Unavailable("no broker is running: periodic launches happen on its leader")
        channel = LeaderChannel(addresses, retry_budget=RELAY_BUDGET_S)
        try:
            resp: periodic_pb2.PeriodicForceResponse = await channel.call(
                lambda c: periodic_pb2_grpc.PeriodicStub(c).Force, request, timeout=30
            )
        except grpc.aio.AioRpcError as exc:
            raise _Relayed(exc.code(), exc.details() or "periodic force failed") from None
        finally:
            await channel.close()
        return resp


def register(server: GrpcServer, ctx: StateContext) -> None:
    server.add(
        periodic_pb2_grpc.add_PeriodicServicer_to_server,
        PeriodicServicer(ctx),
        periodic_pb2.DESCRIPTOR.services_by_name["Periodic"].full_name,
    )
