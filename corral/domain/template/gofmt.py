"""Go's `fmt` printing of template values: Sprint, Sprintln, Sprintf.

A template prints values the way Go's fmt does, and users see it: a map
prints as `map[a:1 b:2]` (keys sorted), a list as `[a b]`, a float64 as
`1e+06`, a bad verb as `%!d(string=x)`. This module reproduces those rules
for the values of `values.py`; the width and precision limits are Go's
(1e6), so one verb cannot allocate without bound.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from corral.domain.template.values import (
    MISSING,
    GoChan,
    GoFunc,
    GoStruct,
    go_methods_of,
    type_name,
)

# Go's fmt refuses widths and precisions beyond this (tooLarge in print.go).
MAX_WIDTH = 1_000_000


class TooLong(Exception):
    """The printed text would exceed the caller's `max_len`."""


@dataclass
class _Flags:
    plus: bool = False
    minus: bool = False
    sharp: bool = False
    space: bool = False
    zero: bool = False
    width: int | None = None
    prec: int | None = None
    plus_v: bool = False
    sharp_v: bool = False


# ---------------------------------------------------------------- quoting


def quote(s: str, ascii_only: bool = False, quote_char: str = '"') -> str:
    """strconv.Quote (and QuoteToASCII, QuoteRune's escaping)."""
    out = [quote_char]
    for ch in s:
        out.append(_quote_rune(ch, quote_char, ascii_only))
    out.append(quote_char)
    return "".join(out)


_ESCAPES = {
    "\a": "\\a",
    "\b": "\\b",
    "\f": "\\f",
    "\n": "\\n",
    "\r": "\\r",
    "\t": "\\t",
    "\v": "\\v",
}


def _quote_rune(ch: str, quote_char: str, ascii_only: bool) -> str:
    if ch == quote_char or ch == "\\":
        return "\\" + ch
    code = ord(ch)
    if ascii_only:
        if code < 0x80 and ch.isprintable():
            return ch
    elif ch.isprintable():
        return ch
    if ch in _ESCAPES:
        return _ESCAPES[ch]
    if code < 0x20 or code == 0x7F:
        return f"\\x{code:02x}"
    if 0xD800 <= code <= 0xDFFF:
        return "\\ufffd"
    if code < 0x10000:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"


def quote_rune(code: int, ascii_only: bool = False) -> str:
    if code < 0 or code > 0x10FFFF or 0xD800 <= code <= 0xDFFF:
        code = 0xFFFD
    return "'" + _quote_rune(chr(code), "'", ascii_only) + "'"


def can_backquote(s: str) -> bool:
    for ch in s:
        if ch == "`" or ch == "\ufeff":
            return False
        if ch != "\t" and (ord(ch) < 0x20 or ord(ch) == 0x7F):
            return False
    return True


# ---------------------------------------------------------------- floats


def _shortest_digits(f: float) -> tuple[str, int]:
    """The shortest round-trip decimal digits of |f| and the decimal point
    position (digits 0.d1d2... x 10^dp), as Go's strconv computes them."""
    r = repr(abs(f))
    if "e" in r:
        mant, exp_s = r.split("e")
        exp = int(exp_s)
    else:
        mant, exp = r, 0
    if "." in mant:
        whole, frac = mant.split(".")
    else:
        whole, frac = mant, ""
    digits = (whole + frac).lstrip("0")
    dp = len(whole) + exp
    # leading zeros of the whole part shift the point
    stripped = len(whole + frac) - len((whole + frac).lstrip("0"))
    dp -= stripped
    digits = digits.rstrip("0")
    if not digits:
        return "0", 1
    return digits, dp


def format_float(f: float, verb: str = "g", prec: int = -1) -> str:
    """strconv.FormatFloat(f, verb, prec, 64) for verbs e, E, f, F, g, G."""
    if math.isnan(f):
        return "NaN"
    if math.isinf(f):
        return "+Inf" if f > 0 else "-Inf"
    if prec >= 0:
        out = format(f, f".{prec}{verb}")
        return out
    # shortest representation
    digits, dp = _shortest_digits(f)
    sign = "-" if math.copysign(1.0, f) < 0 else ""
    if verb in "eE":
        return sign + _exp_form(digits, dp, verb)
    if verb in "fF":
        return sign + _fixed_form(digits, dp)
    # %g shortest (what %v prints): Go switches to an exponent when the
    # decimal exponent is below -4 or at least 6 (1e+06, 1.23456789e+08).
    exp = dp - 1 if digits != "0" else 0
    if exp < -4 or exp >= 6:
        return sign + _exp_form(digits, dp, "e" if verb == "g" else "E")
    return sign + _fixed_form(digits, dp)


