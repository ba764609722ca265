"""/v1/namespaces and /v1/namespace[/:name] (Nomad's
command/agent/namespace_endpoint.go) over the Namespace service. The state
decides every permission: writes need a management token, reads show what
the token may see."""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute

from corral.domain import object_specs
from corral.v1 import namespace_pb2, query_pb2
from services.gateway.authz import MANAGEMENT, ApiRoute, Need
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
from services.gateway.mapping import namespaces as ns_map


async def namespaces(request: Request) -> Response:
    q = QueryOptions.from_request(request)

    async def fetch(query: query_pb2.QueryOptions) -> tuple[list[dict[str, Any]], Any]:
        resp = await backend_of(request).namespaces.List(
            namespace_pb2.NamespaceListRequest(query=query), metadata=q.metadata, timeout=q.timeout
        )
        return [ns_map.namespace(n) for n in resp.namespaces], resp.meta

    return await listing(request, q, fetch, key="Name")


async def _upsert(request: Request, name: str) -> Response:
    body = await object_body(request)
    try:
        message = object_specs.namespace_from_nomad(body)
    except ValueError as exc:
        raise bad_request(str(exc)) from None
    if name and message.name != name:
        raise bad_request("Namespace name does not match request path")
    resp = await backend_of(request).namespaces.Upsert(
        namespace_pb2.NamespaceUpsertRequest(namespaces=[message]),
        metadata=metadata_of(request),
        timeout=DEFAULT_TIMEOUT,
    )
    return written(resp.index)


async def create(request: Request) -> Response:
    return await _upsert(request, "")


async def namespace(request: Request) -> Response:
    name: str = request.path_params["name"]
    if not name:
        raise NomadError(400, "Missing Namespace Name")
    backend = backend_of(request)
    if request.method == "GET":
        q = QueryOptions.from_request(request)
        resp = await backend.namespaces.Get(
            namespace_pb2.NamespaceGetRequest(name=name, query=q.proto(paginate=False)),
            metadata=q.metadata,
            timeout=q.timeout,
        )
        return respond(request, ns_map.namespace(resp.namespace), index=resp.meta.index)
    if request.method == "DELETE":
        resp_w = await backend.namespaces.Delete(
            namespace_pb2.NamespaceDeleteRequest(names=[name]),
            metadata=metadata_of(request),
            timeout=DEFAULT_TIMEOUT,
        )
        return written(resp_w.index)
    return await _upsert(request, name)


#: Nomad's Namespace.ListNamespaces shows those the token has any
#: capability in; Namespace.GetNamespace needs one there
LISTED = Need(summary="lists the namespaces where the token has any capability", filters=True)
SEEN = Need(summary="any capability in the namespace", namespace_seen=True, per_object=True)
_MANAGE = {"PUT": MANAGEMENT, "POST": MANAGEMENT}

ROUTES: list[BaseRoute] = [
    ApiRoute("/v1/namespaces", namespaces, {"GET": LISTED}),
    ApiRoute("/v1/namespace", create, _MANAGE),
    ApiRoute(
        "/v1/namespace/{name:path}", namespace, {"GET": SEEN, **_MANAGE, "DELETE": MANAGEMENT}
    ),
]
