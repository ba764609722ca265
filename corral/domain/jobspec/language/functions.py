"""The functions a Nomad job file may call: exactly the set Nomad's
jobspec2/functions.go registers (cty's stdlib, go-cty-funcs' cidr, crypto,
encoding, filesystem and uuid packages, go-cty-yaml, HCL's try/can and
typeexpr's convert), with their semantics. Filesystem functions read
relative to the job file's directory and are disabled where Nomad disables
them (the HTTP API's /v1/jobs/parse)."""

from __future__ import annotations

import base64
import binascii
import csv
import glob
import hashlib
import io
import ipaddress
import json
import math
import os
import re
import urllib.parse
import uuid
from collections.abc import Callable
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import re2  # type: ignore[import-untyped]

from corral.domain.jobspec import limits
from corral.domain.jobspec.duration import parse_duration
from corral.domain.jobspec.language import nodes as n
from corral.domain.jobspec.language.errors import HclError
from corral.domain.jobspec.language.evaluate import (
    MAX_ITEMS,
    MAX_STRING,
    Evaluator,
    Function,
    FunctionError,
    LazyFunction,
    Scope,
)
from corral.domain.jobspec.language.parser import MAX_DEPTH
from corral.domain.jobspec.language.types import (
    NUMBER,
    STRING,
    ConvertError,
    SetValue,
    TypeExprError,
    convert,
    equal,
    format_number,
    kind_of,
    make_set,
    normalize_number,
    type_from_expr,
)

# --------------------------------------------------------------- argument helpers


def _s(value: Any, what: str = "argument") -> str:
    if value is None:
        raise FunctionError(f"the {what} must not be null")
    try:
        return str(convert(value, STRING))
    except ConvertError:
        raise FunctionError(f"the {what} must be a string, got {kind_of(value)}") from None


def _num(value: Any, what: str = "argument") -> int | float:
    if value is None:
        raise FunctionError(f"the {what} must not be null")
    try:
        result = convert(value, NUMBER)
    except ConvertError:
        raise FunctionError(f"the {what} must be a number, got {kind_of(value)}") from None
    assert isinstance(result, int | float)
    return result


def _int(value: Any, what: str = "argument") -> int:
    num = _num(value, what)
    if not isinstance(num, int):
        raise FunctionError(f"the {what} must be a whole number, got {format_number(num)}")
    return num


def _list(value: Any, what: str = "argument") -> list[Any]:
    if not isinstance(value, list):
        raise FunctionError(f"the {what} must be a list, got {kind_of(value)}")
    return value


def _map(value: Any, what: str = "argument") -> dict[str, Any]:
    if not isinstance(value, dict):
        raise FunctionError(f"the {what} must be a map or object, got {kind_of(value)}")
    return value


def _bounded(n_items: int) -> None:
    if n_items > MAX_ITEMS:
        raise FunctionError(f"the result would have more than {MAX_ITEMS} elements")


# --------------------------------------------------------------- strings


def chomp(s: Any) -> str:
    return re.sub(r"(?:\r\n|\r|\n)+\Z", "", _s(s))


def indent(spaces: Any, s: Any) -> str:
    count = _int(spaces, "number of spaces")
    if not 0 <= count <= 1000:
        raise FunctionError("the number of spaces must be between 0 and 1000")
    lines = _s(s).split("\n")
    return ("\n" + " " * count).join(lines)


def join(sep: Any, *lists: Any) -> str:
    if not lists:
        raise FunctionError("at least one list is required")
    items: list[str] = []
    for lst in lists:
        for v in _list(lst, "list"):
            if v is None:
                raise FunctionError("the list must not hold null values")
            items.append(_s(v, "list element"))
    return _s(sep, "separator").join(items)


def title(s: Any) -> str:
    out: list[str] = []
    prev_letter = False
    for ch in _s(s):
        out.append(ch.upper() if not prev_letter and ch.isalpha() else ch)
        prev_letter = ch.isalpha() or ch.isdigit() or ch == "_" or ch == "'"
    return "".join(out)


def trim(s: Any, cutset: Any) -> str:
    return _s(s).strip(_s(cutset, "cutset"))


def trimprefix(s: Any, prefix: Any) -> str:
    return _s(s).removeprefix(_s(prefix, "prefix"))


def trimsuffix(s: Any, suffix: Any) -> str:
    return _s(s).removesuffix(_s(suffix, "suffix"))


def replace(s: Any, substr: Any, repl: Any) -> str:
    text, old, new = _s(s), _s(substr, "substring"), _s(repl, "replacement")
    if old == "":
        # Go's strings.Replace inserts around every character for an empty old
        return new + new.join(text) + new if text else new
    return text.replace(old, new)


