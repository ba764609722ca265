"""The Sprig functions consul-template exposes as `sprig_<name>` (Masterminds
/sprig v3's hermetic set). Corral implements the string, list, dict,
default, math, encoding, path, regex and JSON helpers; the rest of Sprig
(certificates, bcrypt, semver, dates, ...) is refused by name at parse
time, never silently missing."""

from __future__ import annotations

import base64
import binascii
import hashlib
import posixpath
import re
import zlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from corral.domain.template import encoding, gofmt
from corral.domain.template.exec import FuncError, GoFunction
from corral.domain.template.functions import compile_re2, from_json, go_expand, go_split, go_title
from corral.domain.template.values import (
    MISSING,
    GoList,
    GoStruct,
    Int64,
    Signature,
    is_true,
    kind_name,
    type_name,
)

if TYPE_CHECKING:
    from corral.domain.template.exec import Executor


def _limit(ex: Executor, n: int, what: str) -> None:
    if n > ex.limits.max_value_len:
        raise FuncError(f"{what} exceeds the limit of {ex.limits.max_value_len}")


def _limit_items(ex: Executor, n: int, what: str) -> None:
    if n > ex.limits.max_items:
        raise FuncError(f"{what} exceeds the limit of {ex.limits.max_items} items")


def strval(v: Any) -> str:
    if isinstance(v, str):
        return v
    if isinstance(v, bytes):
        return v.decode("utf-8", "replace")
    return gofmt.sprint([v if v is not None else None])


def to_int64(v: Any) -> int:
    """sprig's toInt64 (spf13/cast): strings parsed, floats truncated,
    anything unparseable is 0."""
    if v is None or v is MISSING:
        return 0
    if isinstance(v, bool):
        return int(v)
    if isinstance(v, int):
        return int(v)
    if isinstance(v, float):
        return int(v) if v == v and abs(v) != float("inf") else 0
    if isinstance(v, str):
        s = v.strip()
        try:
            return int(s, 0)
        except ValueError:
            try:
                return int(float(s))
            except ValueError:
                return 0
    return 0


def to_float64(v: Any) -> float:
    if isinstance(v, bool):
        return float(v)
    if isinstance(v, int | float):
        return float(v)
    if isinstance(v, str):
        try:
            return float(v.strip())
        except ValueError:
            return 0.0
    return 0.0


def empty(v: Any) -> bool:
    if v is None or v is MISSING:
        return True
    if isinstance(v, str | list | tuple | dict | bytes):
        return len(v) == 0
    if isinstance(v, bool):
        return not v
    if isinstance(v, int | float | complex):
        return v == 0
    if isinstance(v, GoStruct):
        return False
    return False


def _dfault(d: Any, *given: Any) -> Any:
    if not given or empty(given[0]):
        return d
    return given[0]


def _coalesce(*vs: Any) -> Any:
    for v in vs:
        if not empty(v):
            return v
    return None


def _as_list(name: str, v: Any) -> list[Any]:
    if isinstance(v, list | tuple):
        return list(v)
    raise FuncError(f"Cannot {name} on type {type_name(v)}")


