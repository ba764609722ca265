"""Expression evaluation with HCL's rules (hclsyntax + cty), in a `Scope`
of variables and functions.

Nomad's jobspec2 evaluates with an "undefined variable" hook: a variable
that is neither `var`, `local` nor an iterator in scope is not an error but
comes back as the text `${...}` it was written as, so runtime
interpolations (`${NOMAD_ALLOC_ID}`, `${attr.kernel.name}`, `${meta.rack}`,
`${node.unique.name}`, `${env["HOME"]}`) reach the client and scheduler
unchanged. A `Scope` with `passthrough=False` (variable defaults and
validation rules) refuses them instead."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from corral.domain.jobspec.language import nodes as n
from corral.domain.jobspec.language.errors import HclError, Source
from corral.domain.jobspec.language.types import (
    NUMBER,
    STRING,
    ConvertError,
    SetValue,
    convert,
    equal,
    format_number,
    kind_of,
    normalize_number,
)

#: the largest string or collection an expression may build (bounds the
#: cost of `range(1e9)`, `format("%999999999s")`, nested for-expressions)
MAX_ITEMS = 100_000
MAX_STRING = 4 * 1024 * 1024


class FunctionError(Exception):
    """A function refused its arguments; the message is the user's."""


Function = Callable[..., Any]
LazyFunction = Callable[["Evaluator", list[n.Expr], "Scope", n.Call], Any]


class Scope:
    def __init__(
        self,
        variables: dict[str, Any],
        functions: dict[str, Function],
        *,
        passthrough: bool,
        lazy: dict[str, LazyFunction] | None = None,
        parent: Scope | None = None,
    ) -> None:
        self.variables = variables
        self.functions = functions
        self.lazy = lazy or {}
        self.passthrough = passthrough
        self.parent = parent
        self.splat: dict[int, Any] = parent.splat if parent else {}

    def child(self, variables: dict[str, Any]) -> Scope:
        return Scope(
            variables, self.functions, passthrough=self.passthrough, lazy=self.lazy, parent=self
        )

    def lookup(self, name: str) -> tuple[bool, Any]:
        scope: Scope | None = self
        while scope is not None:
            if name in scope.variables:
                return True, scope.variables[name]
            scope = scope.parent
        return False, None


