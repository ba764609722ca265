"""Input variables and locals, by Nomad's jobspec2 rules (types.variables.go,
taken there from Packer):

* `variable "name" { type, default, description, validation { condition,
  error_message } }` and the short `variables { name = default }`;
* values from, in rising precedence: the default, `NOMAD_VAR_<name>`
  environment variables, var files (HCL or JSON) in order, the API's
  `Variables` text, `-var name=value` flags. A flag or environment value is
  taken as text for string, number and untyped variables and parsed as an
  HCL expression for every other type; every value is converted to the
  declared type;
* every declared variable must end up with a value; each validation rule
  may refer only to its own variable and must hold;
* locals may refer to variables and to each other in any order (a cycle is
  an error)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from corral.domain.jobspec.language import nodes as n
from corral.domain.jobspec.language.errors import HclError, Source
from corral.domain.jobspec.language.evaluate import Evaluator, Scope
from corral.domain.jobspec.language.parser import parse_config, parse_expression
from corral.domain.jobspec.language.types import (
    ConvertError,
    Type,
    TypeExprError,
    convert,
    infer,
    type_from_expr,
)

ENV_PREFIX = "NOMAD_VAR_"


@dataclass
class VarInputs:
    """Where variable values come from besides the job file."""

    #: `-var name=value` flags, in order
    args: list[str] = field(default_factory=list)
    #: var files as (name, text), in order (HCL, or JSON when the text starts with '{')
    files: list[tuple[str, str]] = field(default_factory=list)
    #: the process environment (only NOMAD_VAR_* entries are read)
    env: dict[str, str] = field(default_factory=dict)
    #: a var file's text given inline (the HTTP API's `Variables`)
    content: str = ""
    #: refuse values for undeclared variables (else they are warnings)
    strict: bool = False

    def flags(self) -> dict[str, str]:
        """The -var flags as name → text, later flags winning."""
        out: dict[str, str] = {}
        for arg in self.args:
            name, _, value = arg.partition("=")
            out[name] = value
        return out


@dataclass
class Validation:
    condition: n.Expr
    error_message: str
    line: int


@dataclass
class Variable:
    name: str
    line: int
    type: Type | None = None
    description: str = ""
    has_value: bool = False
    value: Any = None
    source: str = "default"  # default, env, varfile, cmd
    validations: list[Validation] = field(default_factory=list)


class Declarations:
    """The job file's variables, then their values."""

    def __init__(self, src: Source, ev: Evaluator, empty_scope: Scope) -> None:
        self.src = src
        self.ev = ev
        self.empty = empty_scope  # functions but no variables: defaults, var files
        self.vars: dict[str, Variable] = {}
        self.warnings: list[str] = []

    # ------------------------------------------------------------ declarations

    def declare_block(self, block: n.Block) -> None:
        if len(block.labels) != 1:
            raise self.src.error(
                block.start, 'a variable block takes one label: variable "name" { ... }'
            )
        name = block.labels[0]
        self._check_name(name, block.start)
        v = Variable(name, self.src.line(block.start))
        attrs = {a.name: a for a in block.body.attributes}
        for a in block.body.attributes:
            if a.name not in ("type", "default", "description"):
                raise self.src.error(
                    a.start,
                    f'variable "{name}" > {a.name}: unknown argument (a variable block '
                    f"takes type, default, description and validation blocks)",
                )
        for b in block.body.blocks:
            if b.type != "validation":
                raise self.src.error(
                    b.start, f'variable "{name}" > {b.type}: unknown block (only validation blocks)'
                )
            v.validations.append(self._validation(name, b))
        if "description" in attrs:
            desc = self.ev.eval(attrs["description"].expr, self.empty)
            if not isinstance(desc, str):
                raise self.src.error(
                    attrs["description"].start, f'variable "{name}" > description: must be a string'
                )
            v.description = desc
        if "type" in attrs:
            try:
                v.type = type_from_expr(attrs["type"].expr, lambda e: self.ev.eval(e, self.empty))
            except TypeExprError as exc:
                raise self.src.error(exc.node.start, f'variable "{name}" > type: {exc}') from None
        if "default" in attrs:
            value = self.ev.eval(attrs["default"].expr, self.empty)
            if v.type is not None:
                try:
                    value = convert(value, v.type)
                except ConvertError as exc:
                    raise self.src.error(
                        attrs["default"].start,
                        f'variable "{name}" > default: not compatible with the type '
                        f"{v.type.name()}: {exc}",
                    ) from None
            else:
                v.type = infer(value)
            v.has_value, v.value = True, value
        self._add(v, block.start)

    def declare_short(self, block: n.Block) -> None:
        """`variables { name = default ... }`."""
        if block.labels:
            raise self.src.error(block.start, "a variables block takes no label")
        if block.body.blocks:
            raise self.src.error(
                block.body.blocks[0].start, "a variables block holds only name = default arguments"
            )
        for a in block.body.attributes:
            self._check_name(a.name, a.start)
            value = self.ev.eval(a.expr, self.empty)
            v = Variable(
                a.name, self.src.line(a.start), type=infer(value), has_value=True, value=value
            )
            self._add(v, a.start)

    def _check_name(self, name: str, at: int) -> None:
        import re

        if not re.fullmatch(r"[^\W\d][\w-]*", name):
            raise self.src.error(
                at,
                f"invalid variable name {name!r}: a name starts with a letter or underscore "
                f"and holds only letters, digits, underscores and dashes",
            )

    def _add(self, v: Variable, at: int) -> None:
        if v.name in self.vars:
            raise self.src.error(
                at,
                f'variable "{v.name}" is declared twice (first at line {self.vars[v.name].line})',
            )
        self.vars[v.name] = v

    def _validation(self, name: str, block: n.Block) -> Validation:
        attrs = {a.name: a for a in block.body.attributes}
        where = f'variable "{name}" > validation'
        for a in block.body.attributes:
            if a.name not in ("condition", "error_message"):
                raise self.src.error(
                    a.start, f"{where} > {a.name}: unknown argument (condition and error_message)"
                )
        for required in ("condition", "error_message"):
            if required not in attrs:
                raise self.src.error(block.start, f"{where}: {required} is required")
        cond = attrs["condition"].expr
        refs = list(_traversals(cond))
        for t in refs:
            if not (t.root == "var" and t.steps and t.steps[0] == ("attr", name)):
                raise self.src.error(
                    t.start,
                    f"{where} > condition: can refer only to the variable itself, var.{name}",
                )
        if not refs:
            raise self.src.error(
                cond.start, f"{where} > condition: must refer to var.{name} to test its value"
            )
        message = self.ev.eval(attrs["error_message"].expr, self.empty)
        if not isinstance(message, str) or not message.strip():
            raise self.src.error(
                attrs["error_message"].start, f"{where} > error_message: must be a non-empty string"
            )
        return Validation(cond, message, self.src.line(block.start))

    # ------------------------------------------------------------ values

    def assign(self, inputs: VarInputs) -> None:
        for key, text in sorted(inputs.env.items()):
            if key.startswith(ENV_PREFIX) and key[len(ENV_PREFIX) :]:
                name = key[len(ENV_PREFIX) :]
                if name in self.vars:
                    self._from_text(name, text, f"<value for var.{name} from environment>", "env")
        for fname, text in inputs.files:
            self._from_file(fname, text, inputs.strict)
        if inputs.content.strip():
            self._from_file("<Variables>", inputs.content, inputs.strict)
        for name, text in inputs.flags().items():
            if name not in self.vars:
                self._undeclared(name, "-var", inputs.strict)
                continue
            self._from_text(name, text, f"<value for var.{name} from -var>", "cmd")

    def _undeclared(self, name: str, where: str, strict: bool) -> None:
        message = f"{where}: a value was given for {name!r} but the job declares no such variable"
        if strict:
            raise HclError(where, None, message.split(": ", 1)[1])
        self.warnings.append(message)

    def _set(self, name: str, value: Any, source: str, where: str, line: int | None) -> None:
        v = self.vars[name]
        if v.type is not None:
            try:
                value = convert(value, v.type)
            except ConvertError as exc:
                raise HclError(
                    where,
                    line,
                    f"the value for var.{name} is not compatible with its type "
                    f"{v.type.name()}: {exc}",
                ) from None
        v.has_value, v.value, v.source = True, value, source

    def _from_text(self, name: str, text: str, where: str, source: str) -> None:
        v = self.vars[name]
        if v.type is None or v.type.kind in ("string", "number"):
            self._set(name, text, source, where, None)
            return
        try:
            expr = parse_expression(text, where)
        except HclError as exc:
            raise HclError(
                where, None, f"cannot read the value of var.{name}: {exc.message}"
            ) from None
        value = Evaluator(Source(text, where)).eval(expr, _no_variables(self.empty))
        self._set(name, value, source, where, None)

    def _from_file(self, fname: str, text: str, strict: bool) -> None:
        if text.lstrip().startswith("{"):
            try:
                data = json.loads(text)
            except (json.JSONDecodeError, RecursionError) as exc:
                line = getattr(exc, "lineno", None)
                raise HclError(fname, line, f"invalid JSON: {getattr(exc, 'msg', exc)}") from None
            if not isinstance(data, dict):
                raise HclError(fname, None, "a JSON var file must hold an object of name: value")
            for name, value in data.items():
                if name not in self.vars:
                    self._undeclared(name, fname, strict)
                    continue
                self._set(name, _json_value(value), "varfile", fname, None)
            return
        body = parse_config(text, fname)
        src = Source(text, fname)
        for b in body.blocks:
            if b.type == "variable":
                raise src.error(
                    b.start,
                    f"a var file assigns values (name = value); it cannot declare variable "
                    f"{b.labels[0] if b.labels else ''!r}: move the block to the job file",
                )
            raise src.error(
                b.start, f"a var file holds only name = value arguments, found a {b.type} block"
            )
        ev = Evaluator(src)
        for a in body.attributes:
            if a.name not in self.vars:
                self._undeclared(a.name, f"{fname}:{src.line(a.start)}", strict)
                continue
            value = ev.eval(a.expr, _no_variables(self.empty))
            self._set(a.name, value, "varfile", fname, src.line(a.start))

    def values(self) -> dict[str, Any]:
        """Every variable's value, after its validation rules; an unset
        variable is an error."""
        out: dict[str, Any] = {}
        for name, v in self.vars.items():
            if not v.has_value:
                raise self.src.error(
                    _offset_of_line(self.src, v.line),
                    f'variable "{name}" has no value: give it a default, -var {name}=..., a '
                    f"var file or NOMAD_VAR_{name}",
                )
            out[name] = v.value
        for name, v in self.vars.items():
            scope = self.empty.child({"var": {name: v.value}})
            scope.passthrough = False
            for rule in v.validations:
                ok = self.ev.eval(rule.condition, scope)
                if ok is None:
                    raise self.src.error(
                        rule.condition.start,
                        f'variable "{name}" > validation: the condition is null',
                    )
                if not isinstance(ok, bool):
                    try:
                        ok = convert(ok, Type("bool"))
                    except ConvertError:
                        raise self.src.error(
                            rule.condition.start,
                            f'variable "{name}" > validation: the condition must be true or false',
                        ) from None
                if not ok:
                    raise self.src.error(
                        rule.condition.start,
                        f"invalid value for var.{name} (from {_SOURCES[v.source]}): "
                        f"{rule.error_message}",
                    )
        return out


