"""Values and type constraints, as HCL's cty gives them to Nomad.

A value is plain Python data: str, int or float (cty's number), bool, None
(null), list (list or tuple), `SetValue` (a set: unique, ordered), dict (map
or object). A type constraint is what a `variable` block's `type` says
(`string`, `list(number)`, `object({a = optional(string, "x")})`, `any`, ...)
and `convert` applies cty's conversion rules to a value: "5" becomes 5 for a
number, 5 becomes "5" for a string, a tuple becomes a list, extra attributes
of an object are dropped."""

from __future__ import annotations

from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from corral.domain.jobspec.language import nodes as n


class SetValue(list[Any]):
    """A cty set: unique elements in a stable order."""


class ConvertError(Exception):
    """A value does not fit a type; the message says why, in cty's words."""


# --------------------------------------------------------------- value helpers


def kind_of(value: Any) -> str:
    """The friendly name of a value's type, for error messages."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, SetValue):
        return "set"
    if isinstance(value, list):
        return "tuple"
    if isinstance(value, dict):
        return "object"
    return type(value).__name__


def normalize_number(value: int | float) -> int | float:
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**63:
        return int(value)
    return value


def format_number(value: int | float) -> str:
    """A number as cty prints it: no exponent, no trailing zeros."""
    value = normalize_number(value)
    if isinstance(value, int):
        return str(value)
    if value != value or value in (float("inf"), float("-inf")):
        return str(value)
    text = format(Decimal(repr(value)), "f")
    if "." in text:
        text = text.rstrip("0").rstrip(".")
    return text


def parse_number(text: str) -> int | float | None:
    t = text.strip()
    if not t or t != text:
        return None
    try:
        if all(c in "0123456789-+" for c in t):
            return int(t)
        f = float(t)
    except ValueError:
        return None
    if f != f or f in (float("inf"), float("-inf")):
        return None
    return normalize_number(f)


def equal(a: Any, b: Any) -> bool:
    """cty equality: the same type and the same value (1 is not "1", true is not 1)."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if isinstance(a, int | float) and isinstance(b, int | float):
        return a == b
    if isinstance(a, str) and isinstance(b, str):
        return a == b
    if a is None or b is None:
        return a is None and b is None
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(equal(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return (
            isinstance(a, SetValue) == isinstance(b, SetValue)
            and len(a) == len(b)
            and all(equal(x, y) for x, y in zip(a, b, strict=True))
        )
    return False


def _sort_key(value: Any) -> tuple[int, Any]:
    if isinstance(value, bool):
        return (0, value)
    if isinstance(value, int | float):
        return (1, value)
    if isinstance(value, str):
        return (2, value)
    return (3, repr(value))


def make_set(values: list[Any]) -> SetValue:
    out = SetValue()
    for v in values:
        if not any(equal(v, o) for o in out):
            out.append(v)
    out.sort(key=_sort_key)
    return out


# --------------------------------------------------------------- types


@dataclass(eq=False)
class Type:
    """kind: string, number, bool, any, list, map, set, object, tuple."""

    kind: str
    elem: Type | None = None
    attrs: dict[str, Type] = field(default_factory=dict)
    # optional object attributes → their default (MISSING: none)
    optional: dict[str, Any] = field(default_factory=dict)
    elems: list[Type] = field(default_factory=list)

    def name(self) -> str:
        if self.kind in ("list", "map", "set"):
            assert self.elem is not None
            return f"{self.kind} of {self.elem.name()}"
        if self.kind == "any":
            return "any type"
        return self.kind

    @property
    def primitive(self) -> bool:
        return self.kind in ("string", "number", "bool")


MISSING = object()
STRING = Type("string")
NUMBER = Type("number")
BOOL = Type("bool")
ANY = Type("any")


def infer(value: Any) -> Type:
    """The type a variable takes from its default when it declares none.
    Collections accept any element type here (cty would pin the default's
    exact tuple or object shape)."""
    if isinstance(value, bool):
        return BOOL
    if isinstance(value, int | float):
        return NUMBER
    if isinstance(value, str):
        return STRING
    return ANY


class TypeExprError(Exception):
    def __init__(self, node: n.Node, message: str) -> None:
        super().__init__(message)
        self.node = node


def type_from_expr(expr: n.Expr, evaluate_default: Any = None) -> Type:
    """A `type = ...` expression (read as syntax, never evaluated)."""
    if isinstance(expr, n.Parens):
        return type_from_expr(expr.expr, evaluate_default)
    if isinstance(expr, n.Traversal) and not expr.steps:
        simple = {"string": STRING, "number": NUMBER, "bool": BOOL, "any": ANY}
        if expr.root in simple:
            return simple[expr.root]
        if expr.root in ("list", "map", "set"):
            return Type(expr.root, elem=ANY)
        raise TypeExprError(
            expr,
            f"{expr.root!r} is not a type (expected string, number, bool, any, list(...), "
            f"map(...), set(...), object({{...}}) or tuple([...]))",
        )
    if isinstance(expr, n.Call):
        if expr.name in ("list", "map", "set"):
            if len(expr.args) != 1:
                raise TypeExprError(expr, f"{expr.name}(...) takes one element type")
            return Type(expr.name, elem=type_from_expr(expr.args[0], evaluate_default))
        if expr.name == "object":
            if len(expr.args) != 1 or not isinstance(expr.args[0], n.ObjectCons):
                raise TypeExprError(
                    expr, "object(...) takes one object of attribute types: object({name = string})"
                )
            t = Type("object")
            for key, value in expr.args[0].items:
                if isinstance(key, n.ObjectKey):
                    name = key.name
                elif (
                    isinstance(key, n.Template)
                    and len(key.parts) == 1
                    and isinstance(key.parts[0], n.TemplateLiteral)
                ):
                    name = key.parts[0].text
                else:
                    raise TypeExprError(key, "an object type's attribute names must be names")
                if isinstance(value, n.Call) and value.name == "optional":
                    if not 1 <= len(value.args) <= 2:
                        raise TypeExprError(value, "optional(type) or optional(type, default)")
                    t.attrs[name] = type_from_expr(value.args[0], evaluate_default)
                    default: Any = MISSING
                    if len(value.args) == 2:
                        if evaluate_default is None:
                            raise TypeExprError(value, "optional defaults are not allowed here")
                        default = evaluate_default(value.args[1])
                        try:
                            default = convert(default, t.attrs[name])
                        except ConvertError as exc:
                            raise TypeExprError(
                                value.args[1],
                                f"invalid default for optional attribute {name!r}: {exc}",
                            ) from None
                    t.optional[name] = default
                else:
                    t.attrs[name] = type_from_expr(value, evaluate_default)
            return t
        if expr.name == "tuple":
            if len(expr.args) != 1 or not isinstance(expr.args[0], n.TupleCons):
                raise TypeExprError(
                    expr, "tuple(...) takes one list of element types: tuple([string, number])"
                )
            return Type(
                "tuple", elems=[type_from_expr(e, evaluate_default) for e in expr.args[0].items]
            )
        if expr.name == "optional":
            raise TypeExprError(
                expr, "optional(...) is allowed only for an attribute of object({...})"
            )
        raise TypeExprError(expr, f"{expr.name}(...) is not a type constructor")
    raise TypeExprError(
        expr,
        "a type constraint must be a type (string, list(number), object({...}), ...), not a value",
    )


# --------------------------------------------------------------- conversion


def convert(value: Any, t: Type, path: str = "") -> Any:
    """`value` as type `t` (cty's convert.Convert), or ConvertError."""
    at = f"{path}: " if path else ""
    if value is None:
        return None
    k = t.kind
    if k == "any":
        return value
    if k == "string":
        if isinstance(value, bool):
            return "true" if value else "false"
        if isinstance(value, int | float):
            return format_number(value)
        if isinstance(value, str):
            return value
        raise ConvertError(f"{at}string required, got {kind_of(value)}")
    if k == "number":
        if isinstance(value, bool):
            raise ConvertError(f"{at}number required, got bool")
        if isinstance(value, int | float):
            return normalize_number(value)
        if isinstance(value, str):
            num = parse_number(value)
            if num is None:
                raise ConvertError(f"{at}a number is required, got {value!r}")
            return num
        raise ConvertError(f"{at}number required, got {kind_of(value)}")
    if k == "bool":
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value in ("true", "false"):
            return value == "true"
        if isinstance(value, str):
            raise ConvertError(f"{at}a bool is required, got {value!r}")
        raise ConvertError(f"{at}bool required, got {kind_of(value)}")
    assert t.elem is not None or k in ("object", "tuple")
    if k in ("list", "set"):
        if not isinstance(value, list):
            raise ConvertError(f"{at}{t.name()} required, got {kind_of(value)}")
        assert t.elem is not None
        items = [convert(v, t.elem, f"{path}[{i}]") for i, v in enumerate(value)]
        return make_set(items) if k == "set" else items
    if k == "map":
        if not isinstance(value, dict):
            raise ConvertError(f"{at}{t.name()} required, got {kind_of(value)}")
        assert t.elem is not None
        return {key: convert(v, t.elem, f"{path}[{key!r}]") for key, v in value.items()}
    if k == "tuple":
        if not isinstance(value, list) or len(value) != len(t.elems):
            raise ConvertError(f"{at}a tuple of {len(t.elems)} elements is required")
        return [
            convert(v, e, f"{path}[{i}]")
            for i, (v, e) in enumerate(zip(value, t.elems, strict=True))
        ]
    if k == "object":
        if not isinstance(value, dict):
            raise ConvertError(f"{at}object required, got {kind_of(value)}")
        out: dict[str, Any] = {}
        for name, at_type in t.attrs.items():
            sub = f"{path}.{name}" if path else name
            if name in value and value[name] is not None:
                out[name] = convert(value[name], at_type, sub)
            elif name in t.optional:
                default = t.optional[name]
                out[name] = None if default is MISSING else default
            elif name in value:
                out[name] = None
            else:
                raise ConvertError(f"{at}attribute {name!r} is required")
        return out
    raise ConvertError(f"{at}unsupported type {t.name()}")
