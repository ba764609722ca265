"""Logging, tracing and metrics set-up shared by every role.

* Logs: JSON lines on stdout carrying `eval_id`, `job_id`, `index`,
  `trace_id` when given through `extra=` (STYLE.md).
* Traces: OpenTelemetry, exported over OTLP when `OTEL_EXPORTER_OTLP_ENDPOINT`
  is set (or `CORRAL_TRACING=console` prints spans); otherwise a no-op
  tracer, so tracing costs nothing when nobody collects it.
* Metrics: prometheus-client; `start_metrics_server` serves `/metrics`.
  Every role exports `corral_build_info` and `corral_leader{role}` from
  here, per-RPC metrics from `corral.runtime.rpc_metrics`, and its own from
  `services/<role>/metrics.py` (docs/operations.md lists them all).
"""

from __future__ import annotations

import json
import logging
import os
import platform
import sys
import time
from importlib import metadata
from typing import Any

from opentelemetry import trace
from prometheus_client import Gauge

_CONTEXT_FIELDS = ("eval_id", "job_id", "node_id", "alloc_id", "index", "trace_id", "role")
_tracing_on = False


class JsonFormatter(logging.Formatter):
    def __init__(self, role: str) -> None:
        super().__init__()
        self.role = role

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "role": self.role,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key in _CONTEXT_FIELDS:
            value = record.__dict__.get(key)
            if value is not None:
                out[key] = value
        if "trace_id" not in out:
            span = trace.get_current_span().get_span_context()
            if span.is_valid:
                out["trace_id"] = format(span.trace_id, "032x")
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


def setup_logging(role: str, level: str = "INFO", *, json_logs: bool = True) -> None:
    """Configure the root logger: JSON to stdout for services (default), or
    plain text (a role's `--log-format` / CORRAL_LOG_FORMAT, corral/runtime/settings.py)."""
    handler = logging.StreamHandler(sys.stdout)
    if json_logs:
        handler.setFormatter(JsonFormatter(role))
    else:
        handler.setFormatter(
            logging.Formatter(f"%(asctime)s {role} %(levelname)s %(name)s: %(message)s")
        )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())


def tracing_enabled() -> bool:
    return _tracing_on


#: RPCs that wait for something to happen (a long poll, a blocking query, a
#: feed stream, a probe) or repeat on a timer (heartbeats, index polls):
#: started outside any trace they are idle traffic,
#: not a request worth a trace, so they start none. Inside a trace (a CLI
#: monitor, say) they follow their parent like any call.
QUIET_ROOTS = frozenset(
    {
        "/corral.v1.Eval/Dequeue",
        "/corral.v1.Eval/Heartbeat",  # every worker's lease, each second
        "/corral.v1.Node/GetClientAllocs",
        "/corral.v1.Node/UpdateStatus",
        "/corral.v1.State/Subscribe",
        "/corral.v1.State/RegisterMember",  # every role's membership heartbeat
        "/corral.v1.State/GetIndex",  # catch-up polls
        "/corral.v1.Event/Stream",
        "/grpc.health.v1.Health/Check",
        "/grpc.health.v1.Health/Watch",
        "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
    }
)

#: set on a span whose call turned out idle (a blocking query that timed out
#: with nothing new): such a span, when it is a trace's root, is not exported
IDLE_ATTRIBUTE = "corral.idle"


def mark_idle() -> None:
    """The current call waited and found nothing: drop its trace if it is one."""
    span = trace.get_current_span()
    if span.is_recording():
        span.set_attribute(IDLE_ATTRIBUTE, True)


def _quiet_root(name: str, kind: trace.SpanKind) -> bool:
    if name in QUIET_ROOTS:
        return True
    # a database statement outside any trace: a background loop's (leader
    # lock, change feed, timers), never a root of its own
    return kind == trace.SpanKind.CLIENT and not name.startswith("/")


def _sampler() -> Any:
    """The sampler named by OTEL_TRACES_SAMPLER / OTEL_TRACES_SAMPLER_ARG
    (default parentbased_always_on), behind a filter that starts no trace
    for idle traffic (`QUIET_ROOTS`, database statements outside a trace)."""
    from opentelemetry.sdk.trace import sampling

    configured: sampling.Sampler = sampling._get_from_env_or_default()

    class QuietRoots(sampling.Sampler):
        def should_sample(
            self,
            parent_context: Any,
            trace_id: int,
            name: str,
            kind: trace.SpanKind | None = None,
            attributes: Any = None,
            links: Any = None,
            trace_state: Any = None,
        ) -> sampling.SamplingResult:
            parent = trace.get_current_span(parent_context).get_span_context()
            if not parent.is_valid and _quiet_root(name, kind or trace.SpanKind.INTERNAL):
                return sampling.SamplingResult(sampling.Decision.DROP)
            return configured.should_sample(
                parent_context, trace_id, name, kind, attributes, links, trace_state
            )

        def get_description(self) -> str:
            return f"QuietRoots{{{configured.get_description()}}}"

    return QuietRoots()


