"""/v1/nodes, /v1/node/:id, its drain, eligibility and allocations, and
/v1/client/stats?node_id= (the host usage its agent serves)."""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute

from corral.v1 import node_pb2, query_pb2
from corral.v1 import structs_pb2 as pb
from services.gateway.authz import NODE_READ, NODE_WRITE, ApiRoute, Need
from services.gateway.authz import UNSERVED as NOT_SERVED
from services.gateway.backend import DEFAULT_TIMEOUT
from services.gateway.http import (
    INT64_MAX,
    NomadError,
    QueryOptions,
    backend_of,
    bad_request,
    bool_param,
    json_body,
    listing,
    metadata_of,
    region_of,
    respond,
    unserved,
    whole,
)
from services.gateway.mapping import allocs as alloc_map
from services.gateway.mapping import nodes as node_map
from services.gateway.mapping import stats as stats_map


async def nodes(request: Request) -> Response:
    q = QueryOptions.from_request(request)
    backend = backend_of(request)

    async def call(query: query_pb2.QueryOptions) -> tuple[list[dict[str, Any]], Any]:
        resp = await backend.nodes.List(
            node_pb2.NodeListRequest(
                query=query,
                status=request.query_params.get("status", ""),
                resources=bool_param(request, "resources"),
            ),
            metadata=q.metadata,
            timeout=q.timeout,
        )
        return [node_map.stub(n) for n in resp.nodes], resp.meta

    return await listing(request, q, call)


async def node(request: Request) -> Response:
    q = QueryOptions.from_request(request)
    resp = await backend_of(request).nodes.Get(
        node_pb2.NodeGetRequest(node_id=request.path_params["node_id"], query=q.proto()),
        metadata=q.metadata,
        timeout=q.timeout,
    )
    return respond(request, node_map.node(resp.node), index=resp.meta.index)


async def node_allocations(request: Request) -> Response:
    q = QueryOptions.from_request(request)
    resp = await backend_of(request).nodes.Allocations(
        node_pb2.NodeGetRequest(node_id=request.path_params["node_id"], query=q.proto(), all=True),
        metadata=q.metadata,
        timeout=q.timeout,
    )
    return respond(request, [alloc_map.alloc(a) for a in resp.allocs], index=resp.meta.index)


#: `nomad node drain -enable`'s default deadline
DEFAULT_DRAIN_DEADLINE = 3600 * 1_000_000_000


def _update_response(resp: node_pb2.NodeUpdateResponse) -> dict[str, Any]:
    return {
        "EvalIDs": list(resp.eval_ids) or None,
        "EvalCreateIndex": resp.eval_create_index,
        "NodeModifyIndex": resp.node_modify_index,
        "Index": resp.index,
    }


def _drain_strategy(data: Any) -> pb.DrainStrategy | None:
    """Nomad's DrainSpec/DrainStrategy: Deadline ns (-1 = force now, 0 = no
    deadline), IgnoreSystemJobs; null = stop draining."""
    if data is None:
        return None
    if not isinstance(data, dict):
        raise bad_request("DrainSpec must be an object")
    spec = data.get("DrainSpec", data)
    if spec is None:
        return None
    if not isinstance(spec, dict):
        raise bad_request("DrainSpec must be an object")
    deadline = whole(spec.get("Deadline"), "Deadline", low=-1, high=INT64_MAX)
    ignore = spec.get("IgnoreSystemJobs", False)
    if not isinstance(ignore, bool):
        raise bad_request("IgnoreSystemJobs must be true or false")
    return pb.DrainStrategy(deadline=deadline, ignore_system_jobs=ignore)


async def node_drain(request: Request) -> Response:
    body = await json_body(request)
    if body is not None and not isinstance(body, dict):
        raise bad_request("drain request must be a JSON object")
    body = body or {}
    if not body and "enable" in request.query_params:
        # Nomad's pre-0.8 form (`?enable=true`, still what some clients
        # send): a drain with Nomad's default one-hour deadline, or none
        enable = bool_param(request, "enable")
        body = {"DrainSpec": {"Deadline": DEFAULT_DRAIN_DEADLINE} if enable else None}
    strategy = _drain_strategy(body.get("DrainSpec"))
    meta = body.get("Meta") or {}
    req = node_pb2.NodeUpdateDrainRequest(
        node_id=request.path_params["node_id"],
        mark_eligible=bool(body.get("MarkEligible")),
        meta_message=str(meta.get("message", "")) if isinstance(meta, dict) else "",
    )
    if strategy is not None:
        req.drain_strategy.CopyFrom(strategy)
    resp = await backend_of(request).nodes.UpdateDrain(
        req, metadata=metadata_of(request), timeout=DEFAULT_TIMEOUT
    )
    return respond(request, _update_response(resp), index=resp.index)


