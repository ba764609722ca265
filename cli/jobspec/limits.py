"""What reading one job file may cost: its size, how deeply it nests and the
CPU time its parse takes. The CLI reads files its user wrote, but the HTTP
gateway parses whatever a caller sends (/v1/jobs/parse, job JSON), so every
front end checks these before and while it parses, and a file past a limit
gets a `JobspecError` naming the limit, never a `RecursionError` or minutes
of CPU.

* **Size**: at most `MAX_JOBSPEC_BYTES` of UTF-8 (the state takes a job of
  at most 1 MiB, so a larger file could not register anyway).
* **Nesting**: python-hcl2's transformer, `json.loads` and protobuf's
  `Struct` all recurse per level, and protobuf refuses messages nested more
  than 100 deep (a task's `config` map costs three per level, and a job
  travels inside plans and allocations). `MAX_NESTING_DEPTH` levels of
  blocks, lists, maps, parentheses, operators and interpolations are allowed,
  counted on the parsed syntax tree (HCL) or the decoded value (JSON) without
  recursion.
* **CPU time**: python-hcl2 parses at roughly 10-50 microseconds per byte,
  so even a file within the size limit could keep a CPU busy for a minute.
  `cpu_budget` stops a parse after `PARSE_CPU_SECONDS` of CPU time (a signal
  timer: it works in a process's main thread, where the CLI and the
  gateway's parse worker run it; elsewhere the caller bounds the time, as
  the gateway does by killing its worker).
"""

from __future__ import annotations

import json
import signal
import threading
from collections.abc import Callable
from typing import Any, Final, TypeVar

from lark import Token, Tree

from cli.jobspec.errors import JobspecError

#: the largest job file read, in bytes of UTF-8
MAX_JOBSPEC_BYTES: Final = 1024 * 1024
#: the deepest nesting of blocks, lists, maps and expressions (see above)
MAX_NESTING_DEPTH: Final = 32
#: CPU seconds one parse may take
PARSE_CPU_SECONDS: Final = 5.0

T = TypeVar("T")


#: what a level is, in the words of each format
HCL_LEVELS: Final = "blocks, lists, maps and expressions together"
JSON_LEVELS: Final = "arrays and objects together"


class NestingError(ValueError):
    """A document nested deeper than `MAX_NESTING_DEPTH` (its message names
    the limit in a user's words)."""

    def __init__(self, limit: int = MAX_NESTING_DEPTH, what: str = HCL_LEVELS) -> None:
        super().__init__(f"nested more than {limit} levels deep ({what}; the nesting limit)")
        self.limit = limit


def check_size(text: str, filename: str) -> None:
    """Refuse a job file larger than MAX_JOBSPEC_BYTES."""
    # a character is at most 4 bytes: only long texts need encoding to tell
    if len(text) * 4 <= MAX_JOBSPEC_BYTES:
        return
    size = len(text.encode("utf-8", errors="surrogatepass"))
    if size > MAX_JOBSPEC_BYTES:
        raise JobspecError(
            filename,
            None,
            "",
            f"the job file is {size} bytes; at most {MAX_JOBSPEC_BYTES} are accepted "
            "(the jobspec size limit)",
        )


# -------------------------------------------------------------------- JSON


