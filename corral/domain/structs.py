"""Domain vocabulary shared by every role: the string constants of the wire
contract (as in Nomad's `structs` package) and small predicates over the
protobuf messages.

The protobuf messages in `corral.v1.structs_pb2` *are* the domain model; this
module gives them names and rules so no role spells "running" by hand.
"""

from __future__ import annotations

import hashlib
import re
import time
import uuid
from collections.abc import Iterable
from typing import Any, TypeVar

from google.protobuf.message import Message

from corral.v1 import structs_pb2 as pb

DEFAULT_NAMESPACE = "default"
DEFAULT_NODE_POOL = "default"
#: the built-in pool every node is in (Nomad's NodePoolAll)
ALL_NODE_POOL = "all"
DEFAULT_PRIORITY = 50
MIN_PRIORITY = 1
MAX_PRIORITY = 100
CORE_JOB_PRIORITY = 32767
SCHEDULER_VERSION = 1


class JobType:
    SERVICE = "service"
    BATCH = "batch"
    SYSTEM = "system"
    SYSBATCH = "sysbatch"
    CORE = "_core"

    USER = (SERVICE, BATCH, SYSTEM, SYSBATCH)
    ALL = (SERVICE, BATCH, SYSTEM, SYSBATCH, CORE)


class JobStatus:
    PENDING = "pending"
    RUNNING = "running"
    DEAD = "dead"


class EvalStatus:
    PENDING = "pending"
    BLOCKED = "blocked"
    COMPLETE = "complete"
    FAILED = "failed"
    CANCELED = "canceled"

    ALL = (PENDING, BLOCKED, COMPLETE, FAILED, CANCELED)
    TERMINAL = frozenset((COMPLETE, FAILED, CANCELED))


class Trigger:
    """Eval `triggered_by` values (Nomad's EvalTrigger* constants)."""

    JOB_REGISTER = "job-register"
    JOB_DEREGISTER = "job-deregister"
    PERIODIC_JOB = "periodic-job"
    NODE_DRAIN = "node-drain"
    NODE_UPDATE = "node-update"
    ALLOC_STOP = "alloc-stop"
    SCHEDULED = "scheduled"
    ROLLING_UPDATE = "rolling-update"
    DEPLOYMENT_WATCHER = "deployment-watcher"
    FAILED_FOLLOW_UP = "failed-follow-up"
    MAX_PLAN_ATTEMPTS = "max-plan-attempts"
    ALLOC_FAILURE = "alloc-failure"
    QUEUED_ALLOCS = "queued-allocs"
    PREEMPTION = "preemption"
    JOB_SCALING = "job-scaling"
    MAX_DISCONNECT_TIMEOUT = "max-disconnect-timeout"
    RECONNECT = "reconnect"
    RETRY_FAILED_ALLOC = "alloc-reschedule"

    ALL = frozenset(
        (
            JOB_REGISTER,
            JOB_DEREGISTER,
            PERIODIC_JOB,
            NODE_DRAIN,
            NODE_UPDATE,
            ALLOC_STOP,
            SCHEDULED,
            ROLLING_UPDATE,
            DEPLOYMENT_WATCHER,
            FAILED_FOLLOW_UP,
            MAX_PLAN_ATTEMPTS,
            ALLOC_FAILURE,
            QUEUED_ALLOCS,
            PREEMPTION,
            JOB_SCALING,
            MAX_DISCONNECT_TIMEOUT,
            RECONNECT,
            RETRY_FAILED_ALLOC,
        )
    )


class DesiredStatus:
    RUN = "run"
    STOP = "stop"
    EVICT = "evict"

    ALL = (RUN, STOP, EVICT)


class ClientStatus:
    PENDING = "pending"
    RUNNING = "running"
    COMPLETE = "complete"
    FAILED = "failed"
    LOST = "lost"
    UNKNOWN = "unknown"

    ALL = (PENDING, RUNNING, COMPLETE, FAILED, LOST, UNKNOWN)
    TERMINAL = frozenset((COMPLETE, FAILED, LOST))


class TaskStateName:
    PENDING = "pending"
    RUNNING = "running"
    DEAD = "dead"


