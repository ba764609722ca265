"""Node writes with Nomad's lifecycle rules (nomad-semantics.md §6):
registration, status transitions with the evals they trigger, client alloc
updates, drain and eligibility.

The client writes (registration, status, alloc updates) check the node's
secret on the row read inside the transaction (services/state/node_identity.py),
and an alloc update only touches allocs stored on the calling node."""

from __future__ import annotations

from collections.abc import Iterable

from corral.domain import node_pools, structs
from corral.domain.errors import FailedPrecondition, InvalidArgument, NotFound, PermissionDenied
from corral.domain.structs import (
    ClientStatus,
    DesiredStatus,
    Eligibility,
    EvalStatus,
    JobType,
    NodeStatus,
    Trigger,
    copy_msg,
)
from corral.domain.topics import EventType
from corral.v1 import structs_pb2 as pb
from services.state import node_identity, validate
from services.state.db.database import WriteTx
from services.state.writes.deployments import follow_health
from services.state.writes.jobs import new_eval, refresh_job_status
from services.state.writes.node_pools import ensure_node_pool

NODE_REREGISTERED = "Node reregistered by heartbeat"
#: host volumes a node may offer
MAX_HOST_VOLUMES = 1024
NODE_HEARTBEAT_MISSED = "Node heartbeat missed"


def validate_node(node: pb.Node) -> None:
    validate.no_nul(node, "node")
    validate.require_id(node.id, "node.id")
    validate.node_labels(node, "node")
    node_identity.require_secret(node.secret_id, node.id, "node.secret_id")
    if node.secret_hash:
        raise InvalidArgument("node.secret_hash", "is set by the state, not the node")
    if not node.datacenter:
        raise InvalidArgument("node.datacenter", "is required")
    if node.node_pool:
        problem = node_pools.name_problem(node.node_pool)
        if problem is not None:
            raise InvalidArgument("node.node_pool", problem)
        if node.node_pool == structs.ALL_NODE_POOL:
            raise InvalidArgument(
                "node.node_pool", f"node is not allowed to register in node pool {node.node_pool!r}"
            )
    if node.status:
        validate.one_of(
            node.status, (NodeStatus.INITIALIZING, NodeStatus.READY, NodeStatus.DOWN), "node.status"
        )
    if node.scheduling_eligibility:
        validate.one_of(node.scheduling_eligibility, Eligibility.ALL, "node.scheduling_eligibility")
    for name in ("cpu", "total_cores", "memory_mb", "disk_mb", "max_allocs"):
        if getattr(node.node_resources, name) < 0:
            raise InvalidArgument(f"node.node_resources.{name}", "must not be negative")
    for name in ("cpu", "cores", "memory_mb", "disk_mb"):
        if getattr(node.reserved_resources, name) < 0:
            raise InvalidArgument(f"node.reserved_resources.{name}", "must not be negative")
    if len(node.host_volumes) > MAX_HOST_VOLUMES:
        raise InvalidArgument("node.host_volumes", f"more than {MAX_HOST_VOLUMES} volumes")
    for name, hv in node.host_volumes.items():
        field = f"node.host_volumes[{name}]"
        validate.name_length(name, field)
        if not name or hv.name != name:
            raise InvalidArgument(f"{field}.name", "must be the volume's name")
        if not hv.path.startswith("/") or len(hv.path) > 4096:
            raise InvalidArgument(f"{field}.path", "must be an absolute path")


def _event(node: pb.Node, message: str, now: int) -> None:
    node.events.add(message=message, subsystem="Cluster", timestamp=now)
    del node.events[:-10]  # keep the last ten, as Nomad does


