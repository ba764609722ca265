"""Helpers shared by the generic and system schedulers (Nomad's
`scheduler/util.go` and the plan helpers of `structs.Plan`): ready and
tainted nodes, the destructive-change check, retry accounting, plan
building and the final eval status write.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Mapping

from corral.domain import structs
from corral.domain.store import StateSnapshot
from corral.domain.structs import ClientStatus, DesiredStatus, NodeStatus, Trigger
from corral.v1 import structs_pb2 as pb
from services.worker.scheduler.interfaces import Planner

# ----------------------------------------------------------------- descriptions
# The user-visible reasons, worded as Nomad words them.

ALLOC_NOT_NEEDED = "alloc not needed due to job update"
ALLOC_RECONNECTED = "alloc not needed due to disconnected client reconnect"
ALLOC_MIGRATING = "alloc is being migrated"
ALLOC_UPDATING = "alloc is being updated due to job update"
ALLOC_LOST = "alloc is lost since its node is down"
ALLOC_UNKNOWN = "alloc is unknown since its node is disconnected"
ALLOC_RESCHEDULED = "alloc was rescheduled because it failed"
ALLOC_IN_PLACE = "alloc updating in-place"
ALLOC_NODE_TAINTED = "alloc not needed as node is tainted"

BLOCKED_EVAL_MAX_PLAN = "created due to placement conflicts"
BLOCKED_EVAL_FAILED_PLACEMENTS = "created to place remaining allocations"
RESCHEDULING_FOLLOWUP = "created for delayed rescheduling"
DISCONNECT_TIMEOUT_FOLLOWUP = "created for delayed disconnect timeout"

RESCHEDULE_WINDOW = structs.SECOND  # "now" if due within this
BATCHED_FAILED_ALLOC_WINDOW = 5 * structs.SECOND  # follow-up evals batch allocs this close
DEFAULT_KILL_TIMEOUT = 5 * structs.SECOND
DEFAULT_STAGGER = 30 * structs.SECOND
MAX_PAST_RESCHEDULE_EVENTS = 5

LAST_RESCHEDULE_OK = "ok"
LAST_RESCHEDULE_FAILED = "failed to place"


class SetStatusError(Exception):
    """Retries ran out: the eval ends with `eval_status`."""

    def __init__(self, message: str, eval_status: str) -> None:
        super().__init__(message)
        self.eval_status = eval_status


# ----------------------------------------------------------------- nodes


#: (datacenters, pool) -> (the snapshot's nodes-by-DC index it was computed
#: from, ready nodes, not-ready ids, ready count per DC): globs and pool `all`
_ReadyEntry = tuple[object, list[pb.Node], frozenset[str], dict[str, int]]
_ready_cache: dict[tuple[tuple[str, ...], str], _ReadyEntry] = {}
_ready_lock = threading.Lock()
#: distinct (datacenters, pool) pairs remembered; the oldest is dropped first
READY_CACHE_SIZE = 64


def ready_nodes_in_dcs(
    snap: StateSnapshot, datacenters: Iterable[str], pool: str = ""
) -> tuple[list[pb.Node], set[str], dict[str, int]]:
    """Scheduling-ready nodes of the job's datacenters and node pool, the ids
    of the not-ready ones among them, and the count of ready nodes per DC.

    Every eval asks this. For one pool and plain datacenter names or `*`
    (every one, the default) the answer is read from the store's ready-node
    index, which each node write updates by that node
    (`StateSnapshot.ready_nodes`), in the order a walk of every node would
    give (the stack's shuffle starts from it). Other globs (`dc-*`) and
    every pool (`all`) walk the nodes, and that answer is kept per
    (datacenters, pool) while the snapshot's nodes-by-DC index is the very
    same object (no node written since). Callers get their own copies."""
    dcs = tuple(datacenters)
    if not pool or pool == "all" or any("*" in dc and dc != "*" for dc in dcs):
        return _walked_ready_nodes(snap, dcs, pool)
    if not dcs or "*" in dcs:
        keys: tuple[str | None, ...] = (None,)
    else:
        keys = tuple(dict.fromkeys(dcs))
    ready: list[pb.Node] = []
    not_ready: set[str] = set()
    for dc in keys:
        ready.extend(snap.ready_nodes(dc, pool).values())
        not_ready.update(snap.not_ready_nodes(dc, pool).keys())
    if keys == (None,):
        by_dc = snap.ready_counts_by_dc(pool)
    else:
        by_dc = {dc: n for dc in keys if dc is not None and (n := len(snap.ready_nodes(dc, pool)))}
    return ready, not_ready, by_dc


def _walked_ready_nodes(
    snap: StateSnapshot, datacenters: tuple[str, ...], pool: str
) -> tuple[list[pb.Node], set[str], dict[str, int]]:
    key = (datacenters, pool)
    marker = snap.nodes_by_dc_map
    hit = _ready_cache.get(key)
    if hit is None or hit[0] is not marker:
        hit = (marker, *_compute_ready_nodes(snap, datacenters, pool))
        with _ready_lock:  # schedulers run in worker threads
            if key not in _ready_cache and len(_ready_cache) >= READY_CACHE_SIZE:
                _ready_cache.pop(next(iter(_ready_cache)))
            _ready_cache[key] = hit
    return list(hit[1]), set(hit[2]), dict(hit[3])


def _compute_ready_nodes(
    snap: StateSnapshot, datacenters: tuple[str, ...], pool: str
) -> tuple[list[pb.Node], frozenset[str], dict[str, int]]:
    """The walk: every node of the datacenters, filtered (the index's
    definition, which the tests compare it with)."""
    ready: list[pb.Node] = []
    not_ready: set[str] = set()
    by_dc: dict[str, int] = {}
    for node in snap.nodes_in_datacenters(datacenters):
        if pool and pool != "all" and (node.node_pool or structs.DEFAULT_NODE_POOL) != pool:
            continue
        if not structs.node_ready(node):
            not_ready.add(node.id)
            continue
        ready.append(node)
        by_dc[node.datacenter] = by_dc.get(node.datacenter, 0) + 1
    return ready, frozenset(not_ready), by_dc


def tainted_nodes(
    snap: StateSnapshot, allocs: Iterable[pb.Allocation]
) -> dict[str, pb.Node | None]:
    """The nodes of `allocs` that force a change: missing (None), down,
    draining, or disconnected (kept so lost_after can be computed)."""
    out: dict[str, pb.Node | None] = {}
    seen: set[str] = set()
    for a in allocs:
        nid = a.node_id
        if nid in seen:
            continue
        seen.add(nid)
        node = snap.node_by_id(nid)
        if node is None:
            out[nid] = None
            continue
        if (
            node.status in (NodeStatus.DOWN, NodeStatus.DISCONNECTED)
            or node.drain
            or node.HasField("drain_strategy")
        ):
            out[nid] = node
    return out


def initializing_nodes(snap: StateSnapshot, allocs: Iterable[pb.Allocation]) -> frozenset[str]:
    """The nodes of `allocs` that are initializing: a node that heartbeated
    back after a disconnect stays so until its next heartbeat after pushing
    its alloc states (seed 003). An alloc still `unknown` there has not
    been reported yet and is left alone (`reconcile.allocs.classify`), and
    the planner takes no alloc updates for such a node, so recording a
    reconnect waits for it to turn ready (its node-update eval does it)."""
    out: set[str] = set()
    for nid in {a.node_id for a in allocs}:
        node = snap.node_by_id(nid)
        if node is not None and node.status == NodeStatus.INITIALIZING:
            out.add(nid)
    return frozenset(out)


def node_in_job(node: pb.Node, job: pb.Job) -> bool:
    """The node is in one of the job's datacenters and its node pool."""
    dcs = list(job.datacenters)
    if dcs and "*" not in dcs and node.datacenter not in dcs:
        return False
    pool = job.node_pool
    return not pool or pool == "all" or (node.node_pool or structs.DEFAULT_NODE_POOL) == pool


# ----------------------------------------------------------------- jobs and allocs


def alloc_job(snap: StateSnapshot, job: pb.Job | None, alloc: pb.Allocation) -> pb.Job | None:
    """The job version an alloc was placed for (Nomad embeds it in the alloc;
    we look it up by version), falling back to the current job."""
    if job is not None and alloc.job_version == job.version:
        return job
    old = snap.job_by_version(alloc.namespace, alloc.job_id, alloc.job_version)
    return old if old is not None else job


def placed_job_version(snap: StateSnapshot, job: pb.Job, alloc: pb.Allocation) -> pb.Job | None:
    """Exactly the job version the alloc runs, or None if that version is no
    longer stored (then an update must be treated as destructive)."""
    if alloc.job_version == job.version:
        return job
    return snap.job_by_version(alloc.namespace, alloc.job_id, alloc.job_version)


def job_stopped(job: pb.Job | None) -> bool:
    return job is None or job.stop


def _merged_meta(job: pb.Job, tg: pb.TaskGroup, task: pb.Task) -> dict[str, str]:
    out = dict(job.meta)
    out.update(tg.meta)
    out.update(task.meta)
    return out


def _networks_key(nets: Iterable[pb.NetworkResource]) -> list[object]:
    out: list[object] = []
    for n in nets:
        out.append(
            (
                n.mode or "host",
                n.mbits,
                sorted((p.label, p.value, p.to, p.host_network) for p in n.reserved_ports),
                sorted((p.label, p.to, p.host_network) for p in n.dynamic_ports),
            )
        )
    return out


def tasks_updated(job_a: pb.Job, job_b: pb.Job, group: str) -> str:
    """Why the group's allocs of `job_b` cannot be updated in place to
    `job_a` ('' when they can): semantics §5.3 "Updates". Constraints,
    counts, restart/reschedule/update policies are not destructive."""
    a = structs.task_group(job_a, group)
    b = structs.task_group(job_b, group)
    if a is None or b is None:
        return "task group missing"
    if len(a.tasks) != len(b.tasks):
        return "number of tasks"
    if a.ephemeral_disk.size_mb != b.ephemeral_disk.size_mb or (
        a.ephemeral_disk.sticky,
        a.ephemeral_disk.migrate,
    ) != (b.ephemeral_disk.sticky, b.ephemeral_disk.migrate):
        return "ephemeral disk"
    if _networks_key(a.networks) != _networks_key(b.networks):
        return "group networks"
    if dict(a.volumes) != dict(b.volumes):
        return "group volumes"
    b_tasks = {t.name: t for t in b.tasks}
    for at in a.tasks:
        bt = b_tasks.get(at.name)
        if bt is None:
            return f"task {at.name} added"
        if at.driver != bt.driver:
            return f"task {at.name} driver"
        if at.user != bt.user:
            return f"task {at.name} user"
        if at.config != bt.config:
            return f"task {at.name} config"
        if dict(at.env) != dict(bt.env):
            return f"task {at.name} env"
        if _merged_meta(job_a, a, at) != _merged_meta(job_b, b, bt):
            return f"task {at.name} meta"
        ra, rb = at.resources, bt.resources
        if (ra.cpu, ra.cores, ra.memory_mb, ra.memory_max_mb, ra.disk_mb) != (
            rb.cpu,
            rb.cores,
            rb.memory_mb,
            rb.memory_max_mb,
            rb.disk_mb,
        ):
            return f"task {at.name} resources"
        if [(d.name, d.count) for d in ra.devices] != [(d.name, d.count) for d in rb.devices]:
            return f"task {at.name} devices"
        if _networks_key(ra.networks) != _networks_key(rb.networks):
            return f"task {at.name} networks"
        if at.kill_signal != bt.kill_signal or at.leader != bt.leader:
            return f"task {at.name} lifecycle"
        if list(at.volume_mounts) != list(bt.volume_mounts):
            return f"task {at.name} volume mounts"
        if list(at.artifacts) != list(bt.artifacts):
            return f"task {at.name} artifacts"
        # the client orders an alloc's tasks once, when it starts them
        # (Corral's own: Nomad leaves a changed lifecycle block in place)
        if at.lifecycle != bt.lifecycle:
            return f"task {at.name} lifecycle"
        # where the output goes is set when the task starts (Nomad: only a
        # change of disabled; the sizes are updated in place)
        if at.log_config.disabled != bt.log_config.disabled:
            return f"task {at.name} log disabled"
    return ""


# ----------------------------------------------------------------- plans


def make_plan(ev: pb.Evaluation, job: pb.Job | None) -> pb.Plan:
    plan = pb.Plan(eval_id=ev.id, priority=ev.priority)
    if job is not None:
        plan.all_at_once = job.all_at_once
        plan.job.CopyFrom(job)
    return plan


def append_stopped_alloc(
    plan: pb.Plan,
    alloc: pb.Allocation,
    desc: str,
    client_status: str = "",
    followup_eval_id: str = "",
) -> None:
    """Stop an alloc as a diff the applier merges onto the stored copy."""
    plan.node_update[alloc.node_id].stops.add(
        alloc_id=alloc.id,
        desired_description=desc,
        client_status=client_status,
        followup_eval_id=followup_eval_id,
        desired_status=DesiredStatus.STOP,
    )


def pop_update(plan: pb.Plan, alloc: pb.Allocation) -> None:
    """Undo the last stop of `alloc` in the plan (used around in-place fit
    checks and failed reschedules)."""
    lst = plan.node_update.get(alloc.node_id)
    if lst is None:
        return
    stops = lst.stops
    for i in range(len(stops) - 1, -1, -1):
        if stops[i].alloc_id == alloc.id:
            del stops[i]
            break
    if not len(stops):
        del plan.node_update[alloc.node_id]


def append_alloc(plan: pb.Plan, alloc: pb.Allocation) -> pb.Allocation:
    """Add a new or updated alloc to the plan; returns the stored message."""
    allocs = plan.node_allocation[alloc.node_id].allocs
    allocs.append(alloc)
    return allocs[len(allocs) - 1]


def replace_alloc_in_plan(plan: pb.Plan, alloc: pb.Allocation) -> None:
    """Replace the plan's copy of an alloc with the same id, or add it."""
    allocs = plan.node_allocation[alloc.node_id].allocs
    for i in range(len(allocs)):
        if allocs[i].id == alloc.id:
            allocs[i].CopyFrom(alloc)
            return
    allocs.append(alloc)


def append_preempted_alloc(plan: pb.Plan, alloc: pb.Allocation, preempting_id: str) -> None:
    plan.node_preemptions[alloc.node_id].stops.add(
        alloc_id=alloc.id,
        desired_description=f"Preempted by alloc ID {preempting_id}",
        preempted_by_allocation=preempting_id,
        desired_status=DesiredStatus.EVICT,
    )


def plan_is_noop(plan: pb.Plan) -> bool:
    return (
        not any(len(v.stops) for v in plan.node_update.values())
        and not any(len(v.allocs) for v in plan.node_allocation.values())
        and not plan.HasField("deployment")
        and not len(plan.deployment_updates)
    )


def planned_count(plan: pb.Plan) -> int:
    return sum(len(v.allocs) for v in plan.node_allocation.values())


def full_commit(plan: pb.Plan, result: pb.PlanResult) -> tuple[bool, int, int]:
    expected = planned_count(plan)
    actual = sum(len(v.allocs) for v in result.node_allocation.values())
    return actual == expected, expected, actual


def progress_made(result: pb.PlanResult | None) -> bool:
    return result is not None and (
        any(len(v.stops) for v in result.node_update.values())
        or any(len(v.allocs) for v in result.node_allocation.values())
        or result.HasField("deployment")
        or len(result.deployment_updates) > 0
    )


def retry_max(limit: int, attempt: Callable[[], bool], progress: Callable[[], bool]) -> None:
    """Run `attempt` until it reports done; an attempt that made progress
    resets the count. Raises SetStatusError when attempts run out."""
    attempts = 0
    while attempts < limit:
        if attempt():
            return
        if progress():
            attempts = 0
        else:
            attempts += 1
    raise SetStatusError(f"maximum attempts reached ({limit})", structs.EvalStatus.FAILED)


def adjust_queued_allocations(result: pb.PlanResult | None, queued: dict[str, int]) -> None:
    """Count newly created allocs of the result off the queued numbers."""
    if result is None:
        return
    for lst in result.node_allocation.values():
        for a in lst.allocs:
            if a.create_index != a.modify_index:
                continue
            if a.task_group in queued:
                queued[a.task_group] -= 1


def update_non_terminal_allocs_to_lost(
    plan: pb.Plan, tainted: Mapping[str, pb.Node | None], allocs: Iterable[pb.Allocation]
) -> None:
    """Allocs already told to stop whose node is down or gone will never
    report back: mark them lost."""
    for a in allocs:
        if a.node_id not in tainted:
            continue
        node = tainted[a.node_id]
        if node is not None and node.status != NodeStatus.DOWN:
            continue
        if structs.alloc_server_terminal(a) and a.client_status in (
            ClientStatus.RUNNING,
            ClientStatus.PENDING,
        ):
            append_stopped_alloc(plan, a, ALLOC_LOST, ClientStatus.LOST)


# ----------------------------------------------------------------- evals


def set_status(
    log: logging.Logger,
    planner: Planner,
    ev: pb.Evaluation,
    *,
    status: str,
    desc: str = "",
    blocked: pb.Evaluation | None = None,
    next_eval: pb.Evaluation | None = None,
    failed_tg_allocs: Mapping[str, pb.AllocMetric] | None = None,
    queued: Mapping[str, int] | None = None,
    deployment_id: str = "",
) -> None:
    """Write the final status of the eval being processed."""
    log.debug("setting eval status", extra={"eval_id": ev.id, "status": status})
    out = structs.copy_msg(ev)
    out.status = status
    out.status_description = desc
    out.deployment_id = deployment_id
    out.ClearField("failed_tg_allocs")
    for tg, m in (failed_tg_allocs or {}).items():
        out.failed_tg_allocs[tg].CopyFrom(m)
    if blocked is not None:
        out.blocked_eval = blocked.id
    if next_eval is not None:
        out.next_eval = next_eval.id
    if queued is not None:
        out.ClearField("queued_allocations")
        for tg, n in queued.items():
            out.queued_allocations[tg] = n
    planner.update_eval(out)


def create_blocked_eval(
    ev: pb.Evaluation,
    *,
    class_eligibility: Mapping[str, bool] | None,
    escaped: bool,
    quota_reached: bool,
    failed_tg_allocs: Mapping[str, pb.AllocMetric] | None,
) -> pb.Evaluation:
    """A blocked eval that waits for capacity (Nomad's CreateBlockedEval)."""
    b = pb.Evaluation(
        id=structs.new_id(),
        namespace=ev.namespace,
        priority=ev.priority,
        type=ev.type,
        triggered_by=Trigger.QUEUED_ALLOCS,
        job_id=ev.job_id,
        job_modify_index=ev.job_modify_index,
        status=structs.EvalStatus.BLOCKED,
        previous_eval=ev.id,
        escaped_computed_class=escaped,
        quota_limit_reached=quota_reached,
        traceparent=ev.traceparent,
    )
    for k, v in (class_eligibility or {}).items():
        b.class_eligibility[k] = v
    for tg, m in (failed_tg_allocs or {}).items():
        b.failed_tg_allocs[tg].CopyFrom(m)
    return b


def next_rolling_eval(ev: pb.Evaluation, wait: int) -> pb.Evaluation:
    """The eval that continues a rolling update after `stagger`."""
    return pb.Evaluation(
        id=structs.new_id(),
        namespace=ev.namespace,
        priority=ev.priority,
        type=ev.type,
        triggered_by=Trigger.ROLLING_UPDATE,
        job_id=ev.job_id,
        job_modify_index=ev.job_modify_index,
        status=structs.EvalStatus.PENDING,
        wait=wait,
        previous_eval=ev.id,
        traceparent=ev.traceparent,
    )


def stagger_of(job: pb.Job, tg: pb.TaskGroup | None = None) -> int:
    if tg is not None and tg.HasField("update") and tg.update.stagger:
        return tg.update.stagger
    return job.update.stagger or DEFAULT_STAGGER


def max_parallel_of(job: pb.Job, tg: pb.TaskGroup) -> int:
    """The group's rolling-update width (group update block wins over the
    job's); 0 means no rolling update: everything at once."""
    if tg.HasField("update"):
        return tg.update.max_parallel
    if job.HasField("update"):
        return job.update.max_parallel
    return 0


def merge_node_filtered(acc: pb.AllocMetric | None, curr: pb.AllocMetric) -> pb.AllocMetric:
    """Add one node's filter counts to a group's running total.

    The system schedulers select one node at a time, and each select starts
    from fresh metrics; without summing, a group filtered on every node would
    report only the first node (Nomad's mergeNodeFiltered)."""
    if acc is None:
        return structs.copy_msg(curr)
    acc.nodes_evaluated += curr.nodes_evaluated
    acc.nodes_filtered += curr.nodes_filtered
    for k, v in curr.class_filtered.items():
        acc.class_filtered[k] += v
    for k, v in curr.constraint_filtered.items():
        acc.constraint_filtered[k] += v
    acc.allocation_time += curr.allocation_time
    return acc


def followup_eval(
    job: pb.Job, priority: int, trigger: str, wait_until: int, desc: str
) -> pb.Evaluation:
    """A pending eval of `job` that the broker holds until `wait_until`."""
    return pb.Evaluation(
        id=structs.new_id(),
        namespace=job.namespace,
        priority=priority,
        type=job.type,
        triggered_by=trigger,
        job_id=job.id,
        job_modify_index=job.modify_index,
        status=structs.EvalStatus.PENDING,
        status_description=desc,
        wait_until=wait_until,
    )


def batch_followup_evals(
    job: pb.Job,
    priority: int,
    due: Iterable[tuple[str, int]],
    trigger: str,
    desc: str,
    rest_trigger: str,
) -> tuple[dict[str, str], list[pb.Evaluation]]:
    """Follow-up evals for allocs due at given times, as (alloc id, time):
    allocs due within 5 s of a batch's first share its eval (wait_until =
    that first time), so a node's worth of allocs costs one eval, not one
    each. Returns alloc id -> eval id and the evals."""
    ordered = sorted(due, key=lambda d: d[1])
    if not ordered:
        return {}, []
    first = ordered[0][1]
    ev = followup_eval(job, priority, trigger, first, desc)
    evals = [ev]
    ids: dict[str, str] = {}
    for alloc_id, when in ordered:
        if when - first >= BATCHED_FAILED_ALLOC_WINDOW:
            first = when
            ev = followup_eval(job, priority, rest_trigger, first, desc)
            evals.append(ev)
        ids[alloc_id] = ev.id
    return ids, evals