def _go_replacement(repl: str) -> str:
    """Go's regexp expansion ($1, ${1}, ${name}, $$) in re2's syntax."""
    out: list[str] = []
    i = 0
    while i < len(repl):
        c = repl[i]
        if c == "\\":
            out.append("\\\\")
            i += 1
        elif c == "$" and i + 1 < len(repl):
            if repl[i + 1] == "$":
                out.append("$")
                i += 2
                continue
            m = re.compile(r"\{(\w+)\}|(\w+)").match(repl, i + 1)
            if not m:
                out.append("$")
                i += 1
                continue
            name = m.group(1) or m.group(2)
            out.append(f"\\g<{name}>")
            i = m.end()
        else:
            out.append(c)
            i += 1
    return "".join(out)


def regex_replace(s: Any, pattern: Any, repl: Any) -> str:
    try:
        rx = re2.compile(_s(pattern, "pattern"))
    except re2.error as exc:
        raise FunctionError(f"invalid regular expression: {exc}") from None
    try:
        return str(rx.sub(_go_replacement(_s(repl, "replacement")), _s(s)))
    except (re2.error, IndexError, KeyError) as exc:
        raise FunctionError(f"invalid replacement: {exc}") from None


def split(sep: Any, s: Any) -> list[str]:
    text, separator = _s(s), _s(sep, "separator")
    if separator == "":
        return list(text)
    return text.split(separator)


def strlen(s: Any) -> int:
    return len(_s(s))


def strrev(s: Any) -> str:
    return _s(s)[::-1]


def substr(s: Any, offset: Any, length: Any) -> str:
    text = _s(s)
    off, ln = _int(offset, "offset"), _int(length, "length")
    if off < 0:
        off = len(text) + off
        if off < 0:
            off = 0
    if off > len(text):
        return ""
    if ln < 0:
        return text[off:]
    return text[off : off + ln]


_VERB = re.compile(r"%(\[\d+\])?([-+# 0]*)(\d+|\*)?(?:\.(\d+))?(\[\d+\])?([a-zA-Z%])")


def _format_one(flags: str, width: str | None, prec: str | None, verb: str, value: Any) -> str:
    if width and int(width) > 10_000 or prec and int(prec) > 10_000:
        raise FunctionError("a format width or precision above 10000 is not allowed")
    spec = "%" + flags.replace("#", "") + (width or "") + (f".{prec}" if prec is not None else "")
    if verb == "v":
        if isinstance(value, list | dict):
            return jsonencode(value)
        if value is None:
            return "null"
        return _s(value, "value")
    if value is None:
        raise FunctionError(f"unsupported value for %{verb}: null")
    if verb == "s":
        return (spec + "s") % _s(value, "value")
    if verb == "q":
        return (spec + "s") % json.dumps(_s(value, "value"), ensure_ascii=False)
    if verb == "t":
        if not isinstance(value, bool):
            if value in ("true", "false"):
                value = value == "true"
            else:
                raise FunctionError(f"%t requires a bool, got {kind_of(value)}")
        return (spec + "s") % ("true" if value else "false")
    num = _num(value, "value")
    if verb in "dboxX":
        if not isinstance(num, int):
            raise FunctionError(f"%{verb} requires a whole number, got {format_number(num)}")
        if verb == "b":
            digits = format(abs(num), "b")
            sign = "-" if num < 0 else ("+" if "+" in flags else "")
            text = sign + digits
            w = int(width or 0)
            return text.ljust(w) if "-" in flags else text.rjust(w, "0" if "0" in flags else " ")
        return (spec + verb) % num
    if verb in "eEfFgG":
        return (spec + verb.replace("F", "f")) % float(num)
    raise FunctionError(f"unsupported format verb %{verb}")


def format_(fmt: Any, *args: Any) -> str:
    spec = _s(fmt, "format")
    out: list[str] = []
    pos = 0
    argi = 0
    for m in _VERB.finditer(spec):
        out.append(spec[pos : m.start()])
        pos = m.end()
        idx1, flags, width, prec, idx2, verb = m.groups()
        if verb == "%" and not (idx1 or flags or width or prec):
            out.append("%")
            continue
        if idx1 or idx2:
            argi = int((idx1 or idx2)[1:-1]) - 1
        if width == "*":
            raise FunctionError("'*' widths are not supported")
        if argi >= len(args) or argi < 0:
            raise FunctionError(f"not enough arguments for {spec!r}")
        out.append(_format_one(flags, width, prec, verb, args[argi]))
        argi += 1
    out.append(spec[pos:])
    if argi < len(args) and not any(m.group(1) or m.group(5) for m in _VERB.finditer(spec)):
        raise FunctionError(f"too many arguments for {spec!r}")
    return "".join(out)


