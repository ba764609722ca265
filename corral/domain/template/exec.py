"""Executing a parsed template (Go's text/template/exec.go), bounded.

The rules are Go's: variables live until the `{{end}}` of the block that
declared them, `{{template}}` starts with only `$`, a map is ranged in key
order, `and`/`or` stop at the first deciding argument, a function's
arguments are checked against its parameter kinds, and an error names the
template, line, column and node ("template: t:3:5: executing "t" at <.X>:
..."). On top of Go, every execution is bounded by `Limits`: the output
size, the number of steps (actions, commands, iterations), the depth of
`{{template}}` calls and the size of any value a function returns, so a
hostile template ends in a TemplateError instead of hanging the agent or
exhausting its memory.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from corral.domain.template import gofmt
from corral.domain.template.errors import LimitExceeded, TemplateError
from corral.domain.template.nodes import (
    ActionNode,
    BoolNode,
    BreakNode,
    ChainNode,
    CommandNode,
    CommentNode,
    ContinueNode,
    DotNode,
    FieldNode,
    IdentifierNode,
    IfNode,
    ListNode,
    NilNode,
    Node,
    NumberNode,
    PipeNode,
    RangeNode,
    StringNode,
    TemplateNode,
    TextNode,
    Tree,
    VariableNode,
    WithNode,
)
from corral.domain.template.values import (
    GO_KIND_NAMES,
    MISSING,
    GoChan,
    GoFunc,
    GoList,
    GoMap,
    GoStruct,
    Int64,
    Signature,
    Uint64,
    go_methods_of,
    is_true,
    type_name,
)


@dataclass(frozen=True)
class Limits:
    """Bounds on one execution. The defaults fit any real Nomad template by
    orders of magnitude (a 200-instance upstream list renders in ~3 ms and
    a few thousand steps) and stop a hostile one within a few seconds."""

    max_output: int = 16 * 1024 * 1024  # characters written by one execution
    max_steps: int = 1_000_000  # actions, commands, range iterations, calls
    max_template_depth: int = 100  # nested {{template}} / executeTemplate
    max_nesting: int = 50  # nested control structures and parentheses (parse)
    max_value_len: int = 4 * 1024 * 1024  # characters of one string value
    max_items: int = 100_000  # items of one list or map a function returns


class FuncError(Exception):
    """What a template function raises to fail the execution: Go's
    `error calling NAME: MESSAGE`."""


@dataclass(frozen=True)
class GoFunction:
    """A function callable from a template: `fn(*args)`, or `fn(exec, *args)`
    when `needs_exec` (functions that read the render's context, recurse into
    the template set or spend the step budget)."""

    fn: Callable[..., Any]
    signature: Signature = Signature()
    needs_exec: bool = False


FuncMap = Mapping[str, GoFunction]

MISSING_KEY_MODES = ("default", "invalid", "zero", "error")


class _NoFinal:
    """Go's `missingVal`: no value is piped into this command."""


_NO_FINAL: Any = _NoFinal()


class _Break(Exception):
    pass


class _Continue(Exception):
    pass


