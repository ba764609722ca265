"""The scanner of Go's text/template: text, delimiters, and the tokens of
actions, with Go's trim markers (`{{- ` and ` -}}`), comments, custom
delimiters and error texts ("unclosed action", "bad number syntax", ...)."""

from __future__ import annotations

import enum
from dataclasses import dataclass


class T(enum.IntEnum):
    ERROR = 0
    BOOL = 1
    CHAR = 2
    CHAR_CONSTANT = 3
    COMMENT = 4
    COMPLEX = 5
    ASSIGN = 6
    DECLARE = 7
    EOF = 8
    FIELD = 9
    IDENTIFIER = 10
    LEFT_DELIM = 11
    LEFT_PAREN = 12
    NUMBER = 13
    PIPE = 14
    RAW_STRING = 15
    RIGHT_DELIM = 16
    RIGHT_PAREN = 17
    SPACE = 18
    STRING = 19
    TEXT = 20
    VARIABLE = 21
    KEYWORD = 22  # keywords sort after this
    BLOCK = 23
    BREAK = 24
    CONTINUE = 25
    DOT = 26
    DEFINE = 27
    ELSE = 28
    END = 29
    IF = 30
    NIL = 31
    RANGE = 32
    TEMPLATE = 33
    WITH = 34


KEYWORDS = {
    ".": T.DOT,
    "block": T.BLOCK,
    "break": T.BREAK,
    "continue": T.CONTINUE,
    "define": T.DEFINE,
    "else": T.ELSE,
    "end": T.END,
    "if": T.IF,
    "range": T.RANGE,
    "nil": T.NIL,
    "template": T.TEMPLATE,
    "with": T.WITH,
}

SPACE_CHARS = " \t\r\n"
LEFT_COMMENT = "/*"
RIGHT_COMMENT = "*/"


@dataclass(frozen=True)
class Item:
    typ: T
    pos: int
    val: str
    line: int

    def __str__(self) -> str:
        if self.typ == T.EOF:
            return "EOF"
        if self.typ == T.ERROR:
            return self.val
        if self.typ > T.KEYWORD:
            return f"<{self.val}>"
        from corral.domain.template.gofmt import quote

        if len(self.val) > 10:
            return quote(self.val[:10]) + "..."
        return quote(self.val)


def _is_space(ch: str) -> bool:
    return ch in SPACE_CHARS and ch != ""


def is_alnum(ch: str) -> bool:
    return ch == "_" or ch.isalpha() or (ch.isdigit() and ch.isdecimal())


