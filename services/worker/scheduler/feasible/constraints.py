"""Constraint operators and targets (Nomad's `checkConstraint` and
`resolveTarget`): how `${attr.*}`, `${meta.*}` and `${node.*}` resolve on a
node or device, and what each operator means.

`regexp` patterns run on RE2 (`corral.regexp`: linear time, Go's syntax);
they and `version`/`semver` constraints are parsed once per eval into a
`MatchCache` the eval context owns (Nomad's `EvalContext` regexp and
version caches), so no pattern a user sent outlives the eval that used it.
"""

from __future__ import annotations

import functools

from corral.domain import structs
from corral.domain.regexp import Pattern, PatternError, compile_pattern
from corral.v1 import structs_pb2 as pb
from services.worker.scheduler.feasible.versions import (
    VersionConstraint,
    parse_version_constraint,
    version_match,
)

DISTINCT_HOSTS = "distinct_hosts"
DISTINCT_PROPERTY = "distinct_property"


def resolve_target(target: str, node: pb.Node) -> tuple[str, bool]:
    """The value a constraint target names on `node`, and whether it exists.
    Anything not written as `${...}` is a literal."""
    if not target.startswith("${"):
        return target, True
    if target.startswith("${attr."):
        key = target[7:-1]
        attrs = node.attributes
        if key in attrs:
            return attrs[key], True
        return "", False
    if target.startswith("${meta."):
        key = target[7:-1]
        meta = node.meta
        if key in meta:
            return meta[key], True
        return "", False
    if target == "${node.unique.id}":
        return node.id, True
    if target == "${node.datacenter}":
        return node.datacenter, True
    if target == "${node.unique.name}":
        return node.name, True
    if target == "${node.class}":
        return node.node_class, True
    if target == "${node.pool}":
        return node.node_pool or structs.DEFAULT_NODE_POOL, True
    return "", False


def resolve_device_target(target: str, dev: pb.NodeDevice) -> tuple[str, bool]:
    """Targets of device constraints: `${device.vendor|type|model}` and
    `${device.attr.<name>}`."""
    if not target.startswith("${"):
        return target, True
    if target == "${device.vendor}":
        return dev.vendor, True
    if target == "${device.type}":
        return dev.type, True
    if target in ("${device.model}", "${device.name}"):
        return dev.name, True
    if target.startswith("${device.attr."):
        key = target[14:-1]
        if key in dev.attributes:
            return dev.attributes[key], True
    return "", False


def constraint_string(c: pb.Constraint | pb.Affinity) -> str:
    """Nomad's rendering, used as the `constraint_filtered` key."""
    return f"{c.l_target} {c.operand} {c.r_target}"


class MatchCache:
    """The patterns and version constraints one eval has parsed, each once
    (a constraint is checked against every candidate node). A pattern RE2
    refuses is cached as None: it matches nothing (the state refuses such
    patterns at registration; jobs stored before that rule still schedule)."""

    __slots__ = ("_regexps", "_versions")

    def __init__(self) -> None:
        self._regexps: dict[str, Pattern | None] = {}
        self._versions: dict[str, VersionConstraint | None] = {}

    def regexp(self, pattern: str) -> Pattern | None:
        try:
            return self._regexps[pattern]
        except KeyError:
            pass
        try:
            compiled: Pattern | None = compile_pattern(pattern)
        except PatternError:
            compiled = None
        self._regexps[pattern] = compiled
        return compiled

    def version_constraint(self, text: str) -> VersionConstraint | None:
        try:
            return self._versions[text]
        except KeyError:
            parsed = self._versions[text] = parse_version_constraint(text)
            return parsed


def check_constraint(
    operand: str, lval: str, rval: str, lfound: bool, rfound: bool, cache: MatchCache
) -> bool:
    """Evaluate one operand (distinct_* are handled elsewhere and pass)."""
    if operand in ("=", "==", "is"):
        return lfound and rfound and lval == rval
    if operand in ("!=", "not"):
        return not (lfound == rfound and lval == rval)
    if operand in ("<", "<=", ">", ">="):
        return lfound and rfound and _check_order(operand, lval, rval)
    if operand == "is_set":
        return lfound
    if operand == "is_not_set":
        return not lfound
    if operand == "version":
        return (
            lfound
            and rfound
            and version_match(lval, cache.version_constraint(rval), strict_semver=False)
        )
    if operand == "semver":
        return (
            lfound
            and rfound
            and version_match(lval, cache.version_constraint(rval), strict_semver=True)
        )
    if operand == "regexp":
        if not (lfound and rfound):
            return False
        rx = cache.regexp(rval)
        return rx is not None and rx.search(lval) is not None
    if operand in ("set_contains", "set_contains_all"):
        return lfound and rfound and _split_set(rval) <= _split_set(lval)
    if operand == "set_contains_any":
        return lfound and rfound and bool(_split_set(rval) & _split_set(lval))
    return operand in (DISTINCT_HOSTS, DISTINCT_PROPERTY)


@functools.lru_cache(maxsize=4096)
def _split_set(value: str) -> frozenset[str]:
    return frozenset(p.strip() for p in value.split(","))


def _check_order(op: str, lval: str, rval: str) -> bool:
    lnum = _number(lval)
    rnum = _number(rval)
    if lnum is not None and rnum is not None:
        a: float | str = lnum
        b: float | str = rnum
    else:
        a, b = lval, rval
    if op == "<":
        return a < b  # type: ignore[operator]
    if op == "<=":
        return a <= b  # type: ignore[operator]
    if op == ">":
        return a > b  # type: ignore[operator]
    return a >= b  # type: ignore[operator]


def _number(s: str) -> float | None:
    try:
        return float(s)
    except ValueError:
        return None
