"""/v1/acl/*: bootstrap, policies, roles and tokens (Nomad's
command/agent/acl_endpoint.go semantics) over the ACL service.

The state decides every permission (a management token for all of it but
token/self, and reading the policies and roles a token holds); the gateway
only carries the request's token. Secrets: the
bootstrap and token-create answers carry the new secret, /v1/acl/token/self
echoes the caller's own, a one-time token's create answer its one-time
secret and its exchange the token's secret; nothing else can, since the
state keeps hashes only. No secret is ever logged here (the gateway logs no
bodies).

Not served (501, docs/http-api.md): auth methods, binding rules and login."""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute

from corral.v1 import acl_pb2, query_pb2
from services.gateway.authz import ANY_TOKEN, MANAGEMENT, OWN_POLICIES, ApiRoute, Need
from services.gateway.backend import DEFAULT_TIMEOUT
from services.gateway.http import (
    NomadError,
    QueryOptions,
    backend_of,
    bad_request,
    body_fields,
    listing,
    metadata_of,
    object_body,
    respond,
    token_of,
    written,
)
from services.gateway.mapping import acl as acl_map

# -- bootstrap ---------------------------------------------------------------


async def bootstrap(request: Request) -> Response:
    body = await object_body(request, required=False)
    try:
        message = acl_map.bootstrap_request(body)
    except ValueError as exc:
        raise bad_request(str(exc)) from None
    resp = await backend_of(request).acl.Bootstrap(
        message, metadata=metadata_of(request), timeout=DEFAULT_TIMEOUT
    )
    return respond(request, acl_map.token(resp.token), index=resp.index)


# -- policies ------------------------------------------------------------------


async def policies(request: Request) -> Response:
    q = QueryOptions.from_request(request)

    async def fetch(query: query_pb2.QueryOptions) -> tuple[list[dict[str, Any]], Any]:
        resp = await backend_of(request).acl.ListPolicies(
            acl_pb2.ACLListPoliciesRequest(query=query), metadata=q.metadata, timeout=q.timeout
        )
        return [acl_map.policy_stub(p) for p in resp.policies], resp.meta

    return await listing(request, q, fetch, key="Name")


async def policy(request: Request) -> Response:
    name: str = request.path_params["name"]
    backend = backend_of(request)
    if request.method == "GET":
        q = QueryOptions.from_request(request)
        resp = await backend.acl.GetPolicy(
            acl_pb2.ACLGetPolicyRequest(name=name, query=q.proto(paginate=False)),
            metadata=q.metadata,
            timeout=q.timeout,
        )
        return respond(request, acl_map.policy(resp.policy), index=resp.meta.index)
    if request.method == "DELETE":
        done = await backend.acl.DeletePolicies(
            acl_pb2.ACLDeletePoliciesRequest(names=[name]),
            metadata=metadata_of(request),
            timeout=DEFAULT_TIMEOUT,
        )
        return written(done.index)
    body = await object_body(request)
    try:
        message = acl_map.policy_from_body(name, body)
    except ValueError as exc:
        raise bad_request(str(exc)) from None
    with body_fields("policies[0]"):
        done = await backend.acl.UpsertPolicies(
            acl_pb2.ACLUpsertPoliciesRequest(policies=[message]),
            metadata=metadata_of(request),
            timeout=DEFAULT_TIMEOUT,
        )
    return written(done.index)


# -- roles ---------------------------------------------------------------------


async def roles(request: Request) -> Response:
    q = QueryOptions.from_request(request)

    async def fetch(query: query_pb2.QueryOptions) -> tuple[list[dict[str, Any]], Any]:
        resp = await backend_of(request).acl.ListRoles(
            acl_pb2.ACLListRolesRequest(query=query), metadata=q.metadata, timeout=q.timeout
        )
        return [acl_map.role(r) for r in resp.roles], resp.meta

    return await listing(request, q, fetch)