class Lexer:
    """Produces the items of `text` one by one (`next_item`), like Go's
    lexer: the parser pulls tokens; an error item ends the stream."""

    def __init__(
        self,
        text: str,
        left: str = "{{",
        right: str = "}}",
        break_ok: bool = True,
        continue_ok: bool = True,
    ) -> None:
        self.input = text
        self.left = left or "{{"
        self.right = right or "}}"
        self.pos = 0
        self.start = 0
        self.line = 1
        self.start_line = 1
        self.paren_depth = 0
        self.inside_action = False
        self.items: list[Item] = []
        self.break_ok = break_ok
        self.continue_ok = continue_ok
        self.done = False

    # --- primitives

    def next(self) -> str:
        if self.pos >= len(self.input):
            self.pos = len(self.input) + 1  # past the end: backup() undoes this
            return ""
        ch = self.input[self.pos]
        self.pos += 1
        if ch == "\n":
            self.line += 1
        return ch

    def peek(self) -> str:
        ch = self.next()
        self.backup()
        return ch

    def backup(self) -> None:
        if self.pos > len(self.input):
            self.pos = len(self.input)
            return
        if self.pos > 0:
            self.pos -= 1
            if self.input[self.pos] == "\n":
                self.line -= 1

    def emit(self, typ: T) -> None:
        self.items.append(Item(typ, self.start, self.input[self.start : self.pos], self.start_line))
        self.start = self.pos
        self.start_line = self.line

    def emit_item(self, item: Item) -> None:
        self.items.append(item)

    def ignore(self) -> None:
        self.line += self.input.count("\n", self.start, self.pos)
        self.start = self.pos
        self.start_line = self.line

    def accept(self, valid: str) -> bool:
        ch = self.next()
        if ch != "" and ch in valid:
            return True
        self.backup()
        return False

    def accept_run(self, valid: str) -> None:
        while True:
            ch = self.next()
            if ch == "" or ch not in valid:
                break
        self.backup()

    def errorf(self, msg: str) -> None:
        self.items.append(Item(T.ERROR, self.start, msg, self.start_line))
        self.done = True

    def next_item(self) -> Item:
        while not self.items:
            if self.done:
                return Item(T.EOF, self.pos, "EOF", self.start_line)
            if self.inside_action:
                self.lex_inside_action()
            else:
                self.lex_text()
        return self.items.pop(0)

    # --- trim markers

    @staticmethod
    def _has_left_trim(s: str) -> bool:
        return len(s) >= 2 and s[0] == "-" and _is_space(s[1])

    @staticmethod
    def _has_right_trim(s: str) -> bool:
        return len(s) >= 2 and _is_space(s[0]) and s[1] == "-"

    def at_right_delim(self) -> tuple[bool, bool]:
        rest = self.input[self.pos :]
        if self._has_right_trim(rest) and rest[2:].startswith(self.right):
            return True, True
        if rest.startswith(self.right):
            return True, False
        return False, False

    # --- states

    def lex_text(self) -> None:
        x = self.input.find(self.left, self.pos)
        if x >= 0:
            if x > self.pos:
                self.line += self.input.count("\n", self.pos, x)
                self.pos = x
                text = self.input[self.start : self.pos]
                if self._has_left_trim(self.input[x + len(self.left) :]):
                    text = text.rstrip(SPACE_CHARS)
                if text:
                    self.items.append(Item(T.TEXT, self.start, text, self.start_line))
                self.start = self.pos
                self.start_line = self.line
            self.lex_left_delim()
            return
        self.pos = len(self.input)
        if self.pos > self.start:
            self.line += self.input.count("\n", self.start, self.pos)
            self.emit(T.TEXT)
        self.emit(T.EOF)
        self.done = True

    def lex_left_delim(self) -> None:
        self.pos += len(self.left)
        trim = self._has_left_trim(self.input[self.pos :])
        after = 2 if trim else 0
        if self.input.startswith(LEFT_COMMENT, self.pos + after):
            self.pos += after
            self.ignore()
            self.lex_comment()
            return
        self.emit(T.LEFT_DELIM)
        self.pos += after
        self.ignore()
        self.paren_depth = 0
        self.inside_action = True

    def lex_comment(self) -> None:
        self.pos += len(LEFT_COMMENT)
        x = self.input.find(RIGHT_COMMENT, self.pos)
        if x < 0:
            self.errorf("unclosed comment")
            return
        self.pos = x + len(RIGHT_COMMENT)
        delim, trim = self.at_right_delim()
        if not delim:
            self.errorf("comment ends before closing delimiter")
            return
        self.line += self.input.count("\n", self.start, self.pos)
        self.emit(T.COMMENT)
        if trim:
            self.pos += 2
        self.pos += len(self.right)
        if trim:
            self._skip_leading_space()
        self.ignore()

    def _skip_leading_space(self) -> None:
        while self.pos < len(self.input) and self.input[self.pos] in SPACE_CHARS:
            self.pos += 1

    def lex_right_delim(self) -> None:
        _, trim = self.at_right_delim()
        if trim:
            self.pos += 2
            self.ignore()
        self.pos += len(self.right)
        self.emit(T.RIGHT_DELIM)
        if trim:
            self._skip_leading_space()
            self.ignore()
        self.inside_action = False

    def lex_inside_action(self) -> None:
        delim, _ = self.at_right_delim()
        if delim:
            if self.paren_depth == 0:
                self.lex_right_delim()
                return
            self.errorf("unclosed left paren")
            return
        ch = self.next()
        if ch == "":
            self.errorf("unclosed action")
        elif _is_space(ch):
            self.backup()
            self.lex_space()
        elif ch == "=":
            self.emit(T.ASSIGN)
        elif ch == ":":
            if self.next() != "=":
                self.errorf("expected :=")
                return
            self.emit(T.DECLARE)
        elif ch == "|":
            self.emit(T.PIPE)
        elif ch == '"':
            self.lex_quote()
        elif ch == "`":
            self.lex_raw_quote()
        elif ch == "$":
            self.lex_variable()
        elif ch == "'":
            self.lex_char()
        elif ch == ".":
            if self.pos < len(self.input):
                nxt = self.input[self.pos]
                if not ("0" <= nxt <= "9"):
                    self.lex_field_or_variable(T.FIELD)
                    return
            self.backup()
            self.lex_number()
        elif ch in "+-" or "0" <= ch <= "9":
            self.backup()
            self.lex_number()
        elif is_alnum(ch):
            self.backup()
            self.lex_identifier()
        elif ch == "(":
            self.emit(T.LEFT_PAREN)
            self.paren_depth += 1
        elif ch == ")":
            self.paren_depth -= 1
            if self.paren_depth < 0:
                self.errorf("unexpected right paren")
                return
            self.emit(T.RIGHT_PAREN)
        elif ord(ch) < 0x80 and ch.isprintable():
            self.emit(T.CHAR)
        else:
            self.errorf(f"unrecognized character in action: {_rune_repr(ch)}")

    def lex_space(self) -> None:
        n = 0
        while _is_space(self.peek()):
            self.next()
            n += 1
        # A trim-marked right delimiter is a space then a minus.
        rest = self.input[self.pos - 1 :]
        if self._has_right_trim(rest) and rest[2:].startswith(self.right):
            self.backup()
            if n == 1:
                self.lex_right_delim()
                return
        self.emit(T.SPACE)

    def lex_identifier(self) -> None:
        while True:
            ch = self.next()
            if ch != "" and is_alnum(ch):
                continue
            self.backup()
            word = self.input[self.start : self.pos]
            if not self.at_terminator():
                self.errorf(f"bad character {_rune_repr(ch)}")
                return
            kw = KEYWORDS.get(word)
            if kw is not None and kw > T.KEYWORD:
                if (kw == T.BREAK and not self.break_ok) or (
                    kw == T.CONTINUE and not self.continue_ok
                ):
                    self.emit(T.IDENTIFIER)
                else:
                    self.emit(kw)
            elif word[0] == ".":
                self.emit(T.FIELD)
            elif word in ("true", "false"):
                self.emit(T.BOOL)
            else:
                self.emit(T.IDENTIFIER)
            return

    def lex_variable(self) -> None:
        if self.at_terminator():
            self.emit(T.VARIABLE)
            return
        self.lex_field_or_variable(T.VARIABLE)

    def lex_field_or_variable(self, typ: T) -> None:
        if self.at_terminator():
            self.emit(T.VARIABLE if typ == T.VARIABLE else T.DOT)
            return
        ch = ""
        while True:
            ch = self.next()
            if ch == "" or not is_alnum(ch):
                self.backup()
                break
        if not self.at_terminator():
            self.errorf(f"bad character {_rune_repr(ch)}")
            return
        self.emit(typ)

    def at_terminator(self) -> bool:
        ch = self.peek()
        if ch == "" or _is_space(ch):
            return True
        if ch in ".,|:)(":
            return True
        return self.input.startswith(self.right[0], self.pos)

    def lex_char(self) -> None:
        self._lex_quoted("'", "unterminated character constant", T.CHAR_CONSTANT)

    def lex_number(self) -> None:
        if not self.scan_number():
            self.errorf(f"bad number syntax: {_go_quote(self.input[self.start : self.pos])}")
            return
        sign = self.peek()
        if sign in ("+", "-") and sign != "":
            if not self.scan_number() or self.input[self.pos - 1] != "i":
                self.errorf(f"bad number syntax: {_go_quote(self.input[self.start : self.pos])}")
                return
            self.emit(T.COMPLEX)
            return
        self.emit(T.NUMBER)

    def scan_number(self) -> bool:
        self.accept("+-")
        digits = "0123456789_"
        if self.accept("0"):
            if self.accept("xX"):
                digits = "0123456789abcdefABCDEF_"
            elif self.accept("oO"):
                digits = "01234567_"
            elif self.accept("bB"):
                digits = "01_"
        self.accept_run(digits)
        if self.accept("."):
            self.accept_run(digits)
        if len(digits) == 11 and self.accept("eE"):
            self.accept("+-")
            self.accept_run("0123456789_")
        if len(digits) == 23 and self.accept("pP"):
            self.accept("+-")
            self.accept_run("0123456789_")
        self.accept("i")
        nxt = self.peek()
        if nxt != "" and is_alnum(nxt):
            self.next()
            return False
        return True

    def lex_quote(self) -> None:
        self._lex_quoted('"', "unterminated quoted string", T.STRING)

    def _lex_quoted(self, quote: str, unterminated: str, typ: T) -> None:
        """A '...' or "..." literal (escapes checked by the parser); the
        opening quote is already read."""
        while True:
            ch = self.next()
            if ch == "\\":
                nxt = self.next()
                if nxt not in ("", "\n"):
                    continue
                self.errorf(unterminated)
                return
            if ch in ("", "\n"):
                self.errorf(unterminated)
                return
            if ch == quote:
                break
        self.emit(typ)

    def lex_raw_quote(self) -> None:
        while True:
            ch = self.next()
            if ch == "":
                self.errorf("unterminated raw quoted string")
                return
            if ch == "`":
                break
        self.emit(T.RAW_STRING)


def _rune_repr(ch: str) -> str:
    """Go's %#U: U+0023 '#'."""
    if ch == "":
        return "U+FFFFFFFFFFFFFFFF"
    code = ord(ch)
    if ch.isprintable():
        return f"U+{code:04X} '{ch}'"
    return f"U+{code:04X}"


def _go_quote(s: str) -> str:
    from corral.domain.template.gofmt import quote

    return quote(s)
