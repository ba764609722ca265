"""The public `System` service (proto/corral/v1/system.proto).

Core evals live only in the broker leader's queue, so a forced garbage
collection must be enqueued there (Nomad's System.GarbageCollect does it on
its leader). Users only know the state service's address: this servicer
finds the brokers in the member registry and relays the call to the
leader's internal `CoreGC.Force`, following a standby's `corral-leader`
answer, as `Periodic.Force` does. Expired ACL tokens, which only the state
holds, it deletes itself first (services/state/token_gc.py).
"""

from __future__ import annotations

from typing import Any

import grpc

from corral.domain.errors import InvalidArgument, Unavailable
from corral.runtime.rpc import LeaderChannel
from corral.runtime.server import GrpcServer
from corral.v1 import system_pb2, system_pb2_grpc
from services.state.app_context import StateContext
from services.state.handlers.periodic import RELAY_BUDGET_S, _Relayed, broker_addresses
from services.state.token_gc import collect_expired

Context = Any
#: the broker's defaults (services/broker/core_timers.py), checked here too
#: so a bad request never leaves this process
DEFAULT_WAIT_MS = 60_000
MAX_WAIT_MS = 300_000


class SystemServicer(system_pb2_grpc.SystemServicer):
    def __init__(self, ctx: StateContext) -> None:
        self.ctx = ctx

    async def GarbageCollect(
        self, request: system_pb2.SystemGCRequest, context: Context
    ) -> system_pb2.SystemGCResponse:
        if request.timeout_ms > MAX_WAIT_MS:
            raise InvalidArgument("timeout_ms", f"at most {MAX_WAIT_MS} ms may be waited")
        expired = await collect_expired(self.ctx, 0)
        addresses = await broker_addresses(self.ctx)
        if not addresses:
            raise Unavailable("no broker is running: garbage collection is run by its leader")
        wait_s = 0.0 if request.detach else (request.timeout_ms or DEFAULT_WAIT_MS) / 1000
        channel = LeaderChannel(addresses, retry_budget=RELAY_BUDGET_S)
        try:
            resp: system_pb2.SystemGCResponse = await channel.call(
                lambda c: system_pb2_grpc.CoreGCStub(c).Force, request, timeout=wait_s + 30
            )
        except grpc.aio.AioRpcError as exc:
            raise _Relayed(exc.code(), exc.details() or "garbage collection failed") from None
        finally:
            await channel.close()
        resp.expired_acl_tokens = len(expired)
        return resp


def register(server: GrpcServer, ctx: StateContext) -> None:
    server.add(
        system_pb2_grpc.add_SystemServicer_to_server,
        SystemServicer(ctx),
        system_pb2.DESCRIPTOR.services_by_name["System"].full_name,
    )
