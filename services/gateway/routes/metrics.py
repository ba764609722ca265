"""/v1/metrics: the gateway's own metrics, as Nomad's agent answers its own
(each Corral role serves its metrics on its own Prometheus port).

`?format=prometheus` is the text exposition format (what Prometheus
scrapes, Nomad's `prometheus_metrics`, always on here); without it, Nomad's
JSON `MetricsSummary` built from the same registry. Nomad's JSON comes
from an in-memory sink of 10-second intervals; Corral's registry holds
totals since the process started, so a counter's `Count`, `Sum`, `Min`,
`Max` and `Mean` are its total, and a histogram's (`Samples`) `Count`,
`Sum` and `Mean` are over every observation (`Min`, `Max` 0: the registry
keeps buckets, not extremes). Names are the Prometheus names (`_total`
dropped from counters), labels as `Labels`; any other `format` is JSON.
Open, as Nomad's."""

from __future__ import annotations

import time
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute

from services.gateway.authz import ApiRoute, Need
from services.gateway.http import respond


def summary() -> dict[str, Any]:
    """The registry as api.MetricsSummary."""
    gauges: list[dict[str, Any]] = []
    counters: list[dict[str, Any]] = []
    samples: list[dict[str, Any]] = []
    for family in REGISTRY.collect():
        if family.type in ("gauge", "unknown", "info", "stateset"):
            for s in family.samples:
                gauges.append({"Name": s.name, "Value": float(s.value), "Labels": dict(s.labels)})
        elif family.type == "counter":
            for s in family.samples:
                if s.name.endswith("_total"):
                    counters.append(_counter(family.name, s.labels, s.value))
        elif family.type in ("histogram", "summary"):
            sums: dict[tuple[tuple[str, str], ...], float] = {}
            counts: dict[tuple[tuple[str, str], ...], float] = {}
            for s in family.samples:
                key = tuple(
                    sorted((k, v) for k, v in s.labels.items() if k not in ("le", "quantile"))
                )
                if s.name.endswith("_sum"):
                    sums[key] = s.value
                elif s.name.endswith("_count"):
                    counts[key] = s.value
            for key, count in counts.items():
                samples.append(_observed(family.name, dict(key), count, sums.get(key, 0.0)))
    return {
        "Timestamp": time.strftime("%Y-%m-%d %H:%M:%S +0000 UTC", time.gmtime()),
        "Gauges": gauges,
        "Points": [],
        "Counters": counters,
        "Samples": samples,
    }


def _counter(name: str, labels: dict[str, str], total: float) -> dict[str, Any]:
    return {
        "Name": name,
        "Count": int(total),
        "Rate": 0.0,
        "Sum": float(total),
        "Min": float(total),
        "Max": float(total),
        "Mean": float(total),
        "Stddev": 0.0,
        "Labels": labels,
    }


def _observed(name: str, labels: dict[str, str], count: float, total: float) -> dict[str, Any]:
    return {
        "Name": name,
        "Count": int(count),
        "Rate": 0.0,
        "Sum": float(total),
        "Min": 0.0,
        "Max": 0.0,
        "Mean": total / count if count else 0.0,
        "Stddev": 0.0,
        "Labels": labels,
    }


async def metrics(request: Request) -> Response:
    if request.query_params.get("format") == "prometheus":
        return Response(generate_latest(REGISTRY), media_type=CONTENT_TYPE_LATEST)
    return respond(request, summary())


#: open, as Nomad's: the gateway's request counts and timings
METRICS = Need(summary="none (open, as Nomad's)", open=True)

ROUTES: list[BaseRoute] = [ApiRoute("/v1/metrics", metrics, {"GET": METRICS})]
