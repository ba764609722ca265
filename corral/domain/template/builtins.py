"""The functions every Go template has (text/template/funcs.go): and, or,
not, len, index, slice, print, printf, println, html, js, urlquery, call,
eq, ne, lt, le, gt, ge, with Go's comparison rules and error texts."""

from __future__ import annotations

import urllib.parse
from typing import TYPE_CHECKING, Any

from corral.domain.template import gofmt
from corral.domain.template.exec import FuncError, GoFunction
from corral.domain.template.values import (
    BOOL,
    COMPLEX,
    FLOAT,
    INT,
    INVALID,
    MISSING,
    STRING,
    UINT,
    GoChan,
    GoFunc,
    GoMap,
    GoStruct,
    Signature,
    basic_kind,
    is_true,
    type_name,
)

if TYPE_CHECKING:
    from corral.domain.template.exec import Executor


def _indirect_interface(v: Any) -> Any:
    return MISSING if v is None else v


def _truth(v: Any) -> bool:
    return is_true(_indirect_interface(v))[0]


def _not(arg: Any) -> bool:
    return not _truth(arg)


def _length(item: Any) -> int:
    if item is None:
        raise FuncError("len of nil pointer")
    if item is MISSING:
        raise FuncError("reflect: call of reflect.Value.Type on zero Value")
    if isinstance(item, str):
        return len(item.encode())
    if isinstance(item, list | tuple | dict | bytes):
        return len(item)
    if isinstance(item, GoChan):
        return 0
    raise FuncError(f"len of type {type_name(item)}")


def _index_arg(index: Any, cap: int) -> int:
    if index is MISSING:
        raise FuncError("cannot index slice/array with nil")
    if not isinstance(index, int) or isinstance(index, bool):
        raise FuncError(f"cannot index slice/array with type {type_name(index)}")
    x = int(index)
    if x < 0 or x > cap:
        raise FuncError(f"index out of range: {x}")
    return x


def _index(item: Any, *indexes: Any) -> Any:
    item = _indirect_interface(item)
    if item is MISSING:
        raise FuncError("index of untyped nil")
    for raw in indexes:
        index = _indirect_interface(raw)
        if item is None:
            raise FuncError("index of nil pointer")
        if isinstance(item, str):
            data = item.encode()
            x = _index_arg(index, len(data))
            if x == len(data):
                raise FuncError("reflect: string index out of range")
            item = data[x]
        elif isinstance(item, list | tuple | bytes):
            x = _index_arg(index, len(item))
            if x == len(item):
                raise FuncError("reflect: slice index out of range")
            item = item[x]
        elif isinstance(item, dict):
            if index is MISSING:
                raise FuncError("value is nil; should be of type string")
            if not isinstance(index, str) and not _has_non_string_keys(item):
                raise FuncError(f"value has type {type_name(index)}; should be string")
            if index in item:
                item = item[index]
            else:
                item = item.go_zero() if isinstance(item, GoMap) else None
        else:
            raise FuncError(f"can't index item of type {type_name(item)}")
    return item


def _has_non_string_keys(m: dict[Any, Any]) -> bool:
    return any(not isinstance(k, str) for k in m)


def _slice(item: Any, *indexes: Any) -> Any:
    item = _indirect_interface(item)
    if item is MISSING:
        raise FuncError("slice of untyped nil")
    if len(indexes) > 3:
        raise FuncError(f"too many slice indexes: {len(indexes)}")
    if isinstance(item, str):
        if len(indexes) == 3:
            raise FuncError("cannot 3-index slice a string")
        data = item.encode()
        length = len(data)
    elif isinstance(item, list | tuple):
        length = len(item)
    else:
        raise FuncError(f"can't slice item of type {type_name(item)}")
    idx = [0, length, length]
    for i, raw in enumerate(indexes):
        idx[i] = _index_arg(_indirect_interface(raw), length)
    if idx[0] > idx[1]:
        raise FuncError(f"invalid slice index: {idx[0]} > {idx[1]}")
    if len(indexes) == 3 and idx[1] > idx[2]:
        raise FuncError(f"invalid slice index: {idx[1]} > {idx[2]}")
    if isinstance(item, str):
        return data[idx[0] : idx[1]].decode("utf-8", "replace")
    out = item[idx[0] : idx[1]]
    return type(item)(out) if isinstance(item, tuple) else out


