"""The parser of Go's text/template (text/template/parse), with its grammar,
its checks (undefined variables and functions, `{{break}}` outside
`{{range}}`, too many declarations) and its error texts
("template: NAME:LINE: unexpected {{end}}")."""

from __future__ import annotations

import math
import re
from collections.abc import Callable

from corral.domain.template.errors import TemplateError
from corral.domain.template.lexer import Item, Lexer, T
from corral.domain.template.nodes import (
    ActionNode,
    BoolNode,
    BranchNode,
    BreakNode,
    ChainNode,
    CommandNode,
    CommentNode,
    ContinueNode,
    DotNode,
    ElseNode,
    EndNode,
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
    is_empty_tree,
)

# Nesting of parentheses and control structures a template may use; Go's
# parser stops at "max expression depth exceeded" too (for parentheses).
DEFAULT_MAX_DEPTH = 50


class _ParseError(Exception):
    pass


class _Parser:
    def __init__(
        self,
        name: str,
        parse_name: str,
        text: str,
        lex: Lexer,
        has_function: Callable[[str], bool],
        refused: Callable[[str], str | None],
        tree_set: dict[str, Tree],
        max_depth: int,
    ) -> None:
        self.tree = Tree(name=name, parse_name=parse_name, text=text)
        self.text = text
        self.parse_name = parse_name
        self.lex = lex
        self.has_function = has_function
        self.refused = refused
        self.tree_set = tree_set
        self.max_depth = max_depth
        self.depth = 0
        self.tokens: list[Item] = []
        self.last: Item = Item(T.EOF, 0, "", 1)
        self.vars: list[str] = ["$"]
        self.range_depth = 0
        self.action_line = 0

    # --- errors

    def errorf(self, msg: str) -> None:
        raise TemplateError(f"template: {self.parse_name}:{self.last.line}: {msg}")

    def unexpected(self, token: Item, context: str) -> None:
        if token.typ == T.ERROR:
            extra = ""
            if self.action_line and self.action_line != token.line:
                extra = f" in action started at {self.parse_name}:{self.action_line}"
                if token.val.endswith(" action"):
                    extra = extra[len(" in action") :]
            self.errorf(f"{token}{extra}")
        self.errorf(f"unexpected {token} in {context}")

    # --- token stream

    def next(self) -> Item:
        tok = self.tokens.pop() if self.tokens else self.lex.next_item()
        self.last = tok
        return tok

    def backup(self, tok: Item | None = None) -> None:
        self.tokens.append(tok if tok is not None else self.last)

    def peek(self) -> Item:
        tok = self.next()
        self.backup(tok)
        return tok

    def next_non_space(self) -> Item:
        while True:
            tok = self.next()
            if tok.typ != T.SPACE:
                return tok

    def peek_non_space(self) -> Item:
        tok = self.next_non_space()
        self.backup(tok)
        return tok

    def expect(self, expected: T, context: str) -> Item:
        tok = self.next_non_space()
        if tok.typ != expected:
            self.unexpected(tok, context)
        return tok

    def expect_one_of(self, a: T, b: T, context: str) -> Item:
        tok = self.next_non_space()
        if tok.typ not in (a, b):
            self.unexpected(tok, context)
        return tok

    def _node(self, node: Node) -> Node:
        node.tree = self.tree
        return node

    def _enter(self) -> None:
        self.depth += 1
        if self.depth > self.max_depth:
            self.errorf("max expression depth exceeded")

    # --- top level

    def parse(self) -> None:
        self.tree.root = ListNode(self.peek().pos, tree=self.tree)
        while self.peek().typ != T.EOF:
            if self.peek().typ == T.LEFT_DELIM:
                delim = self.next()
                if self.next_non_space().typ == T.DEFINE:
                    sub = _Parser(
                        "definition",
                        self.parse_name,
                        self.text,
                        self.lex,
                        self.has_function,
                        self.refused,
                        self.tree_set,
                        self.max_depth,
                    )
                    sub.tokens = self.tokens
                    sub.last = self.last
                    sub.parse_definition()
                    self.tokens = sub.tokens
                    self.last = sub.last
                    continue
                self.backup(self.last)
                self.backup(delim)
            n = self.text_or_action()
            if isinstance(n, EndNode | ElseNode):
                self.errorf(f"unexpected {n}")
            self.tree.root.nodes.append(n)
        self.add()

    def parse_definition(self) -> None:
        context = "define clause"
        name = self.expect_one_of(T.STRING, T.RAW_STRING, context)
        self.tree.name = self.unquote(name.val)
        self.expect(T.RIGHT_DELIM, context)
        root, end = self.item_list()
        self.tree.root = root
        if not isinstance(end, EndNode):
            self.errorf(f"unexpected {end} in {context}")
        self.add()

    def add(self) -> None:
        existing = self.tree_set.get(self.tree.name)
        if existing is None or is_empty_tree(existing.root):
            self.tree_set[self.tree.name] = self.tree
            return
        if not is_empty_tree(self.tree.root):
            self.errorf(f"template: multiple definition of template {_q(self.tree.name)}")

    def item_list(self) -> tuple[ListNode, Node]:
        lst = ListNode(self.peek_non_space().pos, tree=self.tree)
        while self.peek_non_space().typ != T.EOF:
            n = self.text_or_action()
            if isinstance(n, EndNode | ElseNode):
                return lst, n
            lst.nodes.append(n)
        self.errorf("unexpected EOF")
        raise AssertionError("unreachable")

    def text_or_action(self) -> Node:
        tok = self.next_non_space()
        if tok.typ == T.TEXT:
            return self._node(TextNode(tok.pos, text=tok.val))
        if tok.typ == T.LEFT_DELIM:
            self.action_line = tok.line
            try:
                return self.action()
            finally:
                self.action_line = 0
        if tok.typ == T.COMMENT:
            return self._node(CommentNode(tok.pos, text=tok.val))
        self.unexpected(tok, "input")
        raise AssertionError("unreachable")

    def action(self) -> Node:
        tok = self.next_non_space()
        typ = tok.typ
        if typ == T.BLOCK:
            return self.block_control()
        if typ == T.BREAK:
            return self.break_control(tok.pos, tok.line)
        if typ == T.CONTINUE:
            return self.continue_control(tok.pos, tok.line)
        if typ == T.ELSE:
            return self.else_control()
        if typ == T.END:
            return self.end_control()
        if typ == T.IF:
            return self.branch(IfNode, "if")
        if typ == T.RANGE:
            return self.branch(RangeNode, "range")
        if typ == T.TEMPLATE:
            return self.template_control()
        if typ == T.WITH:
            return self.branch(WithNode, "with")
        self.backup(tok)
        tok = self.peek()
        pipe = self.pipeline("command", T.RIGHT_DELIM)
        return self._node(ActionNode(tok.pos, line=tok.line, pipe=pipe))

    def break_control(self, pos: int, line: int) -> Node:
        tok = self.next_non_space()
        if tok.typ != T.RIGHT_DELIM:
            self.unexpected(tok, "{{break}}")
        if self.range_depth == 0:
            self.errorf("{{break}} outside {{range}}")
        return self._node(BreakNode(pos, line=line))

    def continue_control(self, pos: int, line: int) -> Node:
        tok = self.next_non_space()
        if tok.typ != T.RIGHT_DELIM:
            self.unexpected(tok, "{{continue}}")
        if self.range_depth == 0:
            self.errorf("{{continue}} outside {{range}}")
        return self._node(ContinueNode(pos, line=line))

    def else_control(self) -> Node:
        peek = self.peek_non_space()
        if peek.typ in (T.IF, T.WITH):
            return self._node(ElseNode(peek.pos, line=peek.line))
        tok = self.expect(T.RIGHT_DELIM, "else")
        return self._node(ElseNode(tok.pos, line=tok.line))

    def end_control(self) -> Node:
        tok = self.expect(T.RIGHT_DELIM, "end")
        return self._node(EndNode(tok.pos))

    def branch(self, cls: type[BranchNode], context: str) -> Node:
        self._enter()
        mark = len(self.vars)
        try:
            pipe = self.pipeline(context, T.RIGHT_DELIM)
            if context == "range":
                self.range_depth += 1
            lst, nxt = self.item_list()
            if context == "range":
                self.range_depth -= 1
            else_list: ListNode | None = None
            if isinstance(nxt, ElseNode):
                if context in ("if", "with") and self.peek().typ == (
                    T.IF if context == "if" else T.WITH
                ):
                    # {{else if ...}} is {{else}}{{if ...}}...{{end}}{{end}}
                    self.next()
                    else_list = ListNode(nxt.pos, tree=self.tree)
                    else_list.nodes.append(self.branch(cls, context))
                else:
                    else_list, nxt = self.item_list()
                    if not isinstance(nxt, EndNode):
                        self.errorf(f"expected end; found {nxt}")
            return self._node(
                cls(
                    pipe.pos,
                    line=pipe.line,
                    pipe=pipe,
                    list=lst,
                    else_list=else_list,
                    keyword=context,
                )
            )
        finally:
            del self.vars[mark:]
            self.depth -= 1

    def template_control(self) -> Node:
        context = "template clause"
        tok = self.next_non_space()
        name = self.parse_template_name(tok, context)
        pipe: PipeNode | None = None
        if self.next_non_space().typ != T.RIGHT_DELIM:
            self.backup()
            pipe = self.pipeline(context, T.RIGHT_DELIM)
        return self._node(TemplateNode(tok.pos, line=tok.line, name=name, pipe=pipe))

    def block_control(self) -> Node:
        context = "block clause"
        tok = self.next_non_space()
        name = self.parse_template_name(tok, context)
        pipe = self.pipeline(context, T.RIGHT_DELIM)
        sub = _Parser(
            name,
            self.parse_name,
            self.text,
            self.lex,
            self.has_function,
            self.refused,
            self.tree_set,
            self.max_depth,
        )
        sub.tokens = self.tokens
        sub.last = self.last
        sub.depth = self.depth
        root, end = sub.item_list()
        sub.tree.root = root
        if not isinstance(end, EndNode):
            self.last = sub.last
            self.errorf(f"unexpected {end} in {context}")
        sub.add()
        self.tokens = sub.tokens
        self.last = sub.last
        return self._node(TemplateNode(tok.pos, line=tok.line, name=name, pipe=pipe))

    def parse_template_name(self, tok: Item, context: str) -> str:
        if tok.typ in (T.STRING, T.RAW_STRING):
            return self.unquote(tok.val)
        self.unexpected(tok, context)
        raise AssertionError("unreachable")

    # --- pipelines

    def pipeline(self, context: str, end: T) -> PipeNode:
        tok = self.peek_non_space()
        pipe = PipeNode(tok.pos, line=tok.line, tree=self.tree)
        while True:  # declarations
            v = self.peek_non_space()
            if v.typ != T.VARIABLE:
                break
            self.next_non_space()
            after = self.peek()
            nxt = self.peek_non_space()
            if nxt.typ in (T.ASSIGN, T.DECLARE):
                pipe.is_assign = nxt.typ == T.ASSIGN
                self.next_non_space()
                pipe.decl.append(self._variable(v.pos, v.val))
                self.vars.append(v.val)
            elif nxt.typ == T.CHAR and nxt.val == ",":
                self.next_non_space()
                pipe.decl.append(self._variable(v.pos, v.val))
                self.vars.append(v.val)
                if context == "range" and len(pipe.decl) < 2:
                    if self.peek_non_space().typ in (T.VARIABLE, T.RIGHT_DELIM, T.RIGHT_PAREN):
                        continue
                    self.errorf("range can only initialize variables")
                self.errorf(f"too many declarations in {context}")
            elif after.typ == T.SPACE:
                # put back the variable and the space after it
                self._put_back(v, after)
            else:
                self._put_back(v)
            break
        while True:
            tok = self.next_non_space()
            if tok.typ == end:
                self.check_pipeline(pipe, context)
                return pipe
            if tok.typ in (
                T.BOOL,
                T.CHAR_CONSTANT,
                T.COMPLEX,
                T.DOT,
                T.FIELD,
                T.IDENTIFIER,
                T.NUMBER,
                T.NIL,
                T.RAW_STRING,
                T.STRING,
                T.VARIABLE,
                T.LEFT_PAREN,
            ):
                self.backup(tok)
                pipe.cmds.append(self.command())
            else:
                self.unexpected(tok, context)

    def _put_back(self, *toks: Item) -> None:
        """Undo reading `toks` (Go's backup2/backup3): the pending lookahead
        stays after them."""
        for tok in reversed(toks):
            self.tokens.append(tok)

    def check_pipeline(self, pipe: PipeNode, context: str) -> None:
        if not pipe.cmds:
            self.errorf(f"missing value for {context}")
        for i, c in enumerate(pipe.cmds[1:]):
            first = c.args[0]
            if isinstance(first, BoolNode | DotNode | NilNode | NumberNode | StringNode):
                self.errorf(f"non executable command in pipeline stage {i + 2}")

    def command(self) -> CommandNode:
        cmd = CommandNode(self.peek_non_space().pos, tree=self.tree)
        while True:
            self.peek_non_space()
            operand = self.operand()
            if operand is not None:
                cmd.args.append(operand)
            tok = self.next()
            if tok.typ == T.SPACE:
                continue
            if tok.typ in (T.RIGHT_DELIM, T.RIGHT_PAREN):
                self.backup(tok)
            elif tok.typ == T.PIPE:
                pass
            else:
                self.unexpected(tok, "operand")
            break
        if not cmd.args:
            self.errorf("empty command")
        return cmd

    def operand(self) -> Node | None:
        node = self.term()
        if node is None:
            return None
        if self.peek().typ == T.FIELD:
            chain = ChainNode(self.peek().pos, node=node, tree=self.tree)
            while self.peek().typ == T.FIELD:
                chain.fields.append(self.next().val[1:])
            if isinstance(node, FieldNode):
                return self._node(FieldNode(chain.pos, ident=node.ident + chain.fields))
            if isinstance(node, VariableNode):
                return self._node(VariableNode(chain.pos, ident=node.ident + chain.fields))
            if isinstance(node, BoolNode | StringNode | NumberNode | NilNode | DotNode):
                self.errorf(f"unexpected . after term {_q(str(node))}")
            return chain
        return node

    def term(self) -> Node | None:
        tok = self.next_non_space()
        typ = tok.typ
        if typ == T.IDENTIFIER:
            why = self.refused(tok.val)
            if why is not None:
                self.errorf(why)
            if not self.has_function(tok.val):
                self.errorf(f"function {_q(tok.val)} not defined")
            return self._node(IdentifierNode(tok.pos, ident=tok.val))
        if typ == T.DOT:
            return self._node(DotNode(tok.pos))
        if typ == T.NIL:
            return self._node(NilNode(tok.pos))
        if typ == T.VARIABLE:
            return self.use_var(tok.pos, tok.val)
        if typ == T.FIELD:
            return self._node(FieldNode(tok.pos, ident=tok.val[1:].split(".")))
        if typ == T.BOOL:
            return self._node(BoolNode(tok.pos, value=tok.val == "true"))
        if typ in (T.CHAR_CONSTANT, T.COMPLEX, T.NUMBER):
            return self.number(tok)
        if typ == T.LEFT_PAREN:
            self._enter()
            try:
                return self.pipeline("parenthesized pipeline", T.RIGHT_PAREN)
            finally:
                self.depth -= 1
        if typ in (T.STRING, T.RAW_STRING):
            return self._node(StringNode(tok.pos, quoted=tok.val, text=self.unquote(tok.val)))
        self.backup(tok)
        return None

    def _variable(self, pos: int, name: str) -> VariableNode:
        node = VariableNode(pos, ident=name.split("."), tree=self.tree)
        return node

    def use_var(self, pos: int, name: str) -> VariableNode:
        v = self._variable(pos, name)
        if v.ident[0] in self.vars:
            return v
        self.errorf(f"undefined variable {_q(v.ident[0])}")
        raise AssertionError("unreachable")

    # --- literals

    def unquote(self, quoted: str) -> str:
        try:
            return unquote(quoted)
        except ValueError:
            self.errorf("invalid syntax")
            raise AssertionError("unreachable") from None

    def number(self, tok: Item) -> NumberNode:
        try:
            return self._number(tok)
        except ValueError as exc:
            self.errorf(str(exc))
            raise AssertionError("unreachable") from None

    def _number(self, tok: Item) -> NumberNode:
        text = tok.val
        n = NumberNode(tok.pos, text=text, tree=self.tree)
        if tok.typ == T.CHAR_CONSTANT:
            body = text[1:-1] if len(text) >= 2 else ""
            code = unquote_char_constant(body, text)
            n.is_int = n.is_uint = n.is_float = True
            n.int_value = code
            n.float_value = float(code)
            return n
        if tok.typ == T.COMPLEX:
            m = re.fullmatch(r"([+-]?[^+-]+(?:[eE][+-]?\d+)?)([+-].+)i", text)
            if not m:
                raise ValueError(f"expected integer; found {text}")
            n.is_complex = True
            n.complex_value = complex(_parse_float(m.group(1)), _parse_float(m.group(2)))
            _simplify_complex(n)
            return n
        if text.endswith("i"):
            try:
                f = _parse_float(text[:-1])
            except ValueError:
                pass
            else:
                n.is_complex = True
                n.complex_value = complex(0, f)
                _simplify_complex(n)
                return n
        u = _parse_int(text, signed=False)
        if u is not None and u < 1 << 64:
            n.is_uint = True
            uval = u
        i = _parse_int(text, signed=True)
        if i is not None and -(1 << 63) <= i < 1 << 63:
            n.is_int = True
            n.int_value = i
            if i == 0:
                n.is_uint = True
        if n.is_int:
            n.is_float = True
            n.float_value = float(n.int_value)
        elif n.is_uint:
            n.is_float = True
            n.int_value = uval
            n.float_value = float(uval)
        else:
            try:
                parsed: float | None = _parse_float(text)
            except ValueError:
                parsed = None
            if parsed is not None:
                f = parsed
                if not any(c in text for c in ".eEpP"):
                    raise ValueError(f"integer overflow: {_q(text)}")
                n.is_float = True
                n.float_value = f
                if math.isfinite(f) and f == int(f):
                    iv = int(f)
                    if -(1 << 63) <= iv < 1 << 63:
                        n.is_int = True
                        n.int_value = iv
                    if 0 <= iv < 1 << 64:
                        n.is_uint = True
                        if not n.is_int:
                            n.int_value = iv
        if not (n.is_int or n.is_uint or n.is_float):
            raise ValueError(f"illegal number syntax: {_q(text)}")
        return n


