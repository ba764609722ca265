"""Input validation shared by the state service's write RPCs.

Every check raises `InvalidArgument(field, problem)` naming the offending
field, before anything is written, so bad input never half-writes.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message

from corral.domain import structs
from corral.domain.errors import InvalidArgument
from corral.domain.structs import ClientStatus, DesiredStatus, EvalStatus, JobType
from corral.v1 import structs_pb2 as pb

MAX_ID_LEN = 256
MAX_BATCH = 100_000
MAX_NAMESPACE_LEN = 128  # Nomad's limit on namespace names
#: the longest duration anywhere in a job or a drain: far beyond any real
#: one, and far enough from the int64 limit that a time plus a duration or
#: two (a force deadline, a deployment's progress deadline, a reschedule
#: time) stays a valid time
MAX_DURATION_NS = 100 * 365 * 24 * structs.HOUR
MAX_DURATION_HOURS = MAX_DURATION_NS // structs.HOUR
_INT64_TYPES = (FieldDescriptor.TYPE_INT64, FieldDescriptor.TYPE_SINT64)
_NAMESPACE = re.compile(r"^[A-Za-z0-9_-]+$")

# Bounds on the parts of a job and a node that every scheduler pass walks
# (each constraint, affinity and spread is checked against every candidate
# node; meta and attributes are copied into every replica and interpolated
# into constraints). Nomad sets none of these; ours are generous next to
# real jobs and nodes (docs/cli.md "bounds on a job") and keep one request
# from costing every scheduler pass or every replica without end.
#: a task group's or task's name (it becomes part of every alloc's name
#: and of its directory on a client)
MAX_NAME_LEN = 128
#: constraints per job, per group, per task (and per requested device)
MAX_CONSTRAINTS = 100
#: affinities per job, per group, per task
MAX_AFFINITIES = 100
#: spreads per job and per group, and targets per spread
MAX_SPREADS = 20
MAX_SPREAD_TARGETS = 100
#: entries of one meta or attribute map (job, group, task, node meta; node,
#: driver and device attributes), and the length of a key and of a value
MAX_META_ENTRIES = 1_000
MAX_META_KEY_LEN = 256
MAX_META_VALUE_LEN = 16 * 1024


def require_id(value: str, field: str) -> None:
    if not value:
        raise InvalidArgument(field, "is required")
    if len(value) > MAX_ID_LEN:
        raise InvalidArgument(field, f"is longer than {MAX_ID_LEN} characters")
    if "\x00" in value:
        raise InvalidArgument(field, "must not contain NUL characters")


def name_length(value: str, field: str) -> None:
    if len(value) > MAX_NAME_LEN:
        raise InvalidArgument(field, f"is longer than {MAX_NAME_LEN} characters")


def at_most(n: int, limit: int, field: str, what: str) -> None:
    """`field` holds `n` items (`what`), refused when over `limit`."""
    if n > limit:
        raise InvalidArgument(field, f"has {n} {what}, more than {limit}")


def labels(entries: Mapping[str, str], field: str) -> None:
    """A meta or attribute map: bounded entry count, key and value length,
    no empty key."""
    at_most(len(entries), MAX_META_ENTRIES, field, "entries")
    for key, value in entries.items():
        if not key:
            raise InvalidArgument(field, "has an empty key")
        if len(key) > MAX_META_KEY_LEN:
            raise InvalidArgument(
                field, f"key {key[:32]!r}... is longer than {MAX_META_KEY_LEN} characters"
            )
        if len(value) > MAX_META_VALUE_LEN:
            raise InvalidArgument(
                f"{field}[{key}]", f"is longer than {MAX_META_VALUE_LEN} characters"
            )


def node_labels(node: pb.Node, field: str) -> None:
    """The node's meta and attributes, its drivers' and devices' attributes."""
    labels(node.meta, f"{field}.meta")
    labels(node.attributes, f"{field}.attributes")
    at_most(len(node.drivers), MAX_META_ENTRIES, f"{field}.drivers", "drivers")
    for name, driver in node.drivers.items():
        labels(driver.attributes, f"{field}.drivers[{name}].attributes")
    devices = node.node_resources.devices
    at_most(len(devices), MAX_META_ENTRIES, f"{field}.node_resources.devices", "devices")
    for i, dev in enumerate(devices):
        labels(dev.attributes, f"{field}.node_resources.devices[{i}].attributes")


def namespace(value: str, field: str) -> None:
    """A namespace name as Nomad allows it (letters, digits, `-`, `_`)."""
    if len(value) > MAX_NAMESPACE_LEN:
        raise InvalidArgument(field, f"is longer than {MAX_NAMESPACE_LEN} characters")
    if value and not _NAMESPACE.match(value):
        raise InvalidArgument(field, "may contain only letters, digits, '-' and '_'")


def no_nul(msg: Message, field: str) -> None:
    """No string anywhere in `msg` holds a NUL character: PostgreSQL cannot
    store one in text, and no name or value of a job or node needs it."""
    for desc, value in msg.ListFields():
        path = f"{field}.{desc.name}"
        if desc.type == desc.TYPE_MESSAGE:
            entry = desc.message_type
            if entry is not None and entry.GetOptions().map_entry:
                items = list(value.items())
                for k, v in items:
                    if isinstance(k, str) and "\x00" in k:
                        raise InvalidArgument(path, "must not contain NUL characters")
                    if isinstance(v, Message):
                        no_nul(v, f"{path}[{k}]")
                    elif isinstance(v, str) and "\x00" in v:
                        raise InvalidArgument(f"{path}[{k}]", "must not contain NUL characters")
            elif desc.is_repeated:
                for i, m in enumerate(value):
                    no_nul(m, f"{path}[{i}]")
            else:
                no_nul(value, path)
        elif desc.type == desc.TYPE_STRING:
            values = value if desc.is_repeated else [value]
            if any("\x00" in v for v in values):
                raise InvalidArgument(path, "must not contain NUL characters")