def _dict(*args: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for i in range(0, len(args), 2):
        key = strval(args[i])
        out[key] = args[i + 1] if i + 1 < len(args) else ""
    return out


def _uniq(items: Any) -> list[Any]:
    out: list[Any] = []
    for x in _as_list("uniq", items):
        if x not in out:
            out.append(x)
    return out


def _without(items: Any, *omit: Any) -> list[Any]:
    return [x for x in _as_list("without", items) if x not in omit]


def _substr(start: int, end: int, s: str) -> str:
    if start < 0:
        return s[:end]
    if end < 0 or end > len(s):
        return s[start:]
    return s[start:end]


def _trunc(c: int, s: str) -> str:
    if c < 0 and len(s) + c > 0:
        return s[len(s) + c :]
    if c >= 0 and len(s) > c:
        return s[:c]
    return s


def _abbrev(width: int, s: str) -> str:
    if width < 4 or len(s) <= width:
        return s
    return s[: width - 3] + "..."


def _indent(ex: Executor, spaces: int, s: str) -> str:
    pad = " " * spaces
    _limit(ex, len(s) + (s.count("\n") + 1) * spaces, "indent result")
    return pad + s.replace("\n", "\n" + pad)


def _nindent(ex: Executor, spaces: int, s: str) -> str:
    return "\n" + _indent(ex, spaces, s)


def _repeat(ex: Executor, count: int, s: str) -> str:
    _limit(ex, max(count, 0) * len(s), "repeat result")
    return s * max(count, 0)


def _words(s: str) -> list[str]:
    return re.findall(r"[A-Z]+(?=[A-Z][a-z])|[A-Z]?[a-z]+|[A-Z]+|\d+", s)


def _snake(s: str) -> str:
    return "_".join(w.lower() for w in _words(s))


def _kebab(s: str) -> str:
    return "-".join(w.lower() for w in _words(s))


def _camel(s: str) -> str:
    return "".join(w[:1].upper() + w[1:] for w in re.split(r"[_\-\s]+", s) if w)


def _until(ex: Executor, count: int) -> list[int]:
    step = 1 if count >= 0 else -1
    return _until_step(ex, 0, count, step)


def _until_step(ex: Executor, start: int, stop: int, step: int) -> list[int]:
    if step == 0 or (step > 0 and start >= stop) or (step < 0 and start <= stop):
        return []
    n = (abs(stop - start) + abs(step) - 1) // abs(step)
    _limit_items(ex, n, "until result")
    return list(range(start, stop, step))


def _sprig_split(sep: str, orig: str) -> dict[str, str]:
    return {f"_{i}": part for i, part in enumerate(orig.split(sep) if sep else list(orig))}


def _split_list(ex: Executor, sep: str, orig: str) -> GoList:
    return GoList(go_split(orig, sep, ex.limits.max_items), "[]string")


def _splitn(sep: str, n: int, orig: str) -> dict[str, str]:
    parts = orig.split(sep, n - 1) if n > 0 else []
    return {f"_{i}": part for i, part in enumerate(parts)}


def _join(ex: Executor, sep: str, v: Any) -> str:
    items = [strval(x) for x in v] if isinstance(v, list | tuple) else [strval(v)]
    _limit(ex, sum(len(x) for x in items) + len(sep) * len(items), "join result")
    return sep.join(items)


def _b64dec(s: str) -> str:
    try:
        return base64.b64decode(s.encode(), validate=True).decode("utf-8", "replace")
    except (binascii.Error, ValueError) as exc:
        return str(exc)


def _b32dec(s: str) -> str:
    try:
        return base64.b32decode(s.encode()).decode("utf-8", "replace")
    except (binascii.Error, ValueError) as exc:
        return str(exc)


def _regex_find_all(regex: str, s: str, n: int) -> list[str]:
    found = [m.group(0) for m in compile_re2(regex).finditer(s)]
    return found if n < 0 else found[:n]


def _regex_find(regex: str, s: str) -> str:
    m = compile_re2(regex).search(s)
    return m.group(0) if m else ""


def _regex_replace_all(regex: str, s: str, repl: str) -> str:
    return str(compile_re2(regex).sub(lambda m: go_expand(repl, m), s))


def _regex_replace_all_literal(regex: str, s: str, repl: str) -> str:
    return str(compile_re2(regex).sub(lambda _m: repl, s))


def _regex_split(regex: str, s: str, n: int) -> list[str]:
    parts = [str(x) for x in compile_re2(regex).split(s)]
    return parts if n < 0 else parts[:n]


def _regex_quote_meta(s: str) -> str:
    return re.sub(r"([\\.+*?()|\[\]{}^$])", r"\\\1", s)


def _to_json(ex: Executor, v: Any) -> str:
    try:
        return encoding.to_json(v, max_len=ex.limits.max_value_len)
    except FuncError:
        return ""


def _must_to_json(ex: Executor, v: Any) -> str:
    return encoding.to_json(v, max_len=ex.limits.max_value_len)


def _to_pretty_json(ex: Executor, v: Any) -> str:
    try:
        return encoding.to_json(v, indent="  ", max_len=ex.limits.max_value_len)
    except FuncError:
        return ""


def _to_raw_json(ex: Executor, v: Any) -> str:
    try:
        return encoding.to_json(v, escape_html=False, max_len=ex.limits.max_value_len)
    except FuncError:
        return ""


def _from_json(s: str) -> Any:
    try:
        return from_json(s)
    except FuncError:
        return {}


def _round(a: Any, p: int, *r_opt: Any) -> float:
    roundon = to_float64(r_opt[0]) if r_opt else 0.5
    val = to_float64(a)
    pow10 = 10.0**p
    digit = pow10 * val
    import math

    _, frac = divmod(digit, 1)
    rounder = math.ceil(digit) if frac >= roundon else math.floor(digit)
    return rounder / pow10


def _max(a: Any, *rest: Any) -> Int64:
    return Int64(max([to_int64(a), *[to_int64(x) for x in rest]]))


def _min(a: Any, *rest: Any) -> Int64:
    return Int64(min([to_int64(a), *[to_int64(x) for x in rest]]))


def _div(a: Any, b: Any) -> Int64:
    x, y = to_int64(a), to_int64(b)
    if y == 0:
        raise FuncError("runtime error: integer divide by zero")
    q = abs(x) // abs(y)
    return Int64(q if (x >= 0) == (y >= 0) else -q)


def _mod(a: Any, b: Any) -> Int64:
    x, y = to_int64(a), to_int64(b)
    if y == 0:
        raise FuncError("runtime error: integer divide by zero")
    r = abs(x) % abs(y)
    return Int64(r if x >= 0 else -r)


def _keys(*dicts: Any) -> list[str]:
    out: list[str] = []
    for d in dicts:
        if isinstance(d, dict):
            out.extend(str(k) for k in d)
    return out


def _pick(d: dict[str, Any], *keys: str) -> dict[str, Any]:
    return {k: d[k] for k in keys if k in d}


def _omit(d: dict[str, Any], *keys: str) -> dict[str, Any]:
    return {k: v for k, v in d.items() if k not in keys}


def _merge(dst: dict[str, Any], *srcs: Any) -> dict[str, Any]:
    from corral.domain.template.functions import _merge as merge

    for src in srcs:
        if isinstance(src, dict):
            dst.update(merge(dst, src, False))
    return dst


def _merge_overwrite(dst: dict[str, Any], *srcs: Any) -> dict[str, Any]:
    from corral.domain.template.functions import _merge as merge

    for src in srcs:
        if isinstance(src, dict):
            dst.update(merge(dst, src, True))
    return dst


def _dig(*args: Any) -> Any:
    if len(args) < 3:
        raise FuncError("dig: needs at least a key, a default and a dict")
    *keys, default, d = args
    cur = d
    for key in keys:
        if not isinstance(cur, dict) or key not in cur:
            return default
        cur = cur[key]
    return cur


def _fail(msg: str) -> str:
    raise FuncError(msg)


def _has(needle: Any, haystack: Any) -> bool:
    if haystack is None:
        return False
    return needle in _as_list("has", haystack)


def _chunk(ex: Executor, size: int, items: Any) -> list[list[Any]]:
    lst = _as_list("chunk", items)
    if size <= 0:
        raise FuncError("chunk size must be positive")
    return [lst[i : i + size] for i in range(0, len(lst), size)]


def _concat(ex: Executor, *lists: Any) -> list[Any]:
    items = [_as_list("concat", lst) for lst in lists]
    _limit_items(ex, sum(len(x) for x in items), "concat result")
    return [x for lst in items for x in lst]


def _type_is(target: str, v: Any) -> bool:
    return target == type_name(v)


def _kind_is(target: str, v: Any) -> bool:
    return target == kind_name(v)


S, A, INT = "string", "any", "int"


def _f(
    fn: Callable[..., Any],
    params: tuple[str, ...] = (),
    variadic: str | None = None,
    ex: bool = False,
) -> GoFunction:
    return GoFunction(fn, Signature(params, variadic), needs_exec=ex)


SPRIG: dict[str, GoFunction] = {
    # strings
    "abbrev": _f(_abbrev, (INT, S)),
    "trunc": _f(_trunc, (INT, S)),
    "trim": _f(lambda s: s.strip(" \t\n\r\v\f"), (S,)),
    "upper": _f(str.upper, (S,)),
    "lower": _f(str.lower, (S,)),
    "title": _f(go_title, (S,)),
    "untitle": _f(lambda s: " ".join(w[:1].lower() + w[1:] for w in s.split(" ")), (S,)),
    "substr": _f(_substr, (INT, INT, S)),
    "repeat": _f(_repeat, (INT, S), ex=True),
    "trimall": _f(lambda a, b: b.strip(a), (S, S)),
    "trimAll": _f(lambda a, b: b.strip(a), (S, S)),
    "trimSuffix": _f(lambda a, b: b[: -len(a)] if a and b.endswith(a) else b, (S, S)),
    "trimPrefix": _f(lambda a, b: b[len(a) :] if a and b.startswith(a) else b, (S, S)),
    "nospace": _f(lambda s: "".join(s.split()), (S,)),
    "initials": _f(lambda s: "".join(w[0] for w in s.split()), (S,)),
    "swapcase": _f(str.swapcase, (S,)),
    "snakecase": _f(_snake, (S,)),
    "camelcase": _f(_camel, (S,)),
    "kebabcase": _f(_kebab, (S,)),
    "contains": _f(lambda sub, s: sub in s, (S, S)),
    "hasPrefix": _f(lambda sub, s: s.startswith(sub), (S, S)),
    "hasSuffix": _f(lambda sub, s: s.endswith(sub), (S, S)),
    "quote": _f(lambda *a: " ".join(gofmt.quote(strval(x)) for x in a if x is not None), (), A),
    "squote": _f(lambda *a: " ".join("'" + strval(x) + "'" for x in a if x is not None), (), A),
    "cat": _f(lambda *a: " ".join(strval(x) for x in a if x is not None), (), A),
    "indent": _f(_indent, (INT, S), ex=True),
    "nindent": _f(_nindent, (INT, S), ex=True),
    "replace": _f(lambda old, new, src: src.replace(old, new), (S, S, S)),
    "plural": _f(lambda one, many, count: one if count == 1 else many, (S, S, INT)),
    "sha1sum": _f(lambda s: hashlib.sha1(s.encode(), usedforsecurity=False).hexdigest(), (S,)),
    "sha256sum": _f(lambda s: hashlib.sha256(s.encode()).hexdigest(), (S,)),
    "sha512sum": _f(lambda s: hashlib.sha512(s.encode()).hexdigest(), (S,)),
    "adler32sum": _f(lambda s: str(zlib.adler32(s.encode())), (S,)),
    "toString": _f(strval, (A,)),
    "atoi": _f(lambda s: _atoi(s), (S,)),
    "int64": _f(lambda v: Int64(to_int64(v)), (A,)),
    "int": _f(lambda v: int(to_int64(v)), (A,)),
    "float64": _f(to_float64, (A,)),
    "split": _f(_sprig_split, (S, S)),
    "splitList": _f(_split_list, (S, S), ex=True),
    "splitn": _f(_splitn, (S, INT, S)),
    "toStrings": _f(
        lambda v: GoList([strval(x) for x in _as_list("toStrings", v)], "[]string"), (A,)
    ),
    "until": _f(_until, (INT,), ex=True),
    "untilStep": _f(_until_step, (INT, INT, INT), ex=True),
    # math
    "add1": _f(lambda v: Int64(to_int64(v) + 1), (A,)),
    "add": _f(lambda *vs: Int64(sum(to_int64(v) for v in vs)), (), A),
    "sub": _f(lambda a, b: Int64(to_int64(a) - to_int64(b)), (A, A)),
    "div": _f(_div, (A, A)),
    "mod": _f(_mod, (A, A)),
    "mul": _f(lambda a, *vs: Int64(_product([a, *vs])), (A,), A),
    "max": _f(_max, (A,), A),
    "biggest": _f(_max, (A,), A),
    "min": _f(_min, (A,), A),
    "maxf": _f(lambda a, *vs: max([to_float64(a), *map(to_float64, vs)]), (A,), A),
    "minf": _f(lambda a, *vs: min([to_float64(a), *map(to_float64, vs)]), (A,), A),
    "addf": _f(lambda *vs: float(sum(to_float64(v) for v in vs)), (), A),
    "add1f": _f(lambda v: to_float64(v) + 1, (A,)),
    "subf": _f(lambda a, *vs: to_float64(a) - sum(map(to_float64, vs)), (A,), A),
    "ceil": _f(lambda v: float(__import__("math").ceil(to_float64(v))), (A,)),
    "floor": _f(lambda v: float(__import__("math").floor(to_float64(v))), (A,)),
    "round": _f(_round, (A, INT), A),
    # lists and dicts
    "join": _f(_join, (S, A), ex=True),
    "sortAlpha": _f(lambda v: sorted(strval(x) for x in _as_list("sortAlpha", v)), (A,)),
    "list": _f(lambda *vs: list(vs), (), A),
    "tuple": _f(lambda *vs: list(vs), (), A),
    "dict": _f(_dict, (), A),
    "get": _f(lambda d, k: d.get(k, ""), ("map", S)),
    "set": _f(lambda d, k, v: (d.__setitem__(k, v), d)[1], ("map", S, A)),
    "unset": _f(lambda d, k: (d.pop(k, None), d)[1], ("map", S)),
    "hasKey": _f(lambda d, k: k in d, ("map", S)),
    "pluck": _f(lambda k, *ds: [d[k] for d in ds if isinstance(d, dict) and k in d], (S,), "map"),
    "keys": _f(_keys, (), "map"),
    "pick": _f(_pick, ("map",), S),
    "omit": _f(_omit, ("map",), S),
    "merge": _f(_merge, ("map",), A),
    "mergeOverwrite": _f(_merge_overwrite, ("map",), A),
    "values": _f(lambda d: list(d.values()), ("map",)),
    "append": _f(lambda lst, v: [*_as_list("append", lst), v], (A, A)),
    "push": _f(lambda lst, v: [*_as_list("push", lst), v], (A, A)),
    "prepend": _f(lambda lst, v: [v, *_as_list("prepend", lst)], (A, A)),
    "first": _f(lambda lst: (_as_list("first", lst) or [None])[0], (A,)),
    "rest": _f(lambda lst: _as_list("rest", lst)[1:], (A,)),
    "last": _f(lambda lst: (_as_list("last", lst) or [None])[-1], (A,)),
    "initial": _f(lambda lst: _as_list("initial", lst)[:-1], (A,)),
    "reverse": _f(lambda lst: list(reversed(_as_list("reverse", lst))), (A,)),
    "uniq": _f(_uniq, (A,)),
    "without": _f(_without, (A,), A),
    "has": _f(_has, (A, A)),
    "concat": _f(_concat, (), A, ex=True),
    "dig": _f(_dig, (), A),
    "chunk": _f(_chunk, (INT, A), ex=True),
    "compact": _f(lambda lst: [x for x in _as_list("compact", lst) if not empty(x)], (A,)),
    # defaults and flow
    "default": _f(_dfault, (A,), A),
    "empty": _f(empty, (A,)),
    "coalesce": _f(_coalesce, (), A),
    "all": _f(lambda *vs: all(not empty(v) for v in vs), (), A),
    "any": _f(lambda *vs: any(not empty(v) for v in vs), (), A),
    "ternary": _f(lambda vt, vf, v: vt if v else vf, (A, A, "bool")),
    "fail": _f(_fail, (S,)),
    "fromJson": _f(_from_json, (S,)),
    "mustFromJson": _f(from_json, (S,)),
    "toJson": _f(_to_json, (A,), ex=True),
    "mustToJson": _f(_must_to_json, (A,), ex=True),
    "toPrettyJson": _f(_to_pretty_json, (A,), ex=True),
    "toRawJson": _f(_to_raw_json, (A,), ex=True),
    # reflection
    "typeOf": _f(type_name, (A,)),
    "typeIs": _f(_type_is, (S, A)),
    "kindOf": _f(kind_name, (A,)),
    "kindIs": _f(_kind_is, (S, A)),
    "deepEqual": _f(lambda a, b: a == b, (A, A)),
    # paths
    "base": _f(
        lambda p: posixpath.basename(p.rstrip("/")) or ("/" if p.startswith("/") else "."), (S,)
    ),
    "dir": _f(lambda p: posixpath.dirname(p) or ".", (S,)),
    "clean": _f(lambda p: posixpath.normpath(p) if p else ".", (S,)),
    "ext": _f(lambda p: posixpath.splitext(p)[1], (S,)),
    "isAbs": _f(lambda p: p.startswith("/"), (S,)),
    # encoding
    "b64enc": _f(lambda s: base64.b64encode(s.encode()).decode(), (S,)),
    "b64dec": _f(_b64dec, (S,)),
    "b32enc": _f(lambda s: base64.b32encode(s.encode()).decode(), (S,)),
    "b32dec": _f(_b32dec, (S,)),
    # regex (RE2, as Go's regexp)
    "regexMatch": _f(lambda r, s: compile_re2(r).search(s) is not None, (S, S)),
    "mustRegexMatch": _f(lambda r, s: compile_re2(r).search(s) is not None, (S, S)),
    "regexFindAll": _f(_regex_find_all, (S, S, INT)),
    "mustRegexFindAll": _f(_regex_find_all, (S, S, INT)),
    "regexFind": _f(_regex_find, (S, S)),
    "mustRegexFind": _f(_regex_find, (S, S)),
    "regexReplaceAll": _f(_regex_replace_all, (S, S, S)),
    "mustRegexReplaceAll": _f(_regex_replace_all, (S, S, S)),
    "regexReplaceAllLiteral": _f(_regex_replace_all_literal, (S, S, S)),
    "mustRegexReplaceAllLiteral": _f(_regex_replace_all_literal, (S, S, S)),
    "regexSplit": _f(_regex_split, (S, S, INT)),
    "mustRegexSplit": _f(_regex_split, (S, S, INT)),
    "regexQuoteMeta": _f(_regex_quote_meta, (S,)),
}


def _atoi(s: str) -> int:
    try:
        return int(s.strip(), 10)
    except ValueError:
        return 0


def _product(vs: list[Any]) -> int:
    out = 1
    for v in vs:
        out *= to_int64(v)
    return out


# Sprig's hermetic functions Corral does not implement (refused by name).
NOT_IMPLEMENTED = [
    "ago",
    "duration",
    "durationRound",
    "mustDateModify",
    "must_date_modify",
    "mustToDate",
    "toDate",
    "unixEpoch",
    "shuffle",
    "wrap",
    "wrapWith",
    "seq",
    "toDecimal",
    "randInt",
    "mulf",
    "divf",
    "mustCompact",
    "ternary_",
    "deepCopy",
    "mustDeepCopy",
    "mustToPrettyJson",
    "mustToRawJson",
    "osBase",
    "osClean",
    "osDir",
    "osExt",
    "osIsAbs",
    "mustMerge",
    "mustMergeOverwrite",
    "mustAppend",
    "mustPush",
    "mustPrepend",
    "mustFirst",
    "mustRest",
    "mustLast",
    "mustInitial",
    "mustReverse",
    "mustUniq",
    "mustWithout",
    "mustHas",
    "slice",
    "mustSlice",
    "mustChunk",
    "bcrypt",
    "htpasswd",
    "derivePassword",
    "buildCustomCert",
    "genCA",
    "genCAWithKey",
    "genSelfSignedCert",
    "genSelfSignedCertWithKey",
    "genSignedCert",
    "genSignedCertWithKey",
    "encryptAES",
    "decryptAES",
    "semver",
    "semverCompare",
    "urlParse",
    "urlJoin",
    "hello",
    "getHostByName",
]


def sprig_funcs() -> dict[str, GoFunction]:
    return {"sprig_" + name: fn for name, fn in SPRIG.items()}


def sprig_refused() -> dict[str, str]:
    return {"sprig_" + name: "" for name in NOT_IMPLEMENTED if name not in SPRIG}


__all__ = ["SPRIG", "empty", "is_true", "sprig_funcs", "sprig_refused", "strval", "to_int64"]
