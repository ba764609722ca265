"""The one gRPC server bootstrap every role uses.

Every server gets: the health checking service, server reflection (so
`grpcurl -plaintext ADDR list` shows everything), the error interceptor that
maps `corral.domain.errors` to statuses, OpenTelemetry instrumentation when tracing
is on, graceful shutdown on SIGTERM/SIGINT (in-flight RPCs finish, streams end
cleanly through `shutting_down`), and port 0 support with the bound port
reported.
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import logging
import signal
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Protocol

import grpc
from google.protobuf import descriptor_pool
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from corral.domain.errors import (
    FIELD_METADATA_KEY,
    LEADER_METADATA_KEY,
    NO_RETRY_METADATA,
    RESTORED_METADATA_KEY,
    CorralError,
    FailedPrecondition,
    InvalidArgument,
    NoRegionPath,
    NotLeader,
    StateRestored,
    bounded_message,
)
from corral.runtime import rpc_metrics
from corral.security import acl, tls, transport
from corral.security.access import Guard
from corral.security.acl_resolve import Resolver

log = logging.getLogger(__name__)

# a role that receives no large server message passes a smaller
# `max_receive_bytes`; users' and nodes' requests are bounded by
# `corral.security.access.MAX_PUBLIC_REQUEST_BYTES` whatever the role.
MAX_MESSAGE_BYTES = transport.MAX_MESSAGE_BYTES

#: a relayed call's answer (the broker writing a worker's eval to the state)
#: that keeps its status: the server that answered judged the request or
#: asks for a retry; it is no fault of the relaying one, so not INTERNAL.
RELAYED_CODES = frozenset(
    {
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.NOT_FOUND,
        grpc.StatusCode.ALREADY_EXISTS,
        grpc.StatusCode.FAILED_PRECONDITION,
        grpc.StatusCode.OUT_OF_RANGE,
        grpc.StatusCode.ABORTED,
        grpc.StatusCode.UNAVAILABLE,
    }
)

AddServicer = Callable[[Any, grpc.aio.Server], None]
Context = Any  # grpc.aio.ServicerContext; its stubs are too strict to wrap handlers


def _status_for(err: CorralError) -> tuple[grpc.StatusCode, str, tuple[tuple[str, str], ...]]:
    md: tuple[tuple[str, str], ...] = ()
    if isinstance(err, NotLeader) and err.leader_address:
        md = ((LEADER_METADATA_KEY, err.leader_address),)
    elif isinstance(err, StateRestored):
        md = ((RESTORED_METADATA_KEY, str(err.index)),)
    elif isinstance(err, NoRegionPath):
        md = NO_RETRY_METADATA
    elif isinstance(err, InvalidArgument) and _metadata_safe(err.field):
        md = ((FIELD_METADATA_KEY, err.field),)
    return err.code, err.message, md


def _metadata_safe(value: str) -> bool:
    """Whether gRPC carries `value` as a text metadata value as it is."""
    return 0 < len(value) <= 1000 and value.isascii() and value.isprintable()


Translate = Callable[[BaseException], CorralError | None]

#: the grpc context of the call the current task serves (each RPC runs in a
#: task of its own): who is calling, for per-connection bounds
_CALL: contextvars.ContextVar[Any] = contextvars.ContextVar("corral_call", default=None)


def current_peer() -> str:
    """The connection the current call came on (`ipv4:10.0.0.7:51234`), or
    '' outside a call."""
    context = _CALL.get()
    return str(context.peer()) if context is not None else ""


class Forwarder(Protocol):
    """Passes a call for another region to a server of that region and
    returns its answer as bytes (the state's federation links,
    services/state/federation/links.py): Nomad's region forwarding."""

    async def unary(self, region: str, method: str, request: Any, context: Context) -> bytes: ...

    def stream(
        self, region: str, method: str, request: Any, context: Context
    ) -> AsyncIterator[bytes]: ...