class Executor:
    """The state of one execution (Go's `state`)."""

    def __init__(
        self,
        trees: Mapping[str, Tree],
        funcs: FuncMap,
        builtins: FuncMap,
        missing_key: str,
        limits: Limits,
        context: Any = None,
    ) -> None:
        self.trees = trees
        self.funcs = funcs
        self.builtins = builtins
        self.missing_key = missing_key
        self.limits = limits
        self.context = context
        self.tree: Tree | None = None
        self.node: Node | None = None
        self.vars: list[list[Any]] = []
        self.depth = 0
        self.steps = 0
        self.out: list[str] = []
        self.out_len = 0

    # ------------------------------------------------------------ errors

    def errorf(self, msg: str, cls: type[TemplateError] = TemplateError) -> None:
        name = self.tree.name if self.tree is not None else ""
        if self.node is None or self.tree is None:
            raise cls(f"template: {name}: {msg}")
        location, context = self.tree.error_context(self.node)
        raise cls(f"template: {location}: executing {gofmt.quote(name)} at <{context}>: {msg}")

    def at(self, node: Node) -> None:
        self.node = node

    def charge(self, steps: int = 1) -> None:
        """Spend execution steps; past `max_steps` the execution fails."""
        self.steps += steps
        if self.steps > self.limits.max_steps:
            self.errorf(
                f"execution exceeded the limit of {self.limits.max_steps} steps",
                LimitExceeded,
            )

    def check_size(self, value: Any, what: str) -> Any:
        if isinstance(value, str | bytes) and len(value) > self.limits.max_value_len:
            self.errorf(
                f"{what} exceeds the limit of {self.limits.max_value_len} characters",
                LimitExceeded,
            )
        if isinstance(value, list | tuple | dict) and len(value) > self.limits.max_items:
            self.errorf(f"{what} exceeds the limit of {self.limits.max_items} items", LimitExceeded)
        return value

    def fmt(self, value: Any) -> str:
        """A value as %v, for error messages (short)."""
        try:
            return gofmt.sprint_limited([value], 200)
        except gofmt.TooLong:
            return f"({type_name(value)} too long to print)"

    # ------------------------------------------------------------ output

    def write(self, s: str) -> None:
        self.out_len += len(s)
        if self.out_len > self.limits.max_output:
            self.errorf(
                f"output exceeds the limit of {self.limits.max_output} characters",
                LimitExceeded,
            )
        self.out.append(s)

    # ------------------------------------------------------------ variables

    def push(self, name: str, value: Any) -> None:
        self.vars.append([name, value])

    def mark(self) -> int:
        return len(self.vars)

    def pop(self, mark: int) -> None:
        del self.vars[mark:]

    def set_var(self, name: str, value: Any) -> None:
        for var in reversed(self.vars):
            if var[0] == name:
                var[1] = value
                return
        self.errorf(f"undefined variable: {name}")

    def set_top_var(self, n: int, value: Any) -> None:
        self.vars[len(self.vars) - n][1] = value

    def var_value(self, name: str) -> Any:
        for var in reversed(self.vars):
            if var[0] == name:
                return var[1]
        self.errorf(f"undefined variable: {name}")
        return MISSING

    # ------------------------------------------------------------ entry

    def execute(self, name: str, data: Any) -> str:
        """Run the template `name` with `data` as dot; the output so far is
        discarded on error (a TemplateError is raised)."""
        tree = self.trees.get(name)
        self.tree = tree
        if tree is None:
            raise TemplateError(
                f"template: no template {gofmt.quote(name)} associated with template"
            )
        if tree.root is None:
            self.errorf(f"{gofmt.quote(name)} is an incomplete or empty template")
        self.vars = [["$", data]]
        try:
            assert tree.root is not None
            self.walk(data, tree.root)
        except RecursionError:
            self.errorf("exceeded maximum nesting depth", LimitExceeded)
        return "".join(self.out)

    def execute_template(self, name: str, data: Any) -> str:
        """Run another template of the set into a string (consul-template's
        executeTemplate), sharing this execution's budget."""
        tree = self.trees.get(name)
        if tree is None or tree.root is None:
            raise FuncError(
                f"template: no template {gofmt.quote(name)} associated with template "
                f"{gofmt.quote(self.tree.name if self.tree else '')}"
            )
        if self.depth >= self.limits.max_template_depth:
            self.errorf(
                f"exceeded maximum template depth ({self.limits.max_template_depth})",
                LimitExceeded,
            )
        saved = (self.tree, self.vars, self.out, self.out_len, self.node)
        self.tree, self.vars, self.out, self.depth = tree, [["$", data]], [], self.depth + 1
        try:
            self.walk(data, tree.root)
            result = "".join(self.out)
        finally:
            self.tree, self.vars, self.out, self.out_len, self.node = saved
            self.depth -= 1
        return result

    # ------------------------------------------------------------ walking

    def walk(self, dot: Any, node: Node) -> None:
        self.at(node)
        self.charge()
        if isinstance(node, ActionNode):
            assert node.pipe is not None
            val = self.eval_pipeline(dot, node.pipe)
            if not node.pipe.decl:
                self.print_value(node, val)
        elif isinstance(node, TextNode):
            self.write(node.text)
        elif isinstance(node, ListNode):
            for n in node.nodes:
                self.walk(dot, n)
        elif isinstance(node, IfNode | WithNode):
            self.walk_if_or_with(isinstance(node, WithNode), dot, node)
        elif isinstance(node, RangeNode):
            self.walk_range(dot, node)
        elif isinstance(node, TemplateNode):
            self.walk_template(dot, node)
        elif isinstance(node, CommentNode):
            pass
        elif isinstance(node, BreakNode):
            raise _Break
        elif isinstance(node, ContinueNode):
            raise _Continue
        else:
            self.errorf(f"unknown node: {node}")

    def walk_if_or_with(self, is_with: bool, dot: Any, node: IfNode | WithNode) -> None:
        mark = self.mark()
        try:
            assert node.pipe is not None and node.list is not None
            val = self.eval_pipeline(dot, node.pipe)
            truth, ok = is_true(val)
            if not ok:
                self.errorf(f"if/with can't use {self.fmt(val)}")
            if truth:
                self.walk(val if is_with else dot, node.list)
            elif node.else_list is not None:
                self.walk(dot, node.else_list)
        finally:
            self.pop(mark)

    def walk_range(self, dot: Any, r: RangeNode) -> None:
        self.at(r)
        mark = self.mark()
        assert r.pipe is not None and r.list is not None
        pipe = r.pipe
        body = r.list
        try:
            val = self.eval_pipeline(dot, pipe)
            inner = self.mark()

            def one(index: Any, elem: Any) -> None:
                self.at(r)
                self.charge()
                if pipe.decl:
                    if pipe.is_assign:
                        if len(pipe.decl) > 1:
                            self.set_var(pipe.decl[0].ident[0], index)
                        else:
                            self.set_var(pipe.decl[0].ident[0], elem)
                    else:
                        self.set_top_var(1, elem)
                if len(pipe.decl) > 1:
                    if pipe.is_assign:
                        self.set_var(pipe.decl[1].ident[0], elem)
                    else:
                        self.set_top_var(2, index)
                try:
                    self.walk(elem, body)
                except _Continue:
                    pass
                finally:
                    self.pop(inner)

            ran = False
            try:
                if isinstance(val, list | tuple):
                    for i, elem in enumerate(val):
                        ran = True
                        one(i, elem)
                elif isinstance(val, dict):
                    for key in gofmt.sorted_keys(val):
                        ran = True
                        one(key, val[key])
                elif isinstance(val, GoChan):
                    if len(pipe.decl) > 1:
                        self.at(r)
                        self.errorf(
                            f"can't use {self.fmt(val)} to iterate over more than one variable"
                        )
                    for i, elem in enumerate(val):
                        ran = True
                        one(i, elem)
                elif isinstance(val, int) and not isinstance(val, bool):
                    if len(pipe.decl) > 1:
                        self.errorf(f"can't use {val} to iterate over more than one variable")
                    make = type(val) if isinstance(val, Int64 | Uint64) else int
                    for i in range(int(val)):
                        ran = True
                        one(make(i), make(i))
                elif val is MISSING or val is None:
                    pass
                else:
                    self.errorf(f"range can't iterate over {self.fmt(val)}")
            except _Break:
                return
            if not ran and r.else_list is not None:
                self.walk(dot, r.else_list)
        finally:
            self.pop(mark)

    def walk_template(self, dot: Any, t: TemplateNode) -> None:
        self.at(t)
        tree = self.trees.get(t.name)
        if tree is None or tree.root is None:
            self.errorf(f"template {gofmt.quote(t.name)} not defined")
        assert tree is not None and tree.root is not None
        if self.depth >= self.limits.max_template_depth:
            self.errorf(
                f"exceeded maximum template depth ({self.limits.max_template_depth})",
                LimitExceeded,
            )
        dot = self.eval_pipeline(dot, t.pipe)
        saved = (self.tree, self.vars)
        self.tree, self.vars = tree, [["$", dot]]
        self.depth += 1
        try:
            self.walk(dot, tree.root)
        finally:
            self.tree, self.vars = saved
            self.depth -= 1

    def print_value(self, node: Node, value: Any) -> None:
        self.at(node)
        if value is MISSING:
            self.write("<no value>")
            return
        if isinstance(value, GoFunc):
            self.errorf(f"can't print {node} of type {type_name(value)}")
        if isinstance(value, str):
            self.write(value)
            return
        room = self.limits.max_output - self.out_len
        try:
            text = gofmt.sprint_limited([value], room)
        except gofmt.TooLong:
            self.errorf(
                f"output exceeds the limit of {self.limits.max_output} characters",
                LimitExceeded,
            )
        self.write(text)

    # ------------------------------------------------------------ evaluation

    def eval_pipeline(self, dot: Any, pipe: PipeNode | None) -> Any:
        if pipe is None:
            return MISSING
        self.at(pipe)
        value: Any = _NO_FINAL
        for cmd in pipe.cmds:
            value = self.eval_command(dot, cmd, value)
            if value is None:  # a nil interface: dig down to "no value"
                value = MISSING
        for var in pipe.decl:
            if pipe.is_assign:
                self.set_var(var.ident[0], value)
            else:
                self.push(var.ident[0], value)
        return value

    def not_a_function(self, args: list[Node] | None, final: Any) -> None:
        if (args is not None and len(args) > 1) or final is not _NO_FINAL:
            assert args is not None
            self.errorf(f"can't give argument to non-function {args[0]}")

    def eval_command(self, dot: Any, cmd: CommandNode, final: Any) -> Any:
        self.charge()
        first = cmd.args[0]
        if isinstance(first, FieldNode):
            return self.eval_field_node(dot, first, cmd.args, final)
        if isinstance(first, ChainNode):
            return self.eval_chain_node(dot, first, cmd.args, final)
        if isinstance(first, IdentifierNode):
            return self.eval_function(dot, first, cmd, cmd.args, final)
        if isinstance(first, PipeNode):
            self.not_a_function(cmd.args, final)
            return self.eval_pipeline(dot, first)
        if isinstance(first, VariableNode):
            return self.eval_variable_node(dot, first, cmd.args, final)
        self.at(first)
        self.not_a_function(cmd.args, final)
        if isinstance(first, BoolNode):
            return first.value
        if isinstance(first, DotNode):
            return dot
        if isinstance(first, NilNode):
            self.errorf("nil is not a command")
        if isinstance(first, NumberNode):
            return self.ideal_constant(first)
        if isinstance(first, StringNode):
            return first.text
        self.errorf(f"can't evaluate command {gofmt.quote(str(first))}")
        return MISSING

    def ideal_constant(self, n: NumberNode) -> Any:
        self.at(n)
        text = n.text
        if n.is_complex:
            return n.complex_value
        is_hex_int = (
            len(text) > 2
            and text[0] == "0"
            and text[1] in "xX"
            and not any(c in text for c in "pP")
        )
        if (
            n.is_float
            and not is_hex_int
            and not text.startswith("'")
            and any(c in text for c in ".eEpP")
        ):
            return n.float_value
        if n.is_int:
            return int(n.int_value)
        if n.is_uint:
            self.errorf(f"{text} overflows int")
        return MISSING

    def eval_field_node(
        self, dot: Any, field: FieldNode, args: list[Node] | None, final: Any
    ) -> Any:
        self.at(field)
        return self.eval_field_chain(dot, dot, field, field.ident, args, final)

    def eval_chain_node(
        self, dot: Any, chain: ChainNode, args: list[Node] | None, final: Any
    ) -> Any:
        self.at(chain)
        if not chain.fields:
            self.errorf("internal error: no fields in evalChainNode")
        if isinstance(chain.node, NilNode):
            self.errorf(f"indirection through explicit nil in {chain}")
        assert chain.node is not None
        pipe = self.eval_arg(dot, None, chain.node)
        return self.eval_field_chain(dot, pipe, chain, chain.fields, args, final)

    def eval_variable_node(
        self, dot: Any, var: VariableNode, args: list[Node] | None, final: Any
    ) -> Any:
        self.at(var)
        value = self.var_value(var.ident[0])
        if len(var.ident) == 1:
            self.not_a_function(args, final)
            return value
        return self.eval_field_chain(dot, value, var, var.ident[1:], args, final)

    def eval_field_chain(
        self,
        dot: Any,
        receiver: Any,
        node: Node,
        idents: list[str],
        args: list[Node] | None,
        final: Any,
    ) -> Any:
        for ident in idents[:-1]:
            receiver = self.eval_field(dot, ident, node, None, _NO_FINAL, receiver)
        return self.eval_field(dot, idents[-1], node, args, final, receiver)

    def eval_function(
        self,
        dot: Any,
        node: IdentifierNode,
        cmd: Node,
        args: list[Node] | None,
        final: Any,
    ) -> Any:
        self.at(node)
        name = node.ident
        fn = self.funcs.get(name)
        is_builtin = False
        if fn is None:
            fn = self.builtins.get(name)
            is_builtin = True
        if fn is None:
            self.errorf(f"{gofmt.quote(name)} is not a defined function")
        assert fn is not None
        return self.eval_call(dot, fn, is_builtin, cmd, name, args, final)

    def eval_field(
        self,
        dot: Any,
        field_name: str,
        node: Node,
        args: list[Node] | None,
        final: Any,
        receiver: Any,
    ) -> Any:
        if receiver is MISSING:
            if self.missing_key == "error":
                self.errorf(f"nil data; no entry for key {gofmt.quote(field_name)}")
            return MISSING
        if receiver is None:
            self.errorf(f"nil pointer evaluating interface {{}}.{field_name}")
        method = go_methods_of(receiver).get(field_name)
        if method is not None:
            bound = GoFunction(
                lambda *a: method.fn(receiver, *a), method.signature, needs_exec=False
            )
            return self.eval_call(dot, bound, False, node, field_name, args, final)
        has_args = (args is not None and len(args) > 1) or final is not _NO_FINAL
        if isinstance(receiver, GoStruct):
            if field_name in receiver.go_fields:
                if has_args:
                    self.errorf(f"{field_name} has arguments but cannot be invoked as function")
                return receiver.go_field(field_name)
        elif isinstance(receiver, dict):
            if has_args:
                self.errorf(f"{field_name} is not a method but has arguments")
            if field_name in receiver:
                return receiver[field_name]
            if self.missing_key == "error":
                self.errorf(f"map has no entry for key {gofmt.quote(field_name)}")
            if self.missing_key == "zero":
                return receiver.go_zero() if isinstance(receiver, GoMap) else None
            return MISSING
        self.errorf(f"can't evaluate field {field_name} in type {type_name(receiver)}")
        return MISSING

    def eval_call(
        self,
        dot: Any,
        fn: GoFunction,
        is_builtin: bool,
        node: Node,
        name: str,
        args: list[Node] | None,
        final: Any,
    ) -> Any:
        arg_nodes = args[1:] if args is not None else []
        sig = fn.signature
        num_in = len(arg_nodes) + (0 if final is _NO_FINAL else 1)
        num_fixed = len(sig.params)
        if sig.variadic is not None:
            if num_in < num_fixed:
                self.errorf(
                    f"wrong number of args for {name}: "
                    f"want at least {num_fixed} got {len(arg_nodes)}"
                )
        elif num_in != num_fixed:
            self.errorf(f"wrong number of args for {name}: want {num_fixed} got {num_in}")
        if is_builtin and name in ("and", "or"):
            v: Any = MISSING
            for arg in arg_nodes:
                v = self.eval_arg(dot, "value", arg)
                if is_true(v)[0] == (name == "or"):
                    return v
            if final is not _NO_FINAL:
                v = self.validate_type(final, "value")
            return v
        argv: list[Any] = []
        for i, arg in enumerate(arg_nodes):
            kind = sig.params[i] if i < num_fixed else sig.variadic
            argv.append(self.eval_arg(dot, kind, arg))
        if final is not _NO_FINAL:
            if sig.variadic is None:
                kind = sig.params[-1]
            elif num_in - 1 < num_fixed:
                kind = sig.params[num_in - 1]
            else:
                kind = sig.variadic
            argv.append(self.validate_type(final, kind))
        if is_builtin and name == "call":
            # Go passes the callee's text first, for its error messages.
            callee = str(arg_nodes[0]) if arg_nodes else gofmt.sprint([final])
            argv.insert(0, callee)
        self.charge()
        try:
            result = fn.fn(self, *argv) if fn.needs_exec else fn.fn(*argv)
        except TemplateError:
            raise
        except _Break:
            raise
        except _Continue:
            raise
        except RecursionError:
            raise
        except FuncError as exc:
            self.at(node)
            self.errorf(f"error calling {name}: {exc}")
        except Exception as exc:  # a panic in a function, as Go's safeCall
            self.at(node)
            self.errorf(f"error calling {name}: {_describe(exc)}")
        self.at(node)
        return self.check_size(result, f"the result of {name}")

    def validate_type(self, value: Any, kind: str | None) -> Any:
        if kind is None or kind == "value":
            return value
        if value is MISSING:
            if kind == "any":
                return None
            if kind in ("[]string", "[]any"):
                return GoList([], GO_KIND_NAMES[kind])
            if kind == "map":
                return {}
            self.errorf(f"invalid value; expected {GO_KIND_NAMES.get(kind, kind)}")
        if kind == "any":
            return value
        if _assignable(value, kind):
            return value
        got = "interface {}" if value is None else type_name(value)
        self.errorf(f"wrong type for value; expected {GO_KIND_NAMES.get(kind, kind)}; got {got}")
        return value

    def eval_arg(self, dot: Any, kind: str | None, n: Node) -> Any:
        self.at(n)
        if isinstance(n, DotNode):
            return self.validate_type(dot, kind)
        if isinstance(n, NilNode):
            if kind in ("any", "[]string", "[]any", "map"):
                return None
            if kind == "value":
                return MISSING
            self.errorf(f"cannot assign nil to {GO_KIND_NAMES.get(kind or '', kind)}")
        if isinstance(n, FieldNode):
            return self.validate_type(self.eval_field_node(dot, n, [n], _NO_FINAL), kind)
        if isinstance(n, VariableNode):
            return self.validate_type(self.eval_variable_node(dot, n, None, _NO_FINAL), kind)
        if isinstance(n, PipeNode):
            return self.validate_type(self.eval_pipeline(dot, n), kind)
        if isinstance(n, IdentifierNode):
            return self.validate_type(self.eval_function(dot, n, n, None, _NO_FINAL), kind)
        if isinstance(n, ChainNode):
            return self.validate_type(self.eval_chain_node(dot, n, None, _NO_FINAL), kind)
        if kind == "bool":
            if isinstance(n, BoolNode):
                return n.value
            self.errorf(f"expected bool; found {n}")
        if kind == "float64":
            if isinstance(n, NumberNode) and n.is_float:
                return n.float_value
            self.errorf(f"expected float; found {n}")
        if kind in ("int", "int64"):
            if isinstance(n, NumberNode) and n.is_int:
                return Int64(n.int_value) if kind == "int64" else int(n.int_value)
            self.errorf(f"expected integer; found {n}")
        if kind == "uint64":
            if isinstance(n, NumberNode) and n.is_uint:
                return Uint64(n.int_value)
            self.errorf(f"expected unsigned integer; found {n}")
        if kind == "string":
            if isinstance(n, StringNode):
                return n.text
            self.errorf(f"expected string; found {n}")
        if kind in ("any", "value"):
            if isinstance(n, BoolNode):
                return n.value
            if isinstance(n, NumberNode):
                return self.ideal_constant(n)
            if isinstance(n, StringNode):
                return n.text
            self.errorf(f"can't handle assignment of {n} to empty interface argument")
        self.errorf(f"can't handle {n} for arg of type {GO_KIND_NAMES.get(kind or '', kind)}")
        return MISSING


def _assignable(value: Any, kind: str) -> bool:
    if kind == "string":
        return isinstance(value, str)
    if kind == "int":
        return type(value) is int
    if kind == "int64":
        return isinstance(value, Int64)
    if kind == "uint64":
        return isinstance(value, Uint64)
    if kind == "float64":
        return type(value) is float
    if kind == "bool":
        return isinstance(value, bool)
    if kind == "[]string":
        # Go requires a []string; a list of strings from the data is accepted
        # too (docs/templates.md lists this leniency).
        if isinstance(value, GoList):
            return value.go_type == "[]string" or all(isinstance(v, str) for v in value)
        return isinstance(value, list | tuple) and all(isinstance(v, str) for v in value)
    if kind == "[]any":
        return isinstance(value, list | tuple)
    if kind == "map":
        return isinstance(value, dict)
    return False


def _describe(exc: Exception) -> str:
    text = str(exc)
    return text if text else type(exc).__name__