class NodeStatus:
    INITIALIZING = "initializing"
    READY = "ready"
    DOWN = "down"
    DISCONNECTED = "disconnected"

    ALL = (INITIALIZING, READY, DOWN, DISCONNECTED)


class Eligibility:
    ELIGIBLE = "eligible"
    INELIGIBLE = "ineligible"

    ALL = (ELIGIBLE, INELIGIBLE)


class DeploymentStatus:
    RUNNING = "running"
    PAUSED = "paused"
    FAILED = "failed"
    SUCCESSFUL = "successful"
    CANCELLED = "cancelled"
    PENDING = "pending"
    INITIALIZING = "initializing"
    BLOCKED = "blocked"

    ACTIVE = frozenset((RUNNING, PAUSED, PENDING, INITIALIZING, BLOCKED))


#: every constraint/affinity operand Nomad knows
CONSTRAINT_OPERANDS = (
    "=",
    "==",
    "is",
    "!=",
    "not",
    ">",
    ">=",
    "<",
    "<=",
    "regexp",
    "version",
    "semver",
    "set_contains",
    "set_contains_all",
    "set_contains_any",
    "distinct_hosts",
    "distinct_property",
    "is_set",
    "is_not_set",
)
#: operators a constraint may name as `constraint { <operator> = value }`
CONSTRAINT_SHORTHANDS = (
    "regexp",
    "version",
    "semver",
    "set_contains",
    "set_contains_all",
    "set_contains_any",
    "distinct_property",
    "distinct_hosts",
)
#: the one operator that needs no attribute (l_target)
OPERANDS_WITHOUT_ATTRIBUTE = ("distinct_hosts",)
RESTART_MODES = ("fail", "delay")
DELAY_FUNCTIONS = ("constant", "exponential", "fibonacci")


class SchedulerAlgorithm:
    BINPACK = "binpack"
    SPREAD = "spread"


# --------------------------------------------------------------------------- ids and time

M = TypeVar("M", bound=Message)


def copy_msg(msg: M) -> M:
    """A deep copy of a message (messages in snapshots are shared: copy
    before changing)."""
    out = type(msg)()
    out.CopyFrom(msg)
    return out


_SHARED_FIELDS: dict[tuple[type[Message], type[Message]], tuple[str, ...]] = {}


def _shared_fields(target: type[Message], source: type[Message]) -> tuple[str, ...]:
    """The scalar fields (single or repeated, without explicit presence)
    that `target` and `source` both have, by name and type."""
    theirs = {f.name: f for f in source.DESCRIPTOR.fields}
    names = []
    for f in target.DESCRIPTOR.fields:
        other = theirs.get(f.name)
        if (
            other is not None
            and f.message_type is None
            and other.message_type is None
            and f.type == other.type
            and f.is_repeated == other.is_repeated
            and not f.has_presence
        ):
            names.append(f.name)
    return tuple(names)


def project(target: type[M], source: Message, **values: Any) -> M:
    """A `target` (a list stub, a summary) holding the scalar fields it
    shares with `source` by name and type, and `values` (which win, and
    give what it holds under other names or computed)."""
    key = (target, type(source))
    names = _SHARED_FIELDS.get(key)
    if names is None:
        names = _SHARED_FIELDS[key] = _shared_fields(target, type(source))
    copied = {n: getattr(source, n) for n in names if n not in values}
    return target(**copied, **values)


def new_id() -> str:
    """A fresh UUID string, the form of every object id."""
    return str(uuid.uuid4())


def now_ns() -> int:
    return time.time_ns()


SECOND = 1_000_000_000
MINUTE = 60 * SECOND
HOUR = 60 * MINUTE


# --------------------------------------------------------------------------- allocs


def alloc_server_terminal(alloc: pb.Allocation) -> bool:
    """The server has told the alloc to stop (desired stop or evict)."""
    return alloc.desired_status in (DesiredStatus.STOP, DesiredStatus.EVICT)


def alloc_client_terminal(alloc: pb.Allocation) -> bool:
    """The client reports the alloc finished: complete, failed or lost."""
    return alloc.client_status in ClientStatus.TERMINAL


def alloc_terminal(alloc: pb.Allocation) -> bool:
    """Terminal from either side: it no longer needs to hold resources once
    the client confirms, and it will not be run again."""
    return alloc_server_terminal(alloc) or alloc_client_terminal(alloc)


