"""Check JSON against the shapes of Nomad's Go `api` package
(nomad_api_types.json beside this file, written by
scripts/gen_nomad_api_types.py; its docstring explains the notation).

What Go's encoding/json does with our answers decides what is a problem:

* a value of the wrong JSON type breaks the decoding of the whole answer
  (a bool where the field is a string, 1.5 where it is an int, a string
  where it is a number) — always a problem;
* `null` where the Go field is not a pointer, slice, map or interface is
  silently ignored by Go but is never what Nomad sends (python-nomad's
  callers index it) — a problem;
* a field of the struct missing from the answer (not `omitempty`) — Go
  leaves the zero value, python clients raise KeyError — a problem;
* a field the struct does not have — harmless to Go, but a sign of a name
  spelt differently — a problem unless Nomad's server sends it too (the
  same-named struct of nomad/structs has it) or `EXTRA` lists it with the
  reason.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

TABLE_PATH = Path(__file__).with_name("nomad_api_types.json")

#: fields Nomad's answers carry beyond the api struct (its server encodes
#: nomad/structs types, a superset) or Corral adds: struct → field → why
EXTRA: dict[str, dict[str, str]] = {}

#: Go's time.Time JSON: RFC 3339 with optional fractional seconds
_RFC3339 = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d{1,9})?(Z|[+-]\d{2}:\d{2})$")
_DURATION = re.compile(r"^([-+]?([0-9]*(\.[0-9]*)?[a-zµμ]+)+|0)$")
_BASE64 = re.compile(r"^[A-Za-z0-9+/]*={0,2}$")


@cache
def _loaded() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(TABLE_PATH.read_text())
    return data


#: anonymous structs the api's functions decode answers into (named here)
_LOCAL: dict[str, dict[str, dict[str, Any]]] = {}


def local_structs(**structs: dict[str, str]) -> None:
    """Name anonymous structs of the api's functions (`Keyring.Rotate`
    decodes `struct{ Key *RootKeyMeta }`): name → field → type."""
    for name, fields in structs.items():
        _LOCAL[name] = {k: {"type": t, "omitempty": False} for k, t in fields.items()}


def table() -> dict[str, dict[str, dict[str, Any]]]:
    """struct → JSON field → {"type", "omitempty"[, "headers"]}."""
    structs: dict[str, dict[str, dict[str, Any]]] = _loaded()["structs"]
    return structs


def server_fields(name: str) -> frozenset[str]:
    """The JSON fields of the nomad/structs struct of that name (what
    Nomad's servers send: some the api struct lacks)."""
    return frozenset(_loaded()["server_fields"].get(name, ()))


@dataclass(frozen=True)
class Problem:
    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}"


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int"
    if isinstance(value, float):
        return "float"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object"


def check(
    value: Any, type_expr: str, path: str = "$", extra: dict[str, dict[str, str]] | None = None
) -> list[Problem]:
    """Every way `value` departs from the Go type `type_expr`."""
    extras = EXTRA if extra is None else extra
    out: list[Problem] = []
    _check(value, type_expr, path, out, extras)
    return out


def _check(
    value: Any, t: str, path: str, out: list[Problem], extras: dict[str, dict[str, str]]
) -> None:
    def bad(expected: str) -> None:
        out.append(Problem(path, f"expected {expected}, got {_kind(value)} {value!r:.60}"))

    if t.startswith("*"):
        if value is not None:
            _check(value, t[1:], path, out, extras)
        return
    if t.startswith("[]"):
        if value is None:
            return
        if not isinstance(value, list):
            bad(f"an array ({t}) or null")
            return
        for i, item in enumerate(value):
            _check(item, t[2:], f"{path}[{i}]", out, extras)
        return
    if t.startswith("map["):
        if value is None:
            return
        if not isinstance(value, dict):
            bad(f"an object ({t}) or null")
            return
        inner = t[4:-1]
        for k, item in value.items():
            _check(item, inner, f"{path}[{k!r}]", out, extras)
        return
    if t == "any" or (t == "bytes" and value is None):
        return
    if value is None:
        bad(f"{t} (Go's field is not a pointer: Nomad never sends null here)")
        return
    if t == "string":
        if not isinstance(value, str):
            bad("a string")
    elif t == "bool":
        if not isinstance(value, bool):
            bad("true or false")
    elif t in ("int", "duration"):
        if isinstance(value, bool) or not isinstance(value, int):
            bad("a whole number" + (" of nanoseconds" if t == "duration" else ""))
    elif t == "float":
        if isinstance(value, bool) or not isinstance(value, int | float):
            bad("a number")
    elif t == "time":
        if not isinstance(value, str) or not _RFC3339.match(value):
            bad("an RFC 3339 time string (Go's time.Time)")
    elif t == "bytes":
        if not isinstance(value, str) or not _BASE64.match(value):
            bad("base64 text ([]byte)")
    elif t == "durstring":
        if isinstance(value, str):
            if value and not _DURATION.match(value):
                bad('a Go duration string ("1h", "" for none)')
        elif isinstance(value, bool) or not isinstance(value, int | float):
            bad("a Go duration string or nanoseconds")
    else:
        _check_struct(value, t, path, out, extras)


def _check_struct(
    value: Any, name: str, path: str, out: list[Problem], extras: dict[str, dict[str, str]]
) -> None:
    fields = _LOCAL.get(name) or table().get(name)
    if fields is None:
        out.append(Problem(path, f"no struct {name} in the table"))
        return
    if not isinstance(value, dict):
        out.append(Problem(path, f"expected an object ({name}), got {_kind(value)}"))
        return
    allowed = set(extras.get(name, {})) | server_fields(name)
    for key, spec in fields.items():
        if key not in value:
            if not spec["omitempty"]:
                out.append(Problem(f"{path}.{key}", f"missing ({name}.{key} is {spec['type']})"))
            continue
        _check(value[key], spec["type"], f"{path}.{key}", out, extras)
    for key in value:
        if key not in fields and key not in allowed:
            out.append(Problem(f"{path}.{key}", f"{name} has no field {key}"))
