"""Invariants of a committed state, checked by integration tests (at the end
of every test that places work), by benchmarks after a run and by the chaos
suite after every fault.

Two families, because some states are wrong at any moment and others only
once the cluster is quiet (a scale-down leaves more allocs than the new
count until its eval runs; a node that just went down still has running
allocs until its node-update eval marks them lost):

`check_snapshot` — true at every committed index:

* no node is over-committed: its non-terminal allocs fit on it by the same
  `allocs_fit` the scheduler and the plan applier use;
* every alloc references an existing node and an existing job version;
* no two live allocs of one job group share a name (an error: issue 19
  found this only warned). Allowed, as Nomad allows them: a canary of an
  active deployment (it borrows the name of the alloc it will replace), an
  alloc the server holds as `unknown` on a disconnected node (its
  replacement takes the name), and a system job's allocs on different nodes.

`check_settled` — for a quiet cluster (no eval being processed), the
`check_snapshot` checks plus:

* `check_placed`: every running service or batch job's groups have their
  count of live allocs, or a blocked eval that still explains the shortfall
  (one for the job's current version, on a cluster with no room for the
  group on a node the eval found eligible — a *stale* blocked eval hides an
  under-placed job and is reported);
* no group has more live allocs than its count (plus the canaries of an
  active deployment); a stopped job has none;
* no node is over-committed when the allocs told to stop that the client
  still runs are counted (they still hold the resources);
* no eval stays `pending` longer than `stuck_after` seconds (by its modify
  time; a delayed eval counts from its `wait_until`) — from state alone
  nothing tells a delivery in progress apart from a lost one, so the bound
  must exceed the longest legitimate delivery (the broker's nack timeout,
  60 s, is the backstop for a dead worker);
* no alloc that is not client-terminal sits on a `down` node.

Every check is one pass over the objects (the stale-blocked-eval check
compares a group's ask with the distinct free capacities of nodes, grouped
by datacenter, pool and class, so a homogeneous cluster costs a handful of
comparisons per under-placed group).

Usage::

    violations = await check_state(state_addr)
    assert not errors(violations), violations
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass

from corral.domain.fit import allocs_fit, node_capacity, usage_of
from corral.domain.store import StateSnapshot, StateStore
from corral.domain.structs import (
    ClientStatus,
    DeploymentStatus,
    EvalStatus,
    JobType,
    NodeStatus,
    alloc_client_terminal,
    alloc_server_terminal,
    alloc_terminal,
    node_ready,
    total_task_resources,
)
from corral.security import transport
from corral.v1 import state_pb2, state_pb2_grpc
from corral.v1 import structs_pb2 as pb

ERROR = "error"
WARNING = "warning"

OVER_COMMITTED = "node_over_committed"
OVER_COMMITTED_STOPPING = "node_over_committed_by_stopping_allocs"
MISSING_NODE = "alloc_missing_node"
MISSING_JOB = "alloc_missing_job"
DUPLICATE_NAME = "duplicate_alloc_name"
UNDER_PLACED = "job_under_placed"
STALE_BLOCKED = "stale_blocked_eval"
OVER_PLACED = "job_over_placed"
STUCK_PENDING = "eval_stuck_pending"
LIVE_ON_DOWN_NODE = "alloc_live_on_down_node"

#: default bound on how long an eval may stay pending in a quiet cluster
STUCK_AFTER_S = 90.0

_SECOND_NS = 1_000_000_000
_PLACEABLE = (JobType.SERVICE, JobType.BATCH)


@dataclass(frozen=True, slots=True)
class Violation:
    kind: str
    subject: str  # the node, alloc, eval or job at fault
    detail: str
    severity: str = ERROR

    def __str__(self) -> str:
        return f"{self.severity} {self.kind} {self.subject}: {self.detail}"


def errors(violations: list[Violation]) -> list[Violation]:
    """The violations that must fail a test (warnings left out)."""
    return [v for v in violations if v.severity == ERROR]


# --------------------------------------------------------------------------- any moment


def check_snapshot(snap: StateSnapshot) -> list[Violation]:
    """Every always-true invariant violated in `snap` (empty when all hold)."""
    out: list[Violation] = []
    for node in snap.iter_nodes():
        live = [a for a in snap.allocs_by_node(node.id) if not alloc_terminal(a)]
        if not live:
            continue
        fit = allocs_fit(node, live, check_devices=True)
        if not fit.fits:
            u = fit.used
            out.append(
                Violation(
                    OVER_COMMITTED,
                    node.id,
                    f"{len(live)} live allocs exceed {fit.dimension} "
                    f"(cpu {u.cpu} MHz, memory {u.memory_mb} MB, disk {u.disk_mb} MB)",
                )
            )

    names: dict[tuple[str, str, str, str, str], list[str]] = defaultdict(list)
    for a in snap.allocs.values():
        if snap.node_by_id(a.node_id) is None:
            out.append(Violation(MISSING_NODE, a.id, f"node {a.node_id!r} does not exist"))
        if snap.job_by_version(a.namespace, a.job_id, a.job_version) is None:
            out.append(
                Violation(
                    MISSING_JOB,
                    a.id,
                    f"job {a.namespace}/{a.job_id} version {a.job_version} does not exist",
                )
            )
        if _holds_name(snap, a):
            per_node = a.node_id if a.job_type in (JobType.SYSTEM, JobType.SYSBATCH) else ""
            names[(a.namespace, a.job_id, a.task_group, a.name, per_node)].append(a.id)
    for (ns, job_id, _group, name, _node), ids in names.items():
        if len(ids) > 1:
            out.append(
                Violation(
                    DUPLICATE_NAME,
                    ",".join(sorted(ids)),
                    f"{len(ids)} live allocs of job {ns}/{job_id} are named {name}",
                )
            )
    return out


def _holds_name(snap: StateSnapshot, a: pb.Allocation) -> bool:
    """A live alloc that must be the only one with its name (see the module
    docstring for the ones Nomad lets share it)."""
    if alloc_terminal(a) or a.client_status == ClientStatus.UNKNOWN:
        return False
    return not (a.deployment_status.canary and _deployment_active(snap, a.namespace, a.job_id))


def _deployment_active(snap: StateSnapshot, namespace: str, job_id: str) -> bool:
    d = snap.latest_deployment_by_job(namespace, job_id)
    return d is not None and d.status in DeploymentStatus.ACTIVE


# --------------------------------------------------------------------------- quiet cluster


def check_settled(
    snap: StateSnapshot, *, now_ns: int | None = None, stuck_after: float = STUCK_AFTER_S
) -> list[Violation]:
    """Every invariant of a quiet cluster violated in `snap`: the
    always-true ones plus placement, pending evals and down nodes."""
    now = time.time_ns() if now_ns is None else now_ns
    return [
        *check_snapshot(snap),
        *check_placed(snap),
        *check_over_placed(snap),
        *check_stopping_over_commit(snap),
        *check_stuck_pending(snap, now_ns=now, stuck_after=stuck_after),
        *check_down_nodes(snap),
    ]


def check_placed(snap: StateSnapshot) -> list[Violation]:
    """Service and batch jobs short of their count with no blocked eval to
    say why, or with only a stale one. Only meaningful once no eval is
    pending or in flight. Batch allocs that completed count as placed."""
    out: list[Violation] = []
    room = _FreeRoom(snap)
    for job in snap.iter_jobs():
        if job.stop or job.type not in _PLACEABLE:
            continue
        if job.periodic.enabled or job.HasField("parameterized"):
            continue
        allocs = snap.allocs_by_job(job.namespace, job.id)
        blocked = [
            e for e in snap.evals_by_job(job.namespace, job.id) if e.status == EvalStatus.BLOCKED
        ]
        for tg in job.task_groups:
            live = sum(
                1
                for a in allocs
                if a.task_group == tg.name
                and (
                    not alloc_terminal(a)
                    or (job.type == JobType.BATCH and a.client_status == ClientStatus.COMPLETE)
                )
            )
            if live >= tg.count:
                continue
            subject = f"{job.namespace}/{job.id}"
            short = f"group {tg.name}: {live} of {tg.count} placed"
            if not blocked:
                out.append(Violation(UNDER_PLACED, subject, f"{short} and no blocked eval"))
                continue
            why = _stale_reason(job, tg, blocked, room)
            if why:
                out.append(Violation(STALE_BLOCKED, subject, f"{short}; blocked eval {why}"))
    return out


def _stale_reason(
    job: pb.Job, tg: pb.TaskGroup, blocked: list[pb.Evaluation], room: _FreeRoom
) -> str:
    """Why no blocked eval of `job` explains the shortfall of `tg` ("" when
    one does)."""
    current = [e for e in blocked if e.job_modify_index >= job.job_modify_index]
    if not current:
        ids = ",".join(sorted(e.id for e in blocked))
        return f"{ids} is for an older version of the job (job_modify_index {job.job_modify_index})"
    found: list[str] = []
    for ev in current:
        node = room.fitting_node(job, tg, ev)
        if node is None:
            return ""
        found.append(f"{ev.id} waits while node {node} has room for group {tg.name}")
    return "; ".join(found)


class _FreeRoom:
    """Free capacity per node, bucketed by (datacenter, pool, class) and
    de-duplicated, so asking "does this group fit anywhere" is cheap."""

    def __init__(self, snap: StateSnapshot) -> None:
        self.snap = snap
        self._buckets: dict[tuple[str, str, str], dict[tuple[int, int, int], str]] | None = None

    def buckets(self) -> dict[tuple[str, str, str], dict[tuple[int, int, int], str]]:
        if self._buckets is None:
            self._buckets = defaultdict(dict)
            for node in self.snap.iter_nodes():
                if not node_ready(node):
                    continue
                cap = node_capacity(node)
                used = usage_of(self.snap.allocs_by_node(node.id), cap.mhz_per_core)
                free = (
                    cap.cpu - used.cpu,
                    cap.memory_mb - used.memory_mb,
                    cap.disk_mb - used.disk_mb,
                )
                key = (node.datacenter, node.node_pool, node.computed_class)
                self._buckets[key].setdefault(free, node.id)
        return self._buckets

    def fitting_node(self, job: pb.Job, tg: pb.TaskGroup, ev: pb.Evaluation) -> str | None:
        """A ready node the blocked eval could use that has room for one more
        alloc of `tg`, or None. Without the eval's class eligibility the
        job's constraints are unknown here, so only an unconstrained job is
        judged."""
        by_class = bool(ev.class_eligibility) and not ev.escaped_computed_class
        if not by_class and _constrained(job, tg):
            return None
        ask = total_task_resources(tg.tasks)
        cpu, mem, disk = ask.cpu, ask.memory_mb, tg.ephemeral_disk.size_mb
        dcs = set(job.datacenters)
        for (dc, pool, klass), frees in self.buckets().items():
            if dcs and "*" not in dcs and dc not in dcs:
                continue
            if job.node_pool not in ("", "all") and pool != job.node_pool:
                continue
            if by_class and not ev.class_eligibility.get(klass, False):
                continue
            for (fc, fm, fd), node_id in frees.items():
                if fc >= cpu and fm >= mem and fd >= disk:
                    return node_id
        return None


def _constrained(job: pb.Job, tg: pb.TaskGroup) -> bool:
    return bool(
        job.constraints
        or tg.constraints
        or any(t.constraints for t in tg.tasks)
        or any(t.resources.networks or t.resources.devices or t.resources.cores for t in tg.tasks)
    )


def check_over_placed(snap: StateSnapshot) -> list[Violation]:
    """Groups with more live allocs than their count (canaries of an active
    deployment and allocs held as unknown on a disconnected node aside); a
    stopped job has none. System jobs are checked per node by names."""
    out: list[Violation] = []
    for job in snap.iter_jobs():
        if job.type in (JobType.SYSTEM, JobType.SYSBATCH):
            continue
        live: dict[str, int] = defaultdict(int)
        for a in snap.allocs_by_job(job.namespace, job.id):
            if _holds_name(snap, a):
                live[a.task_group] += 1
        counts = {tg.name: (0 if job.stop else tg.count) for tg in job.task_groups}
        for group, n in sorted(live.items()):
            want = counts.get(group, 0)
            if n > want:
                what = "stopped job" if job.stop else f"count {want}"
                out.append(
                    Violation(
                        OVER_PLACED,
                        f"{job.namespace}/{job.id}",
                        f"group {group}: {n} live allocs for {what}",
                    )
                )
    return out


def check_stopping_over_commit(snap: StateSnapshot) -> list[Violation]:
    """Nodes whose capacity is exceeded once the allocs told to stop that
    the client still reports running are counted: the planner (like Nomad)
    frees their resources when the stop is committed, but the tasks hold
    them until they exit, so in a quiet cluster this means a stop never
    reached the client or its exit was never recorded."""
    out: list[Violation] = []
    for node in snap.iter_nodes():
        allocs = snap.allocs_by_node(node.id)
        stopping = [
            a
            for a in allocs
            if alloc_server_terminal(a) and a.client_status == ClientStatus.RUNNING
        ]
        if not stopping:
            continue
        holding = [a for a in allocs if not alloc_terminal(a)] + stopping
        fit = allocs_fit(node, holding, check_devices=True)
        if not fit.fits:
            ids = ",".join(sorted(a.id for a in stopping))
            out.append(
                Violation(
                    OVER_COMMITTED_STOPPING,
                    node.id,
                    f"{fit.dimension} exceeded counting {len(stopping)} stopping allocs "
                    f"still running ({ids})",
                )
            )
    return out


def check_stuck_pending(
    snap: StateSnapshot, *, now_ns: int, stuck_after: float = STUCK_AFTER_S
) -> list[Violation]:
    """Evals pending for longer than `stuck_after` seconds past their last
    write (or past the `wait_until` of a delayed eval)."""
    out: list[Violation] = []
    bound = int(stuck_after * _SECOND_NS)
    for ev in snap.evals.values():
        if ev.status != EvalStatus.PENDING:
            continue
        since = max(ev.modify_time, ev.wait_until)
        if since and now_ns - since > bound:
            age = (now_ns - since) / _SECOND_NS
            out.append(
                Violation(
                    STUCK_PENDING,
                    ev.id,
                    f"eval of {ev.namespace}/{ev.job_id} ({ev.triggered_by}) pending "
                    f"for {age:.0f}s (bound {stuck_after:.0f}s)",
                )
            )
    return out


def check_down_nodes(snap: StateSnapshot) -> list[Violation]:
    """Allocs the client has not finished on nodes that are down: a down
    node's node-update eval must have marked them lost."""
    out: list[Violation] = []
    for node in snap.iter_nodes():
        if node.status != NodeStatus.DOWN:
            continue
        for a in snap.allocs_by_node(node.id):
            if not alloc_client_terminal(a):
                out.append(
                    Violation(
                        LIVE_ON_DOWN_NODE,
                        a.id,
                        f"alloc {a.name} is {a.client_status} (desired {a.desired_status}) "
                        f"on down node {node.id}",
                    )
                )
    return out