def _simplify_complex(n: NumberNode) -> None:
    if n.complex_value.imag == 0:
        n.is_float = True
        n.float_value = n.complex_value.real
        f = n.float_value
        if math.isfinite(f) and f == int(f) and -(1 << 63) <= int(f) < 1 << 63:
            n.is_int = True
            n.int_value = int(f)


_DEC = re.compile(r"[+-]?(?:[0-9](?:_?[0-9])*)\Z")
_HEX = re.compile(r"[+-]?0[xX](?:_?[0-9a-fA-F])+\Z")
_OCT = re.compile(r"[+-]?0[oO]?(?:_?[0-7])+\Z")
_BIN = re.compile(r"[+-]?0[bB](?:_?[01])+\Z")


def _parse_int(text: str, signed: bool) -> int | None:
    """strconv.ParseInt/ParseUint(text, 0, 64) syntax (range checked by the caller)."""
    if not signed and text[:1] in "+-" and text[:1] != "":
        return None
    sign = -1 if text.startswith("-") else 1
    body = text.lstrip("+-") if text[:1] in "+-" else text
    if len(text) - len(body) > 1:
        return None
    try:
        if _HEX.match(body):
            return sign * int(body.replace("_", "")[2:], 16)
        if _BIN.match(body):
            return sign * int(body.replace("_", "")[2:], 2)
        if _OCT.match(body) and len(body) > 1:
            digits = body.replace("_", "")[1:]
            if digits[:1] in "oO" and digits[:1] != "":
                digits = digits[1:]
            return sign * int(digits, 8)
        if _DEC.match(body):
            return sign * int(body.replace("_", ""), 10)
    except ValueError:
        return None
    return None


