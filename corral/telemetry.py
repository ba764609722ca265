"""Logging, tracing and metrics set-up shared by every role.

* Logs: JSON lines on stdout carrying `eval_id`, `job_id`, `index`,
  `trace_id` when given through `extra=` (STYLE.md).
* Traces: OpenTelemetry, exported over OTLP when `OTEL_EXPORTER_OTLP_ENDPOINT`
  is set (or `CORRAL_TRACING=console` prints spans); otherwise a no-op
  tracer, so tracing costs nothing when nobody collects it.
* Metrics: prometheus-client; `start_metrics_server` serves `/metrics`.
  Every role exports `corral_build_info` and `corral_leader{role}` from
  here, per-RPC metrics from `corral.rpc_metrics`, and its own from
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
    plain text (a role's `--log-format` / CORRAL_LOG_FORMAT, corral/settings.py)."""
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


def setup_tracing(service_name: str) -> None:
    """Install an OTLP (or console) tracer provider when configured."""
    global _tracing_on
    endpoint = os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
    mode = os.environ.get("CORRAL_TRACING", "")
    if not endpoint and mode != "console":
        return
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import (
        BatchSpanProcessor,
        ConsoleSpanExporter,
        SpanExporter,
    )

    provider = TracerProvider(resource=Resource.create({"service.name": service_name}))
    exporter: SpanExporter
    if endpoint:
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

        exporter = OTLPSpanExporter(endpoint=endpoint, insecure=True)
    else:
        exporter = ConsoleSpanExporter()
    provider.add_span_processor(BatchSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    _tracing_on = True


def tracer(name: str) -> trace.Tracer:
    return trace.get_tracer(name)


def current_traceparent() -> str:
    """The W3C traceparent of the current span ('' when not tracing)."""
    ctx = trace.get_current_span().get_span_context()
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