async def node_evals(
    tx: WriteTx, node: pb.Node, *, index: int | None = None
) -> list[pb.Evaluation]:
    """Nomad's createNodeEvals: one node-update eval per job with allocs on
    the node (service allocs not fully terminal, batch allocs not client
    terminal; system/sysbatch allocs are covered below) plus one per system
    job whose datacenters and pool take the node."""
    jobs: dict[tuple[str, str], pb.Job] = {}
    for a in await tx.allocs_by_node(node.id):
        if a.job_type in (JobType.SYSTEM, JobType.SYSBATCH):
            continue
        if a.job_type == JobType.BATCH and structs.alloc_client_terminal(a):
            continue
        if structs.alloc_server_terminal(a) and structs.alloc_client_terminal(a):
            continue
        key = structs.job_key(a.namespace, a.job_id)
        if key not in jobs:
            job = await tx.get_job(a.namespace, a.job_id)
            if job is not None:
                jobs[key] = job
    for job in await tx.system_jobs():
        dcs = list(job.datacenters) or ["*"]
        if ("*" in dcs or node.datacenter in dcs) and node_pools.node_in_pool(node, job.node_pool):
            jobs[structs.job_key(job.namespace, job.id)] = job
    out = []
    for job in jobs.values():
        ev = new_eval(job, Trigger.NODE_UPDATE)
        ev.node_id = node.id
        ev.node_modify_index = index or tx.index
        tx.put_eval(ev, index=index)
        out.append(ev)
    return out


def _needs_evals(old: str, new: str) -> bool:
    """Nomad: always for down; for init->ready, down->ready, leaving or
    entering disconnected."""
    if new == NodeStatus.DOWN:
        return True
    if (old, new) in (
        (NodeStatus.INITIALIZING, NodeStatus.READY),
        (NodeStatus.DOWN, NodeStatus.READY),
    ):
        return True
    return NodeStatus.DISCONNECTED in (old, new) and old != new


async def register_node(tx: WriteTx, node: pb.Node) -> tuple[pb.Node, list[pb.Evaluation]]:
    stored = await tx.get_node(node.id)
    node = copy_msg(node)
    node.node_pool = node.node_pool or structs.DEFAULT_NODE_POOL
    node.scheduling_eligibility = node.scheduling_eligibility or Eligibility.ELIGIBLE
    node.status = node.status or NodeStatus.INITIALIZING
    node.computed_class = structs.computed_class(node)
    changed_status = stored is None
    old_status = ""
    if stored is not None:
        # a node id is claimed by its first registration: only its secret re-registers it
        node_identity.check(stored, node.secret_id)
        # the stored status and scheduling state are the server's
        old_status = stored.status
        node.create_index = stored.create_index
        node.scheduling_eligibility = stored.scheduling_eligibility
        node.drain = stored.drain
        if stored.HasField("drain_strategy"):
            node.drain_strategy.CopyFrom(stored.drain_strategy)
        node.last_missed_heartbeat_index = stored.last_missed_heartbeat_index
        node.last_alloc_update_index = stored.last_alloc_update_index
        node.events.extend(stored.events)
        if stored.status in (NodeStatus.DOWN, NodeStatus.DISCONNECTED):
            node.status = (
                NodeStatus.INITIALIZING if stored.status == NodeStatus.DISCONNECTED else node.status
            )
        else:
            node.status = stored.status
        changed_status = old_status != node.status
    else:
        _event(node, "Node registered", tx.now)
    node.status_updated_at = (
        tx.now if changed_status else (stored.status_updated_at if stored else tx.now)
    )
    await ensure_node_pool(tx, node.node_pool)
    tx.put_node(node, EventType.NODE_REGISTRATION)
    evals: list[pb.Evaluation] = []
    significant = stored is None or structs.computed_class(stored) != node.computed_class
    if node.status == NodeStatus.DOWN or (
        node.status == NodeStatus.READY and (significant or changed_status)
    ):
        evals = await node_evals(tx, node)
    return node, evals