def _exp_form(digits: str, dp: int, verb: str) -> str:
    exp = dp - 1 if digits != "0" else 0
    mant = digits[0] + ("." + digits[1:] if len(digits) > 1 else "")
    sign = "+" if exp >= 0 else "-"
    return f"{mant}{verb}{sign}{abs(exp):02d}"


def _fixed_form(digits: str, dp: int) -> str:
    if dp <= 0:
        return "0." + "0" * (-dp) + digits
    if dp >= len(digits):
        return digits + "0" * (dp - len(digits))
    return digits[:dp] + "." + digits[dp:]


# ---------------------------------------------------------------- printer


class _Printer:
    def __init__(self, max_len: int | None = None) -> None:
        self.buf: list[str] = []
        self.max_len = max_len
        self.length = 0

    def write(self, s: str) -> None:
        self.length += len(s)
        if self.max_len is not None and self.length > self.max_len:
            raise TooLong
        self.buf.append(s)

    def text(self) -> str:
        return "".join(self.buf)

    # --- padding

    def pad(self, s: str, f: _Flags, numeric: bool = False) -> None:
        if f.width is None or len(s) >= f.width:
            self.write(s)
            return
        n = f.width - len(s)
        if f.minus:
            self.write(s + " " * n)
        elif f.zero:
            if numeric and s[:1] in "+- " and s[:1] != "":
                self.write(s[0] + "0" * n + s[1:])
            else:
                self.write("0" * n + s)
        else:
            self.write(" " * n + s)

    # --- kinds

    def bad_verb(self, verb: str, value: Any) -> None:
        if value is None:
            self.write(f"%!{verb}(<nil>)")
            return
        if value is MISSING:
            self.write(f"%!{verb}(<invalid reflect.Value>)")
            return
        inner = _Printer(self.max_len)
        inner.print_value(value, "v", _Flags(), 0)
        self.write(f"%!{verb}({type_name(value)}={inner.text()})")

    def fmt_integer(self, n: int, verb: str, f: _Flags, value: Any) -> None:
        if verb in ("v", "d"):
            base, digits = 10, "0123456789"
        elif verb == "b":
            base, digits = 2, "01"
        elif verb in ("o", "O"):
            base, digits = 8, "01234567"
        elif verb == "x":
            base, digits = 16, "0123456789abcdef"
        elif verb == "X":
            base, digits = 16, "0123456789ABCDEF"
        elif verb == "c":
            code = n if 0 <= n <= 0x10FFFF and not 0xD800 <= n <= 0xDFFF else 0xFFFD
            self.pad(chr(code), f)
            return
        elif verb == "q":
            self.pad(quote_rune(n, f.plus), f)
            return
        elif verb == "U":
            s = f"U+{n:04X}" if n >= 0 else f"U+{n & 0xFFFFFFFFFFFFFFFF:04X}"
            if f.sharp and 0 <= n <= 0x10FFFF and chr(n).isprintable():
                s += " '" + chr(n) + "'"
            self.pad(s, f)
            return
        else:
            self.bad_verb(verb, value)
            return
        neg = n < 0
        m = -n if neg else n
        body = ""
        while m:
            body = digits[m % base] + body
            m //= base
        if not body:
            body = "0"
        prec = f.prec
        if prec is not None:
            if prec == 0 and n == 0:
                body = ""
            body = body.rjust(prec, "0")
        elif f.zero and f.width is not None and not f.minus:
            width = f.width - (1 if (neg or f.plus or f.space) else 0)
            if f.sharp or verb == "O":
                width -= {16: 2, 8: 1 if verb == "o" else 2, 2: 2}.get(base, 0)
            body = body.rjust(width, "0")
        if f.sharp or verb == "O":
            if base == 16:
                body = ("0x" if verb == "x" else "0X") + body
            elif base == 8 and verb == "o" and not body.startswith("0"):
                body = "0" + body
            elif base == 2:
                body = "0b" + body
        if verb == "O":
            body = "0o" + body.lstrip("0o") if body.startswith("0o") else "0o" + body
        if neg:
            body = "-" + body
        elif f.plus:
            body = "+" + body
        elif f.space:
            body = " " + body
        saved_zero = f.zero
        f.zero = False
        self.pad(body, f)
        f.zero = saved_zero

    def fmt_float(self, x: float, verb: str, f: _Flags) -> None:
        if verb == "v":
            verb, prec = "g", -1
        elif verb in "eEfF":
            prec = 6
        elif verb in "gG":
            prec = -1
        else:
            self.bad_verb(verb, x)
            return
        if f.prec is not None:
            prec = f.prec
        s = format_float(x, verb, prec)
        if f.sharp and verb in "gG" and "." not in s and "e" not in s.lower():
            s += "."
        if not s.startswith(("-", "+")):
            if f.plus:
                s = "+" + s
            elif f.space:
                s = " " + s
        elif s.startswith("+") and not f.plus and s != "+Inf":
            s = s[1:]
        if s in ("+Inf", "-Inf", "NaN") or s.endswith("Inf") or s.endswith("NaN"):
            if s == "+Inf" and not f.plus:
                s = " Inf" if f.space else "+Inf"
            saved = f.zero
            f.zero = False
            self.pad(s, f)
            f.zero = saved
            return
        self.pad(s, f, numeric=True)

    def fmt_complex(self, c: complex, verb: str, f: _Flags) -> None:
        if verb not in "veEfFgG":
            self.bad_verb(verb, c)
            return
        inner = _Printer(self.max_len)
        inner.fmt_float(c.real, verb, _Flags(prec=f.prec))
        imag = _Printer(self.max_len)
        imag.fmt_float(c.imag, verb, _Flags(plus=True, prec=f.prec))
        self.pad("(" + inner.text() + imag.text() + "i)", f)

    def fmt_string(self, s: str, verb: str, f: _Flags, value: Any) -> None:
        if f.prec is not None and verb in "vsxXq":
            s = s[: f.prec]
        if verb in ("v", "s"):
            if f.sharp_v:
                self.pad(quote(s), f)
            else:
                self.pad(s, f)
        elif verb == "q":
            if f.sharp and can_backquote(s):
                self.pad("`" + s + "`", f)
            else:
                self.pad(quote(s, ascii_only=f.plus), f)
        elif verb in ("x", "X"):
            data = s.encode()
            sep = " " if f.space else ""
            prefix = ("0x" if verb == "x" else "0X") if f.sharp else ""
            parts = [(prefix + format(b, "02" + verb)) for b in data]
            if not f.space and f.sharp:
                out = prefix + "".join(format(b, "02" + verb) for b in data)
            else:
                out = sep.join(parts)
            self.pad(out, f)
        else:
            self.bad_verb(verb, value)

    def print_value(self, value: Any, verb: str, f: _Flags, depth: int) -> None:
        if depth > 100:
            self.write("...")
            return
        # Stringer (String() method) for the verbs that take a string.
        methods = go_methods_of(value)
        if not f.sharp_v and verb in "vsxXq" and "String" in methods:
            self.fmt_string(str(methods["String"].fn(value)), verb, f, value)
            return
        if value is MISSING:
            if depth == 0:
                self.write("<invalid reflect.Value>")
            elif verb == "v":
                self.write("<nil>")
            else:
                self.bad_verb(verb, value)
            return
        if value is None:
            if verb == "v":
                self.pad("<nil>", f)
            else:
                self.bad_verb(verb, value)
            return
        if isinstance(value, bool):
            if verb in ("v", "t"):
                self.pad("true" if value else "false", f)
            else:
                self.bad_verb(verb, value)
            return
        if isinstance(value, int):
            if verb in "vdboOxXcqU":
                self.fmt_integer(int(value), verb, f, value)
            else:
                self.bad_verb(verb, value)
            return
        if isinstance(value, float):
            self.fmt_float(value, verb, f)
            return
        if isinstance(value, complex):
            self.fmt_complex(value, verb, f)
            return
        if isinstance(value, str):
            self.fmt_string(value, verb, f, value)
            return
        if isinstance(value, bytes):
            if verb in ("s", "q", "x", "X"):
                self.fmt_string(value.decode("utf-8", "replace"), verb, f, value)
            else:
                self.print_list(list(value), verb, f, depth)
            return
        if isinstance(value, dict):
            self.print_map(value, verb, f, depth)
            return
        if isinstance(value, list | tuple):
            self.print_list(value, verb, f, depth)
            return
        if isinstance(value, GoStruct):
            self.print_struct(value, verb, f, depth)
            return
        if isinstance(value, GoChan | GoFunc):
            self.pad(f"0x{id(value):x}", f)
            return
        self.pad(str(value), f)

    def print_list(self, items: Sequence[Any], verb: str, f: _Flags, depth: int) -> None:
        self.write("[")
        for i, item in enumerate(items):
            if i:
                self.write(" ")
            self.print_value(item, verb, f, depth + 1)
        self.write("]")

    def print_map(self, m: dict[Any, Any], verb: str, f: _Flags, depth: int) -> None:
        self.write("map[")
        for i, key in enumerate(sorted_keys(m)):
            if i:
                self.write(" ")
            self.print_value(key, verb, f, depth + 1)
            self.write(":")
            self.print_value(m[key], verb, f, depth + 1)
        self.write("]")

    def print_struct(self, s: GoStruct, verb: str, f: _Flags, depth: int) -> None:
        if s.go_pointer:
            self.write("&")
        self.write("{")
        for i, name in enumerate(s.go_fields):
            if i:
                self.write(" ")
            if f.plus_v:
                self.write(name + ":")
            self.print_value(s.go_field(name), verb, f, depth + 1)
        self.write("}")


