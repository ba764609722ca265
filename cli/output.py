"""Rendering: Nomad-style aligned tables and `key = value` blocks for
people, and proto JSON for scripts.

`-json` output is `google.protobuf.json_format.MessageToDict` with the proto
field names (snake_case, as in structs.proto), every field present even when
zero, and 64-bit integers as JSON numbers. Lists print as a JSON array; the
event stream prints one JSON object per line."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from typing import Any, TextIO

from google.protobuf import json_format
from google.protobuf.message import Message

SHORT_ID = 8


def to_dict(msg: Message) -> dict[str, Any]:
    result: dict[str, Any] = json_format.MessageToDict(
        msg,
        preserving_proto_field_name=True,
        always_print_fields_with_no_presence=True,
        unquote_int64_if_possible=True,
    )
    return result


def print_json(
    value: Message | Sequence[Message] | dict[str, Any] | list[Any], out: TextIO | None = None
) -> None:
    out = out or sys.stdout
    if isinstance(value, Message):
        data: Any = to_dict(value)
    elif isinstance(value, dict):
        data = value
    else:
        data = [to_dict(m) if isinstance(m, Message) else m for m in value]
    out.write(json.dumps(data, indent=2, sort_keys=False) + "\n")


def short(ident: str, verbose: bool = False) -> str:
    """Nomad shows the first 8 characters of a UUID unless -verbose."""
    return ident if verbose or len(ident) <= SHORT_ID else ident[:SHORT_ID]


def table(headers: Sequence[str], rows: Iterable[Sequence[Any]], out: TextIO | None = None) -> None:
    """Columns separated by two spaces, left-aligned, like Nomad's columnize."""
    out = out or sys.stdout
    cells = [[str(h) for h in headers]] + [["" if c is None else str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    for r in cells:
        line = "  ".join(c.ljust(widths[i]) for i, c in enumerate(r))
        out.write(line.rstrip() + "\n")


def kv(pairs: Sequence[tuple[str, Any]], out: TextIO | None = None) -> None:
    """`Key  = value` lines aligned on the `=`."""
    out = out or sys.stdout
    width = max((len(k) for k, _ in pairs), default=0)
    for k, v in pairs:
        out.write(f"{k.ljust(width)} = {'' if v is None else v}\n")


def heading(text: str, out: TextIO | None = None) -> None:
    out = out or sys.stdout
    out.write(f"\n{text}\n")


def fmt_bytes(n: int) -> str:
    """Bytes in IEC units as Nomad prints them (go-humanize's IBytes):
    "0 B", "316 KiB", "1.1 MiB"."""
    if n < 10:
        return f"{n} B"
    units = ("B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB")
    value, unit = float(n), 0
    while value >= 1024 and unit < len(units) - 1:
        value /= 1024
        unit += 1
    value = round(value * 10) / 10
    return f"{value:.0f} {units[unit]}" if value >= 10 else f"{value:.1f} {units[unit]}"


def fmt_time(ns: int) -> str:
    """RFC 3339 in local time; '<none>' for a zero time."""
    if ns <= 0:
        return "<none>"
    return datetime.fromtimestamp(ns / 1e9, tz=UTC).astimezone().isoformat(timespec="seconds")


def fmt_ago(ns: int, now: float | None = None) -> str:
    """'12s ago', '5m3s ago', '2h ago', '3d4h ago' (Nomad's pretty time)."""
    if ns <= 0:
        return "<none>"
    delta = max(0, int((now if now is not None else time.time()) - ns / 1e9))
    if delta < 60:
        return f"{delta}s ago"
    if delta < 3600:
        return f"{delta // 60}m{delta % 60}s ago"
    if delta < 86400:
        return f"{delta // 3600}h{(delta % 3600) // 60}m ago"
    return f"{delta // 86400}d{(delta % 86400) // 3600}h ago"


def now_stamp() -> str:
    return datetime.now().astimezone().isoformat(timespec="seconds")


def join(values: Iterable[str], sep: str = ",") -> str:
    items = list(values)
    return sep.join(items) if items else "<none>"
