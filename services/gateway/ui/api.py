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
from corral.v1 import alloc_pb2, eval_pb2, job_pb2, node_pb2, operator_pb2, query_pb2
from services.gateway import authz, http
from services.gateway.mapping.common import to_nomad
from services.gateway.ui.journey import journey, trace_id
from services.gateway.ui.topology import topology as topology_of

#: capabilities the UI's actions need, by the name its script uses
NAMESPACE_ACTIONS = {
    "submit-job": "submit-job",
    "read-logs": "read-logs",
    "read-job": "read-job",
    "list-jobs": "list-jobs",
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


async def cluster(request: Request) -> Response:
    """The overview's counts: jobs, nodes (ready), allocations (running),
    counted here from the state's lists read with the request's token, so
    the browser does not fetch every job, node and allocation to count them
    (at 10,000 allocations that is megabytes per refresh). Each count the
    token may not read is null with its error in `Errors`."""
    backend = http.backend_of(request)
    md = http.metadata_of(request)
    every = query_pb2.QueryOptions(namespace="*")
    body: dict[str, Any] = {
        "Jobs": None,
        "Nodes": None,
        "NodesReady": None,
        "Allocs": None,
        "AllocsRunning": None,
        "Errors": {},
    }
    try:
        jobs = await backend.jobs.List(job_pb2.JobListRequest(query=every), metadata=md, timeout=30)
        body["Jobs"] = len(jobs.jobs)
    except grpc.aio.AioRpcError as exc:
        body["Errors"]["Jobs"] = _error(exc)
    try:
        nodes = await backend.nodes.List(
            node_pb2.NodeListRequest(query=query_pb2.QueryOptions()), metadata=md, timeout=30
        )
        body["Nodes"] = len(nodes.nodes)
        body["NodesReady"] = sum(1 for n in nodes.nodes if n.status == "ready")
    except grpc.aio.AioRpcError as exc:
        body["Errors"]["Nodes"] = _error(exc)
    try:
        allocs = await backend.allocs.List(
            alloc_pb2.AllocListRequest(query=every), metadata=md, timeout=30
        )
        body["Allocs"] = len(allocs.allocs)
        body["AllocsRunning"] = sum(1 for a in allocs.allocs if a.client_status == "running")
    except grpc.aio.AioRpcError as exc:
        body["Errors"]["Allocs"] = _error(exc)
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


async def topology(request: Request) -> Response:
    """The topology page's nodes and allocations (ui/topology.py), read
    with the request's token: Node.List needs node:read, Alloc.List over
    every namespace keeps those the token may read-job in."""
    backend = http.backend_of(request)
    md = http.metadata_of(request)
    nodes = await backend.nodes.List(
        node_pb2.NodeListRequest(query=query_pb2.QueryOptions(), resources=True),
        metadata=md,
        timeout=30,
    )
    allocs = await backend.allocs.List(
        alloc_pb2.AllocListRequest(query=query_pb2.QueryOptions(namespace="*")),
        metadata=md,
        timeout=30,
    )
    body = topology_of(nodes.nodes, allocs.allocs)
    body["Index"] = max(nodes.meta.index, allocs.meta.index)
    return JSONResponse(
        body,
        headers={"Cache-Control": "no-store", "X-Nomad-Index": str(max(body["Index"], 1))},
    )


async def members(request: Request) -> Response:
    """The control plane's processes (Operator.Members: every role's
    registered process, whether it holds its role's leadership, its
    version and when it was last seen); needs operator:read."""
    resp = await http.backend_of(request).operator.Members(
        operator_pb2.MembersRequest(), metadata=http.metadata_of(request), timeout=10
    )
    rows = sorted(resp.members, key=lambda m: (m.role, not m.leader, m.id))
    return JSONResponse(
        {
            "Members": [
                {
                    "ID": m.id,
                    "Role": m.role,
                    "Address": m.address,
                    "Leader": m.leader,
                    "Version": m.version,
                    "StartedAt": m.started_at,
                    "LastSeen": m.last_seen,
                    "Tags": dict(m.tags),
                }
                for m in rows
            ]
        },
        headers={"Cache-Control": "no-store"},
    )