def kinds(violations: Iterable[Violation]) -> list[str]:
    """The distinct kinds among `violations`, sorted (for tests and tables)."""
    return sorted({v.kind for v in violations})


# --------------------------------------------------------------------------- fetching


async def fetch_snapshot(state_addr: str) -> StateSnapshot:
    """A consistent snapshot of the whole state through `State.Snapshot`."""
    parts: dict[str, list[object]] = {
        "jobs": [],
        "job_versions": [],
        "nodes": [],
        "allocs": [],
        "evals": [],
        "deployments": [],
        "job_summaries": [],
    }
    index = 0
    tables: dict[str, int] = {}
    config = pb.SchedulerConfiguration()
    first = True
    options = [("grpc.max_receive_message_length", transport.MAX_MESSAGE_BYTES)]
    async with transport.dial(state_addr, options=options) as channel:
        stub = state_pb2_grpc.StateStub(channel)
        async for chunk in stub.Snapshot(state_pb2.SnapshotRequest(chunk_size=2000)):
            if first:
                index = chunk.index
                tables = {t.table: t.index for t in chunk.table_indexes}
                config = chunk.scheduler_config
                first = False
            for name, items in parts.items():
                items.extend(getattr(chunk, name))
    return StateStore.build(
        index,
        scheduler_config=config,
        table_indexes=tables,
        **parts,  # type: ignore[arg-type]
    )


async def check_state(state_addr: str) -> list[Violation]:
    """Fetch the state's snapshot and check the always-true invariants."""
    return check_snapshot(await fetch_snapshot(state_addr))


async def check_state_settled(
    state_addr: str, stuck_after: float = STUCK_AFTER_S
) -> list[Violation]:
    """Fetch the state's snapshot and check every quiet-cluster invariant."""
    return check_settled(await fetch_snapshot(state_addr), stuck_after=stuck_after)