async def update_status(
    tx: WriteTx,
    node_id: str,
    status: str,
    *,
    secret_id: str | None = None,
    reason: str = "",
) -> tuple[pb.Node, list[pb.Evaluation], bool]:
    """Apply a status change; returns (node, evals, written). A node's own
    heartbeat passes its `secret_id` (checked); the state's heartbeat timers
    pass None and the node event they record (`reason`: "Node heartbeat
    missed"). A client that reports itself down records none, as in Nomad,
    where only the heartbeat timer's request carries an event."""
    stored = await tx.get_node(node_id)
    if stored is None:
        raise NotFound(f"node {node_id} not found")
    if secret_id is not None:
        node_identity.check(stored, secret_id)
    old = stored.status
    new = status
    if old == NodeStatus.DISCONNECTED and new == NodeStatus.READY:
        new = NodeStatus.INITIALIZING  # a reconnecting client re-initializes first
    if old == NodeStatus.INITIALIZING and new == NodeStatus.READY:
        allocs = await tx.allocs_by_node(node_id)
        live = [a for a in allocs if not structs.alloc_terminal(a)]
        if live and stored.last_alloc_update_index <= stored.last_missed_heartbeat_index:
            new = NodeStatus.INITIALIZING  # must push its alloc states first (seed 003)
    if new == old:
        return stored, [], False
    node = copy_msg(stored)
    node.status = new
    node.status_updated_at = tx.now
    if new in (NodeStatus.DOWN, NodeStatus.DISCONNECTED):
        node.last_missed_heartbeat_index = tx.index
        if reason:
            _event(node, reason, tx.now)
    else:
        if new == NodeStatus.READY:
            node.last_missed_heartbeat_index = 0
        if old == NodeStatus.DOWN:
            # whichever status the heartbeat brings it back to (Nomad's
            # NodeHeartbeatEventReregistered)
            _event(node, NODE_REREGISTERED, tx.now)
    tx.put_node(node, EventType.NODE_STREAM_EVENT)
    # the allocs of a disconnected node become unknown in the scheduler
    # (with an AllocState) when it processes the node-update eval
    evals = await node_evals(tx, node) if _needs_evals(old, new) else []
    return node, evals, True


async def miss_heartbeat(tx: WriteTx, node_id: str) -> tuple[pb.Node, list[pb.Evaluation], bool]:
    """A node missed its TTL: it becomes `disconnected` while one of its
    allocs is inside a group's disconnect timeout (`may_disconnect`), else
    `down`. Decided on the rows read in this transaction, so a heartbeat or
    client update committed just before cannot be overruled by an older copy."""
    node = await tx.get_node(node_id)
    if node is None:
        raise NotFound(f"node {node_id} not found")
    if node.status == NodeStatus.DOWN:
        return node, [], False
    allocs = await tx.allocs_by_node(node_id)
    groups: dict[str, pb.TaskGroup | None] = {}
    for a in allocs:
        job = await tx.get_job_version(a.namespace, a.job_id, a.job_version) or await tx.get_job(
            a.namespace, a.job_id
        )
        groups[a.id] = structs.task_group(job, a.task_group) if job is not None else None
    new = (
        NodeStatus.DISCONNECTED if may_disconnect(node, allocs, groups, tx.now) else NodeStatus.DOWN
    )
    return await update_status(tx, node_id, new, reason=NODE_HEARTBEAT_MISSED)


def may_disconnect(
    node: pb.Node,
    allocs: Iterable[pb.Allocation],
    groups: dict[str, pb.TaskGroup | None],
    now: int,
) -> bool:
    """Whether a node that missed its TTL becomes `disconnected` rather than
    `down`: some alloc there that should run belongs to a group (`groups`,
    by alloc id) with a disconnect timeout (`max_client_disconnect` /
    `lost_after`) and, if it is already unknown, is still inside that window.

    An initializing node qualifies only while it is coming back from a
    disconnect (an alloc there still awaits its reconnect): it heartbeated
    once and went quiet again before its allocs were reconnected, and going
    `down` would lose them although their window is still open. A node that
    is initializing for the first time goes down, as in Nomad."""
    allocs = list(allocs)
    if node.status == NodeStatus.INITIALIZING and not any(
        a.desired_status == DesiredStatus.RUN and structs.needs_reconnect(a) for a in allocs
    ):
        return False
    for a in allocs:
        if a.desired_status != DesiredStatus.RUN or structs.alloc_client_terminal(a):
            continue
        tg = groups.get(a.id)
        if tg is None:
            continue
        lost_after = structs.lost_after(tg)
        if lost_after > 0 and not _disconnect_expired(a, lost_after, now):
            return True
    return False


def _disconnect_expired(a: pb.Allocation, lost_after: int, now: int) -> bool:
    """An unknown alloc whose window, counted from when it last became
    unknown, has passed (it is about to be marked lost)."""
    if a.client_status != ClientStatus.UNKNOWN:
        return False
    since = 0
    for st in reversed(a.alloc_states):
        if st.field != "client_status":
            continue
        if st.value != ClientStatus.UNKNOWN:
            break
        since = st.time
    return since > 0 and since + lost_after <= now