async def _upsert_role(request: Request, path_id: str = "") -> Response:
    body = await object_body(request)
    try:
        message = acl_map.role_from_body(body, path_id)
    except ValueError as exc:
        raise bad_request(str(exc)) from None
    with body_fields("roles[0]"):
        resp = await backend_of(request).acl.UpsertRoles(
            acl_pb2.ACLUpsertRolesRequest(roles=[message]),
            metadata=metadata_of(request),
            timeout=DEFAULT_TIMEOUT,
        )
    return respond(request, acl_map.role(resp.roles[0]), index=resp.index)


async def create_role(request: Request) -> Response:
    return await _upsert_role(request)


async def role(request: Request) -> Response:
    role_id: str = request.path_params["role_id"]
    backend = backend_of(request)
    if request.method == "GET":
        q = QueryOptions.from_request(request)
        resp = await backend.acl.GetRole(
            acl_pb2.ACLGetRoleRequest(id=role_id, query=q.proto(paginate=False)),
            metadata=q.metadata,
            timeout=q.timeout,
        )
        return respond(request, acl_map.role(resp.role), index=resp.meta.index)
    if request.method == "DELETE":
        done = await backend.acl.DeleteRoles(
            acl_pb2.ACLDeleteRolesRequest(ids=[role_id]),
            metadata=metadata_of(request),
            timeout=DEFAULT_TIMEOUT,
        )
        return written(done.index)
    return await _upsert_role(request, role_id)


async def role_by_name(request: Request) -> Response:
    q = QueryOptions.from_request(request)
    resp = await backend_of(request).acl.GetRoleByName(
        acl_pb2.ACLGetRoleByNameRequest(
            name=request.path_params["name"], query=q.proto(paginate=False)
        ),
        metadata=q.metadata,
        timeout=q.timeout,
    )
    return respond(request, acl_map.role(resp.role), index=resp.meta.index)


# -- tokens --------------------------------------------------------------------


async def tokens(request: Request) -> Response:
    q = QueryOptions.from_request(request)

    async def fetch(query: query_pb2.QueryOptions) -> tuple[list[dict[str, Any]], Any]:
        resp = await backend_of(request).acl.ListTokens(
            acl_pb2.ACLListTokensRequest(query=query), metadata=q.metadata, timeout=q.timeout
        )
        return [acl_map.token_stub(t) for t in resp.tokens], resp.meta

    return await listing(request, q, fetch, key="AccessorID")


async def create_token(request: Request) -> Response:
    body = await object_body(request)
    try:
        message = acl_map.create_token_request(body)
    except ValueError as exc:
        raise bad_request(str(exc)) from None
    with body_fields():
        resp = await backend_of(request).acl.CreateToken(
            message, metadata=metadata_of(request), timeout=DEFAULT_TIMEOUT
        )
    return respond(request, acl_map.token(resp.token), index=resp.index)


async def token_self(request: Request) -> Response:
    resp = await backend_of(request).acl.TokenSelf(
        acl_pb2.ACLTokenSelfRequest(), metadata=metadata_of(request), timeout=DEFAULT_TIMEOUT
    )
    # The caller's own secret, as Nomad answers it (the anonymous token has none).
    secret = token_of(request) if resp.token.accessor_id != "anonymous" else ""
    return respond(request, acl_map.token(resp.token, secret_id=secret), index=resp.index)


async def one_time_token(request: Request) -> Response:
    """Nomad's UpsertOneTimeToken: a one-time token for the caller's own
    token (the request's body, if any, is ignored, as Nomad's)."""
    resp = await backend_of(request).acl.UpsertOneTimeToken(
        acl_pb2.ACLUpsertOneTimeTokenRequest(),
        metadata=metadata_of(request),
        timeout=DEFAULT_TIMEOUT,
    )
    return respond(
        request, {"OneTimeToken": acl_map.one_time_token(resp.one_time_token)}, index=resp.index
    )


async def exchange_one_time_token(request: Request) -> Response:
    body = await object_body(request)
    try:
        message = acl_map.exchange_request(body)
    except ValueError as exc:
        raise bad_request(str(exc)) from None
    with body_fields():
        resp = await backend_of(request).acl.ExchangeOneTimeToken(
            message, metadata=metadata_of(request), timeout=DEFAULT_TIMEOUT
        )
    return respond(request, {"Token": acl_map.token(resp.token)}, index=resp.index)