class Evaluator:
    def __init__(self, src: Source) -> None:
        self.src = src

    def fail(self, node: n.Node, message: str) -> HclError:
        return self.src.error(node.start, message)

    def text(self, node: n.Node) -> str:
        return self.src.text[node.start : node.end]

    # ------------------------------------------------------------ dispatch

    def eval(self, expr: n.Expr, scope: Scope) -> Any:
        method = getattr(self, "_" + type(expr).__name__)
        return method(expr, scope)

    def _Literal(self, e: n.Literal, scope: Scope) -> Any:
        v = e.value
        return normalize_number(v) if isinstance(v, float) else v

    def _Parens(self, e: n.Parens, scope: Scope) -> Any:
        return self.eval(e.expr, scope)

    def _ObjectKey(self, e: n.ObjectKey, scope: Scope) -> Any:
        return e.name

    def _SplatItem(self, e: n.SplatItem, scope: Scope) -> Any:
        return scope.splat[id(e)]

    # ------------------------------------------------------------ templates

    def _Template(self, e: n.Template, scope: Scope) -> Any:
        if len(e.parts) == 1 and isinstance(e.parts[0], n.TemplateInterp):
            return self.eval(e.parts[0].expr, scope)
        out: list[str] = []
        self._parts(e.parts, scope, out)
        return "".join(out)

    def _parts(self, parts: list[n.TemplatePart], scope: Scope, out: list[str]) -> None:
        for part in parts:
            if isinstance(part, n.TemplateLiteral):
                out.append(part.text)
            elif isinstance(part, n.TemplateInterp):
                out.append(self.template_string(part.expr, self.eval(part.expr, scope)))
            elif isinstance(part, n.TemplateIf):
                if self.truth(part.cond, self.eval(part.cond, scope)):
                    self._parts(part.then, scope, out)
                else:
                    self._parts(part.otherwise, scope, out)
            else:
                coll = self.eval(part.collection, scope)
                for key, value in self.iterate(part.collection, coll):
                    names = {part.value_var: value}
                    if part.key_var:
                        names[part.key_var] = key
                    self._parts(part.body, scope.child(names), out)
            if sum(len(x) for x in out) > MAX_STRING:
                raise self.fail(part, f"the template is longer than {MAX_STRING} characters")

    def template_string(self, node: n.Node, value: Any) -> str:
        if value is None:
            raise self.fail(node, "cannot include a null value in a string template")
        if isinstance(value, list | dict):
            raise self.fail(
                node,
                f"cannot include a {kind_of(value)} in a string template (use jsonencode or join)",
            )
        return str(convert(value, STRING))

    # ------------------------------------------------------------ variables

    def _Traversal(self, e: n.Traversal, scope: Scope) -> Any:
        found, value = scope.lookup(e.root)
        if not found:
            if scope.passthrough:
                return "${" + self.text(e) + "}"
            raise self.fail(e, f"unknown variable {e.root!r} (variables are not allowed here)")
        where = e.root
        for kind, key in e.steps:
            if kind == "attr":
                value = self.get_attr(e, value, str(key), where)
                where = f"{where}.{key}"
            else:
                value = self.index(e, value, key, where)
                where = f"{where}[{key!r}]"
        return value

    def get_attr(self, node: n.Node, value: Any, name: str, where: str) -> Any:
        if value is None:
            raise self.fail(node, f"{where} is null: it has no attribute {name!r}")
        if isinstance(value, dict):
            if name not in value:
                if where == "var":
                    raise self.fail(
                        node,
                        f'unknown variable var.{name}: no `variable "{name}"` block declares it',
                    )
                if where == "local":
                    raise self.fail(
                        node, f"unknown local value local.{name}: no `locals` block sets it"
                    )
                raise self.fail(node, f"{where} has no attribute {name!r}")
            return value[name]
        if isinstance(value, list):
            raise self.fail(
                node,
                f"{where} is a {kind_of(value)}: use an index ({where}[0]) or a splat "
                f"({where}[*].{name})",
            )
        raise self.fail(node, f"{where} is a {kind_of(value)}: it has no attribute {name!r}")

    def index(self, node: n.Node, value: Any, key: Any, where: str) -> Any:
        if value is None:
            raise self.fail(node, f"{where} is null: it cannot be indexed")
        if isinstance(value, SetValue):
            raise self.fail(
                node,
                f"{where} is a set: its elements have no index (convert it with tolist or a "
                f"for expression)",
            )
        if isinstance(value, list):
            try:
                i = convert(key, NUMBER)
            except ConvertError:
                raise self.fail(
                    node, f"{where} is a list: the index must be a number, got {key!r}"
                ) from None
            if not isinstance(i, int) or not 0 <= i < len(value):
                raise self.fail(
                    node, f"index {key!r} is out of range for {where} (length {len(value)})"
                )
            return value[i]
        if isinstance(value, dict):
            try:
                k = convert(key, STRING)
            except ConvertError:
                raise self.fail(node, f"{where} is a map: the key must be a string") from None
            if k not in value:
                raise self.fail(node, f"{where} has no element {k!r}")
            return value[k]
        raise self.fail(node, f"{where} is a {kind_of(value)}: it cannot be indexed")

    def _GetAttr(self, e: n.GetAttr, scope: Scope) -> Any:
        return self.get_attr(e, self.eval(e.source, scope), e.name, self.text(e.source))

    def _Index(self, e: n.Index, scope: Scope) -> Any:
        return self.index(
            e, self.eval(e.source, scope), self.eval(e.key, scope), self.text(e.source)
        )

    def _Splat(self, e: n.Splat, scope: Scope) -> Any:
        source = self.eval(e.source, scope)
        if source is None:
            return []
        items = source if isinstance(source, list) else [source]
        out = []
        for item in items:
            scope.splat[id(e.item)] = item
            out.append(self.eval(e.each, scope))
        scope.splat.pop(id(e.item), None)
        return out

    # ------------------------------------------------------------ calls

    def _Call(self, e: n.Call, scope: Scope) -> Any:
        if e.name in scope.lazy:
            return scope.lazy[e.name](self, e.args, scope, e)
        fn = scope.functions.get(e.name)
        if fn is None:
            raise self.fail(e, f"unknown function {e.name}()")
        args = [self.eval(a, scope) for a in e.args]
        if e.expand_final:
            last = args.pop() if args else None
            if not isinstance(last, list):
                raise self.fail(
                    e, f"{e.name}(): the argument before '...' must be a list, got {kind_of(last)}"
                )
            args.extend(last)
        try:
            result = fn(*args)
        except FunctionError as exc:
            raise self.fail(e, f"{e.name}(): {exc}") from None
        except ConvertError as exc:
            raise self.fail(e, f"{e.name}(): {exc}") from None
        except TypeError as exc:
            if "argument" in str(exc):
                raise self.fail(e, f"{e.name}(): wrong number of arguments") from None
            raise
        if isinstance(result, str) and len(result) > MAX_STRING:
            raise self.fail(e, f"{e.name}(): the result is longer than {MAX_STRING} characters")
        if isinstance(result, list | dict) and len(result) > MAX_ITEMS:
            raise self.fail(e, f"{e.name}(): the result has more than {MAX_ITEMS} elements")
        return result

    # ------------------------------------------------------------ collections

    def _TupleCons(self, e: n.TupleCons, scope: Scope) -> Any:
        return [self.eval(item, scope) for item in e.items]

    def _ObjectCons(self, e: n.ObjectCons, scope: Scope) -> Any:
        out: dict[str, Any] = {}
        for key_expr, value_expr in e.items:
            key = self.eval(key_expr, scope)
            out[self.key_string(key_expr, key)] = self.eval(value_expr, scope)
        return out

    def key_string(self, node: n.Node, key: Any) -> str:
        if key is None:
            raise self.fail(node, "an object key cannot be null")
        try:
            return str(convert(key, STRING))
        except ConvertError:
            raise self.fail(node, f"an object key must be a string, got {kind_of(key)}") from None

    def iterate(self, node: n.Node, coll: Any) -> list[tuple[Any, Any]]:
        if isinstance(coll, SetValue):
            return [(v, v) for v in coll]
        if isinstance(coll, list):
            return list(enumerate(coll))
        if isinstance(coll, dict):
            return [(k, coll[k]) for k in sorted(coll)]
        raise self.fail(
            node, f"cannot iterate over a {kind_of(coll)} (a list, set or map is required)"
        )

    def _ForExpr(self, e: n.ForExpr, scope: Scope) -> Any:
        coll = self.eval(e.collection, scope)
        tuple_out: list[Any] = []
        obj_out: dict[str, Any] = {}
        for key, value in self.iterate(e.collection, coll):
            names = {e.value_var: value}
            if e.key_var:
                names[e.key_var] = key
            inner = scope.child(names)
            if e.cond is not None and not self.truth(e.cond, self.eval(e.cond, inner)):
                continue
            if e.key is None:
                tuple_out.append(self.eval(e.value, inner))
                if len(tuple_out) > MAX_ITEMS:
                    raise self.fail(e, f"the for expression builds more than {MAX_ITEMS} elements")
                continue
            k = self.key_string(e.key, self.eval(e.key, inner))
            v = self.eval(e.value, inner)
            if e.group:
                obj_out.setdefault(k, []).append(v)
            elif k in obj_out:
                raise self.fail(
                    e,
                    f"duplicate key {k!r} in the for expression (add '...' after the value "
                    f"to group)",
                )
            else:
                obj_out[k] = v
        return tuple_out if e.key is None else obj_out

    # ------------------------------------------------------------ operators

    def truth(self, node: n.Node, value: Any) -> bool:
        if isinstance(value, bool):
            return value
        if value == "true" or value == "false":
            return bool(value == "true")
        if value is None:
            raise self.fail(node, "the condition is null (true or false is required)")
        raise self.fail(node, f"true or false is required, got {kind_of(value)} {value!r}")

    def number(self, node: n.Node, value: Any, side: str) -> int | float:
        try:
            result = convert(value, NUMBER)
        except ConvertError:
            result = None
        if result is None:
            raise self.fail(
                node, f"the {side} operand must be a number, got {kind_of(value)} {value!r}"
            )
        assert isinstance(result, int | float)
        return result

    def _Unary(self, e: n.Unary, scope: Scope) -> Any:
        value = self.eval(e.operand, scope)
        if e.op == "!":
            return not self.truth(e.operand, value)
        return normalize_number(-self.number(e.operand, value, "negated"))

    def _Conditional(self, e: n.Conditional, scope: Scope) -> Any:
        if self.truth(e.cond, self.eval(e.cond, scope)):
            return self.eval(e.then, scope)
        return self.eval(e.otherwise, scope)

    def _Binary(self, e: n.Binary, scope: Scope) -> Any:
        op = e.op
        if op in ("&&", "||"):
            left = self.truth(e.left, self.eval(e.left, scope))
            if op == "&&" and not left:
                return False
            if op == "||" and left:
                return True
            return self.truth(e.right, self.eval(e.right, scope))
        a = self.eval(e.left, scope)
        b = self.eval(e.right, scope)
        if op == "==":
            return equal(a, b)
        if op == "!=":
            return not equal(a, b)
        x = self.number(e.left, a, "left")
        y = self.number(e.right, b, "right")
        if op == "<":
            return x < y
        if op == ">":
            return x > y
        if op == "<=":
            return x <= y
        if op == ">=":
            return x >= y
        if op == "+":
            return normalize_number(x + y)
        if op == "-":
            return normalize_number(x - y)
        if op == "*":
            return normalize_number(x * y)
        if y == 0:
            raise self.fail(e, "division by zero")
        if op == "/":
            if isinstance(x, int) and isinstance(y, int) and x % y == 0:
                return x // y
            return normalize_number(x / y)
        # %: the remainder takes the dividend's sign (Go's math.Mod)
        if isinstance(x, int) and isinstance(y, int):
            r = abs(x) % abs(y)
            return -r if x < 0 else r
        return normalize_number(math.fmod(x, y))


def to_string(value: Any) -> str:
    """A primitive value as text (numbers as cty prints them)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return format_number(value)
    return str(value)