def _key_rank(key: Any) -> tuple[int, Any]:
    if key is None:
        return (0, 0)
    if isinstance(key, bool):
        return (1, int(key))
    if isinstance(key, int | float):
        return (2, key)
    if isinstance(key, str):
        return (3, key)
    return (4, str(key))


def sorted_keys(m: dict[Any, Any]) -> list[Any]:
    """Map keys in Go's fmtsort order (numbers numerically, strings by bytes)."""
    try:
        return sorted(m, key=_key_rank)
    except TypeError:
        return sorted(m, key=lambda k: (type(k).__name__, str(k)))


def sprint(args: Sequence[Any], max_len: int | None = None) -> str:
    """fmt.Sprint: a space between operands when neither is a string.
    Raises TooLong past `max_len` characters (so does every printer here)."""
    p = _Printer(max_len)
    prev_string = False
    for i, arg in enumerate(args):
        is_string = isinstance(arg, str)
        if i > 0 and not is_string and not prev_string:
            p.write(" ")
        p.print_value(arg, "v", _Flags(), 0)
        prev_string = is_string
    return p.text()


def sprintln(args: Sequence[Any], max_len: int | None = None) -> str:
    """fmt.Sprintln: operands always separated by spaces, then a newline."""
    p = _Printer(max_len)
    for i, arg in enumerate(args):
        if i:
            p.write(" ")
        p.print_value(arg, "v", _Flags(), 0)
    p.write("\n")
    return p.text()


