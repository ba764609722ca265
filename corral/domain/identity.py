"""A task's workload identities in the job (Nomad's `identity` blocks):
their defaults and the checks every front end and the state run on them.

Every task has a default identity, whether or not its job says so; an
`identity` block without a name only says how that one reaches the task
(`env`, `file`, `filepath`). Named identities add JWTs with their own
audience and TTL. The JWTs themselves are signed by the state
(services/state/identities.py) and written into the task by the client
(services/agent/identity.py).
"""

from __future__ import annotations

import re
from pathlib import PurePosixPath

from corral.v1 import structs_pb2 as pb

DEFAULT_IDENTITY = "default"
#: the audience of every default identity (Nomad's IdentityDefaultAud)
DEFAULT_AUDIENCE = "nomadproject.io"
_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,128}$")
#: bounds on what one task may ask for (Nomad has none; each costs a JWT)
MAX_IDENTITIES = 16
MAX_AUDIENCES = 16
MAX_AUDIENCE_CHARS = 256
CHANGE_MODES = ("", "noop")


def canonicalize(task: pb.Task) -> None:
    """Nomad's WorkloadIdentity.Canonicalize for the task's default
    identity: its name is "default" and its audience always Nomad's."""
    if task.HasField("identity"):
        task.identity.name = task.identity.name or DEFAULT_IDENTITY
        if task.identity.name == DEFAULT_IDENTITY:
            del task.identity.audience[:]
            task.identity.audience.append(DEFAULT_AUDIENCE)


def task_identity(task: pb.Task, name: str) -> pb.WorkloadIdentity | None:
    """The identity `name` of `task` ("default" always exists)."""
    if name == DEFAULT_IDENTITY:
        if task.HasField("identity"):
            return task.identity
        return pb.WorkloadIdentity(name=DEFAULT_IDENTITY, audience=[DEFAULT_AUDIENCE])
    for wid in task.identities:
        if wid.name == name:
            return wid
    return None


def problems(task: pb.Task) -> tuple[str, str] | None:
    """The first thing wrong with the task's identities, as (field below
    the task, problem), or None."""
    if task.HasField("identity"):
        found = _problem(task.identity, default=True)
        if found is not None:
            return f"identity.{found[0]}", found[1]
    if len(task.identities) > MAX_IDENTITIES:
        return "identities", f"has {len(task.identities)} identities, more than {MAX_IDENTITIES}"
    seen: set[str] = set()
    for i, wid in enumerate(task.identities):
        where = f"identities[{i}]"
        if not wid.name or wid.name == DEFAULT_IDENTITY:
            return f"{where}.name", (
                'a named identity needs a name other than "default" '
                "(the default identity is the `identity` block without one)"
            )
        if wid.name in seen:
            return f"{where}.name", f"identity {wid.name!r} is defined twice"
        seen.add(wid.name)
        found = _problem(wid, default=False)
        if found is not None:
            return f"{where}.{found[0]}", found[1]
    return None


def _problem(wid: pb.WorkloadIdentity, *, default: bool) -> tuple[str, str] | None:
    if not _NAME.match(wid.name or DEFAULT_IDENTITY):
        return "name", (
            f"invalid name {wid.name!r}: letters, digits, '-' and '_', at most 128 characters"
        )
    if len(wid.audience) > MAX_AUDIENCES:
        return "aud", f"has more than {MAX_AUDIENCES} audiences"
    for i, aud in enumerate(wid.audience):
        if not aud:
            return f"aud[{i}]", "an empty string is an invalid audience"
        if len(aud) > MAX_AUDIENCE_CHARS or "\x00" in aud:
            return f"aud[{i}]", f"must be at most {MAX_AUDIENCE_CHARS} characters, without NUL"
    if wid.change_mode not in CHANGE_MODES:
        return "change_mode", (
            f'{wid.change_mode!r} is not supported by Corral (only "noop": a renewed '
            "identity is rewritten to its file, the task is not restarted or signalled)"
        )
    if wid.change_signal:
        return "change_signal", 'is not supported by Corral (change_mode can only be "noop")'
    if wid.ttl < 0:
        return "ttl", "must not be negative"
    if wid.ttl and default:
        return "ttl", "ttl for the default identity is not supported (as in Nomad)"
    if wid.filepath:
        if not wid.file:
            return "filepath", "file must be true in order to specify filepath"
        path = PurePosixPath(wid.filepath)
        if path.is_absolute() or ".." in path.parts or "\x00" in wid.filepath:
            return "filepath", "must be a relative path inside the task directory"
    return None
