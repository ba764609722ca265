"""Issue 26, finding 8: the web UI's capability check (/ui/api/capabilities)
compiles a token with the servers' own compile (corral.security.acl_resolve's
acl_from_response, which the state and every resolver use), so the UI hides
exactly what the servers would refuse. Before, the UI compiled the policies
with its own loop, which did not fall back to deny-all as the servers do."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import pytest
from starlette.requests import Request

from corral.security import acl, acl_resolve
from corral.v1 import acl_pb2
from services.gateway.ui import api


class _Channel:
    """A channel whose every unary call answers `response` (what the state's
    ACL.ResolveToken would)."""

    def __init__(self, response: acl_pb2.ACLResolveTokenResponse) -> None:
        self.response = response

    def unary_unary(self, *args: Any, **kwargs: Any) -> Any:
        async def call(request: Any, **kw: Any) -> Any:
            return self.response

        return call


def _request(response: acl_pb2.ACLResolveTokenResponse, token: str = "a-secret") -> Request:
    channel: Any = _Channel(response)
    backend = SimpleNamespace(
        tokens=acl_resolve.RemoteResolver(channel),
        # what the UI used before: the same answer, compiled on its own
        acl=SimpleNamespace(ResolveToken=channel.unary_unary()),
    )
    app = SimpleNamespace(state=SimpleNamespace(backend=backend))
    scope = {
        "type": "http",
        "method": "GET",
        "path": "/ui/api/capabilities",
        "query_string": b"namespace=default",
        "headers": [(b"x-nomad-token", token.encode())],
        "app": app,
    }
    return Request(scope)


async def _capabilities(response: acl_pb2.ACLResolveTokenResponse) -> dict[str, Any]:
    answer = await api.capabilities(_request(response))
    assert answer.status_code == 200
    body: dict[str, Any] = json.loads(bytes(answer.body))
    return body


async def test_the_ui_shows_what_the_servers_compile(monkeypatch: pytest.MonkeyPatch) -> None:
    """Whatever the servers' compile makes of a token, the UI shows: here it
    is made to grant write in "default" to a token without policies."""
    write = acl.compile_acl([acl.parse_policy('namespace "default" { policy = "write" }')])
    seen: list[acl_pb2.ACLResolveTokenResponse] = []

    def servers_compile(resp: acl_pb2.ACLResolveTokenResponse) -> acl.ACL:
        seen.append(resp)
        return write

    monkeypatch.setattr(acl_resolve, "acl_from_response", servers_compile)
    body = await _capabilities(acl_pb2.ACLResolveTokenResponse(accessor_id="a", type="client"))
    assert seen, "the UI did not use the servers' compile"
    assert body["Capabilities"]["submit-job"] is True
    assert body["Capabilities"]["node-read"] is False


@pytest.mark.parametrize(
    "policies",
    [
        [],
        # stored by an older version, no longer valid: grants nothing
        [acl_pb2.ACLPolicy(name="old", rules='namespace "default" { policy = "super" }')],
    ],
    ids=["no-policies", "unparseable-policy"],
)
async def test_a_token_without_a_usable_policy_may_do_nothing(
    policies: list[acl_pb2.ACLPolicy],
) -> None:
    resp = acl_pb2.ACLResolveTokenResponse(accessor_id="a", type="client", policies=policies)
    assert acl_resolve.acl_from_response(resp) is acl.DENY_ALL
    body = await _capabilities(resp)
    assert body["Management"] is False
    assert not any(body["Capabilities"].values()), body


async def test_a_management_token_may_do_everything() -> None:
    body = await _capabilities(acl_pb2.ACLResolveTokenResponse(accessor_id="m", type="management"))
    assert body["Management"] is True and all(body["Capabilities"].values())
