"""What reading one job file may cost: its size, how deeply it nests and the
CPU time its parse takes. The CLI reads files its user wrote, but the HTTP
gateway parses whatever a caller sends (/v1/jobs/parse, job JSON), so every
front end checks these before and while it parses, and a file past a limit
gets a `JobspecError` naming the limit, never a `RecursionError` or minutes
of CPU.

* **Size**: at most `MAX_JOBSPEC_BYTES` of UTF-8 (the state takes a job of
  at most 1 MiB, so a larger file could not register anyway).
* **Nesting**: `json.loads` recurses per level, so JSON is decoded with
  `load_json`, which refuses more than `MAX_NESTING_DEPTH` levels (HCL's
  parser has its own bound, `language.parser.MAX_DEPTH`). A job's free-form
  values (a task's `config`) become protobuf `Struct`s, three messages per
  level, and protobuf refuses to decode messages nested more than 100 deep
  while a job travels inside requests, plans, allocations and the change
  feed: `MAX_VALUE_DEPTH` bounds them (validate.py), measured without
  recursion (`json_depth`).
* **CPU time**: a parse within the size limit can still be slow (an HCL
  file of nested lists costs tens of microseconds a byte; functions and for
  expressions build large values), so `cpu_budget` stops a parse after
  `PARSE_CPU_SECONDS` of CPU time (a signal timer: it works in a process's
  main thread, where the CLI and the gateway's parse worker run it;
  elsewhere the caller bounds the time, as the gateway does by killing its
  worker).
"""

from __future__ import annotations

import json
import signal
import threading
from collections.abc import Callable
from typing import Any, Final, TypeVar

from google.protobuf import struct_pb2

from corral.domain.jobspec.errors import JobspecError

#: the largest job file read, in bytes of UTF-8
MAX_JOBSPEC_BYTES: Final = 1024 * 1024
#: the deepest JSON a job file or an HTTP request body may be (see above)
MAX_NESTING_DEPTH: Final = 32
#: the deepest a free-form value of a job (a task's config) may nest: with
#: three protobuf messages per level, this keeps the deepest message that
#: carries a job (about ten levels above the task) under protobuf's 100
MAX_VALUE_DEPTH: Final = 20
#: CPU seconds one parse may take
PARSE_CPU_SECONDS: Final = 5.0

T = TypeVar("T")


#: what a level is, in JSON's words
JSON_LEVELS: Final = "arrays and objects together"


class NestingError(ValueError):
    """A document nested deeper than `MAX_NESTING_DEPTH` (its message names
    the limit in a user's words)."""

    def __init__(self, limit: int = MAX_NESTING_DEPTH, what: str = JSON_LEVELS) -> None:
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


def struct_depth(value: struct_pb2.Struct) -> int:
    """How deeply a protobuf Struct nests, counted as `json_depth` counts
    its JSON (a flat Struct is 1), without recursion."""
    deepest = 0
    stack: list[tuple[struct_pb2.Struct | struct_pb2.ListValue, int]] = [(value, 1)]
    while stack:
        msg, depth = stack.pop()
        deepest = max(deepest, depth)
        items = msg.fields.values() if isinstance(msg, struct_pb2.Struct) else msg.values
        for item in items:
            kind = item.WhichOneof("kind")
            if kind == "struct_value":
                stack.append((item.struct_value, depth + 1))
            elif kind == "list_value":
                stack.append((item.list_value, depth + 1))
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
