"""Nomad Variables in the domain: what a valid path is (Nomad's
ValidatePath), the bounds on a variable and its lock, and a variable as
Nomad's API JSON (api.Variable, api.VariableMetadata, api.RootKeyMeta),
which the HTTP gateway answers and the CLI prints.
"""

from __future__ import annotations

import re
from typing import Any

from corral.domain.jobspec.duration import format_duration, parse_duration
from corral.v1 import structs_pb2 as pb

SECOND = 1_000_000_000
#: Nomad's maxVariableSize: keys and values of one variable together, bytes
MAX_VARIABLE_SIZE = 65536
#: Nomad's lock TTL bounds and defaults
MIN_LOCK_TTL = 10 * SECOND
MAX_LOCK_TTL = 24 * 3600 * SECOND
DEFAULT_LOCK_TTL = 15 * SECOND
DEFAULT_LOCK_DELAY = 15 * SECOND

_PATH = re.compile(r"^[a-zA-Z0-9\-_~/]{1,128}$")


def path_problem(path: str) -> str | None:
    """Nomad's ValidatePath: what is wrong with a variable path, or None."""
    if not path:
        return "variable requires path"
    if not _PATH.match(path):
        return f"invalid path {path[:200]!r}"
    parts = path.split("/")
    if parts[0] != "nomad":
        return None
    if len(parts) == 1:
        return (
            '"nomad" is a reserved top-level directory path, but you may write variables to '
            '"nomad/jobs", "nomad/job-templates", "nomad/sentinel", or below'
        )
    if parts[1] in ("jobs", "sentinel"):
        return None
    if parts[1] == "job-templates" and len(parts) == 3:
        return None
    if parts[1] == "job-templates":
        return (
            '"nomad/job-templates" is a reserved directory path, but you may write variables '
            'at the level below it, for example, "nomad/job-templates/template-name"'
        )
    return (
        'only paths at "nomad/jobs" or "nomad/job-templates" and below are valid paths under '
        'the top-level "nomad" directory'
    )


def items_size(items: dict[str, str]) -> int:
    return sum(len(k.encode()) + len(v.encode()) for k, v in items.items())


# ------------------------------------------------------------ Nomad's JSON


class VariableInputError(ValueError):
    """A request body that is not a variable (Nomad's 400)."""


def lock(lk: pb.VariableLock) -> dict[str, Any]:
    return {
        "ID": lk.id,
        "TTL": format_duration(lk.ttl) if lk.ttl else "",
        "LockDelay": format_duration(lk.lock_delay) if lk.lock_delay else "",
    }


def metadata(meta: pb.VariableMetadata) -> dict[str, Any]:
    """api.VariableMetadata (`Lock` omitted when there is none, as Nomad's
    omitempty)."""
    out: dict[str, Any] = {"Namespace": meta.namespace, "Path": meta.path}
    if meta.HasField("lock"):
        out["Lock"] = lock(meta.lock)
    out.update(
        {
            "CreateIndex": meta.create_index,
            "CreateTime": meta.create_time,
            "ModifyIndex": meta.modify_index,
            "ModifyTime": meta.modify_time,
        }
    )
    return out


def variable(v: pb.Variable) -> dict[str, Any]:
    """api.Variable: its metadata and `Items` (omitted when it has none)."""
    out = metadata(v.metadata)
    if v.items:
        out["Items"] = dict(sorted(v.items.items()))
    return out


def _duration(value: Any, name: str) -> int:
    if value is None or value == "":
        return 0
    if isinstance(value, bool):
        raise VariableInputError(f"Lock.{name} must be a duration")
    if isinstance(value, int | float):
        return int(value)  # Nomad's JSON also takes nanoseconds
    if isinstance(value, str):
        try:
            return parse_duration(value)
        except ValueError as exc:
            raise VariableInputError(f"Lock.{name}: {exc}") from None
    raise VariableInputError(f"Lock.{name} must be a duration")


def _index(value: Any, name: str) -> int:
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**64:
        raise VariableInputError(f"{name} must be a whole number")
    return value


def from_nomad(body: Any, path: str) -> tuple[pb.Variable, str]:
    """The variable of a PUT /v1/var/:path body (`path` from the URL wins,
    as Nomad's), and the namespace the body names ('' for none)."""
    if body is None:
        body = {}
    if not isinstance(body, dict):
        raise VariableInputError("request body must be a JSON object (a variable)")
    namespace = body.get("Namespace") or ""
    if not isinstance(namespace, str):
        raise VariableInputError("Namespace must be a string")
    v = pb.Variable(metadata=pb.VariableMetadata(path=path))
    v.metadata.modify_index = _index(body.get("ModifyIndex"), "ModifyIndex")
    items = body.get("Items")
    if items is not None:
        if not isinstance(items, dict):
            raise VariableInputError("Items must be an object of strings")
        for key, value in items.items():
            if not isinstance(value, str):
                raise VariableInputError(f"Items[{key!r}] must be a string")
            v.items[str(key)] = value
    raw_lock = body.get("Lock")
    if raw_lock is not None:
        if not isinstance(raw_lock, dict):
            raise VariableInputError("Lock must be an object")
        lock_id = raw_lock.get("ID") or ""
        if not isinstance(lock_id, str):
            raise VariableInputError("Lock.ID must be a string")
        v.metadata.lock.id = lock_id
        v.metadata.lock.ttl = _duration(raw_lock.get("TTL"), "TTL")
        v.metadata.lock.lock_delay = _duration(raw_lock.get("LockDelay"), "LockDelay")
    return v, namespace


def root_key(meta: pb.RootKeyMeta) -> dict[str, Any]:
    """api.RootKeyMeta."""
    return {
        "KeyID": meta.key_id,
        "Algorithm": meta.algorithm,
        "CreateTime": meta.create_time,
        "CreateIndex": meta.create_index,
        "ModifyIndex": meta.modify_index,
        "State": meta.state,
        "PublishTime": meta.publish_time,
    }
