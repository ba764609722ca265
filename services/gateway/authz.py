"""Who may call each HTTP route: every route declares, per method, what its
Nomad counterpart needs of the caller's token (a `Need`), and `ApiRoute`
takes its methods from those declarations, so a route cannot serve a method
it declares nothing for. tests/unit/test_gateway_authz.py fails for a route
of the app without one; tests/e2e/gateway_security/test_authz_routes.py
calls every declared route and method with a token that lacks the need
(403) and one that holds it (not 403).

Who decides: most routes call public RPCs with the request's token, and the
RPC's rule (corral.security.access.RULES) decides, as Nomad's HTTP agent forwards to
its RPC endpoints. A route whose answer no RPC guards (parsing a job file,
the agent's own configuration, the web UI's token summary) is decided here
(`gateway=True`), with the token resolved by the state's ACL.ResolveToken
and compiled by corral.security.acl_resolve, the same code every server uses.
docs/http-api.md lists every route's need."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route, WebSocketRoute

from corral.domain.errors import PermissionDenied
from corral.security import acl
from corral.security.acl_resolve import ACLDisabled, Resolved
from services.gateway.http import NomadError, backend_of, token_of

Endpoint = Callable[[Request], Awaitable[Response]]


@dataclass(frozen=True)
class Need:
    """What a route needs of the caller's token.

    `namespace` is a list of alternatives groups: every group must hold,
    and any one capability of a group suffices, in the request's namespace
    (`?namespace=`, default "default") or, with `per_object`, in the
    namespace of the object the path names. `scopes` are node, agent or
    operator levels, all needed."""

    summary: str
    namespace: tuple[tuple[str, ...], ...] = ()
    scopes: tuple[tuple[str, str], ...] = ()
    #: node_pool capabilities (read, write, delete) on the pool the path names
    node_pool: tuple[str, ...] = ()
    #: any capability at all in the namespace the path names (Nomad's
    #: AllowNamespace: may it be seen)
    namespace_seen: bool = False
    #: capabilities of the token's `variables` rules on the variable's path
    variables: tuple[str, ...] = ()
    #: no token needed: the answer holds nothing a token guards
    open: bool = False
    #: any valid token (the answer describes the token itself)
    any_token: bool = False
    management: bool = False
    #: a token also reads the ACL policies it holds
    own_policies: bool = False
    per_object: bool = False
    #: a list or stream that leaves out what the token may not read
    filters: bool = False
    #: answers 200 with each refused part's error in the body (the UI)
    partial: bool = False
    #: decided by the gateway before the handler runs (no RPC guards it)
    gateway: bool = False


def ns(*capabilities: str, per_object: bool = False, filters: bool = False) -> Need:
    """Any of `capabilities` in the namespace."""
    where = "the object's namespace" if per_object else "the namespace"
    return Need(
        summary=f"{' or '.join(f'`{c}`' for c in capabilities)} in {where}",
        namespace=(capabilities,),
        per_object=per_object,
        filters=filters,
    )


def scope(name: str, level: str) -> Need:
    return Need(summary=f"`{name}:{level}`", scopes=((name, level),))


OPEN = Need(summary="none (open)", open=True)
#: a Nomad endpoint Corral does not serve, or no endpoint at all
UNSERVED = Need(summary="none (answers only 404, 405 or 501)", open=True)
#: a path under a served endpoint that is none (Nomad's 400 "invalid URI")
INVALID = Need(summary="none (answers only 400 invalid URI)", open=True)
ANY_TOKEN = Need(summary="any valid token (about itself)", any_token=True)
MANAGEMENT = Need(summary="a management token", management=True)
OWN_POLICIES = Need(
    summary="a management token, or a token holding the policy",
    management=True,
    own_policies=True,
)

READ_JOB = ns("read-job")
READ_JOB_OBJECT = ns("read-job", per_object=True)
SUBMIT_JOB = ns("submit-job")
SUBMIT_JOB_OBJECT = ns("submit-job", per_object=True)
NODE_READ = scope("node", "read")
#: what the gateway's reads at an alloc's agent need (logs aside): Nomad's
#: need read-job in the alloc's namespace; Corral's find the agent with
#: Alloc.Get and Node.Get first, so they need node:read as well
ALLOC_AGENT_READ = Need(
    summary="`read-job` in the alloc's namespace, and `node:read`",
    namespace=(("read-job",),),
    scopes=(("node", "read"),),
    per_object=True,
)


def at_alloc_agent(capability: str, note: str = "") -> Need:
    """A route the alloc's agent answers with `capability` (Nomad's need):
    the gateway finds the agent with Alloc.Get and Node.Get first, so it
    needs read-job and node:read as well; `note` is added to the summary."""
    return Need(
        summary=f"`{capability}` and `read-job` in the alloc's namespace{note}, and `node:read`",
        namespace=((capability,), ("read-job",)),
        scopes=(("node", "read"),),
        per_object=True,
    )


NODE_WRITE = scope("node", "write")
OPERATOR_READ = scope("operator", "read")
OPERATOR_WRITE = scope("operator", "write")


def allows(found: acl.ACL, need: Need, namespace: str) -> bool:
    """Whether an ACL meets a need in `namespace` (for `gateway` needs)."""
    if need.open:
        return True
    if need.management and not found.is_management:
        return False
    for group in need.namespace:
        if not any(found.allows_namespace(namespace, cap) for cap in group):
            return False
    if need.namespace_seen and not found.allows_any_in_namespace(namespace):
        return False
    return all(found.allows(name, level) for name, level in need.scopes)


async def resolve(request: Request) -> Resolved | None:
    """The request's token as the servers see it; None when the state has
    ACLs off (then it enforces nothing, and neither does the gateway).
    Unknown or expired tokens raise PermissionDenied."""
    try:
        return await backend_of(request).tokens.resolve_token(token_of(request))
    except ACLDisabled:
        return None


async def check(request: Request, need: Need, namespace: str = "") -> None:
    """Refuse with 403 unless the request's token meets a `gateway` need in
    `namespace` (default: the request's `?namespace=`)."""
    try:
        resolved = await resolve(request)
    except PermissionDenied:
        raise NomadError(403, "Permission denied") from None
    if resolved is None:
        return
    namespace = namespace or request.query_params.get("namespace") or acl.DEFAULT_NAMESPACE
    if not allows(resolved.acl, need, namespace):
        raise NomadError(403, "Permission denied")


def _guarded(endpoint: Endpoint, needs: Mapping[str, Need]) -> Endpoint:
    async def guarded(request: Request) -> Response:
        need = needs.get(request.method) or needs.get("GET")
        # a per-object need is checked by the handler, once it knows the
        # object's namespace (a job body's `Namespace`)
        if need is not None and need.gateway and not need.per_object:
            await check(request, need)
        return await endpoint(request)

    guarded.__name__ = getattr(endpoint, "__name__", "endpoint")
    guarded.__doc__ = endpoint.__doc__
    return guarded


class ApiRoute(Route):
    """A route serving exactly the methods it declares a Need for (HEAD
    with GET, as Starlette does)."""

    def __init__(self, path: str, endpoint: Endpoint, needs: Mapping[str, Need], **kw: Any) -> None:
        if not needs:
            raise ValueError(f"{path}: a route declares what each method needs")
        self.needs: dict[str, Need] = dict(needs)
        if "GET" in self.needs:
            self.needs.setdefault("HEAD", self.needs["GET"])
        super().__init__(path, _guarded(endpoint, self.needs), methods=list(needs), **kw)


class ApiWebSocketRoute(WebSocketRoute):
    """A WebSocket route and what its caller's token needs (its RPC decides:
    the socket opens first, and a refusal closes it, as Nomad's)."""

    def __init__(self, path: str, endpoint: Any, need: Need, **kw: Any) -> None:
        self.needs: dict[str, Need] = {"GET": need, "HEAD": need}
        super().__init__(path, endpoint, **kw)


def needs_of(route: Any) -> dict[str, Need]:
    """The declared needs of a route, by method ({} when it declares none)."""
    found = getattr(route, "needs", None)
    return dict(found) if isinstance(found, dict) else {}