def _passthrough(serialize: Callable[[Any], bytes] | None) -> Callable[[Any], bytes] | None:
    """A response serializer that sends bytes as they are: a forwarded
    call's answer is the other region's bytes, passed back unchanged."""
    if serialize is None:
        return None

    def out(message: Any) -> bytes:
        return message if isinstance(message, bytes) else serialize(message)

    return out


Fail = Callable[[Context, BaseException], Awaitable[None]]


class _Call:
    """One call through `ErrorInterceptor`, unary or streaming alike: its
    metrics (started, then handled by status and latency), and an exception
    the handler raised turned into a status by `fail` (it aborts the call).
    A cancelled call and grpc's own abort pass through untouched."""

    __slots__ = ("context", "fail", "metrics", "start")

    def __init__(self, fail: Fail, metrics: rpc_metrics.MethodMetrics, context: Context) -> None:
        self.fail = fail
        self.metrics = metrics
        self.context = context
        self.start = 0.0

    async def __aenter__(self) -> None:
        self.metrics.started.inc()
        _CALL.set(self.context)
        self.start = time.perf_counter()

    async def __aexit__(self, exc_type: object, exc: BaseException | None, tb: object) -> None:
        try:
            if isinstance(exc, Exception) and not isinstance(
                exc, asyncio.CancelledError | grpc.aio.AbortError
            ):
                await self.fail(self.context, exc)
        finally:
            code = rpc_metrics.server_code(self.context, exc)
            self.metrics.finished(code, time.perf_counter() - self.start)


class ErrorInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """Runs the access check before every handler (`corral.security.access.Guard`,
    exposing the caller's ACL to the handler), and turns domain errors into
    gRPC statuses and unexpected exceptions into INTERNAL with a logged
    traceback, for unary, server-streaming and bidirectional RPCs (whose
    first message is what the access check reads), and records the per-RPC
    metrics (`corral.runtime.rpc_metrics`: started, handled by status, latency).
    One wrapper does all three: each layer costs a Python call per RPC on
    the hot paths.

    `translate` lets a role name what a dependency's exception means (the
    state: a database that is down is UNAVAILABLE, so clients retry). The
    caller never sees an exception's text: it may carry the database's
    message or a secret; the log has it."""

    def __init__(
        self, translate: Translate | None = None, guard: Guard | None = None, name: str = ""
    ) -> None:
        self.translate = translate
        self.guard = guard
        self.name = name
        #: where calls for other regions go; a role without one refuses them
        self.forwarder: Forwarder | None = None

    def _forwarder(self, method: str, request: Any, context: Context, region: str) -> Forwarder:
        """The forwarder for a call that names another region, once the call
        may be forwarded (`Guard.check_forward`)."""
        assert self.guard is not None
        if self.forwarder is None:
            here = self.guard.settings.region
            raise FailedPrecondition(
                f"this {self.name or 'server'} serves region {here!r} only: send requests "
                f"for region {region!r} to a state server, which forwards them"
            )
        self.guard.check_forward(method, request, context, region)
        return self.forwarder

    async def intercept_service(  # type: ignore[override]
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[Any]],
        details: grpc.HandlerCallDetails,
    ) -> Any:
        handler = await continuation(details)
        if handler is None:
            return None
        method = details.method
        guard = self.guard

        async def fail(context: Context, exc: BaseException) -> None:
            translated = self.translate(exc) if self.translate is not None else None
            if translated is not None:
                log.warning("%s failed: %s (%r)", method, translated.message, exc)
                exc = translated
            if isinstance(exc, CorralError):
                code, msg, md = _status_for(exc)
                if md:
                    context.set_trailing_metadata(md)
                await context.abort(code, msg)
            if isinstance(exc, grpc.aio.AioRpcError) and exc.code() in RELAYED_CODES:
                await context.abort(exc.code(), bounded_message(exc.details() or ""))
            log.exception("unhandled error in %s", method, exc_info=exc)
            await context.abort(
                grpc.StatusCode.INTERNAL, f"internal error in {method} (details in the server log)"
            )

        if handler.unary_unary is not None:
            inner_uu = handler.unary_unary
            uu_metrics = rpc_metrics.SERVER.get(rpc_metrics.UNARY, method)

            async def unary_unary(request: Any, context: Context) -> Any:
                async with _Call(fail, uu_metrics, context):
                    if guard is None:
                        return await inner_uu(request, context)
                    region = guard.foreign_region(context)
                    if region:
                        forwarder = self._forwarder(method, request, context, region)
                        return await forwarder.unary(region, method, request, context)
                    reset = acl.CURRENT.set(await guard.check(method, request, context))
                    try:
                        return await inner_uu(request, context)
                    finally:
                        acl.CURRENT.reset(reset)

            return grpc.unary_unary_rpc_method_handler(
                unary_unary,
                request_deserializer=handler.request_deserializer,
                response_serializer=_passthrough(handler.response_serializer),
            )
        if handler.unary_stream is not None:
            inner_us = handler.unary_stream
            us_metrics = rpc_metrics.SERVER.get(rpc_metrics.SERVER_STREAM, method)

            async def unary_stream(request: Any, context: Context) -> AsyncIterator[Any]:
                async with _Call(fail, us_metrics, context):
                    if guard is not None:
                        region = guard.foreign_region(context)
                        if region:
                            forwarder = self._forwarder(method, request, context, region)
                            async for raw in forwarder.stream(region, method, request, context):
                                yield raw
                            return
                        acl.CURRENT.set(await guard.check(method, request, context))
                    stream = inner_us(request, context)
                    if inspect.isawaitable(stream):
                        # a handler that writes with context.write and
                        # returns nothing (grpc's own Health/Watch)
                        await stream
                        return
                    async for item in stream:
                        yield item

            return grpc.unary_stream_rpc_method_handler(
                unary_stream,
                request_deserializer=handler.request_deserializer,
                response_serializer=_passthrough(handler.response_serializer),
            )
        if handler.stream_stream is not None:
            inner_ss = handler.stream_stream
            ss_metrics = rpc_metrics.SERVER.get(rpc_metrics.BIDI_STREAM, method)

            async def stream_stream(requests: AsyncIterator[Any], context: Context) -> Any:
                # the access check reads the first message (the call's
                # setup), then the handler gets every message, that one too
                async with _Call(fail, ss_metrics, context):
                    first = await anext(aiter(requests), None)
                    if first is None:
                        return
                    if guard is not None:
                        acl.CURRENT.set(await guard.check(method, first, context))
                    async for item in inner_ss(_prepend(first, requests), context):
                        yield item

            return grpc.stream_stream_rpc_method_handler(
                stream_stream,
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        # a client-streaming RPC has no access check here: refuse to serve it
        raise RuntimeError(f"{method}: client-streaming RPCs are not supported")


class GrpcServer:
    """A grpc.aio server with health, reflection and the error interceptor.

    Usage::

        server = GrpcServer("127.0.0.1:0", name="state")
        server.add(state_pb2_grpc.add_StateServicer_to_server, StateServicer(...),
                   state_pb2.DESCRIPTOR.services_by_name["State"].full_name)
        port = await server.start()
        await server.wait_stopped()
    """

    def __init__(
        self,
        address: str,
        *,
        name: str,
        interceptors: list[Any] | None = None,
        translate: Translate | None = None,
        settings: transport.SecuritySettings | None = None,
        resolver: Resolver | None = None,
        max_receive_bytes: int = MAX_MESSAGE_BYTES,
    ) -> None:
        self.address = address
        self.name = name
        self.port = 0
        self.shutting_down = asyncio.Event()
        self._service_names: list[str] = []
        self._stopped = asyncio.Event()
        opts = [
            ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
            ("grpc.max_receive_message_length", max_receive_bytes),
            ("grpc.so_reuseport", 0),
        ]
        self.security = settings or transport.current()
        self.guard = Guard(self.security, resolver)
        self.interceptor = ErrorInterceptor(translate, self.guard, name)
        all_interceptors: list[Any] = [self.interceptor]
        all_interceptors.extend(interceptors or [])
        tracing = _tracing_interceptor()
        if tracing is not None:
            all_interceptors.insert(0, tracing)
        self.server = grpc.aio.server(interceptors=all_interceptors, options=opts)
        self.health = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)

    @property
    def forwarder(self) -> Forwarder | None:
        return self.interceptor.forwarder

    @forwarder.setter
    def forwarder(self, value: Forwarder | None) -> None:
        """Calls that name another region go here (the state's federation)."""
        self.interceptor.forwarder = value

    def add(self, add_fn: AddServicer, servicer: Any, full_name: str) -> None:
        """Register a servicer; full_name is e.g. `corral.v1.State`."""
        add_fn(servicer, self.server)
        self._service_names.append(full_name)

    @property
    def bound_address(self) -> str:
        host = self.address.rsplit(":", 1)[0] or "127.0.0.1"
        if host in ("0.0.0.0", "[::]", "::"):
            host = "127.0.0.1"
        return f"{host}:{self.port}"

    async def start(self) -> int:
        names = [*self._service_names, health.SERVICE_NAME, reflection.SERVICE_NAME]
        reflection.enable_server_reflection(names, self.server)
        self.guard.check_startable(_methods(self._service_names))
        if self.security.tls:
            creds = tls.server_credentials(self.security.files)
            self.port = self.server.add_secure_port(self.address, creds)
        else:
            self.port = self.server.add_insecure_port(self.address)
        if self.port == 0:
            raise RuntimeError(f"{self.name}: could not bind {self.address}")
        await self.server.start()
        for svc in self._service_names:
            await self.health.set(svc, health_pb2.HealthCheckResponse.SERVING)
        await self.health.set("", health_pb2.HealthCheckResponse.SERVING)
        log.info(
            "%s listening on %s (%s)",
            self.name,
            self.bound_address,
            "mutual TLS" if self.security.tls else "plaintext",
        )
        return self.port

    async def set_serving(self, service: str, serving: bool) -> None:
        status = (
            health_pb2.HealthCheckResponse.SERVING
            if serving
            else health_pb2.HealthCheckResponse.NOT_SERVING
        )
        await self.health.set(service, status)

    async def stop(self, grace: float = 5.0) -> None:
        """Stop accepting RPCs, tell streams to end, let in-flight RPCs finish."""
        if self._stopped.is_set():
            return
        self.shutting_down.set()
        await self.health.enter_graceful_shutdown()
        await self.server.stop(grace)
        self._stopped.set()

    async def wait_stopped(self) -> None:
        await self._stopped.wait()


