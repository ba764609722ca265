"""HCL native syntax → `nodes`: a recursive-descent reading of HashiCorp's
hclsyntax specification (the grammar Nomad's jobspec2 parses with).

Written here rather than taken from python-hcl2 because evaluation needs what
its tree does not give: heredocs there are one raw token (their
interpolations and directives would need a second parser), template
directives come back flat, an attribute-only splat swallows the index after
it, and a closing heredoc marker followed by spaces is a syntax error (Go's
HCL accepts it). Newlines end an argument except inside parentheses,
brackets, for-expressions and interpolations, as in Go's parser."""

from __future__ import annotations

import re
from dataclasses import dataclass

from corral.domain.jobspec.language import nodes as n
from corral.domain.jobspec.language.errors import HclError, Source

MAX_DEPTH = 64
_IDENT = re.compile(r"[^\W\d][\w-]*", re.UNICODE)
_NUMBER = re.compile(r"[0-9]+(\.[0-9]+)?([eE][+-]?[0-9]+)?")
_FOR = re.compile(r"for[ \t\r\n]+[^\W\d]", re.UNICODE)
_ESCAPES = {"n": "\n", "r": "\r", "t": "\t", '"': '"', "\\": "\\"}
_BINARY_LEVELS = (
    ("||",),
    ("&&",),
    ("==", "!="),
    (">=", "<=", ">", "<"),
    ("+", "-"),
    ("*", "/", "%"),
)


def parse_config(text: str, filename: str) -> n.Body:
    """A whole file: one body of attributes and blocks."""
    return _Parser(Source(text, filename)).file()


def parse_expression(text: str, filename: str) -> n.Expr:
    """One expression (a `-var` value of a structured type)."""
    p = _Parser(Source(text, filename))
    p.nl.append(False)
    expr = p.expression()
    p.skip(True)
    if p.pos < p.n:
        raise p.err(f"unexpected {p.describe()} after the expression")
    return expr


@dataclass
class _Tok:
    """A flat template token before directives are nested: literal text
    ("lit"), an interpolation ("interp") or a directive keyword."""

    kind: str
    start: int
    end: int
    text: str = ""
    expr: n.Expr | None = None
    for_vars: tuple[str | None, str] = (None, "")
    strip_left: bool = False
    strip_right: bool = False