def formatlist(fmt: Any, *args: Any) -> list[str]:
    length: int | None = None
    for a in args:
        if isinstance(a, list):
            if (
                length is not None
                and len(a) != len(length_list := a)
                and length != len(length_list)
            ):
                raise FunctionError("all list arguments must have the same length")
            length = len(a)
    if length is None:
        return [format_(fmt, *args)]
    return [
        format_(fmt, *[a[i] if isinstance(a, list) else a for a in args]) for i in range(length)
    ]


# --------------------------------------------------------------- collections


def chunklist(lst: Any, size: Any) -> list[list[Any]]:
    items, step = _list(lst), _int(size, "size")
    if step < 0:
        raise FunctionError("the size must not be negative")
    if step == 0:
        return [list(items)]
    return [items[i : i + step] for i in range(0, len(items), step)]


def coalesce(*values: Any) -> Any:
    for v in values:
        if v is None or v == "":
            continue
        return v
    raise FunctionError("no non-null, non-empty-string arguments")


def coalescelist(*lists: Any) -> Any:
    for lst in lists:
        if _list(lst) and len(lst) > 0:
            return lst
    raise FunctionError("no non-empty list arguments")


def compact(lst: Any) -> list[Any]:
    return [v for v in _list(lst) if v is not None and v != ""]


def concat(*lists: Any) -> list[Any]:
    out: list[Any] = []
    for lst in lists:
        out.extend(_list(lst))
    _bounded(len(out))
    return out


def contains(lst: Any, value: Any) -> bool:
    return any(equal(v, value) for v in _list(lst))


def distinct(lst: Any) -> list[Any]:
    out: list[Any] = []
    for v in _list(lst):
        if not any(equal(v, o) for o in out):
            out.append(v)
    return out


def element(lst: Any, index: Any) -> Any:
    items, i = _list(lst), _int(index, "index")
    if not items:
        raise FunctionError("cannot use element function with an empty list")
    if i < 0:
        raise FunctionError("cannot use element function with a negative index")
    return items[i % len(items)]


def flatten(lst: Any) -> list[Any]:
    out: list[Any] = []

    def walk(items: list[Any]) -> None:
        for v in items:
            if isinstance(v, list):
                walk(v)
            else:
                out.append(v)

    walk(_list(lst))
    return out


def index_(lst: Any, value: Any) -> int:
    for i, v in enumerate(_list(lst)):
        if equal(v, value):
            return i
    raise FunctionError("item not found")


def keys(m: Any) -> list[str]:
    return sorted(_map(m))


def values(m: Any) -> list[Any]:
    d = _map(m)
    return [d[k] for k in sorted(d)]


def length(v: Any) -> int:
    if isinstance(v, str):
        return len(v)
    if isinstance(v, list | dict):
        return len(v)
    raise FunctionError(f"a string, list or map is required, got {kind_of(v)}")


def lookup(m: Any, key: Any, *default: Any) -> Any:
    d, k = _map(m), _s(key, "key")
    if k in d:
        return d[k]
    if len(default) == 1:
        return default[0]
    if len(default) > 1:
        raise FunctionError("lookup takes at most three arguments")
    raise FunctionError(f"the map has no key {k!r}")