def alloc_ran_successfully(alloc: pb.Allocation) -> bool:
    """Every task of the alloc finished without failing (batch/sysbatch)."""
    if alloc.client_status != ClientStatus.COMPLETE:
        return False
    if not alloc.task_states:
        return True
    return all(
        ts.state == TaskStateName.DEAD and not ts.failed for ts in alloc.task_states.values()
    )


def alloc_name(job_id: str, group: str, index: int) -> str:
    return f"{job_id}.{group}[{index}]"


_NAME_INDEX = re.compile(r"\[(\d+)\]$")


def alloc_name_index(name: str) -> int:
    """The index of an alloc name `<job>.<group>[<index>]`, or -1."""
    m = _NAME_INDEX.search(name)
    return int(m.group(1)) if m else -1


def last_client_state(alloc: pb.Allocation) -> str:
    """The value of the most recent `client_status` AllocState entry, or ''."""
    for st in reversed(alloc.alloc_states):
        if st.field == "client_status":
            return st.value
    return ""


def needs_reconnect(alloc: pb.Allocation) -> bool:
    """Seed 003 / PR #15068: only an alloc whose last recorded client state is
    `unknown` is reconnecting; a running alloc with any other history is in
    its normal steady state."""
    return (
        alloc.client_status
        in (
            ClientStatus.UNKNOWN,
            ClientStatus.RUNNING,
            ClientStatus.FAILED,
        )
        and last_client_state(alloc) == ClientStatus.UNKNOWN
    )


# --------------------------------------------------------------------------- evals


# what a scheduler's blocked eval is triggered by (Nomad's CreateBlockedEval)
BLOCKED_EVAL_TRIGGERS = frozenset((Trigger.QUEUED_ALLOCS, Trigger.MAX_PLAN_ATTEMPTS))


def is_blocked_eval(ev: pb.Evaluation) -> bool:
    """Is `ev` a blocked eval: one a scheduler created to place what it could
    not? It is `blocked` while the tracker holds it and `pending` once a
    capacity change released it (the broker writes it back so the worker
    waits for the state that unblocked it, and a new leader still has it).
    Either way, a re-run that still cannot place everything reblocks this
    eval instead of completing it and creating another."""
    if ev.status == EvalStatus.BLOCKED:
        return True
    return ev.status == EvalStatus.PENDING and ev.triggered_by in BLOCKED_EVAL_TRIGGERS


def eval_terminal(ev: pb.Evaluation) -> bool:
    return ev.status in EvalStatus.TERMINAL


# --------------------------------------------------------------------------- nodes


def node_ready(node: pb.Node) -> bool:
    """Scheduling-ready: status ready, not draining, eligible."""
    return (
        node.status == NodeStatus.READY
        and not node.drain
        and node.scheduling_eligibility != Eligibility.INELIGIBLE
    )


def node_terminal(node: pb.Node) -> bool:
    return node.status == NodeStatus.DOWN


def node_unresponsive(node: pb.Node) -> bool:
    return node.status in (NodeStatus.DOWN, NodeStatus.DISCONNECTED)


def _unique_key(key: str) -> bool:
    return key.startswith("unique.") or ".unique." in key


def computed_class(node: pb.Node) -> str:
    """Hash of what makes nodes interchangeable for feasibility: datacenter,
    pool, class, non-unique attributes and meta, host volumes, and resources
    (so nodes that differ only in size have different classes). Attributes under `unique.`
    are left out; constraints on them mark an eval as escaped instead."""
    h = hashlib.blake2b(digest_size=8)

    def add(*parts: str) -> None:
        for p in parts:
            h.update(p.encode())
            h.update(b"\x00")

    add(node.datacenter, node.node_pool, node.node_class)
    for k in sorted(node.attributes):
        if not _unique_key(k):
            add("a", k, node.attributes[k])
    for k in sorted(node.meta):
        if not _unique_key(k):
            add("m", k, node.meta[k])
    for name in sorted(node.drivers):
        d = node.drivers[name]
        add("d", name, str(d.detected), str(d.healthy))
    r = node.node_resources
    add(str(r.cpu), str(r.total_cores), str(r.memory_mb), str(r.disk_mb))
    rr = node.reserved_resources
    add(str(rr.cpu), str(rr.cores), str(rr.memory_mb), str(rr.disk_mb), rr.reserved_host_ports)
    for dev in r.devices:
        add("dev", dev.vendor, dev.type, dev.name, str(len(dev.instance_ids)))
    # host volumes decide feasibility too (Nomad hashes them into the class);
    # none adds nothing, so the classes of nodes without them stay as they were
    for name in sorted(node.host_volumes):
        add("hv", name, str(node.host_volumes[name].read_only))
    return "v1:" + h.hexdigest()


