"""Invariants of a committed state, checked by integration tests (at the end
of every test that places work) and by benchmarks after a run.

* no node is over-committed: its non-terminal allocs fit on it by the same
  `allocs_fit` the scheduler and the plan applier use;
* every alloc references an existing node and an existing job version;
* (warning only) no two non-terminal allocs of one job group share a name —
  Nomad tolerates this transiently, so it is reported, not failed;
* `check_placed`, for a quiet cluster: every running service or batch job's
  groups have their count of live allocs, or a blocked eval explains the
  shortfall.

Usage::

    violations = await check_state(state_addr)
    assert not errors(violations), violations
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from corral import security
from corral.fit import allocs_fit
from corral.store import StateSnapshot, StateStore
from corral.structs import EvalStatus, JobType, alloc_terminal
from corral.v1 import state_pb2, state_pb2_grpc
from corral.v1 import structs_pb2 as pb

ERROR = "error"
WARNING = "warning"

OVER_COMMITTED = "node_over_committed"
MISSING_NODE = "alloc_missing_node"
MISSING_JOB = "alloc_missing_job"
DUPLICATE_NAME = "duplicate_alloc_name"
UNDER_PLACED = "job_under_placed"

_MAX_MESSAGE_BYTES = 256 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class Violation:
    kind: str
    subject: str  # the node or alloc id at fault
    detail: str
    severity: str = ERROR

    def __str__(self) -> str:
        return f"{self.severity} {self.kind} {self.subject}: {self.detail}"


def errors(violations: list[Violation]) -> list[Violation]:
    """The violations that must fail a test (warnings left out)."""
    return [v for v in violations if v.severity == ERROR]


def check_snapshot(snap: StateSnapshot) -> list[Violation]:
    """Every invariant violated in `snap` (empty when all hold)."""
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

    names: dict[tuple[str, str, str, str], list[str]] = defaultdict(list)
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
        if not alloc_terminal(a):
            names[(a.namespace, a.job_id, a.task_group, a.name)].append(a.id)
    for (ns, job_id, _group, name), ids in names.items():
        if len(ids) > 1:
            out.append(
                Violation(
                    DUPLICATE_NAME,
                    ",".join(sorted(ids)),
                    f"{len(ids)} live allocs of job {ns}/{job_id} are named {name}",
                    WARNING,
                )
            )
    return out


def check_placed(snap: StateSnapshot) -> list[Violation]:
    """Service and batch jobs short of their count with no blocked eval to
    say why. Only meaningful once no eval is pending or in flight. Batch
    allocs that completed count as placed."""
    out: list[Violation] = []
    for job in snap.iter_jobs():
        if job.stop or job.type not in (JobType.SERVICE, JobType.BATCH):
            continue
        if job.periodic.enabled or job.HasField("parameterized"):
            continue
        allocs = snap.allocs_by_job(job.namespace, job.id)
        if any(e.status == EvalStatus.BLOCKED for e in snap.evals_by_job(job.namespace, job.id)):
            continue
        for tg in job.task_groups:
            live = sum(
                1
                for a in allocs
                if a.task_group == tg.name
                and (
                    not alloc_terminal(a)
                    or (job.type == JobType.BATCH and a.client_status == "complete")
                )
            )
            if live < tg.count:
                out.append(
                    Violation(
                        UNDER_PLACED,
                        f"{job.namespace}/{job.id}",
                        f"group {tg.name}: {live} of {tg.count} placed and no blocked eval",
                    )
                )
    return out


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
    options = [("grpc.max_receive_message_length", _MAX_MESSAGE_BYTES)]
    async with security.dial(state_addr, options=options) as channel:
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
    """Fetch the state's snapshot and check it."""
    return check_snapshot(await fetch_snapshot(state_addr))