def merge(*maps: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for m in maps:
        if m is None:
            continue
        out.update(_map(m))
    return out


def range_(*args: Any) -> list[int | float]:
    nums = [_num(a) for a in args]
    start: int | float
    limit: int | float
    step: int | float
    if len(nums) == 1:
        start, limit, step = 0, nums[0], 1 if nums[0] >= 0 else -1
    elif len(nums) == 2:
        start, limit = nums
        step = 1 if limit >= start else -1
    elif len(nums) == 3:
        start, limit, step = nums
    else:
        raise FunctionError("range takes one, two or three numbers")
    if step == 0:
        raise FunctionError("the step must not be zero")
    if (limit - start) / step > MAX_ITEMS:
        raise FunctionError(f"the range would have more than {MAX_ITEMS} elements")
    if (step > 0 and limit < start) or (step < 0 and limit > start):
        raise FunctionError("the step goes away from the limit")
    out: list[int | float] = []
    v = start
    while (step > 0 and v < limit) or (step < 0 and v > limit):
        out.append(normalize_number(v))
        v += step
    return out


def reverse(lst: Any) -> list[Any]:
    return list(reversed(_list(lst)))


def setintersection(first: Any, *others: Any) -> SetValue:
    base = make_set(_list(first))
    for o in others:
        other = _list(o)
        base = make_set([v for v in base if any(equal(v, x) for x in other)])
    return base


def setunion(*sets: Any) -> SetValue:
    out: list[Any] = []
    for s in sets:
        out.extend(_list(s))
    return make_set(out)


def setproduct(*sets: Any) -> list[list[Any]]:
    if len(sets) < 2:
        raise FunctionError("at least two arguments are required")
    result: list[list[Any]] = [[]]
    for s in sets:
        result = [r + [v] for r in result for v in _list(s)]
        _bounded(len(result))
    if any(isinstance(s, SetValue) for s in sets):
        return make_set(result)
    return result


def slice_(lst: Any, start: Any, end: Any) -> list[Any]:
    items, a, b = _list(lst), _int(start, "start index"), _int(end, "end index")
    if a < 0 or b > len(items) or a > b:
        raise FunctionError(f"the indexes {a}..{b} are out of range for a list of {len(items)}")
    return items[a:b]


def sort(lst: Any) -> list[str]:
    items = _list(lst)
    if any(v is None for v in items):
        raise FunctionError("the list must not hold null values")
    return sorted(_s(v, "element") for v in items)


def zipmap(ks: Any, vs: Any) -> dict[str, Any]:
    k_list, v_list = _list(ks, "keys"), _list(vs, "values")
    if len(k_list) != len(v_list):
        raise FunctionError("the keys and values lists must have the same length")
    return {_s(k, "key"): v for k, v in zip(k_list, v_list, strict=True)}


# --------------------------------------------------------------- numbers


def abs_(v: Any) -> int | float:
    return normalize_number(abs(_num(v)))


def ceil(v: Any) -> int | float:
    x = _num(v)
    return x if isinstance(x, int) or math.isinf(x) else math.ceil(x)


def floor(v: Any) -> int | float:
    x = _num(v)
    return x if isinstance(x, int) or math.isinf(x) else math.floor(x)


def log(v: Any, base: Any) -> int | float:
    try:
        return normalize_number(math.log(_num(v)) / math.log(_num(base, "base")))
    except (ValueError, ZeroDivisionError):
        raise FunctionError("the logarithm is undefined for these numbers") from None


def max_(*vs: Any) -> int | float:
    if not vs:
        raise FunctionError("at least one number is required")
    return max(_num(v) for v in vs)


def min_(*vs: Any) -> int | float:
    if not vs:
        raise FunctionError("at least one number is required")
    return min(_num(v) for v in vs)


def parseint(s: Any, base: Any) -> int:
    text, b = _s(s), _int(base, "base")
    if not 2 <= b <= 62:
        raise FunctionError("the base must be between 2 and 62")
    digits = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
    body = text[1:] if text[:1] in "+-" else text
    if not body:
        raise FunctionError(f"cannot parse {text!r} as a base {b} integer")
    value = 0
    for ch in body:
        d = digits.find(ch) if b > 36 else digits.find(ch.lower())
        if d < 0 or d >= b:
            raise FunctionError(f"cannot parse {text!r} as a base {b} integer")
        value = value * b + d
    return -value if text.startswith("-") else value


def pow_(x: Any, y: Any) -> int | float:
    try:
        result = math.pow(_num(x), _num(y, "exponent"))
    except (OverflowError, ValueError):
        raise FunctionError("the result is out of range") from None
    return normalize_number(result)


def signum(v: Any) -> int:
    x = _num(v)
    return (x > 0) - (x < 0)


# --------------------------------------------------------------- encoding


def base64encode(s: Any) -> str:
    return base64.b64encode(_s(s).encode()).decode()


def base64decode(s: Any) -> str:
    try:
        raw = base64.b64decode(_s(s), validate=True)
    except (binascii.Error, ValueError):
        raise FunctionError("the argument is not valid base64") from None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise FunctionError("the decoded result is not valid UTF-8") from None


def urlencode(s: Any) -> str:
    return urllib.parse.quote_plus(_s(s), safe="-_.~")


def _json_ready(value: Any) -> Any:
    if isinstance(value, float) and (math.isinf(value) or value != value):
        raise FunctionError("cannot encode an infinite number as JSON")
    if isinstance(value, dict):
        return {k: _json_ready(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_json_ready(v) for v in value]
    return value


def jsonencode(value: Any) -> str:
    text = json.dumps(_json_ready(value), sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    # Go's encoder escapes HTML-significant characters
    for ch, esc in (
        ("<", "\\u003c"),
        (">", "\\u003e"),
        ("&", "\\u0026"),
        ("\u2028", "\\u2028"),
        ("\u2029", "\\u2029"),
    ):
        text = text.replace(ch, esc)
    return text


def _from_json(value: Any) -> Any:
    if isinstance(value, float):
        return normalize_number(value)
    if isinstance(value, dict):
        return {k: _from_json(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_from_json(v) for v in value]
    return value


def jsondecode(s: Any) -> Any:
    text = _s(s)
    try:
        return _from_json(limits.load_json(text, MAX_DEPTH))
    except limits.NestingError as exc:
        raise FunctionError(f"the JSON is {exc}") from None
    except json.JSONDecodeError as exc:
        raise FunctionError(f"invalid JSON: {exc}") from None


def _yaml_scalar(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return format_number(value)
    return json.dumps(str(value), ensure_ascii=False)


def _yaml_lines(value: Any, depth: int) -> list[str]:
    pad = "  " * depth
    if isinstance(value, dict):
        if not value:
            return [pad + "{}"]
        lines: list[str] = []
        for k in sorted(value):
            v = value[k]
            key = json.dumps(k, ensure_ascii=False)
            if isinstance(v, dict | list) and v:
                lines.append(f"{pad}{key}:")
                lines.extend(_yaml_lines(v, depth + 1 if isinstance(v, dict) else depth))
            else:
                lines.append(f"{pad}{key}: {_yaml_lines(v, 0)[0]}")
        return lines
    if isinstance(value, list):
        if not value:
            return [pad + "[]"]
        lines = []
        for v in value:
            sub = _yaml_lines(v, 0)
            lines.append(f"{pad}- {sub[0]}")
            lines.extend(f"{pad}  {line}" for line in sub[1:])
        return lines
    return [pad + _yaml_scalar(value)]


def yamlencode(value: Any) -> str:
    return "\n".join(_yaml_lines(value, 0)) + "\n"


def yamldecode(s: Any) -> Any:
    import yaml

    try:
        docs = list(yaml.safe_load_all(_s(s)))
    except RecursionError:
        raise FunctionError(
            f"the YAML is nested more than {MAX_DEPTH} levels deep (the nesting limit)"
        ) from None
    except yaml.YAMLError as exc:
        raise FunctionError(f"invalid YAML: {exc}") from None
    if len(docs) != 1:
        raise FunctionError("the YAML must hold exactly one document")

    def clean(v: Any) -> Any:
        if isinstance(v, dict):
            return {str(k): clean(x) for k, x in v.items()}
        if isinstance(v, list):
            return [clean(x) for x in v]
        if isinstance(v, float):
            return normalize_number(v)
        if isinstance(v, bool | int | str) or v is None:
            return v
        return str(v)  # dates and other tags come back as text

    return clean(docs[0])


def csvdecode(s: Any) -> list[dict[str, str]]:
    rows = list(csv.reader(io.StringIO(_s(s))))
    if not rows:
        raise FunctionError("missing header line")
    header = rows[0]
    out = []
    for i, row in enumerate(rows[1:], start=2):
        if len(row) != len(header):
            raise FunctionError(f"line {i}: wrong number of fields")
        out.append(dict(zip(header, row, strict=True)))
    _bounded(len(out))
    return out


# --------------------------------------------------------------- crypto, uuid, cidr


def _hexdigest(name: str) -> Callable[[Any], str]:
    def digest(s: Any) -> str:
        return hashlib.new(name, _s(s).encode()).hexdigest()

    digest.__name__ = name
    return digest


def bcrypt_(s: Any, *cost: Any) -> str:
    import bcrypt  # type: ignore[import-not-found,unused-ignore]

    rounds = _int(cost[0], "cost") if cost else 10
    if not 4 <= rounds <= 31:
        raise FunctionError("the bcrypt cost must be between 4 and 31")
    if len(cost) > 1:
        raise FunctionError("bcrypt takes at most two arguments")
    hashed: bytes = bcrypt.hashpw(_s(s).encode(), bcrypt.gensalt(rounds=rounds, prefix=b"2a"))
    return hashed.decode()


def rsadecrypt(ciphertext: Any, private_key: Any) -> str:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import padding, rsa

    try:
        raw = base64.b64decode(_s(ciphertext, "ciphertext"), validate=True)
    except (binascii.Error, ValueError):
        raise FunctionError("the ciphertext is not valid base64") from None
    try:
        key = serialization.load_pem_private_key(_s(private_key, "key").encode(), password=None)
    except (ValueError, TypeError):
        raise FunctionError("the key is not a PEM-encoded RSA private key") from None
    if not isinstance(key, rsa.RSAPrivateKey):
        raise FunctionError("the key is not an RSA private key")
    try:
        return key.decrypt(raw, padding.PKCS1v15()).decode()
    except (ValueError, UnicodeDecodeError):
        raise FunctionError("failed to decrypt the ciphertext") from None


def uuidv4() -> str:
    return str(uuid.uuid4())


_UUID_NAMESPACES = {
    "dns": uuid.NAMESPACE_DNS,
    "url": uuid.NAMESPACE_URL,
    "oid": uuid.NAMESPACE_OID,
    "x500": uuid.NAMESPACE_X500,
}


def uuidv5(namespace: Any, name: Any) -> str:
    ns_text = _s(namespace, "namespace")
    ns = _UUID_NAMESPACES.get(ns_text)
    if ns is None:
        try:
            ns = uuid.UUID(ns_text)
        except ValueError:
            raise FunctionError(
                f"the namespace must be dns, url, oid, x500 or a UUID, got {ns_text!r}"
            ) from None
    return str(uuid.uuid5(ns, _s(name, "name")))


def _network(prefix: Any) -> ipaddress.IPv4Network | ipaddress.IPv6Network:
    try:
        return ipaddress.ip_network(_s(prefix, "prefix"), strict=False)
    except ValueError:
        raise FunctionError(f"invalid CIDR prefix {prefix!r}") from None


def cidrhost(prefix: Any, hostnum: Any) -> str:
    net, num = _network(prefix), _int(hostnum, "host number")
    size = net.num_addresses
    if num < 0:
        num += size
    if not 0 <= num < size:
        raise FunctionError(f"prefix {prefix} has no host number {hostnum}")
    return str(net.network_address + num)


def cidrnetmask(prefix: Any) -> str:
    net = _network(prefix)
    if net.version != 4:
        raise FunctionError("only IPv4 prefixes have a netmask")
    return str(net.netmask)


def cidrsubnet(prefix: Any, newbits: Any, netnum: Any) -> str:
    net, bits, num = _network(prefix), _int(newbits, "newbits"), _int(netnum, "netnum")
    new_len = net.prefixlen + bits
    if bits < 0 or new_len > net.max_prefixlen:
        raise FunctionError(f"cannot extend a /{net.prefixlen} prefix by {bits} bits")
    if not 0 <= num < 2**bits:
        raise FunctionError(f"prefix extension of {bits} bits has no network number {num}")
    base = int(net.network_address) + (num << (net.max_prefixlen - new_len))
    return str(ipaddress.ip_network((base, new_len)))


def cidrsubnets(prefix: Any, *newbits: Any) -> list[str]:
    net = _network(prefix)
    out: list[str] = []
    current = int(net.network_address)
    end = int(net.broadcast_address)
    for nb in newbits:
        bits = _int(nb, "newbits")
        new_len = net.prefixlen + bits
        if bits < 1 or new_len > net.max_prefixlen:
            raise FunctionError(f"cannot extend a /{net.prefixlen} prefix by {bits} bits")
        size = 1 << (net.max_prefixlen - new_len)
        current = (current + size - 1) // size * size
        if current + size - 1 > end:
            raise FunctionError(
                f"not enough remaining address space for a subnet of {bits} new bits"
            )
        out.append(str(ipaddress.ip_network((current, new_len))))
        current += size
    return out


# --------------------------------------------------------------- date and time


def _timestamp(value: Any) -> datetime:
    text = _s(value, "timestamp")
    if not re.fullmatch(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?(Z|[+-]\d{2}:\d{2})", text):
        raise FunctionError(f"not a valid RFC 3339 timestamp: {text!r}")
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise FunctionError(f"not a valid RFC 3339 timestamp: {text!r}") from None


def _rfc3339(t: datetime) -> str:
    base = t.strftime("%Y-%m-%dT%H:%M:%S")
    if t.microsecond:
        base += ("." + f"{t.microsecond:06d}").rstrip("0")
    off = t.utcoffset()
    if off is None or off == timedelta(0):
        return base + "Z"
    total = int(off.total_seconds() // 60)
    sign = "+" if total >= 0 else "-"
    return f"{base}{sign}{abs(total) // 60:02d}:{abs(total) % 60:02d}"


def timeadd(timestamp: Any, duration: Any) -> str:
    t = _timestamp(timestamp)
    try:
        ns = parse_duration(_s(duration, "duration"))
    except ValueError as exc:
        raise FunctionError(str(exc)) from None
    try:
        return _rfc3339(t + timedelta(microseconds=ns / 1000))
    except OverflowError:
        raise FunctionError("the result is out of range") from None


_DATE_TOKEN = re.compile(
    r"'(?:[^']|'')*'|YYYY|YY|MMMM|MMM|MM|M|DD|D|EEEE|EEE|hh|h|HH|H|AA|aa|mm|m|ss|s|ZZZZZ|ZZZZ|ZZZ|Z|[A-Za-z]+|[^A-Za-z']+"
)


def formatdate(spec: Any, timestamp: Any) -> str:
    t = _timestamp(timestamp)
    off = t.utcoffset() or timedelta(0)
    minutes = int(off.total_seconds() // 60)
    sign = "+" if minutes >= 0 else "-"
    hh, mm = abs(minutes) // 60, abs(minutes) % 60
    h12 = t.hour % 12 or 12
    table = {
        "YYYY": f"{t.year:04d}",
        "YY": f"{t.year % 100:02d}",
        "MMMM": t.strftime("%B"),
        "MMM": t.strftime("%b"),
        "MM": f"{t.month:02d}",
        "M": str(t.month),
        "DD": f"{t.day:02d}",
        "D": str(t.day),
        "EEEE": t.strftime("%A"),
        "EEE": t.strftime("%a"),
        "hh": f"{t.hour:02d}",
        "h": str(t.hour),
        "HH": f"{h12:02d}",
        "H": str(h12),
        "AA": "AM" if t.hour < 12 else "PM",
        "aa": "am" if t.hour < 12 else "pm",
        "mm": f"{t.minute:02d}",
        "m": str(t.minute),
        "ss": f"{t.second:02d}",
        "s": str(t.second),
        "ZZZZZ": "Z" if minutes == 0 else f"{sign}{hh:02d}:{mm:02d}",
        "ZZZZ": f"{sign}{hh:02d}{mm:02d}",
        "ZZZ": "UTC" if minutes == 0 else f"{sign}{hh:02d}{mm:02d}",
        "Z": "Z" if minutes == 0 else f"{sign}{hh:02d}:{mm:02d}",
    }
    out: list[str] = []
    text = _s(spec, "format")
    for m in _DATE_TOKEN.finditer(text):
        tok = m.group(0)
        if tok.startswith("'"):
            out.append(tok[1:-1].replace("''", "'"))
        elif tok in table:
            out.append(table[tok])
        elif tok[0].isalpha():
            raise FunctionError(f"invalid date format verb {tok!r}")
        else:
            out.append(tok)
    return "".join(out)


# --------------------------------------------------------------- filesystem


def _fs(basedir: str, allow: bool) -> dict[str, Function]:
    def guard(fn: Function) -> Function:
        if allow:
            return fn

        def disabled(*_args: Any) -> Any:
            raise FunctionError(
                "filesystem functions are disabled here "
                "(Nomad's HTTP API parses without file access)"
            )

        return disabled

    def resolve(path: Any) -> Path:
        p = Path(os.path.expanduser(_s(path, "path")))
        return p if p.is_absolute() else Path(basedir) / p

    def read(path: Any) -> bytes:
        try:
            data = resolve(path).read_bytes()
        except OSError as exc:
            raise FunctionError(f"cannot read {str(path)!r}: {exc.strerror or exc}") from None
        if len(data) > MAX_STRING:
            raise FunctionError(f"{str(path)!r} is larger than {MAX_STRING} bytes")
        return data

    def file(path: Any) -> str:
        try:
            return read(path).decode("utf-8")
        except UnicodeDecodeError:
            raise FunctionError(f"{str(path)!r} is not UTF-8 text (use filebase64)") from None

    def filebase64(path: Any) -> str:
        return base64.b64encode(read(path)).decode()

    def fileexists(path: Any) -> bool:
        target = resolve(path)
        if target.exists() and not target.is_file():
            raise FunctionError(f"{str(path)!r} is not a regular file")
        return target.is_file()

    def fileset(path: Any, pattern: Any) -> SetValue:
        root = resolve(path)
        pat = _s(pattern, "pattern")
        found = glob.glob(pat, root_dir=root, recursive=True)
        files = [f for f in found if (root / f).is_file()]
        _bounded(len(files))
        return make_set([f.replace(os.sep, "/") for f in files])

    def abspath(path: Any) -> str:
        return os.path.abspath(_s(path, "path"))

    def basename(path: Any) -> str:
        p = _s(path, "path")
        return os.path.basename(p.rstrip("/")) or ("/" if p.startswith("/") else ".")

    def dirname(path: Any) -> str:
        return os.path.dirname(_s(path, "path").rstrip("/") or "/") or "."

    def pathexpand(path: Any) -> str:
        return os.path.expanduser(_s(path, "path"))

    table: dict[str, Function] = {
        "abspath": abspath,
        "basename": basename,
        "dirname": dirname,
        "file": file,
        "filebase64": filebase64,
        "fileexists": fileexists,
        "fileset": fileset,
        "pathexpand": pathexpand,
    }
    return {name: guard(fn) for name, fn in table.items()}


# --------------------------------------------------------------- lazy: try, can, convert


def _try(ev: Evaluator, args: list[n.Expr], scope: Scope, call: n.Call) -> Any:
    if not args:
        raise ev.fail(call, "try(): at least one argument is required")
    last: HclError | None = None
    for a in args:
        try:
            return ev.eval(a, scope)
        except HclError as exc:
            last = exc
    assert last is not None
    raise ev.fail(call, f"try(): no expression succeeded; the last one failed with: {last.message}")


def _can(ev: Evaluator, args: list[n.Expr], scope: Scope, call: n.Call) -> Any:
    if len(args) != 1:
        raise ev.fail(call, "can(): exactly one argument is required")
    try:
        ev.eval(args[0], scope)
    except HclError:
        return False
    return True


def _convert(ev: Evaluator, args: list[n.Expr], scope: Scope, call: n.Call) -> Any:
    if len(args) != 2:
        raise ev.fail(call, "convert(): a value and a type are required")
    value = ev.eval(args[0], scope)
    try:
        t = type_from_expr(args[1], lambda e: ev.eval(e, scope))
    except TypeExprError as exc:
        raise ev.fail(exc.node, str(exc)) from None
    try:
        return convert(value, t)
    except ConvertError as exc:
        raise ev.fail(call, f"convert(): {exc}") from None


LAZY: dict[str, LazyFunction] = {"try": _try, "can": _can, "convert": _convert}


def library(basedir: str, allow_fs: bool) -> dict[str, Function]:
    """Nomad's functions (jobspec2.Functions) by name, `try`, `can` and
    `convert` aside (they read their arguments unevaluated: see LAZY)."""
    funcs: dict[str, Function] = {
        "abs": abs_,
        "base64decode": base64decode,
        "base64encode": base64encode,
        "bcrypt": bcrypt_,
        "ceil": ceil,
        "chomp": chomp,
        "chunklist": chunklist,
        "cidrhost": cidrhost,
        "cidrnetmask": cidrnetmask,
        "cidrsubnet": cidrsubnet,
        "cidrsubnets": cidrsubnets,
        "coalesce": coalesce,
        "coalescelist": coalescelist,
        "compact": compact,
        "concat": concat,
        "contains": contains,
        "csvdecode": csvdecode,
        "distinct": distinct,
        "element": element,
        "flatten": flatten,
        "floor": floor,
        "format": format_,
        "formatdate": formatdate,
        "formatlist": formatlist,
        "indent": indent,
        "index": index_,
        "join": join,
        "jsondecode": jsondecode,
        "jsonencode": jsonencode,
        "keys": keys,
        "length": length,
        "log": log,
        "lookup": lookup,
        "lower": lambda s: _s(s).lower(),
        "max": max_,
        "md5": _hexdigest("md5"),
        "merge": merge,
        "min": min_,
        "parseint": parseint,
        "pow": pow_,
        "range": range_,
        "regex_replace": regex_replace,
        "replace": replace,
        "reverse": reverse,
        "rsadecrypt": rsadecrypt,
        "setintersection": setintersection,
        "setproduct": setproduct,
        "setunion": setunion,
        "sha1": _hexdigest("sha1"),
        "sha256": _hexdigest("sha256"),
        "sha512": _hexdigest("sha512"),
        "signum": signum,
        "slice": slice_,
        "sort": sort,
        "split": split,
        "strlen": strlen,
        "strrev": strrev,
        "substr": substr,
        "timeadd": timeadd,
        "title": title,
        "trim": trim,
        "trimprefix": trimprefix,
        "trimspace": lambda s: _s(s).strip(),
        "trimsuffix": trimsuffix,
        "upper": lambda s: _s(s).upper(),
        "urlencode": urlencode,
        "uuidv4": uuidv4,
        "uuidv5": uuidv5,
        "values": values,
        "yamldecode": yamldecode,
        "yamlencode": yamlencode,
        "zipmap": zipmap,
    }
    funcs.update(_fs(basedir, allow_fs))
    return funcs


#: every function name a job file may call, for the docs and tests
NAMES = frozenset(library(".", False)) | frozenset(LAZY)