async def node_eligibility(request: Request) -> Response:
    body = await json_body(request)
    if not isinstance(body, dict):
        raise bad_request("eligibility request must be a JSON object")
    eligibility = body.get("Eligibility")
    if eligibility not in ("eligible", "ineligible"):
        raise bad_request(f"invalid scheduling eligibility {eligibility!r}")
    resp = await backend_of(request).nodes.UpdateEligibility(
        node_pb2.NodeUpdateEligibilityRequest(
            node_id=request.path_params["node_id"], eligibility=eligibility
        ),
        metadata=metadata_of(request),
        timeout=DEFAULT_TIMEOUT,
    )
    return respond(request, _update_response(resp), index=resp.index)


async def node_purge(request: Request) -> Response:
    """Nomad's node purge: the node is removed from the state and every
    job with work on it evaluated (its allocs are lost). An agent still
    running registers its node again, as Nomad's."""
    resp = await backend_of(request).nodes.Deregister(
        node_pb2.NodeDeregisterRequest(node_id=request.path_params["node_id"]),
        metadata=metadata_of(request),
        timeout=DEFAULT_TIMEOUT,
    )
    return respond(request, _update_response(resp), index=resp.index)


async def node_evaluate(request: Request) -> Response:
    """Nomad's node evaluate: an eval of every job with work on the node
    (and of the system jobs that take it)."""
    resp = await backend_of(request).nodes.Evaluate(
        node_pb2.NodeEvaluateRequest(node_id=request.path_params["node_id"]),
        metadata=metadata_of(request),
        timeout=DEFAULT_TIMEOUT,
    )
    # Nomad's Go client decodes `EvalID` (its servers send only `EvalIDs`)
    body = {"EvalID": resp.eval_ids[0] if resp.eval_ids else "", **_update_response(resp)}
    return respond(request, body, index=resp.index)


async def node_action(request: Request) -> Response:
    """Other node actions: not served (501, or 405 for a wrong method)."""
    from services.gateway.routes.unserved import wrong_method

    if wrong_method(request, skip=NODE_ACTION):
        raise NomadError(405, "Invalid method")
    raise unserved(f"{request.method} /v1/node/:id/{request.path_params['action']}")


#: endpoints Corral does not serve answer only that (501 or 405)
UNSERVED = dict.fromkeys(("GET", "PUT", "POST", "DELETE"), NOT_SERVED)

NODE_ACTION = ApiRoute("/v1/node/{node_id}/{action:path}", node_action, UNSERVED)

#: Nomad's Node.GetAllocs: node:read, and only the allocs of namespaces
#: where the token has read-job
NODE_ALLOCS = Need(
    summary="`node:read`; lists only allocs of namespaces with `read-job`",
    scopes=(("node", "read"),),
    filters=True,
)
NODE_UPDATE = {"PUT": NODE_WRITE, "POST": NODE_WRITE}


async def client_stats(request: Request) -> Response:
    """Nomad's HostStats of the node named by `node_id` (the gateway is a
    server: there is no local client to default to)."""
    node_id = request.query_params.get("node_id", "")
    if not node_id:
        raise bad_request("No local Node and node_id not provided")
    backend = backend_of(request)
    md = metadata_of(request)
    got = await backend.nodes.Get(
        node_pb2.NodeGetRequest(node_id=node_id), metadata=md, timeout=DEFAULT_TIMEOUT
    )
    if not got.node.http_addr:
        raise NomadError(404, f"node {got.node.id} has no address to reach its agent")
    resp = await backend.client_stats(got.node.http_addr, region_of(request)).Stats(
        node_pb2.ClientStatsRequest(), metadata=md, timeout=DEFAULT_TIMEOUT
    )
    return respond(request, stats_map.host_stats(resp.stats))


ROUTES: list[BaseRoute] = [
    ApiRoute("/v1/nodes", nodes, {"GET": NODE_READ}),
    ApiRoute("/v1/node/{node_id}/allocations", node_allocations, {"GET": NODE_ALLOCS}),
    ApiRoute("/v1/node/{node_id}/drain", node_drain, NODE_UPDATE),
    ApiRoute("/v1/node/{node_id}/eligibility", node_eligibility, NODE_UPDATE),
    ApiRoute("/v1/node/{node_id}/purge", node_purge, NODE_UPDATE),
    ApiRoute("/v1/node/{node_id}/evaluate", node_evaluate, NODE_UPDATE),
    ApiRoute("/v1/node/{node_id}", node, {"GET": NODE_READ}),
    NODE_ACTION,
    ApiRoute("/v1/client/stats", client_stats, {"GET": NODE_READ}),
]