def _methods(service_names: list[str]) -> list[str]:
    """Full method names (`/corral.v1.Job/Register`) of the services."""
    pool = descriptor_pool.Default()
    return [
        f"/{name}/{m.name}" for name in service_names for m in pool.FindServiceByName(name).methods
    ]


def install_signal_handlers(on_stop: Callable[[], None]) -> None:
    """Call on_stop once on SIGTERM or SIGINT (the process then shuts down
    gracefully instead of dying mid-RPC)."""
    loop = asyncio.get_running_loop()
    fired = False

    def handler(signame: str) -> None:
        nonlocal fired
        if fired:
            return
        fired = True
        log.info("received %s, shutting down", signame)
        on_stop()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, handler, sig.name)


def _tracing_interceptor() -> Any | None:
    from corral.runtime import telemetry

    if not telemetry.tracing_enabled():
        return None
    from opentelemetry.instrumentation.grpc import aio_server_interceptor

    # every RPC gets a server span joining the caller's trace; one arriving
    # outside any trace starts one unless it is idle traffic (the sampler's
    # `telemetry.QUIET_ROOTS`)
    return aio_server_interceptor()  # type: ignore[no-untyped-call]


async def _prepend(first: Any, rest: AsyncIterator[Any]) -> AsyncIterator[Any]:
    yield first
    async for item in rest:
        yield item
