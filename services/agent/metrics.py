"""Agent (client node) metrics, named after Nomad's `nomad.client.*` series.

The allocs-by-status gauge and the resource usage gauges are computed when
Prometheus scrapes, from the alloc runners the agent holds and their latest
stats samples; the counters are bumped where a task starts, restarts, is
OOM-killed or its driver fails (services/agent/runner.py).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Protocol

from prometheus_client import REGISTRY, Counter, Metric
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from corral.domain.structs import ClientStatus
from corral.v1 import structs_pb2 as pb

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

OOM_KILLED = Counter(
    "corral_client_allocs_oom_killed_total",
    "Tasks the kernel's OOM killer ended (nomad.client.allocs.oom_killed)",
    ["namespace", "job", "task_group", "task"],
)


@dataclass(frozen=True)
class TaskSample:
    """One running task's latest reading and what it was allocated."""

    namespace: str
    job: str
    task_group: str
    alloc_id: str
    task: str
    usage: pb.TaskResourceUsage
    allocated_mhz: int
    allocated_memory_bytes: int


class UsageSource(Protocol):
    def task_samples(self) -> Iterable[TaskSample]: ...

    def host_sample(self) -> pb.HostStats | None: ...


_TASK_LABELS = ["namespace", "job", "task_group", "alloc_id", "task"]
#: MemoryStats field -> (metric suffix, the Measured name that says it is read)
_MEMORY = {
    "rss": ("rss", "RSS"),
    "cache": ("cache", "Cache"),
    "swap": ("swap", "Swap"),
    "usage": ("usage", "Usage"),
    "max_usage": ("max_usage", "Max Usage"),
    "kernel_usage": ("kernel_usage", "Kernel Usage"),
    "kernel_max_usage": ("kernel_max_usage", "Kernel Max Usage"),
}


class UsageCollector(Collector):
    """Resource usage gauges from the agent's latest samples (Nomad's
    `nomad.client.allocs.memory.*`, `nomad.client.allocs.cpu.*`,
    `nomad.client.host.*`, `nomad.client.uptime`); a field the node does
    not measure is left out rather than reported as 0."""

    def __init__(self) -> None:
        self._sources: list[UsageSource] = []

    def add_source(self, source: UsageSource) -> None:
        self._sources.append(source)

    def remove_source(self, source: UsageSource) -> None:
        with contextlib.suppress(ValueError):
            self._sources.remove(source)

    def describe(self) -> Iterator[Metric]:
        return iter(())  # families depend on what is measured

    def collect(self) -> Iterator[Metric]:
        if not self._sources:
            return
        yield from self._tasks()
        yield from self._host()

    def _tasks(self) -> Iterator[Metric]:
        def gauge(name: str, doc: str) -> GaugeMetricFamily:
            return GaugeMetricFamily(f"corral_client_allocs_{name}", doc, labels=_TASK_LABELS)

        memory = {
            f: gauge(
                f"memory_{suffix}_bytes",
                f"Task memory {measured} (nomad.client.allocs.memory.{suffix})",
            )
            for f, (suffix, measured) in _MEMORY.items()
        }
        mem_allocated = gauge(
            "memory_allocated_bytes", "Task memory allocated (nomad.client.allocs.memory.allocated)"
        )
        cpu = {
            "percent": gauge(
                "cpu_total_percent",
                "Task CPU, percent of one core (nomad.client.allocs.cpu.total_percent)",
            ),
            "system_mode": gauge(
                "cpu_system_percent", "Task CPU in the kernel (nomad.client.allocs.cpu.system)"
            ),
            "user_mode": gauge(
                "cpu_user_percent", "Task CPU in user space (nomad.client.allocs.cpu.user)"
            ),
            "total_ticks": gauge(
                "cpu_total_ticks", "Task CPU as MHz consumed (nomad.client.allocs.cpu.total_ticks)"
            ),
        }
        throttled_periods = gauge(
            "cpu_throttled_periods",
            "Periods the task was throttled (nomad.client.allocs.cpu.throttled_periods)",
        )
        throttled = gauge(
            "cpu_throttled_seconds",
            "Time the task was throttled (nomad.client.allocs.cpu.throttled_time)",
        )
        cpu_allocated = gauge(
            "cpu_allocated_mhz", "Task CPU allocated (nomad.client.allocs.cpu.allocated)"
        )
        for source in list(self._sources):
            for s in source.task_samples():
                labels = [s.namespace, s.job, s.task_group, s.alloc_id, s.task]
                m = s.usage.resource_usage.memory_stats
                for f, (_, measured) in _MEMORY.items():
                    if measured in m.measured:
                        memory[f].add_metric(labels, getattr(m, f))
                mem_allocated.add_metric(labels, s.allocated_memory_bytes)
                c = s.usage.resource_usage.cpu_stats
                for f, family in cpu.items():
                    family.add_metric(labels, getattr(c, f))
                if "Throttled Periods" in c.measured:
                    throttled_periods.add_metric(labels, c.throttled_periods)
                    throttled.add_metric(labels, c.throttled_time / 1e9)
                cpu_allocated.add_metric(labels, s.allocated_mhz)
        yield from memory.values()
        yield mem_allocated
        yield from cpu.values()
        yield from (throttled_periods, throttled, cpu_allocated)

    def _host(self) -> Iterator[Metric]:
        samples = [h for h in (s.host_sample() for s in list(self._sources)) if h is not None]
        if not samples:
            return
        host = samples[0]
        mem = host.memory
        for f in ("total", "available", "used", "free"):
            g = GaugeMetricFamily(
                f"corral_client_host_memory_{f}_bytes",
                f"Host memory {f} (nomad.client.host.memory.{f})",
            )
            g.add_metric([], getattr(mem, f))
            yield g
        cpu_families = {
            f: GaugeMetricFamily(
                f"corral_client_host_cpu_{f}_percent",
                f"Host CPU {f} per core (nomad.client.host.cpu.{f})",
                labels=["cpu"],
            )
            for f in ("user", "system", "idle", "total")
        }
        for c in host.cpu:
            for f in ("user", "system", "idle"):
                cpu_families[f].add_metric([c.cpu], getattr(c, f))
            cpu_families["total"].add_metric([c.cpu], max(0.0, 100.0 - c.idle))
        yield from cpu_families.values()
        disk_families = {
            f: GaugeMetricFamily(
                f"corral_client_host_disk_{name}",
                f"Host disk {f} (nomad.client.host.disk.{f})",
                labels=["disk"],
            )
            for f, name in (
                ("size", "size_bytes"),
                ("used", "used_bytes"),
                ("available", "available_bytes"),
                ("used_percent", "used_percent"),
                ("inodes_used_percent", "inodes_percent"),
            )
        }
        for d in host.disk_stats:
            for f, family in disk_families.items():
                family.add_metric([d.device], getattr(d, f))
        yield from disk_families.values()
        uptime = GaugeMetricFamily(
            "corral_client_uptime_seconds", "Seconds since the host booted (nomad.client.uptime)"
        )
        uptime.add_metric([], host.uptime)
        yield uptime


USAGE = UsageCollector()
REGISTRY.register(USAGE)