def _idle_root_filter(inner: Any) -> Any:
    """A span processor passing every span to `inner` except a trace's root
    marked idle (`mark_idle`)."""
    from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor

    class DropIdleRoots(SpanProcessor):
        def on_start(self, span: Any, parent_context: Any = None) -> None:
            inner.on_start(span, parent_context=parent_context)

        def on_end(self, span: ReadableSpan) -> None:
            if span.parent is None and (span.attributes or {}).get(IDLE_ATTRIBUTE):
                return
            inner.on_end(span)

        def shutdown(self) -> None:
            inner.shutdown()

        def force_flush(self, timeout_millis: int = 30000) -> bool:
            flushed: bool = inner.force_flush(timeout_millis)
            return flushed

    return DropIdleRoots()


def setup_tracing(service_name: str) -> None:
    """Install an OTLP (or console) tracer provider when configured, with
    the sampler of the standard OTEL_* variables (quiet for idle traffic),
    and database spans through the psycopg instrumentation. The batch
    processor reads OTEL_BSP_* (e.g. OTEL_BSP_SCHEDULE_DELAY)."""
    global _tracing_on
    endpoint = os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
    mode = os.environ.get("CORRAL_TRACING", "")
    if _tracing_on or (not endpoint and mode != "console"):
        return
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import (
        BatchSpanProcessor,
        ConsoleSpanExporter,
        SpanExporter,
    )

    provider = TracerProvider(
        resource=Resource.create({"service.name": service_name}), sampler=_sampler()
    )
    exporter: SpanExporter
    if endpoint:
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

        exporter = OTLPSpanExporter(endpoint=endpoint, insecure=_insecure(endpoint))
    else:
        exporter = ConsoleSpanExporter()
    provider.add_span_processor(_idle_root_filter(BatchSpanProcessor(exporter)))
    trace.set_tracer_provider(provider)
    from opentelemetry.instrumentation.psycopg import PsycopgInstrumentor

    PsycopgInstrumentor().instrument(tracer_provider=provider, skip_dep_check=True)
    _tracing_on = True


def _insecure(endpoint: str) -> bool:
    """Plaintext unless the endpoint says https or OTEL_EXPORTER_OTLP_INSECURE=false."""
    flag = os.environ.get("OTEL_EXPORTER_OTLP_INSECURE", "").strip().lower()
    if flag in ("false", "0"):
        return False
    return not endpoint.startswith("https://")


def shutdown_tracing() -> None:
    """Export what is buffered (a short-lived process, the CLI, before exit)."""
    provider = trace.get_tracer_provider()
    shutdown = getattr(provider, "shutdown", None)
    if _tracing_on and shutdown is not None:
        shutdown()


def client_interceptors() -> list[Any]:
    """OpenTelemetry's asyncio client interceptors (none when not tracing):
    each call gets a client span and carries the trace context to the server."""
    if not _tracing_on:
        return []
    from opentelemetry.instrumentation.grpc import aio_client_interceptors

    interceptors: list[Any] = aio_client_interceptors()  # type: ignore[no-untyped-call]
    return interceptors


def traced_sync_channel(channel: Any) -> Any:
    """As `client_interceptors`, for a blocking channel (the CLI's): the
    channel wrapped in OpenTelemetry's client interceptor when tracing."""
    if not _tracing_on:
        return channel
    from opentelemetry.instrumentation.grpc import client_interceptor
    from opentelemetry.instrumentation.grpc.grpcext import intercept_channel

    return intercept_channel(channel, client_interceptor())  # type: ignore[no-untyped-call]


def tracer(name: str) -> trace.Tracer:
    return trace.get_tracer(name)


def current_traceparent() -> str:
    """The W3C traceparent of the current span ('' when not tracing)."""
    return traceparent_of(trace.get_current_span())


def traceparent_of(span: trace.Span) -> str:
    """The W3C traceparent naming `span` as a parent ('' for an invalid one)."""
    ctx = span.get_span_context()
    if not ctx.is_valid:
        return ""
    return f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags):02x}"


def context_from_traceparent(traceparent: str) -> Any:
    """An OpenTelemetry context whose parent is the given traceparent."""
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    if not traceparent:
        return None
    return TraceContextTextMapPropagator().extract({"traceparent": traceparent})


def start_metrics_server(address: str) -> int:
    """Serve Prometheus /metrics on host:port (port 0 picks one); returns the port."""
    from prometheus_client import start_http_server

    host, _, port = address.rpartition(":")
    server, _thread = start_http_server(int(port or 0), addr=host or "127.0.0.1")
    bound: int = server.server_port
    return bound


BUILD_INFO = Gauge(
    "corral_build_info",
    "Always 1; the labels say which build and role this process runs",
    ["version", "python", "role"],
)
LEADER = Gauge(
    "corral_leader",
    "1 while this process holds its role's leader lock, else 0 (nomad.raft.state.leader)",
    ["role"],
)


def corral_version() -> str:
    try:
        return metadata.version("corral")
    except metadata.PackageNotFoundError:
        return "unknown"


def set_build_info(role: str) -> None:
    """Export `corral_build_info` for this process (the runner calls it)."""
    BUILD_INFO.labels(corral_version(), platform.python_version(), role).set(1)
