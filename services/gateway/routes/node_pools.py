"""/v1/node/pools and /v1/node/pool/:name[/nodes|/jobs] (Nomad's
command/agent/node_pool_endpoint.go) over the NodePool service; the state
checks the token's node_pool rules."""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute

from corral.domain import object_specs
from corral.v1 import node_pool_pb2, query_pb2
from services.gateway.authz import ApiRoute, Need
from services.gateway.backend import DEFAULT_TIMEOUT
from services.gateway.http import (
    NomadError,
    QueryOptions,
    backend_of,
    bad_request,
    listing,
    metadata_of,
    object_body,
    respond,
    written,
)
from services.gateway.mapping import jobs as job_map
from services.gateway.mapping import nodes as node_map


async def pools(request: Request) -> Response:
    if request.method in ("PUT", "POST"):
        return await _upsert(request, "")
    q = QueryOptions.from_request(request)

    async def fetch(query: query_pb2.QueryOptions) -> tuple[list[dict[str, Any]], Any]:
        resp = await backend_of(request).node_pools.List(
            node_pool_pb2.NodePoolListRequest(query=query), metadata=q.metadata, timeout=q.timeout
        )
        return [node_map.node_pool(p) for p in resp.node_pools], resp.meta

    return await listing(request, q, fetch, key="Name")


async def _upsert(request: Request, name: str) -> Response:
    body = await object_body(request)
    try:
        message = object_specs.node_pool_from_nomad(body)
    except ValueError as exc:
        raise bad_request(str(exc)) from None
    if name and message.name != name:
        raise bad_request("Node pool name does not match request path")
    resp = await backend_of(request).node_pools.Upsert(
        node_pool_pb2.NodePoolUpsertRequest(node_pools=[message]),
        metadata=metadata_of(request),
        timeout=DEFAULT_TIMEOUT,
    )
    return written(resp.index)


def _no_prefix(q: QueryOptions) -> None:
    if q.prefix:
        # ambiguous here (the pool's name or the listed ids?), as in Nomad
        raise bad_request("prefix argument not allowed")


async def pool(request: Request) -> Response:
    path: str = request.path_params["rest"]
    for suffix, handler in (("/nodes", _nodes), ("/jobs", _jobs)):
        if path.endswith(suffix):
            if request.method != "GET":
                raise NomadError(405, "Invalid method")
            return await handler(request, path[: -len(suffix)])
    backend = backend_of(request)
    if request.method == "GET":
        q = QueryOptions.from_request(request)
        resp = await backend.node_pools.Get(
            node_pool_pb2.NodePoolGetRequest(name=path, query=q.proto(paginate=False)),
            metadata=q.metadata,
            timeout=q.timeout,
        )
        return respond(request, node_map.node_pool(resp.node_pool), index=resp.meta.index)
    if request.method == "DELETE":
        done = await backend.node_pools.Delete(
            node_pool_pb2.NodePoolDeleteRequest(names=[path]),
            metadata=metadata_of(request),
            timeout=DEFAULT_TIMEOUT,
        )
        return written(done.index)
    return await _upsert(request, path)


async def _nodes(request: Request, name: str) -> Response:
    q = QueryOptions.from_request(request)
    _no_prefix(q)

    async def fetch(query: query_pb2.QueryOptions) -> tuple[list[dict[str, Any]], Any]:
        resp = await backend_of(request).node_pools.ListNodes(
            node_pool_pb2.NodePoolGetRequest(name=name, query=query),
            metadata=q.metadata,
            timeout=q.timeout,
        )
        return [node_map.stub(n) for n in resp.nodes], resp.meta

    return await listing(request, q, fetch)


async def _jobs(request: Request, name: str) -> Response:
    q = QueryOptions.from_request(request)
    _no_prefix(q)

    async def fetch(query: query_pb2.QueryOptions) -> tuple[list[dict[str, Any]], Any]:
        resp = await backend_of(request).node_pools.ListJobs(
            node_pool_pb2.NodePoolGetRequest(name=name, query=query),
            metadata=q.metadata,
            timeout=q.timeout,
        )
        return [job_map.stub(j) for j in resp.jobs], resp.meta

    return await listing(request, q, fetch)


#: Nomad's node_pool rules, on the pool the path (or the body) names
LISTED = Need(summary="lists the pools with `node_pool` read", filters=True)
READ = Need(
    summary="`node_pool` read on the pool (its nodes: and `node:read`; its jobs: those "
    "of namespaces with `list-jobs`)",
    node_pool=("read",),
    per_object=True,
)
WRITE = Need(summary="`node_pool` write on the pool", node_pool=("write",), per_object=True)
DELETE = Need(summary="`node_pool` delete on the pool", node_pool=("delete",), per_object=True)

ROUTES: list[BaseRoute] = [
    ApiRoute("/v1/node/pools", pools, {"GET": LISTED, "PUT": WRITE, "POST": WRITE}),
    ApiRoute(
        "/v1/node/pool/{rest:path}",
        pool,
        {"GET": READ, "PUT": WRITE, "POST": WRITE, "DELETE": DELETE},
    ),
]