async def update_allocs(
    tx: WriteTx, updates: Iterable[pb.Allocation], secret_id: str
) -> tuple[pb.Node, list[pb.Evaluation]]:
    """Client-side alloc status (Node.UpdateAlloc) from the node the
    updates name, proven by its `secret_id`. Every stored alloc updated
    must be on that node: one that is not refuses the whole call before
    anything is queued. An alloc id that is not stored (never was, or
    garbage-collected since the client saw it) is ignored, as Nomad's
    `Node.UpdateAlloc` and FSM do; a call naming no stored alloc writes
    nothing, so the index does not move (before, the node's
    `last_alloc_update_index` was stamped anyway: a write per call)."""
    updates = list(updates)
    node_id = updates[0].node_id
    node = await tx.get_node(node_id)
    if node is None:
        raise NotFound(f"node {node_id} not found")
    node_identity.check(node, secret_id)
    if node.status in (NodeStatus.DOWN, NodeStatus.DISCONNECTED):
        raise FailedPrecondition(
            f"node {node_id} is not allowed to update allocs while in status {node.status}"
        )
    stored = await tx.get_allocs([u.id for u in updates])
    for i, upd in enumerate(updates):
        cur = stored.get(upd.id)
        if cur is not None and cur.node_id != node_id:
            raise PermissionDenied(
                f"allocs[{i}]: alloc {upd.id} is not on node {node_id}; "
                "a node may update only its own allocs"
            )
    evals: dict[tuple[str, str], pb.Evaluation] = {}
    jobs: dict[tuple[str, str], pb.Job | None] = {}
    finished: set[tuple[str, str]] = set()  # jobs whose status may change
    updated = 0
    for upd in updates:
        cur = stored.get(upd.id)
        if cur is None:
            continue
        updated += 1
        alloc = copy_msg(cur)
        was_unknown = cur.client_status == ClientStatus.UNKNOWN
        alloc.client_status = upd.client_status
        alloc.client_description = upd.client_description
        alloc.task_states.clear()
        for name, ts in upd.task_states.items():
            alloc.task_states[name].CopyFrom(ts)
        if upd.HasField("deployment_status") and upd.deployment_id == alloc.deployment_id:
            # health the client judged for the deployment the alloc is in now
            alloc.deployment_status.CopyFrom(upd.deployment_status)
            alloc.deployment_status.canary = cur.deployment_status.canary  # the scheduler's
            await follow_health(tx, cur, alloc)
        await _cancel_disconnect_timeout(tx, cur, alloc)
        key = structs.job_key(alloc.namespace, alloc.job_id)
        if key not in jobs:
            jobs[key] = await tx.get_job(alloc.namespace, alloc.job_id)
        job = jobs[key]
        if structs.alloc_client_terminal(alloc) != structs.alloc_client_terminal(cur):
            finished.add(key)
        if job is None:
            alloc.desired_status = DesiredStatus.STOP
            alloc.desired_description = "job no longer exists"
        elif key not in evals:
            trigger = ""
            if was_unknown and upd.client_status != ClientStatus.UNKNOWN:
                trigger = Trigger.RECONNECT
            elif upd.client_status == ClientStatus.FAILED and not alloc.followup_eval_id:
                trigger = Trigger.ALLOC_FAILURE
            if trigger:
                ev = new_eval(job, trigger)
                tx.put_eval(ev)
                evals[key] = ev
        tx.put_alloc(alloc, EventType.ALLOCATION_UPDATED)
    if not updated:
        return node, []
    # a job's status only moves when an alloc starts or stops being client-terminal
    for ns, job_id in finished:
        await refresh_job_status(tx, ns, job_id)
    node = copy_msg(node)
    node.last_alloc_update_index = tx.index
    tx.put_node(node, EventType.NODE_ALLOC_UPDATE)
    return node, list(evals.values())


# client statuses that prove an unknown alloc's node is back (Nomad's
# FollowupEvalForReconnect)
_RECONNECTED = (ClientStatus.RUNNING, ClientStatus.COMPLETE, ClientStatus.FAILED)


