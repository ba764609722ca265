"""The public `System` service (proto/corral/v1/system.proto).

Core evals live only in the broker leader's queue, so a forced garbage
collection must be enqueued there (Nomad's System.GarbageCollect does it on
its leader): this servicer relays the call to the leader's internal
`CoreGC.Force` (services/state/relay.py), as `Periodic.Force` does.
Expired ACL tokens, which only the state holds, it deletes itself first
(services/state/token_gc.py).
"""

from __future__ import annotations

from typing import Any

from corral.domain.errors import InvalidArgument
from corral.runtime.server import GrpcServer
from corral.v1 import system_pb2, system_pb2_grpc
from services.state.app_context import StateContext
from services.state.relay import to_broker_leader
from services.state.token_gc import collect_expired
from services.state.writes.summaries import reconcile_summaries

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
        wait_s = 0.0 if request.detach else (request.timeout_ms or DEFAULT_WAIT_MS) / 1000
        resp: system_pb2.SystemGCResponse = await to_broker_leader(
            self.ctx,
            lambda c: system_pb2_grpc.CoreGCStub(c).Force,
            request,
            timeout=wait_s + 30,
            no_broker="garbage collection is run by its leader",
            failed="garbage collection failed",
        )
        resp.expired_acl_tokens = len(expired)
        return resp

    async def ReconcileSummaries(
        self, request: system_pb2.SystemReconcileSummariesRequest, context: Context
    ) -> system_pb2.SystemReconcileSummariesResponse:
        done = await self.ctx.batcher.submit(reconcile_summaries)
        jobs, fixed = done.value
        return system_pb2.SystemReconcileSummariesResponse(
            index=done.index if fixed else 0, jobs=jobs, fixed=fixed
        )


def register(server: GrpcServer, ctx: StateContext) -> None:
    server.add(
        system_pb2_grpc.add_SystemServicer_to_server,
        SystemServicer(ctx),
        system_pb2.DESCRIPTOR.services_by_name["System"].full_name,
    )