def _eval_args(ex: Executor, args: tuple[Any, ...]) -> str:
    """Go's evalArgs: Sprint of the arguments, nil printed as <no value>."""
    if len(args) == 1 and isinstance(args[0], str):
        return args[0]
    printable = ["<no value>" if a is None or a is MISSING else a for a in args]
    return _limited(ex, gofmt.sprint, tuple(printable))


def html_escape(s: str) -> str:
    out = []
    for ch in s:
        if ch == "\0":
            out.append("\ufffd")
        elif ch == '"':
            out.append("&#34;")
        elif ch == "'":
            out.append("&#39;")
        elif ch == "&":
            out.append("&amp;")
        elif ch == "<":
            out.append("&lt;")
        elif ch == ">":
            out.append("&gt;")
        else:
            out.append(ch)
    return "".join(out)


_JS = {
    "\\": "\\\\",
    "'": "\\'",
    '"': '\\"',
    "<": "\\u003C",
    ">": "\\u003E",
    "&": "\\u0026",
    "=": "\\u003D",
}


def js_escape(s: str) -> str:
    out = []
    for ch in s:
        if ch in _JS:
            out.append(_JS[ch])
        elif ord(ch) < 0x20:
            out.append(f"\\u00{ord(ch):02X}")
        elif ord(ch) < 0x80 or ch.isprintable():
            out.append(ch)
        else:
            out.append(f"\\u{ord(ch):04X}")
    return "".join(out)


def _html(ex: Executor, *args: Any) -> str:
    return html_escape(_eval_args(ex, args))


def _js(ex: Executor, *args: Any) -> str:
    return js_escape(_eval_args(ex, args))


def _urlquery(ex: Executor, *args: Any) -> str:
    return urllib.parse.quote_plus(_eval_args(ex, args), safe="")


def _print(ex: Executor, *args: Any) -> str:
    return _limited(ex, gofmt.sprint, args)


def _println(ex: Executor, *args: Any) -> str:
    return _limited(ex, gofmt.sprintln, args)


def _printf(ex: Executor, fmt: str, *args: Any) -> str:
    try:
        return gofmt.sprintf(fmt, args, ex.limits.max_value_len)
    except gofmt.TooLong:
        raise FuncError(
            f"result exceeds the limit of {ex.limits.max_value_len} characters"
        ) from None


def _limited(ex: Executor, printer: Any, args: tuple[Any, ...]) -> str:
    try:
        return str(printer(args, ex.limits.max_value_len))
    except gofmt.TooLong:
        raise FuncError(
            f"result exceeds the limit of {ex.limits.max_value_len} characters"
        ) from None


def _call(name: str, fn: Any, *args: Any) -> Any:
    fn = _indirect_interface(fn)
    if fn is MISSING:
        raise FuncError("call of nil")
    if not isinstance(fn, GoFunc):
        raise FuncError(f"non-function {name} of type {type_name(fn)}")
    sig = fn.signature
    if sig.variadic is not None:
        if len(args) < len(sig.params):
            raise FuncError(
                f"wrong number of args for {name}: got {len(args)} want at least {len(sig.params)}"
            )
    elif len(args) != len(sig.params):
        raise FuncError(f"wrong number of args for {name}: got {len(args)} want {len(sig.params)}")
    return fn.fn(*[_indirect_interface(a) if a is not MISSING else None for a in args])


# ---------------------------------------------------------------- comparison


def _eq(arg1: Any, *arg2: Any) -> bool:
    arg1 = _indirect_interface(arg1)
    if not arg2:
        raise FuncError("missing argument for comparison")
    k1 = basic_kind(arg1)
    for raw in arg2:
        arg = _indirect_interface(raw)
        k2 = basic_kind(arg)
        truth = False
        if k1 != k2:
            if k1 == INT and k2 == UINT:
                truth = arg1 >= 0 and int(arg1) == int(arg)
            elif k1 == UINT and k2 == INT:
                truth = arg >= 0 and int(arg1) == int(arg)
            elif arg1 is not MISSING and arg is not MISSING:
                raise FuncError(
                    f"incompatible types for comparison: {type_name(arg1)} and {type_name(arg)}"
                )
        elif k1 in (BOOL, COMPLEX, FLOAT, INT, STRING, UINT):
            truth = arg1 == arg
        else:
            truth = _eq_other(arg1, arg)
        if truth:
            return True
    return False