_FLOAT = re.compile(
    r"[+-]?(?:(?:\d(?:_?\d)*)?\.?\d*(?:_?\d)*(?:[eE][+-]?\d+)?|0[xX][0-9a-fA-F_.]+[pP][+-]?\d+|[iI]nf(?:inity)?|NaN)\Z"
)


def _parse_float(text: str) -> float:
    if not text or not _FLOAT.match(text) or text in ("+", "-", ".", "+.", "-."):
        raise ValueError(f"illegal number syntax: {_q(text)}")
    if "x" in text.lower() and "p" in text.lower():
        value = float.fromhex(text.replace("_", ""))
    else:
        value = float(text.replace("_", ""))
    if not math.isfinite(value):
        raise ValueError(f"illegal number syntax: {_q(text)}")
    return value


_SIMPLE = {"a": "\a", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "v": "\v", "\\": "\\"}


def _unquote_char(s: str, i: int, quote: str) -> tuple[str, int]:
    """One (possibly escaped) character of a Go literal at s[i:]."""
    ch = s[i]
    if ch != "\\":
        if ch == quote:
            raise ValueError("invalid syntax")
        return ch, i + 1
    if i + 1 >= len(s):
        raise ValueError("invalid syntax")
    c = s[i + 1]
    if c in _SIMPLE:
        return _SIMPLE[c], i + 2
    if c == quote and quote in "'\"":
        return c, i + 2
    if c in "xuU":
        n = {"x": 2, "u": 4, "U": 8}[c]
        digits = s[i + 2 : i + 2 + n]
        if len(digits) != n or not all(d in "0123456789abcdefABCDEF" for d in digits):
            raise ValueError("invalid syntax")
        code = int(digits, 16)
        if c == "x":
            return chr(code), i + 2 + n  # a byte; text is UTF-8 so keep as rune
        if code > 0x10FFFF or 0xD800 <= code <= 0xDFFF:
            raise ValueError("invalid syntax")
        return chr(code), i + 2 + n
    if c in "01234567":
        digits = s[i + 1 : i + 4]
        if len(digits) != 3 or not all(d in "01234567" for d in digits):
            raise ValueError("invalid syntax")
        code = int(digits, 8)
        if code > 255:
            raise ValueError("invalid syntax")
        return chr(code), i + 4
    raise ValueError("invalid syntax")