def _parse_num(fmt: str, i: int) -> tuple[int | None, int, bool]:
    """Digits at fmt[i:]: (number or None, next index, too large)."""
    start = i
    while i < len(fmt) and fmt[i].isdigit() and fmt[i].isascii():
        i += 1
    if i == start:
        return None, i, False
    n = int(fmt[start:i])
    if n > MAX_WIDTH:
        return None, len(fmt), True
    return n, i, False


def _star_arg(args: Sequence[Any], argnum: int) -> int | None:
    """The int argument a `*` width or precision takes, None if it is not one."""
    if argnum < len(args) and isinstance(args[argnum], int) and not isinstance(args[argnum], bool):
        return int(args[argnum])
    return None


def sprintf(fmt: str, args: Sequence[Any], max_len: int | None = None) -> str:
    """fmt.Sprintf with Go's verbs, flags, widths, precisions, `*` and
    `[n]` argument indexes, and its error notations (%!d(string=x),
    %!d(MISSING), %!(EXTRA ...), %!(NOVERB), %!(BADWIDTH), ...)."""
    p = _Printer(max_len)
    argnum = 0
    reordered = False
    good_argnum = True
    i = 0
    end = len(fmt)
    while i < end:
        j = fmt.find("%", i)
        if j < 0:
            p.write(fmt[i:])
            break
        p.write(fmt[i:j])
        i = j + 1
        f = _Flags()
        while i < end:
            c = fmt[i]
            if c == "#":
                f.sharp = True
            elif c == "0":
                f.zero = not f.minus
            elif c == "+":
                f.plus = True
            elif c == "-":
                f.minus = True
                f.zero = False
            elif c == " ":
                f.space = True
            else:
                break
            i += 1

        def arg_index(idx: int, argnum: int) -> tuple[int, int, bool]:
            # [n] argument index
            nonlocal reordered
            if idx < end and fmt[idx] == "[":
                reordered = True
                close = fmt.find("]", idx)
                if close < 0:
                    return argnum, idx, False
                try:
                    n = int(fmt[idx + 1 : close])
                except ValueError:
                    return argnum, close + 1, False
                if n < 1 or n > len(args):
                    return argnum, close + 1, False
                return n - 1, close + 1, True
            return argnum, idx, True

        argnum, i, ok = arg_index(i, argnum)
        if not ok:
            good_argnum = False
        # width
        if i < end and fmt[i] == "*":
            i += 1
            w = _star_arg(args, argnum)
            if w is None or abs(w) > MAX_WIDTH:
                p.write("%!(BADWIDTH)")
            elif w < 0:
                f.minus, f.zero, f.width = True, False, -w
            else:
                f.width = w
            argnum += 1
        else:
            parsed_w, i, too_large = _parse_num(fmt, i)
            if too_large:
                p.write("%!(NOVERB)")
                break
            f.width = parsed_w
        # precision
        if i < end and fmt[i] == ".":
            i += 1
            argnum, i, ok = arg_index(i, argnum)
            if not ok:
                good_argnum = False
            if i < end and fmt[i] == "*":
                i += 1
                pr = _star_arg(args, argnum)
                if pr is None or pr < 0 or pr > MAX_WIDTH:
                    p.write("%!(BADPREC)")
                else:
                    f.prec = pr
                argnum += 1
            else:
                parsed_p, i, too_large = _parse_num(fmt, i)
                if too_large:
                    p.write("%!(NOVERB)")
                    break
                f.prec = parsed_p if parsed_p is not None else 0
        argnum, i, ok = arg_index(i, argnum)
        if not ok:
            good_argnum = False
        if i >= end:
            p.write("%!(NOVERB)")
            break
        verb = fmt[i]
        i += 1
        if verb == "%":
            p.write("%")
            continue
        if not good_argnum:
            p.write(f"%!{verb}(BADINDEX)")
            good_argnum = True
            continue
        if argnum >= len(args):
            p.write(f"%!{verb}(MISSING)")
            continue
        arg = args[argnum]
        argnum += 1
        if verb == "w":
            verb = "v"
        if verb == "v":
            if f.sharp:
                f.sharp = False
                f.sharp_v = True
            if f.plus:
                f.plus = False
                f.plus_v = True
        if verb == "T":
            p.pad(type_name(arg), f)
            continue
        if verb == "p":
            p.pad(f"0x{id(arg):x}", f)
            continue
        p.print_value(arg, verb, f, 0)
    if not reordered and argnum < len(args):
        p.write("%!(EXTRA ")
        for k, arg in enumerate(args[argnum:]):
            if k:
                p.write(", ")
            if arg is None:
                p.write("<nil>")
            else:
                p.write(type_name(arg) + "=")
                p.print_value(arg, "v", _Flags(), 0)
        p.write(")")
    return p.text()


def sprint_limited(args: Sequence[Any], max_len: int) -> str:
    return sprint(args, max_len)


def to_string(value: Any) -> str:
    """A value printed with %v (what a template action prints)."""
    return sprint([value])


__all__ = [
    "MAX_WIDTH",
    "TooLong",
    "format_float",
    "quote",
    "sorted_keys",
    "sprint",
    "sprintf",
    "sprintln",
    "to_string",
]
