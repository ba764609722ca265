"""The gateway app served in the test's process over a module's real state,
and a plain HTTP client of it that sends a named token (what python-nomad
hides: status codes, headers, raw bodies)."""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from corral.runtime.http_server import HttpServer
from services.gateway.app import create_app
from services.gateway.backend import Backend
from services.gateway.config import GatewaySettings


class Http:
    def __init__(self, url: str, tokens: dict[str, str]) -> None:
        self.url = url
        self.tokens = tokens

    def call(
        self,
        method: str,
        path: str,
        body: Any = None,
        who: str = "management",
        *,
        raw: bytes | None = None,
        **params: str,
    ) -> tuple[int, Any, dict[str, str]]:
        """(status, the answer's JSON or text, headers) of one request with
        the token named `who` (a token itself when it has a dot, none when
        unknown); `raw` is sent as the body as it is."""
        data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
        query = ("?" + urllib.parse.urlencode(params)) if params else ""
        req = urllib.request.Request(self.url + path + query, data=data, method=method)
        token = self.tokens.get(who, who if "." in who else "")
        if token:
            req.add_header("X-Nomad-Token", token)
        try:
            with urllib.request.urlopen(req, timeout=30) as resp:
                text, status = resp.read(), resp.status
                headers = {k.lower(): v for k, v in resp.headers.items()}
        except urllib.error.HTTPError as exc:
            text, status = exc.read(), exc.code
            headers = {k.lower(): v for k, v in exc.headers.items()}
        try:
            parsed: Any = json.loads(text) if text else None
        except json.JSONDecodeError:
            parsed = text.decode()
        return status, parsed, headers


@asynccontextmanager
async def served_gateway(state_address: str) -> AsyncIterator[str]:
    """The gateway's URL, serving until the block ends."""
    backend = Backend(state_address)
    app = create_app(GatewaySettings(state_addr=state_address), backend)
    server = HttpServer("127.0.0.1:0", app, name="gateway")
    await server.start()
    try:
        yield server.url
    finally:
        await server.stop()
        await backend.close()