def unquote(quoted: str) -> str:
    """strconv.Unquote for "..." and `...` literals."""
    if len(quoted) < 2:
        raise ValueError("invalid syntax")
    q = quoted[0]
    if q != quoted[-1]:
        raise ValueError("invalid syntax")
    body = quoted[1:-1]
    if q == "`":
        if "`" in body:
            raise ValueError("invalid syntax")
        return body.replace("\r", "")
    if q != '"':
        raise ValueError("invalid syntax")
    if "\\" not in body and '"' not in body:
        return body
    out = []
    i = 0
    while i < len(body):
        ch, i = _unquote_char(body, i, '"')
        out.append(ch)
    return "".join(out)


def unquote_char_constant(body: str, text: str) -> int:
    if not body:
        raise ValueError("invalid syntax")
    ch, i = _unquote_char(body, 0, "'")
    if i != len(body):
        raise ValueError(f"malformed character constant: {text}")
    return ord(ch)


def _q(s: str) -> str:
    from corral.domain.template.gofmt import quote

    return quote(s)


def parse(
    name: str,
    text: str,
    *,
    left: str = "{{",
    right: str = "}}",
    has_function: Callable[[str], bool],
    refused: Callable[[str], str | None] = lambda _: None,
    max_depth: int = DEFAULT_MAX_DEPTH,
) -> dict[str, Tree]:
    """Parse `text` into its named trees (the main one and each {{define}}
    or {{block}}). Raises TemplateError with Go's message on bad syntax."""
    lex = Lexer(
        text,
        left,
        right,
        break_ok=not has_function("break"),
        continue_ok=not has_function("continue"),
    )
    tree_set: dict[str, Tree] = {}
    p = _Parser(name, name, text, lex, has_function, refused, tree_set, max_depth)
    p.parse()
    return tree_set