async def _cancel_disconnect_timeout(
    tx: WriteTx, stored: pb.Allocation, alloc: pb.Allocation
) -> None:
    """An alloc awaiting reconnect whose client reports in needs no more
    follow-up evals: they would only replace or lose an alloc whose state
    is known again, and, pending, keep the job from looking settled.

    * Its own follow-up (`followup_eval_id`: the max-disconnect-timeout
      eval, or the alloc-reschedule eval of its replacement when that one
      was delayed) is cleared, so a later failure gets its own
      alloc-failure eval, and canceled unless another live alloc of the
      job still names it (Nomad PR #25923).
    * Once no other live alloc of the job is still `unknown`, every pending
      max-disconnect-timeout eval of the job is canceled too: such an eval
      only marks unknown allocs lost, and the alloc no longer names it when
      a delayed reschedule took its place (Nomad leaks it: #12809; its
      TestClientEndpoint_UpdateStatus_Reconnect wants every eval terminal).

    Both are canceled "allocs reconnected"; workers acknowledge a canceled
    eval the broker still held without running it."""
    if not structs.needs_reconnect(stored) or alloc.client_status not in _RECONNECTED:
        return
    followup = stored.followup_eval_id
    alloc.followup_eval_id = ""
    others = [
        o
        for o in await tx.allocs_by_job(alloc.namespace, alloc.job_id)
        if o.id != alloc.id and not structs.alloc_terminal(o)
    ]
    cancel: list[pb.Evaluation] = []
    if followup and not any(o.followup_eval_id == followup for o in others):
        ev = await tx.get_eval(followup)
        if ev is not None:
            cancel.append(ev)
    if not any(o.client_status == ClientStatus.UNKNOWN for o in others):
        cancel.extend(
            e
            for e in await tx.evals_by_job(alloc.namespace, alloc.job_id)
            if e.triggered_by == Trigger.MAX_DISCONNECT_TIMEOUT and e.id != followup
        )
    for ev in cancel:
        if ev.status in EvalStatus.TERMINAL:
            continue
        canceled = copy_msg(ev)
        canceled.status = EvalStatus.CANCELED
        canceled.status_description = "allocs reconnected"
        tx.put_eval(canceled)


async def set_eligibility(
    tx: WriteTx, node_id: str, eligibility: str
) -> tuple[pb.Node, list[pb.Evaluation]]:
    validate.one_of(eligibility, Eligibility.ALL, "eligibility")
    stored = await tx.get_node(node_id)
    if stored is None:
        raise NotFound(f"node {node_id} not found")
    if stored.drain and eligibility == Eligibility.ELIGIBLE:
        raise FailedPrecondition(
            f"node {node_id} is draining: it cannot be made eligible until the drain ends"
        )
    if stored.scheduling_eligibility == eligibility:
        return stored, []
    node = copy_msg(stored)
    node.scheduling_eligibility = eligibility
    tx.put_node(node, EventType.NODE_ELIGIBILITY)
    evals = await node_evals(tx, node) if eligibility == Eligibility.ELIGIBLE else []
    return node, evals


async def set_drain(
    tx: WriteTx, node_id: str, strategy: pb.DrainStrategy | None, mark_eligible: bool
) -> pb.Node:
    stored = await tx.get_node(node_id)
    if stored is None:
        raise NotFound(f"node {node_id} not found")
    node = copy_msg(stored)
    if strategy is not None:
        node.drain = True
        node.drain_strategy.CopyFrom(strategy)
        # the server's clock decides both: a caller's started_at or
        # force_deadline (one in the past would force the drain at once) is
        # not taken
        node.drain_strategy.started_at = tx.now
        node.drain_strategy.force_deadline = (
            tx.now + strategy.deadline if strategy.deadline > 0 else 0
        )
        node.scheduling_eligibility = Eligibility.INELIGIBLE
        _event(node, "Node drain strategy set", tx.now)
    else:
        node.drain = False
        node.ClearField("drain_strategy")
        if mark_eligible:
            node.scheduling_eligibility = Eligibility.ELIGIBLE
        _event(node, "Node drain complete" if not mark_eligible else "Node drain stopped", tx.now)
    tx.put_node(node, EventType.NODE_DRAIN)
    return node


def live_allocs(allocs: Iterable[pb.Allocation]) -> list[pb.Allocation]:
    return [a for a in allocs if not structs.alloc_terminal(a)]
