"""Version matching for the `version` and `semver` constraint operators
(go-version and semver rules as Nomad applies them)."""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

_VERSION_RE = re.compile(
    r"^v?(?P<segs>\d+(?:\.\d+)*)(?:-(?P<pre>[0-9A-Za-z.\-]+))?(?:\+(?P<meta>[0-9A-Za-z.\-]+))?$"
)


@dataclass(frozen=True, slots=True)
class Version:
    """A version as hashicorp/go-version reads it: numeric segments (padded
    to three), an optional pre-release; build metadata is ignored."""

    segments: tuple[int, ...]
    specified: int  # how many segments were written (for ~>)
    pre: str

    def _cmp(self, other: Version) -> int:
        if self.segments != other.segments:
            return -1 if self.segments < other.segments else 1
        return _cmp_pre(self.pre, other.pre)

    def __lt__(self, other: Version) -> bool:
        return self._cmp(other) < 0


def _cmp_pre(a: str, b: str) -> int:
    if a == b:
        return 0
    if not a:
        return 1  # a release is newer than any of its pre-releases
    if not b:
        return -1
    pa, pb_ = a.split("."), b.split(".")
    for x, y in zip(pa, pb_, strict=False):
        if x == y:
            continue
        xd, yd = x.isdigit(), y.isdigit()
        if xd and yd:
            return -1 if int(x) < int(y) else 1
        if xd != yd:
            return -1 if xd else 1  # numeric identifiers sort first
        return -1 if x < y else 1
    return -1 if len(pa) < len(pb_) else (1 if len(pa) > len(pb_) else 0)


@functools.lru_cache(maxsize=4096)
def parse_version(text: str) -> Version | None:
    """A node's version attribute (cached: nodes repeat theirs)."""
    return _parse_version(text)


def _parse_version(text: str) -> Version | None:
    m = _VERSION_RE.match(text.strip())
    if m is None:
        return None
    try:
        segs = [int(s) for s in m.group("segs").split(".")]
    except ValueError:  # more digits than Python converts (go-version: int64)
        return None
    specified = len(segs)
    while len(segs) < 3:
        segs.append(0)
    return Version(tuple(segs), specified, m.group("pre") or "")


_OPS = ("~>", ">=", "<=", "!=", ">", "<", "=")

#: "> 1.2, < 2.0" parsed: ((">", 1.2.0), ("<", 2.0.0))
VersionConstraint = tuple[tuple[str, Version], ...]


def parse_version_constraint(text: str) -> VersionConstraint | None:
    """ "> 1.2, < 2.0" into ((op, version), ...); None if malformed. Not
    cached here: the text is a user's, so the eval that uses it caches it
    (`constraints.MatchCache`)."""
    out: list[tuple[str, Version]] = []
    for raw in text.split(","):
        part = raw.strip()
        op = "="
        for cand in _OPS:
            if part.startswith(cand):
                op = cand
                part = part[len(cand) :].strip()
                break
        v = _parse_version(part)
        if v is None:
            return None
        out.append((op, v))
    return tuple(out) if out else None


def version_match(lval: str, cons: VersionConstraint | None, *, strict_semver: bool) -> bool:
    """Does the version `lval` (a node's) meet the parsed constraint?"""
    v = parse_version(lval)
    if v is None or cons is None:
        return False
    for op, c in cons:
        if strict_semver and op == "~>":
            return False
        if not strict_semver and v.pre and (not c.pre or v.segments != c.segments):
            # go-version: a pre-release only satisfies constraints naming a
            # pre-release of the same version
            return False
        cmp = v._cmp(c)
        if op == "=":
            ok = cmp == 0
        elif op == "!=":
            ok = cmp != 0
        elif op == ">":
            ok = cmp > 0
        elif op == "<":
            ok = cmp < 0
        elif op == ">=":
            ok = cmp >= 0
        elif op == "<=":
            ok = cmp <= 0
        else:  # ~>: at least c, and the same leading segments
            n = max(c.specified - 1, 1)
            ok = cmp >= 0 and v.segments[:n] == c.segments[:n]
        if not ok:
            return False
    return True
