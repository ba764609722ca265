"""What `corral var` reads and prints, as Nomad's `nomad var` does: a
variable specification (JSON as api.Variable, or HCL with `path`,
`namespace`, `items { ... }`), `key=value` arguments (a value may be
`@file`, `-` for stdin, or `\\@...` for a literal `@`), and a variable
rendered as JSON, HCL, a table or a Go template."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

import hcl2
from hcl2 import SerializationOptions
from lark.exceptions import LarkError

from cli.context import CliError
from cli.output import fmt_time, heading, kv
from corral.domain import variables as nomad_json
from corral.domain.template.errors import TemplateError
from corral.domain.template.template import Template
from corral.v1 import structs_pb2 as pb

FORMATS_IN = ("hcl", "json")
SPEC_KEYS = (
    "namespace",
    "path",
    "create_index",
    "modify_index",
    "create_time",
    "modify_time",
    "items",
)
_HCL = SerializationOptions(
    strip_string_quotes=True, explicit_blocks=False, with_comments=False, preserve_heredocs=False
)


def format_of(path: str) -> str:
    if path.endswith(".json"):
        return "json"
    if path.endswith(".hcl"):
        return "hcl"
    raise CliError(f"Unable to determine format of {path}; Use the -in flag to specify it.")


def parse_spec(text: str, fmt: str) -> tuple[pb.Variable, str]:
    """A variable spec: (the variable, the namespace it names or '')."""
    if fmt == "json":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise CliError(
                f"Failed to parse variable data: error unmarshaling json: {exc}"
            ) from None
        try:
            v, namespace = nomad_json.from_nomad(
                data, str(data.get("Path", "")) if isinstance(data, dict) else ""
            )
        except nomad_json.VariableInputError as exc:
            raise CliError(f"Failed to parse variable data: {exc}") from None
        if isinstance(data, dict):
            v.metadata.create_index = _number(data.get("CreateIndex"), "CreateIndex")
        return v, namespace
    try:
        data = hcl2.loads(text, serialization_options=_HCL)
    except (LarkError, RecursionError, ValueError) as exc:
        raise CliError(f"Failed to parse variable data: error parsing hcl: {exc}") from None
    unknown = sorted(set(data) - set(SPEC_KEYS))
    if unknown:
        raise CliError(f"Failed to parse variable data: invalid key {unknown[0]!r}")
    v = pb.Variable(metadata=pb.VariableMetadata(path=str(data.get("path", ""))))
    for field in ("create_index", "modify_index", "create_time", "modify_time"):
        if field in data:
            setattr(v.metadata, field, _number(data[field], field))
    items = data.get("items", {})
    if isinstance(items, list):  # `items { ... }` as a block
        items = items[0] if len(items) == 1 else None
    if not isinstance(items, dict):
        raise CliError("Failed to parse variable data: items must be a map of strings")
    for key, value in items.items():
        if isinstance(value, dict | list):
            raise CliError(f"Failed to parse variable data: items.{key} must be a string")
        v.items[str(key)] = str(value)
    return v, str(data.get("namespace", "") or "")


def _number(value: Any, name: str) -> int:
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise CliError(f"Failed to parse variable data: {name} must be integer; got {value!r}")
    return value


def read_value(raw: str, stdin: TextIO, used: list[bool]) -> str:
    """A value of `key=value`: `@file`, `-` (stdin, once), `\\@` for `@`."""
    if raw.startswith("@"):
        try:
            return Path(raw[1:]).read_text()
        except OSError as exc:
            raise CliError(
                f"Failed to parse K=V data: error reading file: {exc.strerror}"
            ) from None
    if raw.startswith("\\@"):
        return raw[1:]
    if raw == "-":
        if used[0]:
            raise CliError("Failed to parse K=V data: stdin already consumed")
        used[0] = True
        return stdin.read()
    return raw


def apply_pairs(v: pb.Variable, pairs: Sequence[str], stdin: TextIO, used: list[bool]) -> list[str]:
    """`key=value` arguments onto the variable's items (an empty value
    removes the item, as Nomad's); the keys templates would need `index`
    for, as warnings."""
    warnings = []
    seen: set[str] = set()
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep or not key:
            raise CliError(
                f'Failed to parse K=V data: invalid key/value pair "{pair}": '
                "format must be key=value"
            )
        if key in seen:
            raise CliError(f"Failed to parse K=V data: key {key!r} is given twice")
        seen.add(key)
        value = read_value(raw, stdin, used)
        if value == "":
            v.items.pop(key, None)
            continue
        bad = sorted({c for c in key if not (c == "_" or c.isalnum())})
        if bad:
            chars = ",".join(f'"{c}"' for c in bad)
            warnings.append(
                f"\"{key}\" contains characters [{chars}] that require the 'index' function "
                "for direct access in templates"
            )
        v.items[key] = value
    return warnings


# ------------------------------------------------------------------ output

OUT_FORMATS = ("go-template", "hcl", "json", "none", "table")


def default_out(interactive: str, redirected: str, out: TextIO) -> str:
    """Nomad's default: one format on a terminal, another when redirected."""
    return interactive if out.isatty() else redirected


def check_out(fmt: str, template: str, allowed: Sequence[str]) -> None:
    if fmt != "go-template" and template:
        raise CliError("The '-template' flag is only valid when using 'go-template' formatting")
    if fmt not in allowed:
        raise CliError(f'Invalid value for "-out"; valid values are [{", ".join(allowed)}]')
    if fmt == "go-template" and not template:
        raise CliError(
            "A template must be supplied using '-template' when using go-template formatting"
        )


def as_json(value: Any) -> str:
    return json.dumps(value, indent=2)


def render_template(text: str, data: Any) -> str:
    try:
        return Template("var", text).execute(data)
    except TemplateError as exc:
        raise CliError(str(exc)) from None


def as_hcl(v: pb.Variable) -> str:
    m = v.metadata
    width = max((len(k) for k in v.items), default=0)
    lines = [
        f'namespace    = "{m.namespace}"',
        f'path         = "{m.path}"',
        f"create_index = {m.create_index}  # Set by server",
        f"modify_index = {m.modify_index}  # Set by server; consulted for check-and-set",
        f"create_time  = {m.create_time}   # Set by server",
        f"modify_time  = {m.modify_time}   # Set by server",
        "",
        "items = {",
        *(f"  {k.rjust(width)} = {json.dumps(val)}" for k, val in sorted(v.items.items())),
        "}",
    ]
    return "\n".join(lines)


def as_table(v: pb.Variable, out: TextIO) -> None:
    m = v.metadata
    pairs: list[tuple[str, Any]] = [
        ("Namespace", m.namespace),
        ("Path", m.path),
        ("Create Time", fmt_time(m.create_time)),
    ]
    if m.modify_time != m.create_time:
        pairs.append(("Modify Time", fmt_time(m.modify_time)))
    pairs.append(("Check Index", m.modify_index))
    kv(pairs, out)
    heading("Items", out)
    if v.items:
        kv(sorted(v.items.items()), out)


def render(v: pb.Variable, fmt: str, template: str, out: TextIO) -> None:
    if fmt == "json":
        out.write(as_json(nomad_json.variable(v)) + "\n")
    elif fmt == "hcl":
        out.write(as_hcl(v) + "\n")
    elif fmt == "go-template":
        out.write(render_template(template, nomad_json.variable(v)) + "\n")
    elif fmt == "table":
        as_table(v, out)


def stdin() -> TextIO:
    return sys.stdin
