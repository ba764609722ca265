"""Go-style durations ("30s", "5m", "1h30m", "250ms") as int64 nanoseconds,
the unit every duration field in the wire contract uses."""

from __future__ import annotations

import re

_UNITS = {
    "ns": 1,
    "us": 1_000,
    "µs": 1_000,
    "μs": 1_000,
    "ms": 1_000_000,
    "s": 1_000_000_000,
    "m": 60 * 1_000_000_000,
    "h": 3600 * 1_000_000_000,
}
_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|μs|ms|s|m|h)")


def parse_duration(text: str) -> int:
    """Nanoseconds in `text`; raises ValueError with a readable message.

    Accepts what Go's time.ParseDuration accepts ("0", "1h30m", "1.5s",
    "-5s"), which is what Nomad job files use."""
    s = text.strip()
    if not s:
        raise ValueError("empty duration")
    sign = 1
    if s[0] in "+-":
        sign = -1 if s[0] == "-" else 1
        s = s[1:]
    if s == "0":
        return 0
    pos = 0
    total = 0.0
    while pos < len(s):
        m = _PART.match(s, pos)
        if m is None:
            raise ValueError(f'invalid duration "{text}" (expected e.g. "30s", "5m", "1h30m")')
        total += float(m.group(1)) * _UNITS[m.group(2)]
        pos = m.end()
    return sign * round(total)


def format_duration(ns: int) -> str:
    """The shortest Go-style rendering of `ns` ("1h30m0s" → "1h30m")."""
    if ns == 0:
        return "0s"
    sign = "-" if ns < 0 else ""
    ns = abs(ns)
    if ns < 1_000_000_000:
        for unit, size in (("ms", 1_000_000), ("us", 1_000)):
            if ns >= size and ns % size == 0:
                return f"{sign}{ns // size}{unit}"
        if ns >= 1_000_000:
            return f"{sign}{ns / 1_000_000:g}ms"
        return f"{sign}{ns}ns"
    parts = []
    hours, rest = divmod(ns, 3600 * 1_000_000_000)
    minutes, rest = divmod(rest, 60 * 1_000_000_000)
    seconds = rest / 1_000_000_000
    if hours:
        parts.append(f"{hours}h")
    if minutes:
        parts.append(f"{minutes}m")
    if seconds:
        parts.append(f"{seconds:g}s")
    return sign + "".join(parts)