class _Parser:
    def __init__(self, src: Source) -> None:
        self.src = src
        self.s = src.text
        self.n = len(self.s)
        self.pos = 0
        # whether newlines are significant here (False inside brackets)
        self.nl: list[bool] = [True]
        self.depth = 0

    # ------------------------------------------------------------ helpers

    def err(self, message: str, at: int | None = None) -> HclError:
        return self.src.error(self.pos if at is None else at, f"syntax error: {message}")

    def describe(self) -> str:
        if self.pos >= self.n:
            return "end of file"
        c = self.s[self.pos]
        if c == "\n":
            return "end of line"
        m = _IDENT.match(self.s, self.pos)
        return repr(m.group(0)) if m else repr(c)

    def skip(self, newlines: bool | None = None) -> None:
        """Skip spaces and comments (and newlines where they do not count)."""
        if newlines is None:
            newlines = not self.nl[-1]
        s, pos, end = self.s, self.pos, self.n
        while pos < end:
            c = s[pos]
            if c in " \t\r" or (c == "\n" and newlines):
                pos += 1
            elif c == "#" or (c == "/" and s.startswith("//", pos)):
                nl = s.find("\n", pos)
                pos = end if nl < 0 else nl
            elif c == "/" and s.startswith("/*", pos):
                close = s.find("*/", pos + 2)
                if close < 0:
                    raise self.err("unterminated comment (a '/*' without '*/')", pos)
                pos = close + 2
            else:
                break
        self.pos = pos

    def peek(self, text: str) -> bool:
        return self.s.startswith(text, self.pos)

    def expect(self, text: str, what: str) -> None:
        self.skip()
        if not self.peek(text):
            raise self.err(f"expected {what}, found {self.describe()}")
        self.pos += len(text)

    def ident(self, what: str = "a name") -> str:
        m = _IDENT.match(self.s, self.pos)
        if not m:
            raise self.err(f"expected {what}, found {self.describe()}")
        self.pos = m.end()
        return m.group(0)

    def enter(self) -> None:
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise self.err(f"nested more than {MAX_DEPTH} levels deep")

    # ------------------------------------------------------------ structure

    def file(self) -> n.Body:
        body = self.body(closing=False)
        return body

    def body(self, *, closing: bool) -> n.Body:
        self.enter()
        body = n.Body(self.pos, self.pos)
        seen: dict[str, n.Attribute] = {}
        while True:
            self.skip(True)
            if self.pos >= self.n:
                if closing:
                    raise self.err("unexpected end of file (a missing '}'?)")
                break
            if self.s[self.pos] == "}":
                if closing:
                    break
                raise self.err("unexpected '}' (one too many?)")
            start = self.pos
            if self.s[self.pos] == '"':
                raise self.err("an argument or block name cannot be quoted")
            name = self.ident("an argument or block name")
            self.skip(False)
            if self.peek("=") and not self.peek("=="):
                self.pos += 1
                self.nl.append(True)
                expr = self.expression()
                self.nl.pop()
                attr = n.Attribute(start, expr.end, name, expr)
                if name in seen:
                    first = self.src.line(seen[name].start)
                    raise self.err(f"{name}: set twice (first at line {first})", start)
                seen[name] = attr
                body.attributes.append(attr)
                body.items.append(attr)
            else:
                labels: list[str] = []
                while not self.peek("{"):
                    if self.peek('"'):
                        labels.append(self.label())
                    elif _IDENT.match(self.s, self.pos):
                        labels.append(self.ident())
                    else:
                        raise self.err(
                            f"expected '=' or a block "
                            f"('{{') after {name!r}, found {self.describe()}"
                        )
                    self.skip(False)
                self.pos += 1
                self.nl.append(True)
                inner = self.body(closing=True)
                self.nl.pop()
                self.pos += 1  # the closing brace
                block = n.Block(start, self.pos, name, labels, inner)
                body.blocks.append(block)
                body.items.append(block)
            self.end_of_item()
        body.end = self.pos
        self.depth -= 1
        return body

    def end_of_item(self) -> None:
        self.skip(False)
        if self.pos >= self.n or self.s[self.pos] == "}":
            return
        if self.s[self.pos] == "\n":
            self.pos += 1
            return
        raise self.err(f"expected a new line after this argument or block, found {self.describe()}")

    def label(self) -> str:
        start = self.pos
        tpl = self.quoted()
        if not tpl.parts:
            return ""
        if len(tpl.parts) == 1 and isinstance(tpl.parts[0], n.TemplateLiteral):
            return tpl.parts[0].text
        raise self.err("a block label cannot hold interpolations or directives", start)

    # ------------------------------------------------------------ expressions

    def expression(self) -> n.Expr:
        self.enter()
        cond = self.binary(0)
        self.skip()
        if self.peek("?"):
            self.pos += 1
            then = self.expression()
            self.skip()
            if not self.peek(":"):
                raise self.err(f"expected ':' in the conditional, found {self.describe()}")
            self.pos += 1
            otherwise = self.expression()
            cond = n.Conditional(cond.start, otherwise.end, cond, then, otherwise)
        self.depth -= 1
        return cond

    def binary(self, level: int) -> n.Expr:
        if level == len(_BINARY_LEVELS):
            return self.unary()
        left = self.binary(level + 1)
        while True:
            self.skip()
            op = next((o for o in _BINARY_LEVELS[level] if self.peek(o)), None)
            if op is None or (op in ("<", ">") and self.peek(op * 2)):
                return left
            if op == "!=" or op == "==":
                pass
            elif op in ("<", ">") and self.peek(op + "="):
                op = op + "="
            self.pos += len(op)
            right = self.binary(level + 1)
            left = n.Binary(left.start, right.end, op, left, right)

    def unary(self) -> n.Expr:
        self.skip()
        if (self.peek("-") and not self.peek("->")) or (self.peek("!") and not self.peek("!=")):
            start = self.pos
            op = self.s[self.pos]
            self.pos += 1
            self.enter()
            operand = self.unary()
            self.depth -= 1
            return n.Unary(start, operand.end, op, operand)
        return self.postfix(self.term())

    def term(self) -> n.Expr:
        self.skip()
        start = self.pos
        if self.pos >= self.n:
            raise self.err("expected an expression, found end of file")
        c = self.s[self.pos]
        if c.isdigit():
            m = _NUMBER.match(self.s, self.pos)
            assert m is not None
            self.pos = m.end()
            text = m.group(0)
            value: object = float(text) if (m.group(1) or m.group(2)) else int(text)
            return n.Literal(start, self.pos, value)
        if c == '"':
            return self.quoted()
        if self.peek("<<"):
            return self.heredoc()
        if c == "(":
            self.pos += 1
            self.nl.append(False)
            inner = self.expression()
            self.expect(")", "')'")
            self.nl.pop()
            return n.Parens(start, self.pos, inner)
        if c == "[":
            return self.tuple_or_for()
        if c == "{":
            return self.object_or_for()
        m = _IDENT.match(self.s, self.pos)
        if not m:
            raise self.err(f"expected an expression, found {self.describe()}")
        name = self.ident()
        after = self.pos
        self.skip(False)
        if self.peek("::"):
            raise self.err(f"provider functions ({name}::...) are not part of Nomad's jobspec")
        if self.peek("("):
            return self.call(start, name)
        self.pos = after
        if name in ("true", "false"):
            return n.Literal(start, after, name == "true")
        if name == "null":
            return n.Literal(start, after, None)
        return n.Traversal(start, after, name, [])

    def call(self, start: int, name: str) -> n.Call:
        self.pos += 1
        self.nl.append(False)
        args: list[n.Expr] = []
        expand = False
        while True:
            self.skip()
            if self.peek(")"):
                break
            args.append(self.expression())
            self.skip()
            if self.peek("..."):
                self.pos += 3
                expand = True
                self.skip()
                if not self.peek(")"):
                    raise self.err("'...' may only follow the last argument")
                break
            if self.peek(","):
                self.pos += 1
                continue
            if not self.peek(")"):
                raise self.err(
                    f"expected ',' or ')' in the arguments of {name}(), found {self.describe()}"
                )
        self.pos += 1
        self.nl.pop()
        return n.Call(start, self.pos, name, args, expand)

    def postfix(self, expr: n.Expr) -> n.Expr:
        while True:
            save = self.pos
            self.skip()
            if self.peek(".*"):
                self.pos += 2
                expr = self.splat(expr, full=False)
            elif self.peek(".") and not self.peek("..."):
                self.pos += 1
                expr = self.get_attr(expr)
            elif self.at_full_splat():
                expr = self.splat(expr, full=True)
            elif self.peek("["):
                expr = self.index(expr)
            else:
                self.pos = save
                return expr

    def get_attr(self, expr: n.Expr) -> n.Expr:
        """After a '.': an attribute name or a legacy numeric index (`.0`)."""
        if self.pos < self.n and self.s[self.pos].isdigit():
            m = re.compile(r"[0-9]+").match(self.s, self.pos)
            assert m is not None
            self.pos = m.end()
            key = n.Literal(m.start(), m.end(), int(m.group(0)))
            return self._index(expr, key)
        name = self.ident("an attribute name after '.'")
        if isinstance(expr, n.Traversal):
            expr.steps.append(("attr", name))
            expr.end = self.pos
            return expr
        return n.GetAttr(expr.start, self.pos, expr, name)

    def index(self, expr: n.Expr) -> n.Expr:
        self.pos += 1
        self.nl.append(False)
        key = self.expression()
        self.expect("]", "']'")
        self.nl.pop()
        return self._index(expr, key)

    def _index(self, expr: n.Expr, key: n.Expr) -> n.Expr:
        static = _static_key(key)
        if isinstance(expr, n.Traversal) and static is not None:
            expr.steps.append(("index", static))
            expr.end = self.pos
            return expr
        return n.Index(expr.start, self.pos, expr, key)

    def at_full_splat(self) -> bool:
        m = re.compile(r"\[[ \t]*\*[ \t]*\]").match(self.s, self.pos)
        if m:
            self.pos = m.end() - 1  # leave ']' for splat() to consume
            return True
        return False

    def splat(self, source: n.Expr, *, full: bool) -> n.Splat:
        if full:
            self.pos += 1
        item = n.SplatItem(self.pos, self.pos)
        each: n.Expr = item
        while True:
            save = self.pos
            self.skip()
            if self.peek(".") and not self.peek(".*") and not self.peek("..."):
                self.pos += 1
                each = self.get_attr(each)
            elif full and self.peek("[") and not self.at_full_splat():
                each = self.index(each)
            else:
                self.pos = save
                break
        return n.Splat(source.start, self.pos, source, each, item)

    # ------------------------------------------------------------ collections

    def tuple_or_for(self) -> n.Expr:
        start = self.pos
        self.pos += 1
        self.nl.append(False)
        self.skip()
        if _FOR.match(self.s, self.pos):
            expr = self.for_expr(start, "]")
            self.nl.pop()
            return expr
        items: list[n.Expr] = []
        while True:
            self.skip()
            if self.peek("]"):
                break
            items.append(self.expression())
            self.skip()
            if self.peek(","):
                self.pos += 1
            elif not self.peek("]"):
                raise self.err(f"expected ',' or ']' in the list, found {self.describe()}")
        self.pos += 1
        self.nl.pop()
        return n.TupleCons(start, self.pos, items)

    def object_or_for(self) -> n.Expr:
        start = self.pos
        self.pos += 1
        self.skip(True)
        if _FOR.match(self.s, self.pos):
            self.nl.append(False)
            expr = self.for_expr(start, "}")
            self.nl.pop()
            return expr
        self.nl.append(True)
        items: list[tuple[n.Expr, n.Expr]] = []
        while True:
            self.skip(True)
            if self.peek("}"):
                break
            key = self.expression()
            if isinstance(key, n.Traversal) and not key.steps:
                key = n.ObjectKey(key.start, key.end, key.root)
            self.skip(False)
            if self.peek("=") and not self.peek("==") and not self.peek("=>") or self.peek(":"):
                self.pos += 1
            else:
                raise self.err(f"expected '=' after the object key, found {self.describe()}")
            value = self.expression()
            items.append((key, value))
            self.skip(False)
            if self.peek(","):
                self.pos += 1
            elif not (self.peek("\n") or self.peek("}")):
                raise self.err(
                    f"expected ',', a new line or '}}' after the object item, "
                    f"found {self.describe()}"
                )
        self.pos += 1
        self.nl.pop()
        return n.ObjectCons(start, self.pos, items)

    def for_intro(self) -> tuple[str | None, str]:
        """`for [key,] value in` (after the word `for`): the variable names."""
        self.skip()
        first = self.ident("a variable name after 'for'")
        self.skip()
        key_var: str | None = None
        value_var = first
        if self.peek(","):
            self.pos += 1
            self.skip()
            key_var, value_var = first, self.ident("a second variable name")
            self.skip()
        m = _IDENT.match(self.s, self.pos)
        if not m or m.group(0) != "in":
            raise self.err(f"expected 'in' after the for variables, found {self.describe()}")
        self.pos = m.end()
        return key_var, value_var

    def for_expr(self, start: int, close: str) -> n.ForExpr:
        self.pos += 3  # "for"
        key_var, value_var = self.for_intro()
        collection = self.expression()
        self.expect(":", "':' in the for expression")
        first_expr = self.expression()
        self.skip()
        key: n.Expr | None = None
        value = first_expr
        group = False
        if close == "}":
            if not self.peek("=>"):
                raise self.err(
                    f"expected '=>' in the object for expression, found {self.describe()}"
                )
            self.pos += 2
            key = first_expr
            value = self.expression()
            self.skip()
            if self.peek("..."):
                self.pos += 3
                group = True
                self.skip()
        cond: n.Expr | None = None
        m = _IDENT.match(self.s, self.pos)
        if m and m.group(0) == "if":
            self.pos += 2
            cond = self.expression()
            self.skip()
        if not self.peek(close):
            raise self.err(f"expected {close!r} to end the for expression, found {self.describe()}")
        self.pos += 1
        return n.ForExpr(start, self.pos, key_var, value_var, collection, key, value, cond, group)

    # ------------------------------------------------------------ templates

    def quoted(self) -> n.Template:
        start = self.pos
        self.pos += 1
        tokens = self.template_tokens(stop=None)
        parts = _nest(self, tokens, start)
        return n.Template(start, self.pos, parts)

    def heredoc(self) -> n.Template:
        start = self.pos
        self.pos += 2
        flush = self.peek("-")
        if flush:
            self.pos += 1
        marker = self.ident("a heredoc marker after '<<'")
        line_end = self.s.find("\n", self.pos)
        if line_end < 0 or self.s[self.pos : line_end].strip():
            raise self.err(f"the heredoc marker <<{marker} must end its line")
        body_start = line_end + 1
        scan = body_start
        while True:
            if scan >= self.n:
                raise self.err(f"unterminated heredoc: no line holding only {marker!r}", start)
            eol = self.s.find("\n", scan)
            eol = self.n if eol < 0 else eol
            if self.s[scan:eol].strip() == marker:
                break
            scan = eol + 1
        self.pos = body_start
        tokens = self.template_tokens(stop=scan)
        if flush:
            tokens = _flush(tokens)
        parts = _nest(self, tokens, start)
        marker_end = self.s.find(marker, scan) + len(marker)
        self.pos = marker_end
        return n.Template(start, self.pos, parts)

    def template_tokens(self, stop: int | None) -> list[_Tok]:
        """Literal text, interpolations and directives in order; `stop`
        None reads a quoted string up to its closing quote."""
        s = self.s
        tokens: list[_Tok] = []
        buf: list[str] = []
        lit_start = self.pos
        end = self.n if stop is None else stop

        def flush_lit() -> None:
            nonlocal buf, lit_start
            if buf:
                tokens.append(_Tok("lit", lit_start, self.pos, text="".join(buf)))
            buf = []

        while True:
            if self.pos >= end:
                if stop is None:
                    raise self.err("unterminated string (a missing '\"'?)")
                break
            c = s[self.pos]
            if stop is None and c == '"':
                flush_lit()
                self.pos += 1
                break
            if stop is None and c == "\n":
                raise self.err(
                    "unterminated string: a quoted string cannot span lines (use a heredoc)"
                )
            if stop is None and c == "\\":
                buf.append(self.escape())
                continue
            if s.startswith("$${", self.pos) or s.startswith("%%{", self.pos):
                buf.append(s[self.pos + 1 : self.pos + 3])
                self.pos += 3
                continue
            if s.startswith("${", self.pos) or s.startswith("%{", self.pos):
                flush_lit()
                tokens.append(self.template_sequence())
                lit_start = self.pos
                continue
            if stop is not None and c == "\n":
                buf.append(c)
                self.pos += 1
                flush_lit()  # heredoc literals are one line each (for <<- flushing)
                lit_start = self.pos
                continue
            buf.append(c)
            self.pos += 1
        if stop is not None:
            flush_lit()
        return tokens

    def escape(self) -> str:
        s = self.s
        start = self.pos
        if self.pos + 1 >= self.n:
            raise self.err("unterminated string")
        c = s[self.pos + 1]
        if c in _ESCAPES:
            self.pos += 2
            return _ESCAPES[c]
        if c in "uU":
            width = 4 if c == "u" else 8
            digits = s[self.pos + 2 : self.pos + 2 + width]
            if len(digits) == width and all(d in "0123456789abcdefABCDEF" for d in digits):
                self.pos += 2 + width
                try:
                    return chr(int(digits, 16))
                except ValueError:
                    raise self.err(f"invalid unicode escape \\{c}{digits}", start) from None
            raise self.err(f"the \\{c} escape needs {width} hexadecimal digits", start)
        raise self.err(
            f'invalid escape sequence \\{c} (expected \\n, \\r, \\t, \\", \\\\, \\u or \\U)', start
        )

    def template_sequence(self) -> _Tok:
        start = self.pos
        kind = "interp" if self.s[self.pos] == "$" else "directive"
        self.pos += 2
        self.nl.append(False)
        strip_left = self.peek("~")
        if strip_left:
            self.pos += 1
        self.skip()
        if kind == "interp":
            token = _Tok("interp", start, start, expr=self.expression())
        else:
            word = self.ident("if, else, endif, for or endfor after '%{'")
            if word == "if":
                token = _Tok("if", start, start, expr=self.expression())
            elif word in ("else", "endif", "endfor"):
                token = _Tok(word, start, start)
            elif word == "for":
                for_vars = self.for_intro()
                token = _Tok("for", start, start, expr=self.expression(), for_vars=for_vars)
            else:
                raise self.err(f"unknown template directive %{{{word}}}", start)
        self.skip()
        token.strip_left = strip_left
        token.strip_right = self.peek("~")
        if token.strip_right:
            self.pos += 1
        self.skip()
        if not self.peek("}"):
            raise self.err(f"expected '}}' to close the template sequence, found {self.describe()}")
        self.pos += 1
        self.nl.pop()
        token.end = self.pos
        return token


