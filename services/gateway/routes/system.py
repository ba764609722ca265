"""/v1/system/gc: Nomad's "Force GC": the state relays it to the broker
leader, which has a worker run every collector whatever the thresholds
(proto/corral/v1/system.proto). As Nomad's, it answers at once, with no
body, before the pass has run (`corral system gc` waits for it).

/v1/system/reconcile/summaries: every job's stored summary recomputed
and rewritten where it differs (System.ReconcileSummaries); answered, with
no body as Nomad's, once written."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute

from corral.v1 import system_pb2
from services.gateway.authz import MANAGEMENT, OPERATOR_WRITE, ApiRoute
from services.gateway.backend import DEFAULT_TIMEOUT
from services.gateway.http import backend_of, metadata_of


async def system_gc(request: Request) -> Response:
    await backend_of(request).system.GarbageCollect(
        system_pb2.SystemGCRequest(detach=True),
        metadata=metadata_of(request),
        timeout=DEFAULT_TIMEOUT,
    )
    return Response(status_code=200)


async def reconcile_summaries(request: Request) -> Response:
    resp = await backend_of(request).system.ReconcileSummaries(
        system_pb2.SystemReconcileSummariesRequest(),
        metadata=metadata_of(request),
        timeout=DEFAULT_TIMEOUT,
    )
    # the index of the rewrite, when there was one (Nomad sends none)
    headers = {"X-Nomad-Index": str(resp.index)} if resp.index else {}
    return Response(status_code=200, headers=headers)


ROUTES: list[BaseRoute] = [
    # Nomad asks a management token; Corral's System.GarbageCollect operator:write
    ApiRoute("/v1/system/gc", system_gc, {"PUT": OPERATOR_WRITE}),
    # Nomad's System.ReconcileJobSummaries asks a management token
    ApiRoute("/v1/system/reconcile/summaries", reconcile_summaries, {"PUT": MANAGEMENT}),
]
