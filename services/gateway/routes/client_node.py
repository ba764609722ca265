"""A node's agent, reached through the node's address (as the alloc routes
reach an alloc's agent): Nomad's `/v1/client/metadata` (read and apply the
node's dynamic metadata, `nomad node meta`), `/v1/client/gc` (destroy every
finished alloc of the node) and `/v1/client/allocation/:id/gc` (one).

The gateway is a server: it has no local client, so `node_id` is required
where Nomad's agent would default to its own node (Nomad's answer then)."""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute

from corral.domain import node_meta
from corral.v1 import alloc_pb2, node_pb2
from services.gateway.authz import NODE_READ, NODE_WRITE, ApiRoute, at_alloc_agent
from services.gateway.backend import DEFAULT_TIMEOUT
from services.gateway.http import (
    NomadError,
    backend_of,
    bad_request,
    metadata_of,
    object_body,
    region_of,
    respond,
)
from services.gateway.routes.allocs import alloc_agent

NO_NODE = "No local Node and node_id not provided"


async def node_agent(request: Request, node_id: str) -> tuple[str, str]:
    """The full id of `node_id` (an id or a prefix) and its agent's address
    (the agent refuses a call naming another node than its own)."""
    if not node_id:
        raise bad_request(NO_NODE)
    got = await backend_of(request).nodes.Get(
        node_pb2.NodeGetRequest(node_id=node_id),
        metadata=metadata_of(request),
        timeout=DEFAULT_TIMEOUT,
    )
    if not got.node.http_addr:
        raise NomadError(404, f"node {got.node.id} has no address to reach its agent")
    return got.node.id, got.node.http_addr


def _changes(body: dict[str, Any]) -> tuple[dict[str, str], list[str]]:
    meta = body.get("Meta")
    if meta is None:
        raise bad_request("missing required Meta object")
    if not isinstance(meta, dict):
        raise bad_request("Meta must be an object of strings (null unsets a key)")
    sets: dict[str, str] = {}
    unset: list[str] = []
    for key, value in meta.items():
        if value is None:
            unset.append(key)
        elif isinstance(value, str):
            sets[key] = value
        else:
            raise bad_request(f"Meta[{key!r}] must be a string or null")
    return sets, unset


async def metadata(request: Request) -> Response:
    """GET: the node's metadata (node:read); POST/PUT {"NodeID", "Meta"}:
    apply dynamic metadata (node:write); `?node_id=` names the node."""
    node_id = request.query_params.get("node_id", "")
    if request.method == "GET":
        node_id, address = await node_agent(request, node_id)
        resp = await (
            backend_of(request)
            .client_node(address, region_of(request))
            .ReadMeta(
                node_pb2.NodeMetaReadRequest(node_id=node_id),
                metadata=metadata_of(request),
                timeout=DEFAULT_TIMEOUT,
            )
        )
        return respond(request, node_meta.nomad_json(resp))
    body = await object_body(request)
    body_node = body.get("NodeID")
    if body_node is not None and not isinstance(body_node, str):
        raise bad_request("NodeID must be a string")
    sets, unset = _changes(body)
    node_id, address = await node_agent(request, node_id or body_node or "")
    resp = await (
        backend_of(request)
        .client_node(address, region_of(request))
        .ApplyMeta(
            node_pb2.NodeMetaApplyRequest(node_id=node_id, meta=sets, unset=unset),
            metadata=metadata_of(request),
            # the agent registers the node again before it answers
            timeout=DEFAULT_TIMEOUT + 10,
        )
    )
    return respond(request, node_meta.nomad_json(resp))


async def client_gc(request: Request) -> Response:
    """Nomad's /v1/client/gc?node_id=: destroy every finished alloc of the
    node (node:write); answers no body, as Nomad."""
    node_id, address = await node_agent(request, request.query_params.get("node_id", ""))
    await (
        backend_of(request)
        .client_node(address, region_of(request))
        .GarbageCollectAll(
            node_pb2.ClientGCRequest(node_id=node_id),
            metadata=metadata_of(request),
            timeout=DEFAULT_TIMEOUT + 60,  # the allocs' poststop tasks run first
        )
    )
    return Response(status_code=200)


async def allocation_gc(request: Request) -> Response:
    """Nomad's /v1/client/allocation/:id/gc: destroy one finished alloc
    (submit-job in its namespace); a running one is refused (400)."""
    alloc, address = await alloc_agent(request)
    await (
        backend_of(request)
        .client_alloc(address, region_of(request))
        .GarbageCollect(
            alloc_pb2.AllocGCRequest(alloc_id=alloc.id),
            metadata=metadata_of(request),
            timeout=DEFAULT_TIMEOUT + 60,
        )
    )
    return Response(status_code=200)


#: Nomad's need is submit-job in the alloc's namespace; the gateway finds
#: the alloc's agent with Alloc.Get and Node.Get first
ALLOC_GC = at_alloc_agent("submit-job")
META = {"GET": NODE_READ, "POST": NODE_WRITE, "PUT": NODE_WRITE}
GC = dict.fromkeys(("GET", "PUT", "POST"), NODE_WRITE)

ROUTES: list[BaseRoute] = [
    ApiRoute("/v1/client/metadata", metadata, META),
    ApiRoute("/v1/client/gc", client_gc, GC),
    ApiRoute(
        "/v1/client/allocation/{alloc_id}/gc",
        allocation_gc,
        dict.fromkeys(("GET", "PUT", "POST"), ALLOC_GC),
    ),
]
