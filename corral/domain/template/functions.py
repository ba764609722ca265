"""consul-template's helper functions as Nomad offers them (template/funcs.go
and nomad_funcs.go in hashicorp/consul-template), with their argument
orders (`{{ "a,b" | split "," }}`), result types (`add` gives an int64,
`parseJSON` numbers are float64) and error texts.

Functions that need the render (env, file, the Nomad data functions,
timestamp, executeTemplate) read it from `RenderContext`, which also
collects the dependencies a render used and those it is still missing.
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import hashlib
import hmac
import json
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import re2

from corral.domain.template import encoding
from corral.domain.template.exec import FuncError, GoFunction
from corral.domain.template.nomad import (
    UNKNOWN,
    Dependency,
    FileDependency,
    NomadData,
    NomadService,
    NomadServicesSnippet,
    NomadVarItems,
    ProviderError,
    parse_service,
    parse_services,
    parse_var_get,
    parse_var_list,
)
from corral.domain.template.values import (
    MISSING,
    GoChan,
    GoList,
    GoStruct,
    Int64,
    Signature,
    Uint64,
    type_name,
)

if TYPE_CHECKING:
    from corral.domain.template.exec import Executor

MAX_FILE_BYTES = 4 * 1024 * 1024


@dataclass
class RenderContext:
    """What one render reads, and what it records for the runner."""

    env: Mapping[str, str] = field(default_factory=dict)
    namespace: str = "default"
    data: NomadData | None = None
    sandbox_dir: str | None = None
    now: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.UTC)
    used: set[Dependency] = field(default_factory=set)
    missing: set[Dependency] = field(default_factory=set)


def _ctx(ex: Executor) -> RenderContext:
    ctx = ex.context
    if not isinstance(ctx, RenderContext):
        return RenderContext()
    return ctx


# ---------------------------------------------------------------- env, file


def _env(ex: Executor, name: str) -> str:
    return _ctx(ex).env.get(name, "")


def _must_env(ex: Executor, name: str) -> str:
    value = _ctx(ex).env.get(name, "")
    if value == "":
        raise FuncError(f"required environment variable {name} is empty")
    return value


def _env_or_default(ex: Executor, name: str, default: str) -> str:
    return _ctx(ex).env.get(name, default)


def resolve_sandboxed(sandbox: str | None, path: str) -> str:
    """consul-template's resolveSandboxedPath: symlinks resolved, the result
    must stay inside the sandbox (the task directory). Relative paths are
    taken from the sandbox (Nomad's documented behaviour)."""
    if sandbox is None:
        return os.path.normpath(path)
    base = os.path.realpath(sandbox)
    target = os.path.realpath(os.path.join(base, path))
    rel = os.path.relpath(target, base)
    if rel == ".." or rel.startswith(".." + os.sep):
        raise FuncError(f"'{path}' is outside of sandbox")
    return target


def _file(ex: Executor, path: str) -> str:
    if path == "":
        return ""
    ctx = _ctx(ex)
    resolved = resolve_sandboxed(ctx.sandbox_dir, path.strip())
    dep = FileDependency(resolved)
    ctx.used.add(dep)
    try:
        with open(resolved, "rb") as fh:
            data = fh.read(MAX_FILE_BYTES + 1)
    except FileNotFoundError:
        ctx.missing.add(dep)
        return ""
    except OSError as exc:
        raise FuncError(f"file({path}): {exc.strerror or exc}") from None
    if len(data) > MAX_FILE_BYTES:
        raise FuncError(f"file({path}): larger than {MAX_FILE_BYTES} bytes")
    return data.decode("utf-8", "replace")


# ---------------------------------------------------------------- Nomad data


def _lookup(ctx: RenderContext, dep: Any, fetch: Callable[[NomadData], Any]) -> Any:
    ctx.used.add(dep)
    if ctx.data is None:
        ctx.missing.add(dep)
        return UNKNOWN
    try:
        value = fetch(ctx.data)
    except ProviderError as exc:
        raise FuncError(str(exc)) from None
    if value is UNKNOWN:
        ctx.missing.add(dep)
    return value


def _nomad_var(ex: Executor, path: str) -> Any:
    if path == "":
        return NomadVarItems()
    ctx = _ctx(ex)
    try:
        query = parse_var_get(path, ctx.namespace)
    except ProviderError as exc:
        raise FuncError(str(exc)) from None
    # nomadVar blocks until the variable exists (consul-template's
    # EnableBlocking): a variable that does not exist yet keeps it missing.
    blocking = replace(query, block=True)
    value = _lookup(ctx, blocking, lambda d: d.variable(query))
    if value is UNKNOWN:
        return NomadVarItems()
    if value is None:
        ctx.missing.add(blocking)
        return NomadVarItems()
    return value.Items


def _nomad_var_exists(ex: Executor, path: str) -> bool:
    if path == "":
        return False
    ctx = _ctx(ex)
    try:
        query = parse_var_get(path, ctx.namespace)
    except ProviderError as exc:
        raise FuncError(str(exc)) from None
    value = _lookup(ctx, query, lambda d: d.variable(query))
    return value is not UNKNOWN and value is not None


def _nomad_var_list(safe: bool) -> Callable[..., Any]:
    def fn(ex: Executor, *args: str) -> Any:
        if len(args) > 1:
            raise FuncError(
                'nomadVarList takes either a single "prefix" parameter or none for all '
                f"available variables; got: [{' '.join(args)}]"
            )
        ctx = _ctx(ex)
        try:
            query = parse_var_list(args[0] if args else "", ctx.namespace)
        except ProviderError as exc:
            raise FuncError(str(exc)) from None
        value = _lookup(ctx, query, lambda d: d.variables(query))
        if value is UNKNOWN:
            return GoList([], "[]*dependency.NomadVarMeta")
        if not value and safe:
            ctx.missing.add(query)
        return GoList(value, "[]*dependency.NomadVarMeta")

    return fn


def _nomad_service(ex: Executor, *params: Any) -> Any:
    ctx = _ctx(ex)
    try:
        if len(params) == 1:
            if not isinstance(params[0], str):
                raise FuncError("expected string for <service> argument")
            query = parse_service(params[0], ctx.namespace)
        elif len(params) == 3:
            count, key, name = params
            if type(count) is not int:
                raise FuncError("expected integer for <count> argument")
            if not isinstance(key, str):
                raise FuncError("expected string for <key> argument")
            if not isinstance(name, str):
                raise FuncError("expected string for <service> argument")
            query = parse_service(name, ctx.namespace, choose=f"{count}|{key}")
        else:
            raise FuncError("expected arguments <service> or <count> <key> <service>")
    except ProviderError as exc:
        raise FuncError(str(exc)) from None
    value = _lookup(ctx, query, lambda d: d.service(query))
    if value is UNKNOWN:
        return None
    return GoList(value, "[]*dependency.NomadService")


def _nomad_services(ex: Executor, *args: str) -> Any:
    ctx = _ctx(ex)
    try:
        query = parse_services("".join(args), ctx.namespace)
    except ProviderError as exc:
        raise FuncError(str(exc)) from None
    value = _lookup(ctx, query, lambda d: d.services(query))
    if value is UNKNOWN:
        return GoList([], "[]*dependency.NomadServicesSnippet")
    return GoList(value, "[]*dependency.NomadServicesSnippet")


# ---------------------------------------------------------------- encodings


def _b64decode(s: str, urlsafe: bool, name: str) -> str:
    try:
        data = (base64.urlsafe_b64decode if urlsafe else base64.b64decode)(
            s.encode(), **({} if urlsafe else {"validate": True})
        )
    except (binascii.Error, ValueError) as exc:
        raise FuncError(f"{name}: illegal base64 data: {exc}") from None
    return data.decode("utf-8", "replace")


def _base64_decode(s: str) -> str:
    return _b64decode(s, False, "base64Decode")


def _base64_encode(s: str) -> str:
    return base64.b64encode(s.encode()).decode()


def _base64_url_decode(s: str) -> str:
    return _b64decode(s, True, "base64URLDecode")


def _base64_url_encode(s: str) -> str:
    return base64.urlsafe_b64encode(s.encode()).decode()


def _to_json(ex: Executor, value: Any) -> str:
    return encoding.to_json(value, max_len=ex.limits.max_value_len)


def _to_json_pretty(ex: Executor, value: Any) -> str:
    return encoding.to_json(value, indent="  ", max_len=ex.limits.max_value_len)


def _to_unescaped_json(ex: Executor, value: Any) -> str:
    return encoding.to_json(value, escape_html=False, max_len=ex.limits.max_value_len)


def _to_unescaped_json_pretty(ex: Executor, value: Any) -> str:
    return encoding.to_json(value, indent="  ", escape_html=False, max_len=ex.limits.max_value_len)


def _to_yaml(ex: Executor, value: Any) -> str:
    return encoding.to_yaml(value, ex.limits.max_value_len)


def from_json(s: str) -> Any:
    """JSON as Go's encoding/json decodes it into interface{}: numbers are
    float64."""
    encoding.check_json_depth(s)
    try:
        return json.loads(s, parse_int=float, parse_constant=_bad_constant)
    except json.JSONDecodeError as exc:
        raise FuncError(_json_error(exc)) from None


def _bad_constant(name: str) -> Any:
    raise json.JSONDecodeError(
        f"invalid character '{name[0]}' looking for beginning of value", name, 0
    )


def _json_error(exc: json.JSONDecodeError) -> str:
    if exc.msg.startswith("invalid character"):
        return exc.msg
    if exc.msg.startswith("Expecting value") and exc.pos >= len(exc.doc):
        return "unexpected end of JSON input"
    ch = exc.doc[exc.pos : exc.pos + 1]
    if not ch:
        return "unexpected end of JSON input"
    return f"invalid character {_char(ch)} {exc.msg[0].lower() + exc.msg[1:]}"


def _char(ch: str) -> str:
    return "'" + ch + "'" if ch != "'" else "'\\''"


def _parse_json(s: str) -> Any:
    if s == "":
        return {}
    return from_json(s)


def _parse_yaml(s: str) -> Any:
    if s == "":
        return {}
    return encoding.parse_yaml(s)


# ---------------------------------------------------------------- parsing


def _go_number_error(fn: str, s: str, what: str = "invalid syntax") -> FuncError:
    from corral.domain.template.gofmt import quote

    return FuncError(f"{fn}: strconv.{fn[0].upper() + fn[1:]}: parsing {quote(s)}: {what}")


def _parse_bool(s: str) -> bool:
    if s == "":
        return False
    if s in ("1", "t", "T", "TRUE", "true", "True"):
        return True
    if s in ("0", "f", "F", "FALSE", "false", "False"):
        return False
    raise _go_number_error("parseBool", s)


def _parse_float(s: str) -> float:
    if s == "":
        return 0.0
    from corral.domain.template.parser import _parse_float as go_float

    try:
        return go_float(s)
    except ValueError:
        raise _go_number_error("parseFloat", s) from None


def _parse_int(s: str) -> Int64:
    if s == "":
        return Int64(0)
    body = s[1:] if s[:1] in "+-" and s[:1] else s
    if not body.isdigit() or not body.isascii():
        raise _go_number_error("parseInt", s)
    n = int(s)
    if not -(1 << 63) <= n < 1 << 63:
        raise _go_number_error("parseInt", s, "value out of range")
    return Int64(n)


def _parse_uint(s: str) -> Uint64:
    if s == "":
        return Uint64(0)
    if not s.isdigit() or not s.isascii():
        raise _go_number_error("parseUint", s)
    n = int(s)
    if n >= 1 << 64:
        raise _go_number_error("parseUint", s, "value out of range")
    return Uint64(n)


# ---------------------------------------------------------------- strings


def _split(ex: Executor, sep: str, s: str) -> GoList:
    s = s.strip()
    if s == "":
        return GoList([], "[]string")
    return GoList(go_split(s, sep, ex.limits.max_items), "[]string")


def go_split(s: str, sep: str, limit: int) -> list[str]:
    """strings.Split, refusing results longer than `limit` items before
    building them."""
    count = len(s) if sep == "" else s.count(sep) + 1
    if count > limit:
        raise FuncError(f"split: more than {limit} parts")
    return list(s) if sep == "" else s.split(sep)


def _split_to_map(sep1: str, sep2: str, s: str) -> dict[str, str]:
    s = s.strip()
    out: dict[str, str] = {}
    if s == "":
        return out
    for part in s.split(sep1):
        k, found, v = part.partition(sep2)
        if found:
            out[k] = v
    return out


def _join(ex: Executor, sep: str, items: list[str]) -> str:
    total = sum(len(x) for x in items) + len(sep) * max(len(items) - 1, 0)
    if total > ex.limits.max_value_len:
        raise FuncError(f"join: result exceeds the limit of {ex.limits.max_value_len} characters")
    return sep.join(items)


def go_title(s: str) -> str:
    """cases.Title(language.Und, cases.NoLower): upper-case the first letter
    of each word, leave the rest as is."""
    out = []
    prev_letter = False
    for ch in s:
        is_word = ch.isalnum() or ch in "'’"
        out.append(ch.upper() if is_word and not prev_letter else ch)
        prev_letter = is_word
    return "".join(out)


def go_trim_space(s: str) -> str:
    return s.strip(
        " \t\n\r\v\f\u0085\u00a0\u1680\u2000\u2001\u2002\u2003\u2004\u2005"
        "\u2006\u2007\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000"
    )


def _indent(spaces: int, s: str) -> str:
    if spaces < 0:
        raise FuncError("indent value must be a positive integer")
    prefix = " " * spaces
    out = []
    at_line_start = True
    for ch in s:
        if at_line_start and ch != "\n":
            out.append(prefix)
        out.append(ch)
        at_line_start = ch == "\n"
    return "".join(out)


def compile_re2(pattern: str) -> Any:
    try:
        return re2.compile(pattern)
    except re2.error as exc:
        raise FuncError(f"error parsing regexp: {exc}") from None


def go_expand(template: str, match: Any) -> str:
    """regexp.Expand for ReplaceAllString: $1, ${1}, $name, ${name}, $$."""
    out = []
    i = 0
    while i < len(template):
        ch = template[i]
        if ch != "$" or i + 1 >= len(template):
            out.append(ch)
            i += 1
            continue
        nxt = template[i + 1]
        if nxt == "$":
            out.append("$")
            i += 2
            continue
        if nxt == "{":
            end = template.find("}", i + 2)
            if end < 0:
                out.append(ch)
                i += 1
                continue
            name = template[i + 2 : end]
            i = end + 1
        else:
            j = i + 1
            while j < len(template) and (template[j].isalnum() or template[j] == "_"):
                j += 1
            if j == i + 1:
                out.append(ch)
                i += 1
                continue
            name = template[i + 1 : j]
            i = j
        try:
            group = match.group(int(name)) if name.isdigit() else match.group(name)
        except (IndexError, KeyError, re2.error):
            group = ""
        out.append(group or "")
    return "".join(out)


def _regex_replace_all(ex: Executor, pattern: str, repl: str, s: str) -> str:
    rx = compile_re2(pattern)
    result = rx.sub(lambda m: go_expand(repl, m), s)
    if len(result) > ex.limits.max_value_len:
        raise FuncError("result exceeds the limit")
    return str(result)


def _regex_match(pattern: str, s: str) -> bool:
    return compile_re2(pattern).search(s) is not None


def _replace_all(ex: Executor, old: str, new: str, s: str) -> str:
    count = len(s) + 1 if old == "" else s.count(old)
    if len(s) + count * (len(new) - len(old)) > ex.limits.max_value_len:
        raise FuncError("result exceeds the limit")
    if old == "":
        # Go inserts `new` before each rune and at the end.
        return new + new.join(s) + new if s else new
    return s.replace(old, new)


def _timestamp(ex: Executor, *args: str) -> str:
    now = _ctx(ex).now().astimezone(dt.UTC)
    if not args:
        return encoding.go_time_format(now, encoding.RFC3339)
    if len(args) == 1:
        if args[0] == "unix":
            return str(int(now.timestamp()))
        return encoding.go_time_format(now, args[0])
    raise FuncError(f"timestamp: wrong number of arguments, expected 0 or 1, but got {len(args)}")


def _sha256_hex(s: str) -> str:
    return hashlib.sha256(s.encode()).hexdigest()


def _md5sum(s: str) -> str:
    return hashlib.md5(s.encode(), usedforsecurity=False).hexdigest()


def _hmac_sha256_hex(message: str, key: str) -> str:
    return hmac.new(key.encode(), message.encode(), hashlib.sha256).hexdigest()


# ---------------------------------------------------------------- collections


def _elements(value: Any) -> list[Any] | None:
    if isinstance(value, list | tuple):
        return list(value)
    return None


def _in(container: Any, needle: Any) -> bool:
    """consul-template's `in`: a string contains a substring of the same
    type; a list contains an int, float or string equal to the needle."""
    if isinstance(container, str):
        return isinstance(needle, str) and needle in container
    items = _elements(container)
    if items is None:
        return False
    for item in items:
        if item is None:
            continue
        if isinstance(item, int) and not isinstance(item, bool):
            if (
                isinstance(needle, int)
                and not isinstance(needle, bool)
                and int(needle) == int(item)
            ):
                return True
        elif isinstance(item, float):
            if isinstance(needle, float) and needle == item:
                return True
        elif isinstance(item, str) and isinstance(needle, str) and item == needle:
            return True
    return False


def _contains(needle: Any, container: Any) -> bool:
    return _in(container, needle)


def _contains_some(ret_true: bool, invert: bool) -> Callable[[Any, Any], bool]:
    def fn(needles: list[Any], container: Any) -> bool:
        for needle in needles:
            if _in(container, needle) != invert:
                return not ret_true
        return ret_true

    return fn


def _tags_of(item: Any) -> list[str]:
    tags = (
        item.go_field("Tags") if isinstance(item, GoStruct) and "Tags" in item.go_fields else None
    )
    return list(tags or [])


def _by_tag(value: Any) -> dict[str, list[Any]]:
    out: dict[str, list[Any]] = {}
    if value is None:
        return out
    if not isinstance(value, list) or not all(
        isinstance(v, NomadService | NomadServicesSnippet) for v in value
    ):
        raise FuncError(f"byTag: wrong argument type {type_name(value)}")
    for item in value:
        for tag in _tags_of(item):
            out.setdefault(tag, GoList([], "[]interface {}")).append(item)
    return out


def _by_port(value: Any) -> dict[int, list[Any]]:
    out: dict[int, list[Any]] = {}
    if value is None:
        return out
    if not isinstance(value, list) or not all(isinstance(v, NomadService) for v in value):
        raise FuncError(f"byPort: wrong argument type {type_name(value)}")
    for item in value:
        out.setdefault(item.Port, GoList([], "[]interface {}")).append(item)
    return out


def _pair(item: Any) -> tuple[str, Any]:
    if isinstance(item, GoStruct) and "Key" in item.go_fields and "Value" in item.go_fields:
        return str(item.go_field("Key")), item
    if isinstance(item, dict) and "Key" in item:
        return str(item["Key"]), item
    raise FuncError(f"wrong type for value; expected []*dependency.KeyPair; got {type_name(item)}")


def _by_key(pairs: list[Any]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for item in pairs:
        key, obj = _pair(item)
        top, _, rest = key.partition("/")
        if rest == "":
            continue
        out.setdefault(top, {})[rest] = obj
    return out


def _explode_into(m: dict[str, Any], key: str, value: Any, full: str) -> None:
    if "/" in key:
        top, _, rest = key.partition("/")
        nest = m.setdefault(top, {})
        if not isinstance(nest, dict):
            from corral.domain.template.gofmt import quote, sprint

            raise FuncError(
                f"not a map: {quote(full)}: {quote(top)} already has value {quote(sprint([nest]))}"
            )
        _explode_into(nest, rest, value, key)
    elif key:
        m[key] = value


def _explode(pairs: list[Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for item in pairs:
        key, obj = _pair(item)
        value = obj.go_field("Value") if isinstance(obj, GoStruct) else obj.get("Value")
        try:
            _explode_into(out, key, value, key)
        except FuncError as exc:
            raise FuncError(f"explode: {exc}") from None
    return out


def _explode_map(m: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key in sorted(m):
        try:
            _explode_into(out, str(key), m[key], str(key))
        except FuncError as exc:
            raise FuncError(f"explodeMap: {exc}") from None
    return out


def _merge(dst: dict[str, Any], src: dict[str, Any], override: bool) -> dict[str, Any]:
    """mergo.Map: keys missing (or empty) in dst come from src, recursively;
    with override src wins."""
    out = dict(dst)
    for key, value in src.items():
        if key in out and isinstance(out[key], dict) and isinstance(value, dict):
            out[key] = _merge(out[key], value, override)
        elif key not in out or override or _is_empty(out[key]):
            out[key] = value
    return out


def _is_empty(v: Any) -> bool:
    return (
        v is None or v is MISSING or v in ("", 0, False) or (isinstance(v, list | dict) and not v)
    )


def _merge_map(dst: dict[str, Any], src: dict[str, Any]) -> dict[str, Any]:
    return _merge(dst, src, False)


def _merge_map_override(dst: dict[str, Any], src: dict[str, Any]) -> dict[str, Any]:
    return _merge(dst, src, True)


def _loop(*args: Any) -> GoChan:
    def to_int(v: Any) -> int:
        if isinstance(v, int) and not isinstance(v, bool):
            return int(v)
        if isinstance(v, str):
            return int(_parse_int(v))
        raise FuncError(f"loop: bad argument type: {type_name(v)}")

    if len(args) == 1:
        start, stop = 0, to_int(args[0])
    elif len(args) == 2:
        start, stop = to_int(args[0]), to_int(args[1])
    else:
        raise FuncError(f"loop: wrong number of arguments, expected 1 or 2, but got {len(args)}")
    return GoChan(start, stop)


# ---------------------------------------------------------------- math


def _num_kind(v: Any) -> str | None:
    if isinstance(v, bool):
        return None
    if isinstance(v, Uint64):
        return "uint"
    if isinstance(v, int):
        return "int"
    if isinstance(v, float):
        return "float"
    return None


def _math(
    name: str, op: Callable[[Any, Any], Any], floats: bool = True
) -> Callable[[Any, Any], Any]:
    def fn(b: Any, a: Any) -> Any:
        from corral.domain.template.gofmt import quote, sprint

        ka, kb = _num_kind(a), _num_kind(b)
        if ka is None or (ka == "float" and not floats):
            raise FuncError(f"{name}: unknown type for {quote(sprint([a]))} ({type_name(a)})")
        if kb is None or (kb == "float" and not floats):
            raise FuncError(f"{name}: unknown type for {quote(sprint([b]))} ({type_name(b)})")
        if "float" in (ka, kb):
            return float(op(float(a), float(b)))
        if ka == "uint" and kb == "uint":
            return Uint64(op(int(a), int(b)) % (1 << 64))
        result = op(int(a), int(b))
        return Int64(((result + (1 << 63)) % (1 << 64)) - (1 << 63))

    return fn


def _go_div(a: Any, b: Any) -> Any:
    if isinstance(a, float) or isinstance(b, float):
        if b == 0:
            return float("inf") if a > 0 else float("-inf") if a < 0 else float("nan")
        return a / b
    if b == 0:
        raise FuncError("runtime error: integer divide by zero")
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b >= 0) else -q


def _go_mod(a: int, b: int) -> int:
    if b == 0:
        raise FuncError("runtime error: integer divide by zero")
    r = abs(a) % abs(b)
    return r if a >= 0 else -r


def _min_max(name: str, pick_min: bool) -> Callable[[Any, Any], Any]:
    def fn(b: Any, a: Any) -> Any:
        from corral.domain.template.gofmt import quote, sprint

        for v in (a, b):
            if _num_kind(v) is None:
                raise FuncError(f"{name}: unknown type for {quote(sprint([v]))} ({type_name(v)})")
        chosen = a if ((a < b) if pick_min else (a > b)) else b
        if isinstance(chosen, float):
            return chosen
        return chosen if isinstance(chosen, Uint64) else Int64(chosen)

    return fn


def _denied(*_: Any) -> str:
    raise FuncError("function is disabled")


# ---------------------------------------------------------------- execute


def _execute_template(ex: Executor, name: str, *data: Any) -> str:
    if len(data) > 1:
        raise FuncError(
            f"executeTemplate: wrong number of arguments, expected 1 or 2, but got {len(data) + 1}"
        )
    dot = data[0] if data else None
    return ex.execute_template(name, MISSING if dot is None else dot)


def sockaddr_function(ex: Executor, *args: str) -> str:
    from corral.domain.template.sockaddr import evaluate

    return evaluate(" ".join(args))


S, A, V = "string", "any", "value"


def _f(
    fn: Callable[..., Any],
    params: tuple[str, ...] = (),
    variadic: str | None = None,
    ex: bool = False,
) -> GoFunction:
    return GoFunction(fn, Signature(params, variadic), needs_exec=ex)


CONSUL_TEMPLATE_FUNCS: dict[str, GoFunction] = {
    "env": _f(_env, (S,), ex=True),
    "mustEnv": _f(_must_env, (S,), ex=True),
    "envOrDefault": _f(_env_or_default, (S, S), ex=True),
    "file": _f(_file, (S,), ex=True),
    "executeTemplate": _f(_execute_template, (S,), A, ex=True),
    # Nomad
    "nomadVar": _f(_nomad_var, (S,), ex=True),
    "nomadVarExists": _f(_nomad_var_exists, (S,), ex=True),
    "nomadVarList": _f(_nomad_var_list(False), (), S, ex=True),
    "nomadVarListSafe": _f(_nomad_var_list(True), (), S, ex=True),
    "nomadService": _f(_nomad_service, (), A, ex=True),
    "nomadServices": _f(_nomad_services, (), S, ex=True),
    # helpers
    "base64Decode": _f(_base64_decode, (S,)),
    "base64Encode": _f(_base64_encode, (S,)),
    "base64URLDecode": _f(_base64_url_decode, (S,)),
    "base64URLEncode": _f(_base64_url_encode, (S,)),
    "byKey": _f(_by_key, ("[]any",)),
    "byPort": _f(_by_port, (A,)),
    "byTag": _f(_by_tag, (A,)),
    "contains": _f(_contains, (A, A)),
    "containsAll": _f(_contains_some(True, True), ("[]any", A)),
    "containsAny": _f(_contains_some(False, False), ("[]any", A)),
    "containsNone": _f(_contains_some(True, False), ("[]any", A)),
    "containsNotAll": _f(_contains_some(False, True), ("[]any", A)),
    "explode": _f(_explode, ("[]any",)),
    "explodeMap": _f(_explode_map, ("map",)),
    "mergeMap": _f(_merge_map, ("map", "map")),
    "mergeMapWithOverride": _f(_merge_map_override, ("map", "map")),
    "in": _f(_in, (A, A)),
    "indent": _f(_indent, ("int", S)),
    "loop": _f(_loop, (), A),
    "join": _f(_join, (S, "[]string"), ex=True),
    "trim": _f(lambda cutset, s: s.strip(cutset) if cutset else s, (S, S)),
    "trimPrefix": _f(lambda p, s: s[len(p) :] if p and s.startswith(p) else s, (S, S)),
    "trimSuffix": _f(lambda p, s: s[: -len(p)] if p and s.endswith(p) else s, (S, S)),
    "trimSpace": _f(go_trim_space, (S,)),
    "parseBool": _f(_parse_bool, (S,)),
    "parseFloat": _f(_parse_float, (S,)),
    "parseInt": _f(_parse_int, (S,)),
    "parseJSON": _f(_parse_json, (S,)),
    "parseUint": _f(_parse_uint, (S,)),
    "parseYAML": _f(_parse_yaml, (S,)),
    "plugin": _f(_denied, (), S),
    "writeToFile": _f(_denied, (), S),
    "regexReplaceAll": _f(_regex_replace_all, (S, S, S), ex=True),
    "regexMatch": _f(_regex_match, (S, S)),
    "replaceAll": _f(_replace_all, (S, S, S), ex=True),
    "sha256Hex": _f(_sha256_hex, (S,)),
    "md5sum": _f(_md5sum, (S,)),
    "hmacSHA256Hex": _f(_hmac_sha256_hex, (S, S)),
    "split": _f(_split, (S, S), ex=True),
    "splitToMap": _f(_split_to_map, (S, S, S)),
    "timestamp": _f(_timestamp, (), S, ex=True),
    "toLower": _f(str.lower, (S,)),
    "toUpper": _f(str.upper, (S,)),
    "toTitle": _f(go_title, (S,)),
    "toJSON": _f(_to_json, (A,), ex=True),
    "toJSONPretty": _f(_to_json_pretty, (A,), ex=True),
    "toUnescapedJSON": _f(_to_unescaped_json, (A,), ex=True),
    "toUnescapedJSONPretty": _f(_to_unescaped_json_pretty, (A,), ex=True),
    "toYAML": _f(_to_yaml, (A,), ex=True),
    "sockaddr": _f(sockaddr_function, (), S, ex=True),
    # math
    "add": _f(_math("add", lambda a, b: a + b), (A, A)),
    "subtract": _f(_math("subtract", lambda a, b: a - b), (A, A)),
    "multiply": _f(_math("multiply", lambda a, b: a * b), (A, A)),
    "divide": _f(_math("divide", _go_div), (A, A)),
    "modulo": _f(_math("modulo", _go_mod, floats=False), (A, A)),
    "minimum": _f(_min_max("minimum", True), (A, A)),
    "maximum": _f(_min_max("maximum", False), (A, A)),
}

# Functions Nomad's renderer has that read Consul or Vault, or debug Go
# values: refused at parse time with a reason instead of "not defined".
_CONSUL = "it reads Consul, which Corral does not have"
_VAULT = "it reads Vault, which Corral does not have"
REFUSED: dict[str, str] = {
    **dict.fromkeys(
        (
            "datacenters",
            "exportedServices",
            "importedServices",
            "key",
            "keyExists",
            "keyOrDefault",
            "ls",
            "safeLs",
            "node",
            "nodes",
            "partitions",
            "peerings",
            "service",
            "connect",
            "services",
            "tree",
            "safeTree",
            "caRoots",
            "caLeaf",
            "byMeta",
        ),
        _CONSUL,
    ),
    **dict.fromkeys(("secret", "secrets", "pkiCert"), _VAULT),
    "scratch": "",
    "toTOML": "",
    **dict.fromkeys(("spew_dump", "spew_sdump", "spew_printf", "spew_sprintf"), ""),
}