def json_depth(value: Any) -> int:
    """How deeply `value` (decoded JSON) nests: 0 for a scalar, 1 for a flat
    list or object. Iterative, so any depth is measured without recursion."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        depth += 1
        deepest = max(deepest, depth)
        stack.extend((child, depth) for child in children)
    return deepest


def load_json(text: str | bytes, limit: int = MAX_NESTING_DEPTH) -> Any:
    """`json.loads` that refuses nesting deeper than `limit` with a
    NestingError (the decoder recurses per level: past Python's recursion
    limit it would raise RecursionError, and within it the value would still
    be too deep for what follows). JSONDecodeError and UnicodeDecodeError
    pass through as json.loads raises them."""
    try:
        value = json.loads(text)
    except RecursionError:
        raise NestingError(limit, JSON_LEVELS) from None
    if json_depth(value) > limit:
        raise NestingError(limit, JSON_LEVELS)
    return value


# --------------------------------------------------------------------- HCL

#: syntax-tree nodes that open a level of nesting a user can see (a block,
#: a list, a map, a call, an operator, an interpolation, an index or an
#: attribute access); the wrappers between them (body, attribute, expr_term,
#: string parts, ...) are not counted
_HCL_LEVELS: Final = frozenset(
    {
        "block",
        "tuple",
        "object",
        "function_call",
        "binary_op",
        "unary_op",
        "conditional",
        "interpolation",
        "for_tuple_expr",
        "for_object_expr",
        "index_expr_term",
        "get_attr_expr_term",
        "attr_splat_expr_term",
        "full_splat_expr_term",
        "template_if_start",
        "template_for_start",
    }
)
#: at most this many tree nodes lie between two counted levels (an
#: interpolation inside a string inside an interpolation: interpolation >
#: expr_term > string > string_part); the raw depth is bounded too, in case
#: a construct nests through nodes not counted above
_WRAPPERS_PER_LEVEL: Final = 4
_TOP_WRAPPERS: Final = 8


def _opens_level(node: Tree[Any]) -> bool:
    if node.data in _HCL_LEVELS:
        return True
    # a parenthesized expression: expr_term "(" expression ")"
    first = node.children[0] if node.children else None
    return node.data == "expr_term" and isinstance(first, Token) and first.type == "LPAR"


def hcl_depth(tree: Tree[Any]) -> tuple[int, int]:
    """(the deepest nesting of counted levels, the deepest raw tree depth)
    of an HCL syntax tree, measured without recursion."""
    deepest = raw_deepest = 0
    stack: list[tuple[Tree[Any], int, int]] = [(tree, 0, 1)]
    while stack:
        node, levels, raw = stack.pop()
        if _opens_level(node):
            levels += 1
        deepest = max(deepest, levels)
        raw_deepest = max(raw_deepest, raw)
        stack.extend((c, levels, raw + 1) for c in node.children if isinstance(c, Tree))
    return deepest, raw_deepest


def check_hcl_depth(tree: Tree[Any], limit: int = MAX_NESTING_DEPTH) -> None:
    """Raise NestingError when the tree nests deeper than `limit` levels."""
    levels, raw = hcl_depth(tree)
    if levels > limit or raw > _TOP_WRAPPERS + (_WRAPPERS_PER_LEVEL + 1) * limit:
        raise NestingError(limit)


# ---------------------------------------------------------------- CPU time


class _OverBudget(BaseException):
    """Raised by the timer's signal handler inside the parse. A
    BaseException, so that no `except Exception` of a library between the
    handler and `cpu_budget` swallows it (lark wraps exceptions of its
    callbacks)."""


def cpu_budget(fn: Callable[[], T], filename: str, seconds: float | None = None) -> T:
    """`fn()`, stopped with a JobspecError naming the limit once the process
    has spent `seconds` (default PARSE_CPU_SECONDS) of CPU time in it. Only the main thread can take
    the timer's signal: called from another thread, `fn` runs unbounded and
    the caller must bound it (the gateway runs parses in a worker process
    it kills)."""
    if seconds is None:
        seconds = PARSE_CPU_SECONDS
    if threading.current_thread() is not threading.main_thread() or seconds <= 0:
        return fn()
    active = True

    def expired(signum: int, frame: Any) -> None:
        if active:
            raise _OverBudget

    previous = signal.signal(signal.SIGPROF, expired)
    try:
        # one shot: the signal fires at most once, and `active` turns false
        # once the timer is disarmed, so a late delivery raises nothing
        signal.setitimer(signal.ITIMER_PROF, seconds)
        try:
            return fn()
        finally:
            signal.setitimer(signal.ITIMER_PROF, 0)
            active = False
    except _OverBudget:
        raise JobspecError(
            filename,
            None,
            "",
            f"parsing took more than {seconds:g} s of CPU time (the jobspec parse time limit)",
        ) from None
    finally:
        signal.signal(signal.SIGPROF, previous)
