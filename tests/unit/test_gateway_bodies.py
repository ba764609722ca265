"""Issue 26, finding 4 at the gateway: a JSON body nested deeper than a job
may be (40 KB of brackets to /v1/jobs was a 500 naming RecursionError) is a
400 naming the nesting limit; a body within it decodes; one over the size
limit is a 413 read no further."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from starlette.requests import Request

from corral.domain.jobspec import limits
from corral.security.access import MAX_PUBLIC_REQUEST_BYTES
from services.gateway import http


def _request(body: bytes, headers: dict[str, str] | None = None) -> Request:
    chunks = [body[i : i + 65536] for i in range(0, len(body), 65536)] or [b""]

    async def receive() -> dict[str, Any]:
        chunk = chunks.pop(0) if chunks else b""
        return {"type": "http.request", "body": chunk, "more_body": bool(chunks)}

    scope = {
        "type": "http",
        "method": "PUT",
        "path": "/v1/jobs",
        "query_string": b"",
        "headers": [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()],
    }
    return Request(scope, receive)


def _error(body: bytes, **kw: Any) -> http.NomadError:
    with pytest.raises(http.NomadError) as caught:
        asyncio.run(http.json_body(_request(body, **kw)))
    return caught.value


@pytest.mark.parametrize(
    "body",
    [
        b"[" * 40_000 + b"]" * 40_000,
        b'{"Job": ' + b'{"a": ' * 20_000 + b"1" + b"}" * 20_000 + b"}",
        b"[" * (limits.MAX_NESTING_DEPTH + 1) + b"]" * (limits.MAX_NESTING_DEPTH + 1),
    ],
    ids=["brackets-40k", "objects-20k", "one-past-the-limit"],
)
def test_json_nested_past_the_limit_is_a_400_naming_it(body: bytes) -> None:
    err = _error(body)
    assert err.status == 400
    assert f"nested more than {limits.MAX_NESTING_DEPTH} levels deep" in err.message
    assert "Recursion" not in err.message


def test_json_within_the_limit_decodes() -> None:
    depth = limits.MAX_NESTING_DEPTH
    body = b"[" * depth + b"]" * depth
    assert asyncio.run(http.json_body(_request(body))) is not None


def test_a_body_over_the_size_limit_is_a_413() -> None:
    declared = {"content-length": str(MAX_PUBLIC_REQUEST_BYTES + 1)}
    assert _error(b"{}", headers=declared).status == 413
    assert _error(b" " * (MAX_PUBLIC_REQUEST_BYTES + 1)).status == 413