_SOURCES = {
    "default": "its default",
    "env": "the environment",
    "varfile": "a var file",
    "cmd": "-var",
}


def _no_variables(scope: Scope) -> Scope:
    child = scope.child({})
    child.passthrough = False
    return child


def _offset_of_line(src: Source, line: int) -> int:
    offset = 0
    for _ in range(line - 1):
        nl = src.text.find("\n", offset)
        if nl < 0:
            break
        offset = nl + 1
    return offset


def _json_value(value: Any) -> Any:
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, dict):
        return {k: _json_value(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_json_value(v) for v in value]
    return value


def _traversals(expr: n.Node) -> list[n.Traversal]:
    """Every variable reference inside an expression (iterators excluded
    only by name, which validation conditions rarely need)."""
    out: list[n.Traversal] = []
    bound: set[str] = set()

    def walk(node: object) -> None:
        if isinstance(node, n.Traversal):
            if node.root not in bound:
                out.append(node)
            return
        if isinstance(node, n.ForExpr | n.TemplateFor):
            walk(node.collection)
            names = {node.value_var} | ({node.key_var} if node.key_var else set())
            added = names - bound
            bound.update(added)
            for child in (
                [node.key, node.value, node.cond] if isinstance(node, n.ForExpr) else node.body
            ):
                walk(child)
            bound.difference_update(added)
            return
        if isinstance(node, n.Node):
            for value in vars(node).values():
                walk(value)
        elif isinstance(node, list | tuple):
            for item in node:
                walk(item)

    walk(expr)
    return out


def evaluate_locals(
    blocks: list[n.Block], ev: Evaluator, scope: Scope, src: Source
) -> dict[str, Any]:
    """Every `locals` attribute, evaluated in an order that satisfies their
    references to each other; `scope` holds `var` and will hold `local`."""
    pending: list[n.Attribute] = []
    seen: dict[str, int] = {}
    for block in blocks:
        if block.labels:
            raise src.error(block.start, "a locals block takes no label")
        if block.body.blocks:
            raise src.error(
                block.body.blocks[0].start, "a locals block holds only name = value arguments"
            )
        for a in block.body.attributes:
            if a.name in seen:
                raise src.error(
                    a.start, f"local.{a.name} is set twice (first at line {seen[a.name]})"
                )
            seen[a.name] = src.line(a.start)
            pending.append(a)
    values: dict[str, Any] = {}
    scope.variables["local"] = values
    while pending:
        progressed = False
        failed: list[tuple[n.Attribute, HclError]] = []
        for a in pending:
            try:
                values[a.name] = ev.eval(a.expr, scope)
                progressed = True
            except HclError as exc:
                failed.append((a, exc))
        pending = [a for a, _ in failed]
        if failed and not progressed:
            names = {a.name for a, _ in failed}
            a, first_error = failed[0]
            waits = [
                t.steps[0][1]
                for t in _traversals(a.expr)
                if t.root == "local" and t.steps and t.steps[0][1] in names
            ]
            if waits:
                raise src.error(
                    a.start,
                    f"local.{a.name} depends on local.{waits[0]}, which depends back on it "
                    f"(a cycle)",
                )
            raise first_error
    return values