def _static_key(key: n.Expr) -> object | None:
    if (
        isinstance(key, n.Literal)
        and isinstance(key.value, int | str)
        and not isinstance(key.value, bool)
    ):
        return key.value
    if isinstance(key, n.Template) and len(key.parts) == 1:
        part = key.parts[0]
        if isinstance(part, n.TemplateLiteral):
            return part.text
    if isinstance(key, n.Template) and not key.parts:
        return ""
    return None


def _flush(tokens: list[_Tok]) -> list[_Tok]:
    """`<<-`: remove the smallest indentation of the heredoc's lines from
    each line (blank lines do not count), as Go's parser does on the static
    text before interpolation."""
    big = 1 << 62
    min_spaces = big
    newline = True
    adjust: list[_Tok] = []
    for tok in tokens:
        if newline:
            newline = False
            if tok.kind == "lit":
                trimmed = tok.text.lstrip()
                if not trimmed and tok.text.endswith("\n"):
                    spaces = big
                else:
                    spaces = len(tok.text) - len(trimmed)
                    adjust.append(tok)
            else:
                spaces = 0
            min_spaces = min(min_spaces, spaces)
        if tok.kind == "lit" and tok.text.endswith("\n"):
            newline = True
    if min_spaces != big:
        for tok in adjust:
            tok.text = tok.text[min_spaces:]
    return tokens


