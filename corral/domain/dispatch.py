"""Parameterized jobs and their dispatched children: the rules the state
service, the CLI and the client agent must agree on (Nomad's limits and
naming, so that job files and scripts written for Nomad keep working)."""

from __future__ import annotations

import posixpath
import uuid

from corral.v1 import structs_pb2 as pb

#: Nomad refuses larger dispatch payloads (16 KiB)
PAYLOAD_LIMIT = 16 * 1024
#: a child's id is `<parent>/dispatch-...`
LAUNCH_SUFFIX = "/dispatch-"


class Payload:
    OPTIONAL = "optional"
    REQUIRED = "required"
    FORBIDDEN = "forbidden"

    ALL = (OPTIONAL, REQUIRED, FORBIDDEN)


def dispatched_id(parent_id: str, id_prefix_template: str, unix_seconds: int) -> str:
    """`<parent>/dispatch-[<prefix>-]<unix time>-<8 hex>`: unique per
    dispatch, sortable by time, and recognisably the parent's child."""
    suffix = uuid.uuid4().hex[:8]
    prefix = f"{id_prefix_template}-" if id_prefix_template else ""
    return f"{parent_id}{LAUNCH_SUFFIX}{prefix}{unix_seconds}-{suffix}"


def payload_file_problem(file: str) -> str | None:
    """Why `dispatch_payload.file` cannot be written under the task's local
    directory, or None: it must be a relative path that stays inside it."""
    if not file:
        return "a file name is required"
    if file.startswith("/"):
        return f"{file!r} must be relative to the task's local directory"
    normal = posixpath.normpath(file)
    if normal == "." or normal == ".." or normal.startswith("../"):
        return f"{file!r} escapes the task's local directory"
    return None


def dispatch_problem(parent: pb.Job, payload: bytes, meta: dict[str, str]) -> str | None:
    """Why this payload and meta cannot be dispatched to the parameterized
    `parent`, or None (the order of Nomad's checks: payload, size, meta)."""
    rule = parent.parameterized.payload or Payload.OPTIONAL
    if rule == Payload.REQUIRED and not payload:
        return "payload is required by the parameterized job but none was given"
    if rule == Payload.FORBIDDEN and payload:
        return "payload is forbidden by the parameterized job"
    if len(payload) > PAYLOAD_LIMIT:
        return f"payload is {len(payload)} bytes, more than the {PAYLOAD_LIMIT} allowed"
    allowed = {*parent.parameterized.meta_required, *parent.parameterized.meta_optional}
    unknown = sorted(k for k in meta if k not in allowed)
    if unknown:
        return (
            f"meta keys not allowed by the parameterized job: {', '.join(unknown)}"
            f" (allowed: {', '.join(sorted(allowed)) or 'none'})"
        )
    missing = sorted(k for k in parent.parameterized.meta_required if k not in meta)
    if missing:
        return f"missing required meta keys: {', '.join(missing)}"
    return None
