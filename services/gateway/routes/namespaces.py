"""/v1/namespaces and /v1/namespace[/:name] (Nomad's
command/agent/namespace_endpoint.go) over the Namespace service. The state
decides every permission: writes need a management token, reads show what
the token may see."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute

from corral.domain import object_specs
from corral.v1 import namespace_pb2
from services.gateway.authz import MANAGEMENT, ApiRoute, Need
from services.gateway.http import NomadError
from services.gateway.mapping import namespaces as ns_map
from services.gateway.routes.named import Named

NAMESPACES = Named(
    title="Namespace",
    single="namespace",
    plural="namespaces",
    service=lambda backend: backend.namespaces,
    list_request=namespace_pb2.NamespaceListRequest,
    get_request=namespace_pb2.NamespaceGetRequest,
    upsert_request=namespace_pb2.NamespaceUpsertRequest,
    delete_request=namespace_pb2.NamespaceDeleteRequest,
    show=ns_map.namespace,
    from_nomad=object_specs.namespace_from_nomad,
)


async def namespaces(request: Request) -> Response:
    return await NAMESPACES.listing(request)


async def create(request: Request) -> Response:
    return await NAMESPACES.upsert(request, "")


async def namespace(request: Request) -> Response:
    name: str = request.path_params["name"]
    if not name:
        raise NomadError(400, "Missing Namespace Name")
    return await NAMESPACES.one(request, name)


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
