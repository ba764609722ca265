"""Per-RPC metrics for every server and every client channel.

Named as the dashboards everyone already has expect them (the
go-grpc-prometheus names): `grpc_server_started_total`,
`grpc_server_handled_total` (by `grpc_code`) and
`grpc_server_handling_seconds`, and the same under `grpc_client_`. Labels:
`grpc_type` (unary, server_stream), `grpc_service` (`corral.v1.Eval`),
`grpc_method` (`Dequeue`), `grpc_code` (`OK`, `UNAVAILABLE`, ...).

The server side is measured inside the one handler wrapper every role
already has (`corral.runtime.server.ErrorInterceptor`), the client side by one
interceptor per call type on every channel `corral.security.transport.dial` opens.
Both keep the labelled children of each method in a dict, so a call costs
a lookup, a counter increment and a histogram observation, no label
resolution.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import grpc
from grpc._cython import cygrpc  # type: ignore[attr-defined]
from prometheus_client import Counter, Histogram

_LABELS = ("grpc_type", "grpc_service", "grpc_method")
# long-polls (Eval.Dequeue, Node watches) and streams reach minutes
_BUCKETS = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    300.0,
)

SERVER_STARTED = Counter("grpc_server_started_total", "RPCs started on the server", _LABELS)
SERVER_HANDLED = Counter(
    "grpc_server_handled_total",
    "RPCs completed on the server, by status code",
    (*_LABELS, "grpc_code"),
)
SERVER_HANDLING = Histogram(
    "grpc_server_handling_seconds",
    "Server-side RPC time, from the handler's start to its status (streams: their lifetime)",
    _LABELS,
    buckets=_BUCKETS,
)
CLIENT_STARTED = Counter(
    "grpc_client_started_total", "RPCs started by this process's clients", _LABELS
)
CLIENT_HANDLED = Counter(
    "grpc_client_handled_total",
    "RPCs this process's clients saw complete, by status code",
    (*_LABELS, "grpc_code"),
)
CLIENT_HANDLING = Histogram(
    "grpc_client_handling_seconds",
    "Client-side RPC time, from the call to its status (streams: their lifetime)",
    _LABELS,
    buckets=_BUCKETS,
)

UNARY = "unary"
SERVER_STREAM = "server_stream"
BIDI_STREAM = "bidi_stream"

_CYGRPC_CODES: dict[Any, grpc.StatusCode] = {
    getattr(cygrpc.StatusCode, code.name.lower()): code
    for code in grpc.StatusCode
    if hasattr(cygrpc.StatusCode, code.name.lower())
}


def split_method(full_method: str) -> tuple[str, str]:
    """`/corral.v1.Eval/Dequeue` -> (`corral.v1.Eval`, `Dequeue`)."""
    service, _, method = full_method.lstrip("/").rpartition("/")
    return service or "unknown", method or full_method


class MethodMetrics:
    """The labelled children of one method (on one side, of one type)."""

    __slots__ = ("_handled", "_handled_family", "_labels", "handling", "started")

    def __init__(
        self,
        started: Counter,
        handled: Counter,
        handling: Histogram,
        kind: str,
        full_method: str,
    ) -> None:
        service, method = split_method(full_method)
        self._labels = (kind, service, method)
        self.started = started.labels(*self._labels)
        self.handling = handling.labels(*self._labels)
        self._handled_family = handled
        self._handled: dict[grpc.StatusCode, Any] = {}

    def finished(self, code: grpc.StatusCode, seconds: float) -> None:
        child = self._handled.get(code)
        if child is None:
            child = self._handled[code] = self._handled_family.labels(*self._labels, code.name)
        child.inc()
        self.handling.observe(seconds)


class _Methods:
    """MethodMetrics by (type, full method), created on first use."""

    def __init__(self, started: Counter, handled: Counter, handling: Histogram) -> None:
        self._families = (started, handled, handling)
        self._by_method: dict[tuple[str, str], MethodMetrics] = {}

    def get(self, kind: str, full_method: str) -> MethodMetrics:
        found = self._by_method.get((kind, full_method))
        if found is None:
            found = self._by_method[(kind, full_method)] = MethodMetrics(
                *self._families, kind, full_method
            )
        return found


SERVER = _Methods(SERVER_STARTED, SERVER_HANDLED, SERVER_HANDLING)
CLIENT = _Methods(CLIENT_STARTED, CLIENT_HANDLED, CLIENT_HANDLING)


def server_code(context: Any, exc: BaseException | None) -> grpc.StatusCode:
    """The status a server handler ended with: what it (or the error
    wrapper's abort) set on the context, CANCELLED when the call was
    cancelled or its stream abandoned, OK when it returned, UNKNOWN for an
    exception that set no status."""
    code = context.code()
    if code is not None:
        if isinstance(code, grpc.StatusCode):
            return code
        return _CYGRPC_CODES.get(code, grpc.StatusCode.UNKNOWN)
    if exc is None:
        return grpc.StatusCode.OK
    if isinstance(exc, asyncio.CancelledError | GeneratorExit):
        return grpc.StatusCode.CANCELLED
    return grpc.StatusCode.UNKNOWN


# ------------------------------------------------------------------ clients


def _call_code(call: Any) -> grpc.StatusCode:
    """The status of a finished call, read without awaiting (a done
    callback cannot await). grpc.aio exposes it only through coroutines, so
    this reads the finished call's status object; `tests/unit/
    test_rpc_metrics.py` fails if a grpc release moves it."""
    if call.cancelled():
        return grpc.StatusCode.CANCELLED
    status = getattr(getattr(call, "_cython_call", None), "_status", None)
    if status is None:
        return grpc.StatusCode.UNKNOWN
    return _CYGRPC_CODES.get(status.code(), grpc.StatusCode.UNKNOWN)


def _watch(call: Any, recorded: MethodMetrics) -> Any:
    recorded.started.inc()
    start = time.perf_counter()

    def done(finished: Any) -> None:
        recorded.finished(_call_code(finished), time.perf_counter() - start)

    call.add_done_callback(done)
    return call


# grpc.aio files an interceptor under the first call type it implements
# only, so each call type needs its own class. Put them last in a channel's
# interceptors: the innermost one receives grpc's own call object.
class UnaryClientMetrics(grpc.aio.UnaryUnaryClientInterceptor):  # type: ignore[misc]
    async def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        method = details.method
        if isinstance(method, bytes):
            method = method.decode()
        return _watch(await continuation(details, request), CLIENT.get(UNARY, method))


class StreamClientMetrics(grpc.aio.UnaryStreamClientInterceptor):  # type: ignore[misc]
    async def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        method = details.method
        if isinstance(method, bytes):
            method = method.decode()
        return _watch(await continuation(details, request), CLIENT.get(SERVER_STREAM, method))


def client_interceptors() -> list[grpc.aio.ClientInterceptor]:
    """The interceptors that measure a channel's calls."""
    return [UnaryClientMetrics(), StreamClientMetrics()]