# --------------------------------------------------------------------------- task groups


def lost_after(tg: pb.TaskGroup) -> int:
    """The group's disconnect timeout in ns (0 = allocs on a disconnected node
    are lost at once). The seed-era `max_client_disconnect` maps onto it."""
    if tg.disconnect.lost_after:
        return tg.disconnect.lost_after
    if tg.HasField("max_client_disconnect"):
        return tg.max_client_disconnect
    return 0


def replace_on_disconnect(tg: pb.TaskGroup) -> bool:
    if tg.disconnect.HasField("replace"):
        return tg.disconnect.replace
    return True


def stop_on_client_after(tg: pb.TaskGroup) -> int:
    if tg.disconnect.stop_on_client_after:
        return tg.disconnect.stop_on_client_after
    if tg.HasField("stop_after_client_disconnect"):
        return tg.stop_after_client_disconnect
    return 0


def reconcile_strategy(tg: pb.TaskGroup) -> str:
    return tg.disconnect.reconcile or "best_score"


def task_group(job: pb.Job, name: str) -> pb.TaskGroup | None:
    for tg in job.task_groups:
        if tg.name == name:
            return tg
    return None


def default_reschedule_policy(job_type: str) -> pb.ReschedulePolicy:
    """Nomad's defaults: service unlimited exponential from 30 s to 1 h;
    batch one attempt per 24 h after 5 s; system jobs do not reschedule."""
    if job_type == JobType.SERVICE:
        return pb.ReschedulePolicy(
            delay=30 * SECOND,
            delay_function="exponential",
            max_delay=HOUR,
            unlimited=True,
        )
    if job_type == JobType.BATCH:
        return pb.ReschedulePolicy(
            attempts=1, interval=24 * HOUR, delay=5 * SECOND, delay_function="constant"
        )
    return pb.ReschedulePolicy()


#: bookkeeping fields of a job, not part of its spec
NON_SPEC_FIELDS = (
    "status",
    "status_description",
    "stable",
    "version",
    "submit_time",
    "create_index",
    "modify_index",
    "job_modify_index",
    "version_tag",  # a name given to a version, not part of its spec
)


def same_except(a: Message, b: Message, fields: Iterable[str]) -> bool:
    """Whether two messages of one type are equal once `fields` are cleared
    in both (an object written again unchanged costs no write)."""
    names = tuple(fields)

    def spec(msg: Message) -> bytes:
        m = copy_msg(msg)
        for name in names:
            m.ClearField(name)
        return m.SerializeToString(deterministic=True)

    return spec(a) == spec(b)


INDEX_FIELDS = ("create_index", "modify_index")


def job_spec_changed(old: pb.Job, new: pb.Job) -> bool:
    """Whether the user-visible spec differs (status and indexes aside): an
    unchanged re-registration keeps its version and job modify index."""
    return not same_except(old, new, NON_SPEC_FIELDS)


def job_key(namespace: str, job_id: str) -> tuple[str, str]:
    return (namespace or DEFAULT_NAMESPACE, job_id)


def total_task_resources(tasks: Iterable[pb.Task]) -> pb.Resources:
    """Sum of the tasks' cpu/memory/cores; networks and devices appended."""
    out = pb.Resources()
    for t in tasks:
        r = t.resources
        out.cpu += r.cpu
        out.cores += r.cores
        out.memory_mb += r.memory_mb
        # a ceiling of 0 (none) or -1 (no limit) counts as the reservation
        out.memory_max_mb += r.memory_max_mb if r.memory_max_mb > 0 else r.memory_mb
        out.networks.extend(r.networks)
        out.devices.extend(r.devices)
    return out