def _strip_markers(tokens: list[_Tok]) -> list[_Tok]:
    for i, tok in enumerate(tokens):
        if tok.kind == "lit":
            continue
        if tok.strip_left and i > 0 and tokens[i - 1].kind == "lit":
            tokens[i - 1].text = tokens[i - 1].text.rstrip()
        if tok.strip_right and i + 1 < len(tokens) and tokens[i + 1].kind == "lit":
            tokens[i + 1].text = tokens[i + 1].text.lstrip()
    return tokens


def _nest(p: _Parser, tokens: list[_Tok], start: int) -> list[n.TemplatePart]:
    """Flat tokens → parts with `%{ if }` and `%{ for }` nested."""
    tokens = _strip_markers(tokens)
    pos = 0

    def seq(until: tuple[str, ...]) -> tuple[list[n.TemplatePart], str | None]:
        nonlocal pos
        parts: list[n.TemplatePart] = []
        while pos < len(tokens):
            tok = tokens[pos]
            if tok.kind in until:
                return parts, tok.kind
            pos += 1
            if tok.kind == "lit":
                if tok.text:
                    parts.append(n.TemplateLiteral(tok.start, tok.end, tok.text))
            elif tok.kind == "interp":
                assert tok.expr is not None
                parts.append(n.TemplateInterp(tok.start, tok.end, tok.expr))
            elif tok.kind == "if":
                then, stop = seq(("else", "endif"))
                otherwise: list[n.TemplatePart] = []
                if stop == "else":
                    pos += 1
                    otherwise, stop = seq(("endif",))
                if stop != "endif":
                    raise p.err("%{ if } without a matching %{ endif }", tok.start)
                pos += 1
                assert tok.expr is not None
                parts.append(n.TemplateIf(tok.start, tok.end, tok.expr, then, otherwise))
            elif tok.kind == "for":
                body, stop = seq(("endfor",))
                if stop != "endfor":
                    raise p.err("%{ for } without a matching %{ endfor }", tok.start)
                pos += 1
                assert tok.expr is not None
                key_var, value_var = tok.for_vars
                parts.append(n.TemplateFor(tok.start, tok.end, key_var, value_var, tok.expr, body))
            else:
                raise p.err(f"%{{ {tok.kind} }} without its opening directive", tok.start)
        return parts, None

    parts, _ = seq(())
    return parts
