"""Nomad's `filter` expression language (HashiCorp's go-bexpr), evaluated
over the Nomad-shaped JSON dicts the gateway's list endpoints return.

Why a parser of our own: PyPI has no implementation of go-bexpr, and the
language is small (one precedence ladder, a dozen operators), so a
hand-written recursive-descent parser of about two hundred lines is easier
to read, to give exact error positions and to bound (length, nesting) than a
grammar library would be. Regular expressions (`matches`) use RE2 through
`google-re2`: the engine Go's regexp (and so Nomad) uses, with the same
syntax and linear-time matching, so a caller's pattern cannot stall the
gateway's event loop with catastrophic backtracking.

The language, as Nomad documents it (api-docs "Filtering"):

    Selector == "value"        Selector != "value"
    Selector is empty          Selector is not empty
    "value" in Selector        "value" not in Selector
    Selector contains "value"  Selector not contains "value"
    Selector matches "regex"   Selector not matches "regex"
    expr and expr, expr or expr, not expr, ( expr )

Selectors are `.`-separated names (`Meta.env`, `TaskGroups.cache`), each
starting with a letter; a map key that is not a valid name is written
`TaskGroups["my-group"]`. Values are double-quoted strings (Go escapes),
backtick raw strings, numbers, or a bare selector-like word taken as its
text (`Status == running`). `not` binds tightest, then `and`, then `or`.

Evaluation follows go-bexpr: a value is coerced to the type of the field it
is compared with (`Priority == 50`, `Priority == "50"`, `Stop == true`);
`in`/`contains` test substrings of strings, elements of lists and keys of
maps; `is empty` holds for "", [], {} and null. A selector that finds
nothing makes the positive operators false and their negations (`!=`,
`not in`, `not contains`, `not matches`, `is empty`) true. A value that
cannot be coerced to the field's type compares unequal.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Final

import re2

#: Longest expression accepted: a filter travels in a URL; this is far more
#: than any real one and keeps parsing and error messages small.
MAX_LENGTH: Final = 4096
#: Deepest nesting of parentheses and `not`s (the parser recurses on them).
MAX_DEPTH: Final = 64

_NUMBER: Final = re.compile(r"[+-]?[0-9]+(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?")
_KEYWORDS: Final = frozenset({"and", "or", "not", "in", "contains", "is", "empty", "matches"})
_GO_ESCAPES: Final = {
    "a": "\a",
    "b": "\b",
    "f": "\f",
    "n": "\n",
    "r": "\r",
    "t": "\t",
    "v": "\v",
    "\\": "\\",
    '"': '"',
}
_BOOL_WORDS: Final = {
    "1": True,
    "t": True,
    "T": True,
    "TRUE": True,
    "true": True,
    "True": True,
    "0": False,
    "f": False,
    "F": False,
    "FALSE": False,
    "false": False,
    "False": False,
}


class FilterError(ValueError):
    """A filter expression that does not parse; the message names the place."""


# --- tokens -------------------------------------------------------------------


@dataclass(frozen=True)
class _Token:
    kind: str  # "name", "string", "number", "op" ('==', '!=', '(', ')', '[', ']', '.'), "end"
    text: str  # the value (strings unquoted) or the operator
    pos: int  # offset in the expression, for messages


def _describe(token: _Token) -> str:
    if token.kind == "end":
        return "the end of the expression"
    if token.kind == "string":
        return f"string {json.dumps(token.text)}"
    return repr(token.text)


def _read_quoted(text: str, start: int) -> tuple[str, int]:
    """A double-quoted Go string starting at `start`: its value and the
    offset after the closing quote. As in Go, `\\x..` and octal escapes are
    bytes (`"\\303\\251"` is "é"), `\\u....` and `\\U........` code points."""
    out = bytearray()
    i = start + 1
    while i < len(text):
        ch = text[i]
        if ch == '"':
            return out.decode("utf-8", errors="surrogateescape"), i + 1
        if ch == "\n":
            break
        if ch != "\\":
            out += ch.encode("utf-8", errors="surrogatepass")
            i += 1
            continue
        if i + 1 >= len(text):
            break
        esc = text[i + 1]
        if esc in _GO_ESCAPES:
            out += _GO_ESCAPES[esc].encode()
            i += 2
            continue
        width = {"x": 2, "u": 4, "U": 8}.get(esc)
        if width is None and esc in "01234567":
            digits, base, i_next = text[i + 1 : i + 4], 8, i + 4
        elif width is not None:
            digits, base, i_next = text[i + 2 : i + 2 + width], 16, i + 2 + width
        else:
            raise FilterError(f"unknown escape sequence \\{esc} at position {i + 1}")
        try:
            if len(digits) != (width or 3):
                raise ValueError(digits)
            code = int(digits, base)
            if esc in "uU":
                out += chr(code).encode("utf-8")  # ValueError past U+10FFFF
            else:
                out.append(code)  # ValueError past 255
        except (ValueError, OverflowError, UnicodeEncodeError):
            raise FilterError(f"bad escape sequence at position {i + 1}") from None
        i = i_next
    raise FilterError(f"unterminated string starting at position {start + 1}")


def _tokens(text: str) -> list[_Token]:
    found: list[_Token] = []
    i = 0
    while i < len(text):
        ch = text[i]
        if ch.isspace():
            i += 1
        elif text.startswith(("==", "!="), i):
            found.append(_Token("op", text[i : i + 2], i))
            i += 2
        elif ch in "()[].":
            found.append(_Token("op", ch, i))
            i += 1
        elif ch == '"':
            value, end = _read_quoted(text, i)
            found.append(_Token("string", value, i))
            i = end
        elif ch == "`":
            end = text.find("`", i + 1)
            if end < 0:
                raise FilterError(f"unterminated raw string starting at position {i + 1}")
            found.append(_Token("string", text[i + 1 : end], i))
            i = end + 1
        elif number := _NUMBER.match(text, i):
            found.append(_Token("number", number.group(), i))
            i = number.end()
        elif ch.isascii() and ch.isalpha():
            j = i + 1
            while j < len(text) and text[j].isascii() and (text[j].isalnum() or text[j] == "_"):
                j += 1
            found.append(_Token("name", text[i:j], i))
            i = j
        else:
            raise FilterError(f"unexpected character {ch!r} at position {i + 1}")
    found.append(_Token("end", "", len(text)))
    return found


# --- the tree -----------------------------------------------------------------

#: A compiled expression: the object in, true or false out.
Predicate = Callable[[Any], bool]
_MISSING: Final = object()


def _select(obj: Any, path: Sequence[str]) -> Any:
    """The value at `path`, or _MISSING. A list takes a decimal index."""
    for name in path:
        if isinstance(obj, dict):
            if name not in obj:
                return _MISSING
            obj = obj[name]
        elif isinstance(obj, list) and name.isdecimal() and int(name) < len(obj):
            obj = obj[int(name)]
        else:
            return _MISSING
    return obj


@dataclass(frozen=True)
class _Value:
    """A literal as written: its text, and the number it spells if it is one."""

    text: str

    @property
    def number(self) -> int | float | None:
        """The number the text spells (an int when it is one: nanosecond
        times do not survive a float)."""
        for kind in (int, float):
            try:
                return kind(self.text)
            except ValueError:
                continue
        return None

    def equals(self, actual: Any) -> bool:
        """go-bexpr's coercion: the literal is read as the field's type."""
        if isinstance(actual, bool):
            want = _BOOL_WORDS.get(self.text)
            return want is not None and want == actual
        if isinstance(actual, int | float):
            number = self.number
            return number is not None and not math.isnan(number) and number == actual
        if isinstance(actual, str):
            return actual == self.text
        return False


def _is_empty(actual: Any) -> bool:
    if actual is _MISSING or actual is None:
        return True
    if isinstance(actual, str | list | dict):
        return len(actual) == 0
    return False


def _contains(actual: Any, value: _Value) -> bool:
    if isinstance(actual, str):
        return value.text in actual
    if isinstance(actual, list):
        return any(value.equals(item) for item in actual)
    if isinstance(actual, dict):
        return value.text in actual
    return False


def _equal(path: tuple[str, ...], value: _Value) -> Predicate:
    def check(obj: Any) -> bool:
        actual = _select(obj, path)
        return actual is not _MISSING and value.equals(actual)

    return check


def _empty(path: tuple[str, ...]) -> Predicate:
    return lambda obj: _is_empty(_select(obj, path))


def _holds(path: tuple[str, ...], value: _Value) -> Predicate:
    def check(obj: Any) -> bool:
        actual = _select(obj, path)
        return actual is not _MISSING and _contains(actual, value)

    return check


def _matches(path: tuple[str, ...], pattern: Any) -> Predicate:
    def check(obj: Any) -> bool:
        actual = _select(obj, path)
        return isinstance(actual, str) and pattern.search(actual) is not None

    return check


def _negate(inner: Predicate) -> Predicate:
    return lambda obj: not inner(obj)


def _all(parts: list[Predicate]) -> Predicate:
    return lambda obj: all(part(obj) for part in parts)


def _any(parts: list[Predicate]) -> Predicate:
    return lambda obj: any(part(obj) for part in parts)


# --- the parser ---------------------------------------------------------------


class _Parser:
    def __init__(self, text: str) -> None:
        self.tokens = _tokens(text)
        self.at = 0
        self.depth = 0

    @property
    def token(self) -> _Token:
        return self.tokens[self.at]

    def _is_word(self, word: str, offset: int = 0) -> bool:
        token = self.tokens[min(self.at + offset, len(self.tokens) - 1)]
        return token.kind == "name" and token.text == word

    def _fail(self, expected: str) -> FilterError:
        token = self.token
        return FilterError(
            f"unexpected {_describe(token)} at position {token.pos + 1}: expected {expected}"
        )

    def _take(self) -> _Token:
        token = self.token
        self.at += 1
        return token

    def _expect_word(self, word: str) -> None:
        if not self._is_word(word):
            raise self._fail(repr(word))
        self.at += 1

    def parse(self) -> Predicate:
        if self.token.kind == "end":
            raise FilterError("empty filter expression")
        predicate = self._or()
        if self.token.kind != "end":
            raise self._fail("'and', 'or' or the end of the expression")
        return predicate

    def _or(self) -> Predicate:
        parts = [self._and()]
        while self._is_word("or"):
            self.at += 1
            parts.append(self._and())
        return parts[0] if len(parts) == 1 else _any(parts)

    def _and(self) -> Predicate:
        parts = [self._not()]
        while self._is_word("and"):
            self.at += 1
            parts.append(self._not())
        return parts[0] if len(parts) == 1 else _all(parts)

    def _nested(self, inner: Callable[[], Predicate]) -> Predicate:
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise FilterError(f"filter expression nested deeper than {MAX_DEPTH} levels")
        try:
            return inner()
        finally:
            self.depth -= 1

    def _not(self) -> Predicate:
        if self._is_word("not"):
            self.at += 1
            return _negate(self._nested(self._not))
        if self.token.kind == "op" and self.token.text == "(":
            self.at += 1
            inner = self._nested(self._or)
            if not (self.token.kind == "op" and self.token.text == ")"):
                raise self._fail("')'")
            self.at += 1
            return inner
        return self._matching()

    def _selector(self) -> tuple[str, ...]:
        token = self.token
        if token.kind != "name" or token.text in _KEYWORDS:
            raise self._fail("a selector")
        path = [token.text]
        self.at += 1
        while self.token.kind == "op" and self.token.text in ".[":
            if self._take().text == ".":
                if self.token.kind not in ("name", "number") or not self.token.text.isalnum():
                    raise self._fail("a name after '.'")
                path.append(self._take().text)
            else:
                if self.token.kind != "string":
                    raise self._fail('a quoted map key, as in ["key"]')
                path.append(self._take().text)
                if not (self.token.kind == "op" and self.token.text == "]"):
                    raise self._fail("']'")
                self.at += 1
        return tuple(path)

    def _value(self) -> _Value:
        token = self.token
        if token.kind == "string":
            self.at += 1
            return _Value(token.text)
        if token.kind == "number":
            self.at += 1
            return _Value(token.text)
        if token.kind == "name" and token.text not in _KEYWORDS:
            # go-bexpr takes a bare selector as a value for its text.
            return _Value(".".join(self._selector()))
        raise self._fail("a value (a quoted string, a number or a word)")

    def _matching(self) -> Predicate:
        token = self.token
        if token.kind in ("string", "number"):
            value = self._value()
            return self._in(value)
        if token.kind != "name" or token.text in _KEYWORDS:
            raise self._fail("a selector, a value, 'not' or '('")
        # `word in Selector` (a bare value) or `Selector <operator> ...`
        start = self.at
        path = self._selector()
        if self._is_word("in") or (self._is_word("not") and self._is_word("in", 1)):
            self.at = start
            return self._in(self._value())
        operator = self.token
        if operator.kind == "op" and operator.text in ("==", "!="):
            self.at += 1
            equal = _equal(path, self._value())
            return equal if operator.text == "==" else _negate(equal)
        if self._is_word("is"):
            self.at += 1
            negated = self._is_word("not")
            if negated:
                self.at += 1
            self._expect_word("empty")
            empty = _empty(path)
            return _negate(empty) if negated else empty
        negated = self._is_word("not")
        if negated:
            self.at += 1
        if self._is_word("contains"):
            self.at += 1
            found = _holds(path, self._value())
        elif self._is_word("matches"):
            self.at += 1
            value_token = self.token
            value = self._value()
            try:
                pattern = re2.compile(value.text)
            except re2.error as exc:
                raise FilterError(
                    f"bad regular expression {json.dumps(value.text)} at position "
                    f"{value_token.pos + 1}: {exc}"
                ) from None
            found = _matches(path, pattern)
        else:
            raise self._fail("an operator (==, !=, is, contains, matches, in)")
        return _negate(found) if negated else found

    def _in(self, value: _Value) -> Predicate:
        negated = self._is_word("not")
        if negated:
            self.at += 1
        self._expect_word("in")
        found = _holds(self._selector(), value)
        return _negate(found) if negated else found


# --- the API ------------------------------------------------------------------


@dataclass(frozen=True)
class Filter:
    """A parsed filter expression."""

    expression: str
    predicate: Predicate

    def __call__(self, obj: Any) -> bool:
        return self.predicate(obj)


def parse(expression: str) -> Filter:
    """Compile `expression`; FilterError names what is wrong and where."""
    if len(expression) > MAX_LENGTH:
        raise FilterError(f"filter expression longer than {MAX_LENGTH} characters")
    return Filter(expression, _Parser(expression).parse())


def apply(expression: str | None, items: Iterable[Any]) -> list[Any]:
    """The items the expression selects, in order (all of them without one)."""
    if not expression:
        return list(items)
    keep = parse(expression)
    return [item for item in items if keep(item)]
