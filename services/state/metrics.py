"""Prometheus metrics of the state service (served on --metrics-listen).

The write path is the cluster's serial section: every write takes the
index counter's row lock, so `lock_wait` (queueing for it) and `hold` (how
long a transaction keeps it) say where write latency comes from."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from prometheus_client import REGISTRY, Counter, Gauge, Histogram, Metric
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from corral.domain.store import StateSnapshot
from corral.domain.structs import JobStatus, NodeStatus
from corral.runtime.slow_readers import SlowReader
from services.state import stubs

_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)

WRITE_LOCK_WAIT = Histogram(
    "corral_state_write_lock_wait_seconds",
    "From asking for a connection to holding the index counter's lock",
    buckets=_BUCKETS,
)
WRITE_HOLD = Histogram(
    "corral_state_write_hold_seconds",
    "From taking the index counter's lock to the commit",
    buckets=_BUCKETS,
)
BATCH_SIZE = Histogram(
    "corral_state_write_batch_ops",
    "Operations coalesced into one node-write batch",
    buckets=(1, 2, 5, 10, 25, 50, 100, 250, 500),
)

# ------------------------------------------------------------ federation

FEDERATION_FORWARDED = Counter(
    "corral_federation_forwarded_total",
    "Calls forwarded to another region, by region and outcome (forwarded, unreachable) "
    "(nomad.rpc.cross-region)",
    ["region", "outcome"],
)
FEDERATION_LINK_ALIVE = Gauge(
    "corral_federation_link_alive",
    "1 while at least one state server of the region answered this process's last probe",
    ["region"],
)
ACL_REPLICATION_LAST_SUCCESS = Gauge(
    "corral_acl_replication_last_success_timestamp_seconds",
    "When ACL replication from the authoritative region last succeeded (state leader of "
    "a non-authoritative region)",
)

WAITING_CALLS = Gauge(
    "corral_state_waiting_calls",
    "Blocking queries and streams this state process holds open now",
)
WAITING_REFUSED = Counter(
    "corral_state_waiting_refused_total",
    "Waiting calls refused because their connection (or node) held its bound already",
)
STREAMS_DROPPED = Counter(
    "corral_state_streams_dropped_total",
    "Stream readers dropped for taking nothing for --stream-stall-timeout, by RPC",
    ["rpc"],
)


@contextlib.contextmanager
def dropped_counted(rpc: str) -> Iterator[None]:
    """Count a stream whose reader was dropped as slow (`SlowReader`)."""
    try:
        yield
    except SlowReader:
        STREAMS_DROPPED.labels(rpc).inc()
        raise


# ------------------------------------------------------------ cluster gauges
#
# What Nomad's leader reports about the cluster (`nomad.nomad.heartbeat.
# active`, `nomad.nomad.job_summary.*`, `nomad.nomad.job_status.*`), computed
# when Prometheus scrapes, from the state leader's in-memory copy: nothing
# is counted on the write path. Followers report none of them, so a sum
# over the state processes is the cluster's number.

HEARTBEAT_MISSED = Counter(
    "corral_heartbeat_missed_total",
    "Nodes that missed their heartbeat, by the status they got (nomad.nomad.heartbeat.invalidate)",
    ["status"],
)
NODE_STATUS_CHANGES = Counter(
    "corral_node_status_changes_total",
    "Node status changes the state leader saw between two collections, by new status",
    ["status"],
)

_TASK_GROUP_STATES = ("queued", "starting", "running", "complete", "failed", "lost", "unknown")
_JOB_STATES = (JobStatus.PENDING, JobStatus.RUNNING, JobStatus.DEAD)


@dataclass(frozen=True)
class LeaderView:
    """What the state leader shows the collector."""

    snapshot: StateSnapshot
    heartbeats_active: int


#: returns the view while this process leads, else None
Source = Callable[[], LeaderView | None]


class ClusterCollector(Collector):
    def __init__(self) -> None:
        self._sources: list[Source] = []
        self._last_status: dict[str, str] = {}

    def add_source(self, source: Source) -> None:
        self._sources.append(source)

    def remove_source(self, source: Source) -> None:
        with contextlib.suppress(ValueError):
            self._sources.remove(source)

    def _view(self) -> LeaderView | None:
        for source in list(self._sources):
            view = source()
            if view is not None:
                return view
        return None

    def describe(self) -> Iterator[Metric]:
        """The families `collect` yields (the registry's name check, and
        tests/unit/test_observability.py)."""
        yield GaugeMetricFamily("corral_heartbeat_active", "")
        yield GaugeMetricFamily("corral_nodes", "", labels=["status", "datacenter"])
        yield GaugeMetricFamily("corral_jobs", "", labels=["status"])
        yield GaugeMetricFamily(
            "corral_job_summary", "", labels=["namespace", "job", "task_group", "state"]
        )

    def collect(self) -> Iterator[Metric]:
        view = self._view()
        if view is None:
            self._last_status = {}
            return
        yield GaugeMetricFamily(
            "corral_heartbeat_active",
            "Nodes whose heartbeat timer the state leader runs (nomad.nomad.heartbeat.active)",
            value=view.heartbeats_active,
        )
        yield self._nodes(view.snapshot)
        yield from self._jobs(view.snapshot)

    def _nodes(self, snap: StateSnapshot) -> GaugeMetricFamily:
        counts: dict[tuple[str, str], int] = {}
        last = self._last_status
        seen: dict[str, str] = {}
        for node in snap.iter_nodes():
            dc = node.datacenter
            for status in NodeStatus.ALL:
                counts.setdefault((status, dc), 0)
            counts[(node.status, dc)] = counts.get((node.status, dc), 0) + 1
            seen[node.id] = node.status
            before = last.get(node.id)
            if before is not None and before != node.status:
                NODE_STATUS_CHANGES.labels(node.status).inc()
        self._last_status = seen
        family = GaugeMetricFamily(
            "corral_nodes", "Nodes by status and datacenter", labels=["status", "datacenter"]
        )
        for (status, dc), n in sorted(counts.items()):
            family.add_metric([status, dc], n)
        return family

    def _jobs(self, snap: StateSnapshot) -> Iterator[GaugeMetricFamily]:
        by_status = dict.fromkeys(_JOB_STATES, 0)
        summary = GaugeMetricFamily(
            "corral_job_summary",
            "Allocs of each job's task groups by state (nomad.nomad.job_summary.<state>); "
            "dispatched and periodic children are left out, as Nomad can",
            labels=["namespace", "job", "task_group", "state"],
        )
        for job in snap.iter_jobs():
            status = job.status or JobStatus.PENDING
            by_status[status] = by_status.get(status, 0) + 1
            if job.parent_id:
                continue
            # the stored summary holds only the queued counts: the others
            # come from the allocs, as every read of a summary computes them
            js = stubs.summarize(snap, job)
            for group, tg in sorted(js.summary.items()):
                for state in _TASK_GROUP_STATES:
                    summary.add_metric([job.namespace, job.id, group, state], getattr(tg, state))
        jobs = GaugeMetricFamily(
            "corral_jobs", "Jobs by status (nomad.nomad.job_status.<status>)", labels=["status"]
        )
        for status, n in sorted(by_status.items()):
            jobs.add_metric([status], n)
        yield jobs
        yield summary


CLUSTER = ClusterCollector()
REGISTRY.register(CLUSTER)
