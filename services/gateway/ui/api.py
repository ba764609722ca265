"""The few JSON answers the UI needs that Nomad's /v1 API has no endpoint
for: the broker's and planner's queue statistics, what the browser's token
may do (to hide the actions it may not take), and an eval's journey.

Each call carries the browser's ACL token, exactly as the /v1 routes do, so
the UI can show nothing the token could not read through /v1 or gRPC."""

from __future__ import annotations

from typing import Any

import grpc
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from corral.domain.errors import PermissionDenied
from corral.security import acl
from corral.v1 import eval_pb2
from services.gateway import authz, http
from services.gateway.mapping.common import to_nomad
from services.gateway.ui.journey import journey, trace_id

#: capabilities the UI's actions need, by the name its script uses
NAMESPACE_ACTIONS = {
    "submit-job": "submit-job",
    "read-logs": "read-logs",
    "read-job": "read-job",
}


def _error(exc: grpc.aio.AioRpcError) -> str:
    return bytes(http.grpc_error_response(exc).body).decode()


async def overview(request: Request) -> Response:
    """Eval.Stats and Plan.Stats in Nomad's casing; either one answers its
    error text instead when it cannot be read (no such role, no
    operator:read)."""
    backend = http.backend_of(request)
    md = http.metadata_of(request)
    body: dict[str, Any] = {"Broker": None, "Plan": None, "BrokerError": "", "PlanError": ""}
    try:
        broker = await backend.broker_stats(md, http.region_of(request))
        if broker is None:
            body["BrokerError"] = "no broker is known"
        else:
            body["Broker"] = to_nomad(broker)
    except grpc.aio.AioRpcError as exc:
        body["BrokerError"] = _error(exc)
    try:
        plan = await backend.plan_stats(md, http.region_of(request))
        if plan is None:
            body["PlanError"] = "no planner is known"
        else:
            body["Plan"] = to_nomad(plan)
    except grpc.aio.AioRpcError as exc:
        body["PlanError"] = _error(exc)
    return JSONResponse(body, headers={"Cache-Control": "no-store"})


async def capabilities(request: Request) -> Response:
    """What the request's token may do in `?namespace=`: the token resolved
    by the state (ACL.ResolveToken) and compiled by the one compile every
    server uses (corral.security.acl_resolve.acl_from_response: a token with no
    policy that parses grants nothing), so the UI never shows an action the
    servers would refuse, nor hides one they allow. With ACLs off every
    action is allowed; an unknown or expired token is a 403 with the
    state's reason."""
    namespace = request.query_params.get("namespace") or acl.DEFAULT_NAMESPACE
    try:
        resolved = await authz.resolve(request)
    except PermissionDenied as exc:
        return Response(" ".join(exc.message.split()), status_code=403, media_type="text/plain")
    if resolved is None:
        return JSONResponse({"Enabled": False, "Management": True, "Capabilities": {}})
    compiled = resolved.acl
    caps = {
        name: compiled.allows_namespace(namespace, cap) for name, cap in NAMESPACE_ACTIONS.items()
    }
    caps["node-write"] = compiled.allows("node", acl.WRITE)
    caps["node-read"] = compiled.allows("node", acl.READ)
    caps["operator-read"] = compiled.allows("operator", acl.READ)
    return JSONResponse(
        {
            "Enabled": True,
            "Management": compiled.is_management,
            "AccessorID": resolved.response.accessor_id,
            "Policies": [p.name for p in resolved.response.policies],
            "Namespace": namespace,
            "Capabilities": caps,
        },
        headers={"Cache-Control": "no-store"},
    )


async def eval_journey(request: Request) -> Response:
    """The stages of an eval's journey (journey.py) with its trace id and,
    when the gateway knows a trace viewer (`ui_trace_url`), a link to it."""
    backend = http.backend_of(request)
    eval_id = request.path_params["eval_id"]
    resp = await backend.evals.Get(
        eval_pb2.EvalGetRequest(eval_id=eval_id, include_related=True),
        metadata=http.metadata_of(request),
        timeout=10,
    )
    ev = resp.eval
    tid = trace_id(ev.traceparent)
    template = str(getattr(request.app.state.settings, "ui_trace_url", "") or "")
    return JSONResponse(
        {
            "EvalID": ev.id,
            "TraceID": tid,
            "TraceURL": template.replace("{trace_id}", tid) if tid and template else "",
            "Stages": [s.to_json() for s in journey(ev, resp.allocs)],
        },
        headers={"Cache-Control": "no-store"},
    )
