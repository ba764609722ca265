"""The generic half of the mapping: a proto message as Nomad JSON, field by
field, with Nomad's spelling of names (`ID`, `CPU`, `MemoryMB`), every
field present (Nomad's JSON lists empty ones too), durations left as
nanoseconds (our protos already use Nomad's unit) and times as Nomad has
them: int64 nanoseconds for `*Time` fields of jobs, allocs and evals,
RFC 3339 strings where Nomad's struct holds a Go `time.Time`."""

from __future__ import annotations

import base64
import datetime as dt
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from google.protobuf import json_format
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message

from services.gateway.mapping.absent import ZERO_TIME as ZERO_TIME  # its users import it here
from services.gateway.mapping.absent import fill, fill_all

#: word → Nomad's (Go's) spelling of it in a field name
_ACRONYMS = {
    "id": "ID",
    "ids": "IDs",
    "cpu": "CPU",
    "mb": "MB",
    "mbits": "MBits",
    "http": "HTTP",
    "tg": "TG",
    "ip": "IP",
    "url": "URL",
    "dns": "DNS",
    "ttl": "TTL",
    "ui": "UI",
    "cni": "CNI",
    "tls": "TLS",
}
#: whole field names whose Nomad name is not the PascalCase of ours
_FIELD_RENAMES = {
    "parameterized": "ParameterizedJob",
    "crons": "Specs",
    "l_target": "LTarget",
    "r_target": "RTarget",
    "selinux_label": "SELinuxLabel",
    # a plan's DesiredUpdates
    "reconnect_updates": "Reconnect",
    "disconnect_updates": "Disconnect",
}


Override = Callable[[Any], Any]


def pascal(name: str) -> str:
    """Our snake_case field name as Nomad's Go field name."""
    if name in _FIELD_RENAMES:
        return _FIELD_RENAMES[name]
    return "".join(_ACRONYMS.get(part, part.capitalize()) for part in name.split("_"))


def rfc3339(ns: int) -> str:
    """Unix nanoseconds as Go's time.Time JSON (RFC 3339 with nanoseconds);
    0 is Go's zero time."""
    if ns <= 0:
        return ZERO_TIME
    seconds, frac = divmod(int(ns), 1_000_000_000)
    base = dt.datetime.fromtimestamp(seconds, tz=dt.UTC).strftime("%Y-%m-%dT%H:%M:%S")
    return f"{base}.{frac:09d}Z" if frac else f"{base}Z"


_RFC3339 = re.compile(r"^(\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2})(?:\.(\d{1,9}))?(Z|[+-]\d{2}:\d{2})$")


def from_rfc3339(text: str) -> int:
    """Go's time.Time JSON as Unix nanoseconds (`rfc3339`'s inverse); Go's
    zero time is 0. Raises ValueError for anything else."""
    if text == ZERO_TIME:
        return 0
    m = _RFC3339.match(text)
    if m is None:
        raise ValueError(f"{text!r} is not an RFC 3339 time")
    base, frac, zone = m.groups()
    offset = "+00:00" if zone == "Z" else zone
    when = dt.datetime.fromisoformat(base + offset)
    return int(when.timestamp()) * 1_000_000_000 + int((frac or "").ljust(9, "0"))


def _scalar(fd: Any, value: Any) -> Any:
    if fd.type == FieldDescriptor.TYPE_BYTES:
        return base64.b64encode(value).decode() if value else None
    if fd.type == FieldDescriptor.TYPE_ENUM:
        return fd.enum_type.values_by_number[value].name if fd.enum_type else value
    return value


def _whole_numbers(value: Any) -> Any:
    """A Struct's numbers are doubles; a task config's `port = 8080` reads
    back as 8080, as Nomad shows it, not 8080.0."""
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**53:
        return int(value)
    if isinstance(value, dict):
        return {k: _whole_numbers(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_whole_numbers(v) for v in value]
    return value


def _value(fd: Any, value: Any) -> Any:
    if fd.message_type is not None:
        if fd.message_type.full_name == "google.protobuf.Struct":
            return _whole_numbers(json_format.MessageToDict(value))
        return to_nomad(value)
    return _scalar(fd, value)


def to_nomad(msg: Message, overrides: Mapping[str, Override] | None = None) -> dict[str, Any]:
    """`msg` as Nomad JSON. Unset sub-messages are null (Go's nil pointer),
    empty lists and maps null too (Go's nil slice/map), so a client sees
    the same presence Nomad would give. `overrides` maps a field name to a
    function of the field's value (for times and Nomad-only renames)."""
    out: dict[str, Any] = {}
    for fd in msg.DESCRIPTOR.fields:
        value = getattr(msg, fd.name)
        key = pascal(fd.name)
        if overrides and fd.name in overrides:
            out[key] = overrides[fd.name](value)
            continue
        if fd.message_type is not None and fd.message_type.GetOptions().map_entry:
            vfd = fd.message_type.fields_by_name["value"]
            out[key] = {k: _value(vfd, v) for k, v in value.items()} if value else None
        elif fd.is_repeated:
            out[key] = [_value(fd, v) for v in value] if value else None
        elif fd.message_type is not None:
            has = msg.HasField(fd.name)
            out[key] = _value(fd, value) if has else None
        elif fd.has_presence and not msg.HasField(fd.name):
            out[key] = None
        else:
            out[key] = _scalar(fd, value)
    return out


def networks(items: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
    """Network JSON completed as Nomad's api.NetworkResource and api.Port
    (in place; returned for chaining)."""
    for net in items or ():
        fill("NetworkResource", net)
        fill_all("Port", net.get("ReservedPorts"))
        fill_all("Port", net.get("DynamicPorts"))
    return items


def complete_resources(out: dict[str, Any] | None) -> dict[str, Any] | None:
    """Resources JSON as Nomad's api.Resources: the devices an alloc was
    given are Corral's own (Nomad shows them in AllocatedResources), the
    fields Corral lacks at Nomad's unset values (in place)."""
    if out is None:
        return None
    out.pop("AllocatedDevices", None)
    networks(out.get("Networks"))
    fill_all("RequestedDevice", out.get("Devices"))
    return fill("Resources", out)


def resources(msg: Message | None) -> dict[str, Any] | None:
    """Resources as Nomad's api.Resources (networks and devices included)."""
    if msg is None:
        return None
    return complete_resources(to_nomad(msg))


#: a field of a list entry: our field name (shown under its Nomad name), or
#: (Nomad's name, what it shows of the message)
Field = str | tuple[str, Callable[[Any], Any]]


def entry(msg: Message, fields: Sequence[Field]) -> dict[str, Any]:
    """The Nomad JSON of a list entry (a stub): `fields` of `msg`, in that
    order."""
    out: dict[str, Any] = {}
    for f in fields:
        if isinstance(f, str):
            out[pascal(f)] = getattr(msg, f)
        else:
            out[f[0]] = f[1](msg)
    return out
