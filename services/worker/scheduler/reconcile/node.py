"""What a system or sysbatch job needs on each node (Nomad's
`reconciler/reconcile_node.go`): per (node, alloc name) slot, whether to
place, update, migrate, stop, ignore, mark lost, disconnect or reconnect.
The system scheduler (services/worker/scheduler/system_sched.py) acts on
the `NodeDiff`; the plan annotations count it."""

from __future__ import annotations

from dataclasses import dataclass, field

from corral.domain import structs
from corral.domain.structs import ClientStatus, DesiredStatus, JobType, NodeStatus
from corral.v1 import structs_pb2 as pb
from services.worker.scheduler import util
from services.worker.scheduler.reconcile.allocs import expired


@dataclass
class AllocTuple:
    """One (node, name) slot: the group it belongs to and the alloc in it
    (for placements: the terminal alloc it follows, if any)."""

    name: str
    task_group: pb.TaskGroup | None
    alloc: pb.Allocation | None
    node_id: str


@dataclass
class NodeDiff:
    place: list[AllocTuple] = field(default_factory=list)
    update: list[AllocTuple] = field(default_factory=list)
    migrate: list[AllocTuple] = field(default_factory=list)
    stop: list[AllocTuple] = field(default_factory=list)
    ignore: list[AllocTuple] = field(default_factory=list)
    lost: list[AllocTuple] = field(default_factory=list)
    disconnecting: list[AllocTuple] = field(default_factory=list)
    reconnecting: list[AllocTuple] = field(default_factory=list)


def required_names(job: pb.Job | None) -> dict[str, pb.TaskGroup]:
    """Alloc name -> group that every eligible node must run."""
    if util.job_stopped(job):
        return {}
    assert job is not None
    out: dict[str, pb.TaskGroup] = {}
    for tg in job.task_groups:
        for i in range(max(tg.count, 0)):
            out[structs.alloc_name(job.id, tg.name, i)] = tg
    return out


def diff_system_allocs(
    job: pb.Job | None,
    ready_nodes: list[pb.Node],
    not_ready: set[str],
    tainted: dict[str, pb.Node | None],
    live: list[pb.Allocation],
    terminal: dict[tuple[str, str], pb.Allocation],
    now: int,
    initializing: frozenset[str] = frozenset(),
) -> NodeDiff:
    """Per node, what the job's allocs there need (semantics §5.5).

    A running alloc reconnecting on a node that is still initializing is
    left alone: the planner takes no update for that node, and the node's
    own eval when it turns ready records the reconnect."""
    diff = NodeDiff()
    required = required_names(job)
    sysbatch = job is not None and job.type == JobType.SYSBATCH
    job_index = job.job_modify_index if job is not None else 0
    eligible = {n.id for n in ready_nodes}
    by_node: dict[str, list[pb.Allocation]] = {n.id: [] for n in ready_nodes}
    for a in live:
        by_node.setdefault(a.node_id, []).append(a)

    for node_id, allocs in by_node.items():
        existing: set[str] = set()
        node_tainted = node_id in tainted
        node = tainted.get(node_id)
        for a in allocs:
            existing.add(a.name)
            tg = required.get(a.name)
            t = AllocTuple(a.name, tg, a, node_id)
            if tg is None:
                diff.stop.append(t)
                continue
            reconnect = False
            is_expired = False
            if a.client_status in (ClientStatus.UNKNOWN, ClientStatus.RUNNING):
                reconnect = structs.needs_reconnect(a)
                if reconnect:
                    is_expired = expired(a, tg, now)
            if a.desired_transition.migrate:
                diff.migrate.append(t)
                continue
            if is_expired:
                diff.lost.append(t)
                continue
            if a.client_status == ClientStatus.UNKNOWN and a.desired_status == DesiredStatus.RUN:
                diff.ignore.append(t)
                continue
            if not node_tainted and reconnect and node_id in initializing:
                diff.ignore.append(t)
                continue
            if not node_tainted and reconnect:
                r = structs.copy_msg(a)
                r.alloc_states.add(field="client_status", value=a.client_status, time=now)
                diff.reconnecting.append(AllocTuple(a.name, tg, r, node_id))
                continue
            if node_tainted:
                if sysbatch and structs.alloc_ran_successfully(a):
                    diff.ignore.append(t)
                    continue
                if (
                    node is not None
                    and node.status == NodeStatus.DISCONNECTED
                    and a.client_status == ClientStatus.RUNNING
                ):
                    if structs.lost_after(tg) == 0:
                        diff.lost.append(t)
                        continue
                    if reconnect:
                        # alloc update before heartbeat: wait for the node
                        diff.ignore.append(t)
                        continue
                    d = structs.copy_msg(a)
                    d.client_status = ClientStatus.UNKNOWN
                    d.alloc_states.add(field="client_status", value=ClientStatus.UNKNOWN, time=now)
                    d.client_description = util.ALLOC_UNKNOWN
                    diff.disconnecting.append(AllocTuple(a.name, tg, d, node_id))
                    continue
                if node is None or node.status in (NodeStatus.DOWN, NodeStatus.DISCONNECTED):
                    diff.lost.append(t)
                else:
                    diff.ignore.append(t)
                continue
            if node_id in not_ready:
                if job_index != a.job_modify_index:
                    diff.stop.append(t)
                else:
                    diff.ignore.append(t)
                continue
            if node_id not in eligible:
                diff.stop.append(t)
                continue
            if job_index != a.job_modify_index:
                diff.update.append(t)
                continue
            diff.ignore.append(t)

        for name, tg in required.items():
            if name in existing:
                continue
            term = terminal.get((node_id, name))
            if sysbatch and term is not None:
                if job_index != term.job_modify_index:
                    diff.update.append(AllocTuple(name, tg, term, node_id))
                else:
                    diff.ignore.append(AllocTuple(name, tg, term, node_id))
                continue
            if node_tainted or node_id not in eligible:
                continue
            diff.place.append(AllocTuple(name, tg, term, node_id))
    return diff
