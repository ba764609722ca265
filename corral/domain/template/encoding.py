"""Go's encodings of template values: encoding/json (toJSON), yaml.v2
(toYAML) and time.Format layouts (timestamp), bounded in depth and size."""

from __future__ import annotations

import datetime as dt
import math
import re
from typing import Any

import yaml

from corral.domain.template.exec import FuncError
from corral.domain.template.gofmt import format_float, sorted_keys
from corral.domain.template.values import MISSING, GoChan, GoFunc, GoStruct, type_name

MAX_DEPTH = 100

# ---------------------------------------------------------------- JSON

_JSON_ESCAPES = {
    '"': '\\"',
    "\\": "\\\\",
    "\n": "\\n",
    "\r": "\\r",
    "\t": "\\t",
    "\b": "\\b",
    "\f": "\\f",
}
_HTML_ESCAPES = {"<": "\\u003c", ">": "\\u003e", "&": "\\u0026"}


def _json_string(s: str, escape_html: bool) -> str:
    out = ['"']
    for ch in s:
        if ch in _JSON_ESCAPES:
            out.append(_JSON_ESCAPES[ch])
        elif escape_html and ch in _HTML_ESCAPES:
            out.append(_HTML_ESCAPES[ch])
        elif ord(ch) < 0x20 or ch in "\u2028\u2029":
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


def json_float(f: float) -> str:
    if math.isnan(f) or math.isinf(f):
        raise FuncError(f"json: unsupported value: {format_float(f)}")
    a = abs(f)
    if a != 0 and (a < 1e-6 or a >= 1e21):
        s = format_float(f, "e", -1)
        # Go cleans e-09 up to e-9
        m = re.fullmatch(r"(.*e[-+])0(\d)", s)
        if m and "e-" in s:
            s = m.group(1) + m.group(2)
        return s
    return format_float(f, "f", -1)


def to_json(value: Any, *, indent: str = "", escape_html: bool = True, max_len: int) -> str:
    """json.Marshal / MarshalIndent(value, "", indent) of a template value."""
    out: list[str] = []
    size = [0]

    def emit(s: str) -> None:
        size[0] += len(s)
        if size[0] > max_len:
            raise FuncError(f"json: result exceeds the limit of {max_len} characters")
        out.append(s)

    def enc(v: Any, depth: int) -> None:
        if depth > MAX_DEPTH:
            raise FuncError(f"json: unsupported value: nesting deeper than {MAX_DEPTH} levels")
        nl = "\n" + indent * (depth + 1) if indent else ""
        close_nl = "\n" + indent * depth if indent else ""
        sep = ": " if indent else ":"
        if v is None or v is MISSING:
            emit("null")
        elif isinstance(v, bool):
            emit("true" if v else "false")
        elif isinstance(v, int):
            emit(str(int(v)))
        elif isinstance(v, float):
            emit(json_float(v))
        elif isinstance(v, str):
            emit(_json_string(v, escape_html))
        elif isinstance(v, GoStruct):
            custom = getattr(v, "go_json", None)
            if custom is not None:
                enc(custom(), depth)
                return
            emit("{")
            for i, name in enumerate(v.go_fields):
                emit(("," if i else "") + nl + _json_string(name, escape_html) + sep)
                enc(v.go_field(name), depth + 1)
            emit((close_nl if v.go_fields else "") + "}")
        elif isinstance(v, dict):
            if not v:
                emit("{}")
                return
            emit("{")
            for i, key in enumerate(sorted(v, key=lambda k: str(k))):
                emit(("," if i else "") + nl + _json_string(str(key), escape_html) + sep)
                enc(v[key], depth + 1)
            emit(close_nl + "}")
        elif isinstance(v, list | tuple):
            if not v:
                emit("[]")
                return
            emit("[")
            for i, item in enumerate(v):
                emit(("," if i else "") + nl)
                enc(item, depth + 1)
            emit(close_nl + "]")
        elif isinstance(v, bytes):
            import base64

            emit('"' + base64.b64encode(v).decode() + '"')
        elif isinstance(v, GoChan | GoFunc | complex):
            raise FuncError(f"json: unsupported type: {type_name(v)}")
        else:
            raise FuncError(f"json: unsupported type: {type_name(v)}")

    enc(value, 0)
    return "".join(out)


def check_json_depth(text: str, limit: int = MAX_DEPTH) -> None:
    """Refuse JSON nested deeper than `limit` before parsing it (Python's
    parser would raise RecursionError on deep input)."""
    depth = 0
    in_string = False
    escaped = False
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            if depth > limit:
                raise FuncError(f"json: nesting deeper than {limit} levels")
        elif ch in "]}":
            depth -= 1


# ---------------------------------------------------------------- YAML


def _plain(v: Any, depth: int = 0, budget: list[int] | None = None) -> Any:
    """A template value as plain Python data for the YAML emitter; `budget`
    (characters left) stops a structure whose output would be too large
    (shared references count each time they would be written)."""
    if budget is not None:
        budget[0] -= len(v) + 4 if isinstance(v, str) else 4
        if budget[0] < 0:
            raise FuncError("yaml: result exceeds the limit")
    if depth > MAX_DEPTH:
        raise FuncError(f"yaml: nesting deeper than {MAX_DEPTH} levels")
    if v is MISSING:
        return None
    if isinstance(v, GoStruct):
        custom = getattr(v, "go_json", None)
        if custom is not None:
            return _plain(custom(), depth + 1, budget)
        # yaml.v2 names struct fields in lower case
        return {name.lower(): _plain(v.go_field(name), depth + 1, budget) for name in v.go_fields}
    if isinstance(v, dict):
        return {k: _plain(v[k], depth + 1, budget) for k in sorted_keys(v)}
    if isinstance(v, list | tuple):
        return [_plain(x, depth + 1, budget) for x in v]
    if isinstance(v, bool):
        return v
    if isinstance(v, int):
        return int(v)
    if isinstance(v, GoChan | GoFunc):
        raise FuncError(f"yaml: cannot marshal type: {type_name(v)}")
    return v