async def token(request: Request) -> Response:
    accessor: str = request.path_params["accessor_id"]
    if accessor in ("self", "onetime"):  # their own routes, with other methods
        raise NomadError(405, "Invalid method")
    backend = backend_of(request)
    if request.method == "GET":
        q = QueryOptions.from_request(request)
        resp = await backend.acl.GetToken(
            acl_pb2.ACLGetTokenRequest(accessor_id=accessor, query=q.proto(paginate=False)),
            metadata=q.metadata,
            timeout=q.timeout,
        )
        return respond(request, acl_map.token(resp.token), index=resp.index)
    if request.method == "DELETE":
        done = await backend.acl.DeleteTokens(
            acl_pb2.ACLDeleteTokensRequest(accessor_ids=[accessor]),
            metadata=metadata_of(request),
            timeout=DEFAULT_TIMEOUT,
        )
        return written(done.index)
    body = await object_body(request)
    try:
        message = acl_map.update_token_request(accessor, body)
    except ValueError as exc:
        raise bad_request(str(exc)) from None
    with body_fields():
        resp = await backend.acl.UpdateToken(
            message, metadata=metadata_of(request), timeout=DEFAULT_TIMEOUT
        )
    return respond(request, acl_map.token(resp.token), index=resp.index)


#: anyone, once (the state refuses a second bootstrap)
BOOTSTRAP = Need(summary="none (once: the state refuses a second bootstrap)", open=True)
_MANAGE = {"PUT": MANAGEMENT, "POST": MANAGEMENT}
_LISTED_POLICIES = Need(
    summary="a management token; any other token lists the policies it holds",
    management=True,
    own_policies=True,
    filters=True,
)

_LISTED_ROLES = Need(
    summary="a management token; any other token lists the roles it links",
    management=True,
    filters=True,
)
#: Nomad's GetRoleByID/GetRoleByName: a management token, or one linking the role
OWN_ROLES = Need(summary="a management token, or a token linking the role", management=True)

#: Nomad's UpsertOneTimeToken: any non-anonymous token, for itself
ONE_TIME = Need(summary="any non-anonymous token (a one-time token for itself)", any_token=True)
#: the one-time secret in the body is the authorization
EXCHANGE = Need(summary="none (the one-time secret in the body is the authorization)", open=True)

ROUTES: list[BaseRoute] = [
    ApiRoute("/v1/acl/bootstrap", bootstrap, {"PUT": BOOTSTRAP, "POST": BOOTSTRAP}),
    ApiRoute("/v1/acl/policies", policies, {"GET": _LISTED_POLICIES}),
    ApiRoute(
        "/v1/acl/policy/{name}", policy, {"GET": OWN_POLICIES, **_MANAGE, "DELETE": MANAGEMENT}
    ),
    ApiRoute("/v1/acl/roles", roles, {"GET": _LISTED_ROLES}),
    ApiRoute("/v1/acl/role", create_role, _MANAGE),
    ApiRoute("/v1/acl/role/name/{name}", role_by_name, {"GET": OWN_ROLES}),
    ApiRoute("/v1/acl/role/{role_id}", role, {"GET": OWN_ROLES, **_MANAGE, "DELETE": MANAGEMENT}),
    ApiRoute("/v1/acl/tokens", tokens, {"GET": MANAGEMENT}),
    ApiRoute("/v1/acl/token", create_token, _MANAGE),
    ApiRoute("/v1/acl/token/self", token_self, {"GET": ANY_TOKEN}),
    ApiRoute("/v1/acl/token/onetime", one_time_token, {"PUT": ONE_TIME, "POST": ONE_TIME}),
    ApiRoute(
        "/v1/acl/token/onetime/exchange",
        exchange_one_time_token,
        {"PUT": EXCHANGE, "POST": EXCHANGE},
    ),
    ApiRoute(
        "/v1/acl/token/{accessor_id}",
        token,
        {"GET": MANAGEMENT, **_MANAGE, "DELETE": MANAGEMENT},
    ),
]