def one_of(value: str, allowed: tuple[str, ...] | frozenset[str], field: str) -> None:
    if value not in allowed:
        choices = ", ".join(sorted(allowed))
        raise InvalidArgument(field, f"unknown value {value!r} (expected one of: {choices})")


def batch_size(n: int, field: str, *, allow_empty: bool = False) -> None:
    if n == 0 and not allow_empty:
        raise InvalidArgument(field, "must not be empty")
    if n > MAX_BATCH:
        raise InvalidArgument(field, f"has {n} entries, more than {MAX_BATCH}")


def evaluation(ev: pb.Evaluation, field: str) -> None:
    require_id(ev.id, f"{field}.id")
    one_of(ev.status, EvalStatus.ALL, f"{field}.status")
    one_of(ev.type, JobType.ALL, f"{field}.type")
    if ev.type != JobType.CORE:
        require_id(ev.job_id, f"{field}.job_id")
    if not ev.triggered_by:
        raise InvalidArgument(f"{field}.triggered_by", "is required")
    if ev.triggered_by not in structs.Trigger.ALL:
        one_of(ev.triggered_by, structs.Trigger.ALL, f"{field}.triggered_by")
    if not 0 <= ev.priority <= structs.CORE_JOB_PRIORITY:
        raise InvalidArgument(
            f"{field}.priority", f"must be between 0 and {structs.CORE_JOB_PRIORITY}"
        )
    if ev.wait < 0:
        raise InvalidArgument(f"{field}.wait", "must not be negative")
    for tg, n in ev.queued_allocations.items():
        if n < 0:
            raise InvalidArgument(f"{field}.queued_allocations[{tg}]", "must not be negative")


def resources(r: pb.Resources, field: str) -> None:
    for name in ("cpu", "cores", "memory_mb", "disk_mb"):
        if getattr(r, name) < 0:
            raise InvalidArgument(f"{field}.{name}", "must not be negative")
    if r.memory_max_mb < -1:  # -1: no limit (Nomad's MemoryNoLimit)
        raise InvalidArgument(
            f"{field}.memory_max_mb", "must not be negative, except -1 (no limit)"
        )
    for i, net in enumerate(r.networks):
        for kind in ("reserved_ports", "dynamic_ports"):
            for j, port in enumerate(getattr(net, kind)):
                if not 0 <= port.value <= 65535:
                    raise InvalidArgument(
                        f"{field}.networks[{i}].{kind}[{j}].value", "must be 0..65535"
                    )


def allocation(a: pb.Allocation, field: str) -> None:
    require_id(a.id, f"{field}.id")
    require_id(a.job_id, f"{field}.job_id")
    require_id(a.node_id, f"{field}.node_id")
    require_id(a.eval_id, f"{field}.eval_id")
    if not a.task_group:
        raise InvalidArgument(f"{field}.task_group", "is required")
    one_of(a.desired_status, DesiredStatus.ALL, f"{field}.desired_status")
    if a.client_status:
        one_of(a.client_status, ClientStatus.ALL, f"{field}.client_status")
    resources(a.resources, f"{field}.resources")
    for name, tr in a.task_resources.items():
        resources(tr, f"{field}.task_resources[{name}]")


def alloc_stop(s: pb.AllocStop, field: str) -> None:
    require_id(s.alloc_id, f"{field}.alloc_id")
    if s.client_status:
        one_of(s.client_status, ClientStatus.ALL, f"{field}.client_status")
    if s.desired_status:
        one_of(
            s.desired_status, (DesiredStatus.STOP, DesiredStatus.EVICT), f"{field}.desired_status"
        )


def drain_strategy(s: pb.DrainStrategy, field: str) -> None:
    """A drain strategy as a user sends it. Its deadline becomes an absolute
    force deadline (now + deadline, int64 nanoseconds), so it is bounded."""
    if s.deadline > MAX_DURATION_NS:
        raise InvalidArgument(f"{field}.deadline", f"must be at most {MAX_DURATION_HOURS} hours")


def durations(msg: Message, field: str) -> None:
    """Every duration in `msg` and its sub-messages (its int64 fields but
    times, named `*_time` or `*_at`) is between 0 and MAX_DURATION_NS: the
    roles add them to the clock (a deployment's progress deadline, a
    reschedule's delay), which must stay an int64. A new duration field is
    covered the day it is added."""
    for desc, value in msg.ListFields():
        path = f"{field}.{desc.name}"
        if desc.type == desc.TYPE_MESSAGE:
            entry = desc.message_type
            if entry is not None and entry.GetOptions().map_entry:
                for k, v in value.items():
                    if isinstance(v, Message):
                        durations(v, f"{path}[{k}]")
            elif desc.is_repeated:
                for i, m in enumerate(value):
                    durations(m, f"{path}[{i}]")
            else:
                durations(value, path)
        elif desc.type in _INT64_TYPES and not desc.name.endswith(("_time", "_at")):
            for v in value if desc.is_repeated else [value]:
                if v < 0:
                    raise InvalidArgument(path, "must not be negative")
                if v > MAX_DURATION_NS:
                    raise InvalidArgument(path, f"must be at most {MAX_DURATION_HOURS} hours")


def deployment(d: pb.Deployment, field: str) -> None:
    require_id(d.id, f"{field}.id")
    require_id(d.job_id, f"{field}.job_id")
