"""Regular expressions that users write: RE2, as Go's `regexp` is in Nomad.

Python's `re` backtracks: a job's `regexp` constraint such as `(a+)+$` over
an attribute of thirty characters pins a worker's CPU for minutes, and each
character more doubles it. RE2 (`google-re2`) matches in time linear in the
input, its syntax is Go's (the one Nomad users write their constraints in),
and it refuses what it cannot do in linear time (backreferences,
lookaround) at compile time. So every pattern a caller supplies is compiled
here: the state refuses at registration what RE2 refuses, naming the field
(Nomad's `Constraint.Validate`), and the scheduler matches with what this
module compiles.
"""

from __future__ import annotations

from typing import Any

import re2

# RE2 would otherwise print each refused pattern to stderr (a user's text in
# the logs, unstructured)
_OPTIONS: Any = re2.Options()
_OPTIONS.log_errors = False

#: a compiled pattern (`google-re2` exports no public name for the type)
Pattern = Any


class PatternError(ValueError):
    """The pattern is not one RE2 accepts; the message says why in RE2's
    words ("invalid perl operator: (?=")."""


def compile_pattern(pattern: str) -> Pattern:
    """`pattern` compiled by RE2, or `PatternError`."""
    try:
        return re2.compile(pattern, _OPTIONS)
    except re2.error as exc:
        raise PatternError(_reason(exc)) from None


def pattern_problem(pattern: str) -> str | None:
    """Why RE2 refuses `pattern`, or None if it compiles."""
    try:
        compile_pattern(pattern)
    except PatternError as exc:
        return str(exc)
    return None


def glob(pattern: str) -> Pattern:
    """A `*` glob (Nomad's datacenter names, `dc-*`) as an anchored RE2
    pattern: every other character is literal."""
    return compile_pattern("^" + ".*".join(re2.escape(p) for p in pattern.split("*")) + "$")


def _reason(exc: Exception) -> str:
    arg = exc.args[0] if exc.args else ""
    text = arg.decode("utf-8", "replace") if isinstance(arg, bytes) else str(arg)
    return text or "not a valid regular expression"
