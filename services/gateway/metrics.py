"""Gateway metrics: requests by route and status code, and their latency
(a blocking query counts its whole wait). The route is the path template
(`/v1/job/{job_id:path}`), never the path itself, so ids do not become
label values."""

from __future__ import annotations

import time
from typing import Any

from prometheus_client import Counter, Histogram
from starlette.types import ASGIApp, Message, Receive, Scope, Send

REQUESTS = Counter(
    "corral_http_requests_total",
    "HTTP requests answered by the gateway, by method, route template and status code",
    ["method", "route", "code"],
)
SECONDS = Histogram(
    "corral_http_request_seconds",
    "HTTP request time in the gateway, blocking queries' waits included, by route template",
    ["route"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 600),
)


def _route(scope: Scope) -> str:
    route: Any = scope.get("route")
    path = getattr(route, "path", "")
    return str(path) if path else "unmatched"


class HttpMetrics:
    """ASGI middleware counting every HTTP answer (status as sent)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500

        async def sending(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, sending)
        finally:
            route = _route(scope)
            REQUESTS.labels(scope.get("method", ""), route, str(status)).inc()
            SECONDS.labels(route).observe(time.perf_counter() - started)