def _eq_other(a: Any, b: Any) -> bool:
    if a is MISSING or b is MISSING:
        return (a is MISSING) == (b is MISSING)
    if type(a) is not type(b) and not (isinstance(a, list | tuple) and isinstance(b, list | tuple)):
        raise FuncError(
            f"non-comparable types {gofmt.sprint([a])}: {type_name(a)}, "
            f"{type_name(b)}: {gofmt.sprint([b])}"
        )
    if isinstance(a, list | tuple | dict):
        raise FuncError(f"non-comparable type {gofmt.sprint([b])}: {type_name(b)}")
    if isinstance(a, GoStruct) and not a.go_pointer:
        return all(a.go_field(f) == b.go_field(f) for f in a.go_fields)
    return a is b


def _ne(arg1: Any, arg2: Any) -> bool:
    return not _eq(arg1, arg2)


def _lt(arg1: Any, arg2: Any) -> bool:
    arg1 = _indirect_interface(arg1)
    k1 = basic_kind(arg1)
    if k1 == INVALID:
        raise FuncError("invalid type for comparison")
    arg2 = _indirect_interface(arg2)
    k2 = basic_kind(arg2)
    if k2 == INVALID:
        raise FuncError("invalid type for comparison")
    if k1 != k2:
        if k1 == INT and k2 == UINT:
            return bool(arg1 < 0 or int(arg1) < int(arg2))
        if k1 == UINT and k2 == INT:
            return bool(arg2 >= 0 and int(arg1) < int(arg2))
        raise FuncError(
            f"incompatible types for comparison: {type_name(arg1)} and {type_name(arg2)}"
        )
    if k1 in (BOOL, COMPLEX):
        raise FuncError("invalid type for comparison")
    if k1 == STRING:
        return bool(arg1.encode() < arg2.encode())
    return bool(arg1 < arg2)


def _le(arg1: Any, arg2: Any) -> bool:
    return _lt(arg1, arg2) or _eq(arg1, arg2)


def _gt(arg1: Any, arg2: Any) -> bool:
    return not _le(arg1, arg2)


def _ge(arg1: Any, arg2: Any) -> bool:
    return not _lt(arg1, arg2)


def _unreachable(*_: Any) -> Any:
    raise AssertionError("and/or are evaluated by the executor")


V = "value"
BUILTINS: dict[str, GoFunction] = {
    "and": GoFunction(_unreachable, Signature((V,), V)),
    "or": GoFunction(_unreachable, Signature((V,), V)),
    "not": GoFunction(_not, Signature((V,))),
    "len": GoFunction(_length, Signature((V,))),
    "index": GoFunction(_index, Signature((V,), V)),
    "slice": GoFunction(_slice, Signature((V,), V)),
    "print": GoFunction(_print, Signature((), "any"), needs_exec=True),
    "printf": GoFunction(_printf, Signature(("string",), "any"), needs_exec=True),
    "println": GoFunction(_println, Signature((), "any"), needs_exec=True),
    "html": GoFunction(_html, Signature((), "any"), needs_exec=True),
    "js": GoFunction(_js, Signature((), "any"), needs_exec=True),
    "urlquery": GoFunction(_urlquery, Signature((), "any"), needs_exec=True),
    "call": GoFunction(_call, Signature((V,), V)),
    "eq": GoFunction(_eq, Signature((V,), V)),
    "ne": GoFunction(_ne, Signature((V, V))),
    "lt": GoFunction(_lt, Signature((V, V))),
    "le": GoFunction(_le, Signature((V, V))),
    "gt": GoFunction(_gt, Signature((V, V))),
    "ge": GoFunction(_ge, Signature((V, V))),
}