class _Dumper(yaml.SafeDumper):
    pass


def _str_representer(dumper: yaml.SafeDumper, data: str) -> yaml.ScalarNode:
    style = "|" if "\n" in data else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", data, style=style)


def _float_representer(dumper: yaml.SafeDumper, data: float) -> yaml.ScalarNode:
    # yaml.v2 writes floats as strconv 'g' -1: 1, 2.5, 1e+06
    if math.isfinite(data) and data == int(data) and abs(data) < 1e21:
        return dumper.represent_int(int(data))
    text = {"+Inf": ".inf", "-Inf": "-.inf", "NaN": ".nan"}.get(
        format_float(data), format_float(data)
    )
    return dumper.represent_scalar("tag:yaml.org,2002:float", text)


_Dumper.add_representer(str, _str_representer)
_Dumper.add_representer(float, _float_representer)


def to_yaml(value: Any, max_len: int) -> str:
    plain = _plain(value, 0, [max_len])
    text = yaml.dump(
        plain,
        Dumper=_Dumper,
        default_flow_style=False,
        sort_keys=False,
        allow_unicode=True,
        width=1_000_000,
    )
    if text.endswith("\n...\n"):
        text = text[: -len("...\n")]
    if len(text) > max_len:
        raise FuncError(f"yaml: result exceeds the limit of {max_len} characters")
    return text.strip()


class _Loader(yaml.SafeLoader):
    pass


def parse_yaml(text: str) -> Any:
    try:
        return yaml.load(text, Loader=_Loader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as exc:
        raise FuncError(f"yaml: {exc}".replace("\n", " ")) from None
    except RecursionError:
        raise FuncError("yaml: nesting deeper than the parser allows") from None


# ---------------------------------------------------------------- time

_LAYOUT = re.compile(
    r"January|Jan|Monday|Mon|MST|2006|Z07:00:00|Z070000|Z07:00|Z0700|Z07|"
    r"-07:00:00|-070000|-07:00|-0700|-07|[.,](?:0+|9+)(?!\d)|002|__2|_2|01|02|03|04|05|06|"
    r"15|PM|pm|1|2|3|4|5"
)


def go_time_format(t: dt.datetime, layout: str) -> str:
    """time.Time.Format with Go's reference-time layout tokens."""

    def offset(sep: str, z: bool, seconds: bool, hours_only: bool) -> str:
        off = t.utcoffset() or dt.timedelta(0)
        total = int(off.total_seconds())
        if z and total == 0:
            return "Z"
        sign = "-" if total < 0 else "+"
        total = abs(total)
        h, rem = divmod(total, 3600)
        m, s = divmod(rem, 60)
        if hours_only:
            return f"{sign}{h:02d}"
        out = f"{sign}{h:02d}{sep}{m:02d}"
        if seconds:
            out += f"{sep}{s:02d}"
        return out

    def repl(m: re.Match[str]) -> str:
        tok = m.group(0)
        if tok == "January":
            return t.strftime("%B")
        if tok == "Jan":
            return t.strftime("%b")
        if tok == "Monday":
            return t.strftime("%A")
        if tok == "Mon":
            return t.strftime("%a")
        if tok == "MST":
            return t.tzname() or "UTC"
        if tok == "2006":
            return f"{t.year:04d}"
        if tok == "06":
            return f"{t.year % 100:02d}"
        if tok == "01":
            return f"{t.month:02d}"
        if tok == "1":
            return str(t.month)
        if tok == "02":
            return f"{t.day:02d}"
        if tok == "_2":
            return f"{t.day:2d}"
        if tok == "2":
            return str(t.day)
        if tok == "002":
            return f"{t.timetuple().tm_yday:03d}"
        if tok == "__2":
            return f"{t.timetuple().tm_yday:3d}"
        if tok == "15":
            return f"{t.hour:02d}"
        if tok == "03":
            return f"{(t.hour % 12) or 12:02d}"
        if tok == "3":
            return str((t.hour % 12) or 12)
        if tok == "04":
            return f"{t.minute:02d}"
        if tok == "4":
            return str(t.minute)
        if tok == "05":
            return f"{t.second:02d}"
        if tok == "5":
            return str(t.second)
        if tok == "PM":
            return "PM" if t.hour >= 12 else "AM"
        if tok == "pm":
            return "pm" if t.hour >= 12 else "am"
        if tok.startswith(("Z", "-")):
            z = tok.startswith("Z")
            body = tok[1:]
            return offset(
                ":" if ":" in body else "",
                z,
                body.count("0") >= 6 or body.count(":") == 2,
                body == "07",
            )
        if tok[0] in ".,":
            digits = len(tok) - 1
            nanos = f"{t.microsecond * 1000:09d}"[:digits]
            if tok[1] == "9":
                nanos = nanos.rstrip("0")
                return (tok[0] + nanos) if nanos else ""
            return tok[0] + nanos
        return tok

    return _LAYOUT.sub(repl, layout)


RFC3339 = "2006-01-02T15:04:05Z07:00"
