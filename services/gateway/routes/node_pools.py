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
from services.gateway.http import (
    NomadError,
    QueryOptions,
    backend_of,
    bad_request,
    listing,
)
from services.gateway.mapping import jobs as job_map
from services.gateway.mapping import nodes as node_map
from services.gateway.routes.named import Named

POOLS = Named(
    title="Node pool",
    single="node_pool",
    plural="node_pools",
    service=lambda backend: backend.node_pools,
    list_request=node_pool_pb2.NodePoolListRequest,
    get_request=node_pool_pb2.NodePoolGetRequest,
    upsert_request=node_pool_pb2.NodePoolUpsertRequest,
    delete_request=node_pool_pb2.NodePoolDeleteRequest,
    show=node_map.node_pool,
    from_nomad=object_specs.node_pool_from_nomad,
)


async def pools(request: Request) -> Response:
    if request.method in ("PUT", "POST"):
        return await POOLS.upsert(request, "")
    return await POOLS.listing(request)


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
    return await POOLS.one(request, path)


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
