"""Agent (client node) metrics, named after Nomad's `nomad.client.*` series.

The allocs-by-status gauge is computed when Prometheus scrapes, from the
alloc runners the agent holds; the counters are bumped where a task starts,
restarts or its driver fails (services/agent/runner.py).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator

from prometheus_client import REGISTRY, Counter, Metric
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from corral.domain.structs import ClientStatus

TASK_STARTS = Counter(
    "corral_client_task_starts_total",
    "Tasks started by a driver, restarts included (nomad.client.allocs.start)",
    ["driver"],
)
TASK_RESTARTS = Counter(
    "corral_client_task_restarts_total",
    "Task restarts under the group's restart policy (nomad.client.allocs.restart)",
    ["driver"],
)
DRIVER_ERRORS = Counter(
    "corral_client_driver_errors_total",
    "Task starts a driver failed (the task event `Driver Failure`)",
    ["driver"],
)

_STATUSES = (
    ClientStatus.PENDING,
    ClientStatus.RUNNING,
    ClientStatus.COMPLETE,
    ClientStatus.FAILED,
)

#: the client statuses of the allocs one agent runs, read at scrape time
Source = Callable[[], Iterable[str]]


class AllocsCollector(Collector):
    """`corral_client_allocs{status}` (nomad.client.allocations.<status>)."""

    def __init__(self) -> None:
        self._sources: list[Source] = []

    def add_source(self, source: Source) -> None:
        self._sources.append(source)

    def remove_source(self, source: Source) -> None:
        with contextlib.suppress(ValueError):
            self._sources.remove(source)

    def describe(self) -> Iterator[Metric]:
        """The family `collect` yields (see the state's ClusterCollector)."""
        yield GaugeMetricFamily("corral_client_allocs", "", labels=["status"])

    def collect(self) -> Iterator[Metric]:
        if not self._sources:
            return
        counts = dict.fromkeys(_STATUSES, 0)
        for source in list(self._sources):
            for status in source():
                counts[status] = counts.get(status, 0) + 1
        family = GaugeMetricFamily(
            "corral_client_allocs",
            "Allocs this agent runs, by client status (nomad.client.allocations.<status>)",
            labels=["status"],
        )
        for status, n in sorted(counts.items()):
            family.add_metric([status], n)
        yield family


ALLOCS = AllocsCollector()
REGISTRY.register(ALLOCS)
