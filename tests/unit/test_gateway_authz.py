"""Every route of the gateway declares what each of its methods needs of the
caller's token (services/gateway/authz.py): a route added without a
declaration fails here, before the end-to-end test
(tests/e2e/gateway_security/test_authz_routes.py) checks that each
declaration holds. The needs the gateway decides itself (no RPC guards
those routes) are checked here on compiled ACLs."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from starlette.routing import BaseRoute, Mount, Route, WebSocketRoute

from corral.security import acl
from services.gateway import app, authz
from services.gateway.routes import agent, parse


def declared(routes: list[BaseRoute], prefix: str = "") -> Iterator[tuple[str, Any]]:
    """(path template, route) of every route and mount, mounts entered."""
    for route in routes:
        if isinstance(route, Mount) and route.routes:
            yield from declared(list(route.routes), prefix + route.path)
        elif isinstance(route, Route | Mount | WebSocketRoute):
            yield prefix + route.path, route
        else:
            raise AssertionError(f"{route!r}: a kind of route the gateway does not use")


def test_every_route_declares_a_need_for_every_method() -> None:
    missing = []
    for path, route in declared(app.routes()):
        needs = authz.needs_of(route)
        methods = set(getattr(route, "methods", None) or ()) or {"GET", "HEAD"}
        for method in sorted(methods):
            if method not in needs:
                missing.append(f"{method} {path}")
    assert not missing, "routes without a declared need: " + ", ".join(missing)


def test_a_route_cannot_serve_a_method_it_declares_nothing_for() -> None:
    async def endpoint(request: Any) -> Any:
        raise AssertionError

    route = authz.ApiRoute("/v1/x", endpoint, {"PUT": authz.SUBMIT_JOB})
    assert route.methods == {"PUT"}
    with pytest.raises(ValueError, match="declares what each method needs"):
        authz.ApiRoute("/v1/y", endpoint, {})
    plain = Route("/v1/z", endpoint, methods=["GET"])
    assert authz.needs_of(plain) == {}


def compiled(rules: str) -> acl.ACL:
    return acl.compile_acl([acl.parse_policy(rules)])


@pytest.mark.parametrize(
    ("rules", "allowed"),
    [
        ('namespace "default" { capabilities = ["parse-job"] }', True),
        ('namespace "default" { capabilities = ["submit-job"] }', True),
        ('namespace "default" { capabilities = ["read-job"] }', True),
        ('namespace "default" { policy = "read" }', True),
        ('namespace "default" { capabilities = ["list-jobs", "dispatch-job"] }', False),
        ('namespace "other" { policy = "write" }', False),
        ('node { policy = "write" }\noperator { policy = "write" }', False),
    ],
)
def test_parsing_a_job_needs_parse_submit_or_read_job(rules: str, allowed: bool) -> None:
    """Finding 2: /v1/jobs/parse needs parse-job, submit-job or read-job in
    the namespace (before: nothing at all)."""
    need = parse.PARSE
    assert need.gateway
    assert authz.allows(compiled(rules), need, "default") is allowed
    assert authz.allows(acl.DENY_ALL, need, "default") is False
    assert authz.allows(acl.MANAGEMENT, need, "default") is True


def test_the_agent_self_needs_agent_read() -> None:
    need = agent.AGENT_READ
    assert need.gateway
    assert authz.allows(compiled('agent { policy = "read" }'), need, "default")
    assert not authz.allows(compiled('node { policy = "write" }'), need, "default")
    assert not authz.allows(acl.DENY_ALL, need, "default")
