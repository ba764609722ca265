"""Feasibility: which nodes *may* run a task group, regardless of load
(Nomad's `scheduler/feasible/feasible.go` and `propertyset.go`).

Checks run in Nomad's order: job constraints; task-group drivers; task
group + task constraints; devices; then distinct_hosts and
distinct_property, which depend on what already runs where. The first three
groups only read node data that the computed node class covers, so their
outcome is memoised per class in `EvalEligibility` (and reported to blocked
evals) unless a constraint targets unique node data, which "escapes" the
class. Filtered nodes are counted in the metric (`nodes_filtered`,
`class_filtered` by node class, `constraint_filtered` by reason).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from corral import structs
from corral.structs import ClientStatus, DesiredStatus
from corral.v1 import structs_pb2 as pb
from services.worker.scheduler.context import ClassStatus, EvalContext

DISTINCT_HOSTS = "distinct_hosts"
DISTINCT_PROPERTY = "distinct_property"
FILTER_CLASS_INELIGIBLE = "computed class ineligible"
FILTER_MISSING_DRIVERS = "missing drivers"
FILTER_MISSING_DEVICES = "missing devices"

_TERMINAL_DESIRED = (DesiredStatus.STOP, DesiredStatus.EVICT)
_TERMINAL_CLIENT = ClientStatus.TERMINAL


# --------------------------------------------------------------------------- candidates


# --------------------------------------------------------------------------- targets


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


# --------------------------------------------------------------------------- operands


def check_constraint(operand: str, lval: str, rval: str, lfound: bool, rfound: bool) -> bool:
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
        return lfound and rfound and _version_match(lval, rval, strict_semver=False)
    if operand == "semver":
        return lfound and rfound and _version_match(lval, rval, strict_semver=True)
    if operand == "regexp":
        if not (lfound and rfound):
            return False
        rx = _regex(rval)
        return rx is not None and rx.search(lval) is not None
    if operand in ("set_contains", "set_contains_all"):
        return lfound and rfound and _split_set(rval) <= _split_set(lval)
    if operand == "set_contains_any":
        return lfound and rfound and bool(_split_set(rval) & _split_set(lval))
    return operand in (DISTINCT_HOSTS, DISTINCT_PROPERTY)


@functools.lru_cache(maxsize=4096)
def _split_set(value: str) -> frozenset[str]:
    return frozenset(p.strip() for p in value.split(","))


@functools.lru_cache(maxsize=1024)
def _regex(pattern: str) -> re.Pattern[str] | None:
    try:
        return re.compile(pattern)
    except re.error:
        return None


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


# --------------------------------------------------------------------------- versions

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
    m = _VERSION_RE.match(text.strip())
    if m is None:
        return None
    segs = [int(s) for s in m.group("segs").split(".")]
    specified = len(segs)
    while len(segs) < 3:
        segs.append(0)
    return Version(tuple(segs), specified, m.group("pre") or "")


_OPS = ("~>", ">=", "<=", "!=", ">", "<", "=")


@functools.lru_cache(maxsize=1024)
def parse_version_constraint(text: str) -> tuple[tuple[str, Version], ...] | None:
    """ "> 1.2, < 2.0" into ((op, version), ...); None if malformed."""
    out: list[tuple[str, Version]] = []
    for raw in text.split(","):
        part = raw.strip()
        op = "="
        for cand in _OPS:
            if part.startswith(cand):
                op = cand
                part = part[len(cand) :].strip()
                break
        v = parse_version(part)
        if v is None:
            return None
        out.append((op, v))
    return tuple(out) if out else None


def _version_match(lval: str, rval: str, *, strict_semver: bool) -> bool:
    v = parse_version(lval)
    cons = parse_version_constraint(rval)
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


# --------------------------------------------------------------------------- checkers


def meets_constraints(node: pb.Node, constraints: Sequence[pb.Constraint]) -> pb.Constraint | None:
    """The first constraint `node` fails, or None."""
    for c in constraints:
        if c.operand in (DISTINCT_HOSTS, DISTINCT_PROPERTY):
            continue
        lval, lok = resolve_target(c.l_target, node)
        rval, rok = resolve_target(c.r_target, node)
        if not check_constraint(c.operand, lval, rval, lok, rok):
            return c
    return None


def has_drivers(node: pb.Node, drivers: Iterable[str]) -> bool:
    """Each driver is detected and healthy (or, for nodes that only
    fingerprint attributes, `driver.<name>` is truthy)."""
    for d in drivers:
        info = node.drivers.get(d)
        if info is not None:
            if not (info.detected and info.healthy):
                return False
            continue
        if node.attributes.get(f"driver.{d}", "").lower() not in ("1", "true"):
            return False
    return True


def split_device_name(name: str) -> tuple[str, str, str]:
    """ "type", "vendor/type" or "vendor/type/name" as (vendor, type, name)."""
    parts = name.split("/", 2)
    if len(parts) == 1:
        return "", parts[0], ""
    if len(parts) == 2:
        return parts[0], parts[1], ""
    return parts[0], parts[1], parts[2]


def device_matches(req: pb.RequestedDevice, dev: pb.NodeDevice) -> bool:
    """The node device group is what `req` names and meets its constraints."""
    vendor, dtype, name = split_device_name(req.name)
    if dtype != dev.type or (vendor and vendor != dev.vendor) or (name and name != dev.name):
        return False
    for c in req.constraints:
        lval, lok = resolve_device_target(c.l_target, dev)
        rval, rok = resolve_device_target(c.r_target, dev)
        if not check_constraint(c.operand, lval, rval, lok, rok):
            return False
    return True


def has_devices(node: pb.Node, requests: Sequence[pb.RequestedDevice]) -> bool:
    """Every request can be met by one device group of the node (capacity
    only; what is already in use is the ranker's concern)."""
    if not requests:
        return True
    available = {i: len(d.instance_ids) for i, d in enumerate(node.node_resources.devices)}
    for req in requests:
        want = req.count or 1
        for i, dev in enumerate(node.node_resources.devices):
            if available[i] >= want and device_matches(req, dev):
                available[i] -= want
                break
        else:
            return False
    return True


@dataclass(frozen=True, slots=True)
class TaskGroupConstraints:
    """What a group asks of a node: its and its tasks' constraints, drivers
    and devices (Nomad's TaskGroupConstraints)."""

    constraints: tuple[pb.Constraint, ...]
    drivers: frozenset[str]
    devices: tuple[pb.RequestedDevice, ...]


def task_group_constraints(tg: pb.TaskGroup) -> TaskGroupConstraints:
    cons = list(tg.constraints)
    drivers: set[str] = set()
    devices: list[pb.RequestedDevice] = []
    for t in tg.tasks:
        cons.extend(t.constraints)
        if t.driver:
            drivers.add(t.driver)
        devices.extend(t.resources.devices)
    return TaskGroupConstraints(tuple(cons), frozenset(drivers), tuple(devices))


def distinct_hosts_enabled(constraints: Iterable[pb.Constraint]) -> bool:
    for c in constraints:
        if c.operand == DISTINCT_HOSTS:
            v = c.r_target.strip().lower()
            return v not in ("false", "0", "f")
    return False


# --------------------------------------------------------------------------- property sets


class PropertySet:
    """How many of the job's (or one group's) allocs sit on nodes with each
    value of a node property, counting the snapshot and the plan being built
    (Nomad's propertySet; used by distinct_property and spread)."""

    def __init__(
        self,
        ctx: EvalContext,
        job: pb.Job,
        attribute: str,
        *,
        task_group: str = "",
        allowed: int = 0,
        target_values: Iterable[str] = (),
        error: str = "",
    ) -> None:
        self.ctx = ctx
        self.job_id = job.id
        self.namespace = job.namespace
        self.attribute = attribute
        self.task_group = task_group
        self.allowed = allowed
        self.target_values = frozenset(target_values)
        self.error = error
        self._node_value: dict[str, tuple[str, bool]] = {}
        self.existing: dict[str, int] = {}
        self.proposed: dict[str, int] = {}
        self.cleared: dict[str, int] = {}
        self._combined: dict[str, int] | None = None
        self._bounds: tuple[int, int] | None = None
        self._placed_cache: dict[str, tuple[tuple[int, str], int]] = {}
        self._stop_cache: dict[str, tuple[tuple[int, str], int]] = {}
        if not error:
            self._populate_existing()
            self.populate_proposed()

    def _value_of_node_id(self, node_id: str) -> tuple[str, bool]:
        hit = self._node_value.get(node_id)
        if hit is None:
            node = self.ctx.snapshot.node_by_id(node_id)
            hit = resolve_target(self.attribute, node) if node is not None else ("", False)
            self._node_value[node_id] = hit
        return hit

    def targeted(self, value: str) -> str:
        if not self.target_values or value in self.target_values:
            return value
        return "*"

    def _wanted(self, a: pb.Allocation) -> bool:
        if a.job_id != self.job_id:
            return False
        return not self.task_group or a.task_group == self.task_group

    def _populate_existing(self) -> None:
        counts = self.existing
        for a in self.ctx.snapshot.allocs_by_job(self.namespace, self.job_id):
            if a.desired_status in _TERMINAL_DESIRED or a.client_status in _TERMINAL_CLIENT:
                continue
            if not self._wanted(a):
                continue
            v, ok = self._value_of_node_id(a.node_id)
            if ok:
                key = self.targeted(v)
                counts[key] = counts.get(key, 0) + 1

    def _counted_in_existing(self, a: pb.Allocation) -> bool:
        """An in-place update of an alloc the snapshot already counts (same
        id and node) must not count twice."""
        old = self.ctx.snapshot.alloc_by_id(a.id)
        return (
            old is not None
            and old.node_id == a.node_id
            and old.desired_status not in _TERMINAL_DESIRED
            and old.client_status not in _TERMINAL_CLIENT
            and self._wanted(old)
        )

    def populate_proposed(self) -> None:
        """Recount the plan's placements and stops (call before each select).

        Each node's contribution is cached keyed on the plan's per-node
        fingerprint (length and last element of its placement and stop
        lists, as `EvalContext.proposed_allocs` does), so a select only
        re-examines the nodes whose plan entries changed since the last
        one instead of every alloc in the plan."""
        proposed: dict[str, int] = {}
        cleared: dict[str, int] = {}
        plan = self.ctx.plan
        snap = self.ctx.snapshot
        placed_cache = self._placed_cache
        for node_id, lst in plan.node_allocation.items():
            v, ok = self._value_of_node_id(node_id)
            if not ok:
                continue
            allocs = lst.allocs
            size = len(allocs)
            fp = (size, allocs[size - 1].id if size else "")
            hit = placed_cache.get(node_id)
            if hit is not None and hit[0] == fp:
                n = hit[1]
            else:
                n = 0
                for a in allocs:
                    if (
                        a.desired_status not in _TERMINAL_DESIRED
                        and a.client_status not in _TERMINAL_CLIENT
                        and self._wanted(a)
                        and not self._counted_in_existing(a)
                    ):
                        n += 1
                placed_cache[node_id] = (fp, n)
            if n:
                key = self.targeted(v)
                proposed[key] = proposed.get(key, 0) + n
        stop_cache = self._stop_cache
        for node_id, stops in plan.node_update.items():
            v, ok = self._value_of_node_id(node_id)
            if not ok:
                continue
            entries = stops.stops
            size = len(entries)
            fp = (size, entries[size - 1].alloc_id if size else "")
            hit = stop_cache.get(node_id)
            if hit is not None and hit[0] == fp:
                n = hit[1]
            else:
                n = 0
                for s in entries:
                    old = snap.alloc_by_id(s.alloc_id)
                    if old is not None and self._wanted(old):
                        n += 1
                stop_cache[node_id] = (fp, n)
            if n:
                key = self.targeted(v)
                cleared[key] = cleared.get(key, 0) + n
        self.proposed = proposed
        self.cleared = cleared
        self._combined = None
        self._bounds = None

    def invalidate(self) -> None:
        """Forget cached per-node plan counts (after editing plan entries in
        place rather than appending)."""
        self._placed_cache.clear()
        self._stop_cache.clear()

    def combined_use(self) -> dict[str, int]:
        """existing + proposed − stopped, per (targeted) value."""
        if self._combined is None:
            out = dict(self.existing)
            for k, n in self.proposed.items():
                out[k] = out.get(k, 0) + n
            for k, n in self.cleared.items():
                if k in out:
                    out[k] = max(out[k] - n, 0)
            self._combined = out
        return self._combined

    def use_bounds(self) -> tuple[int, int]:
        """Least and most uses among values in use (0, 0 if none); values
        whose count dropped to zero do not set the minimum, as in Nomad."""
        if self._bounds is None:
            nonzero = [n for n in self.combined_use().values() if n > 0]
            self._bounds = (min(nonzero), max(nonzero)) if nonzero else (0, 0)
        return self._bounds

    def used_count(self, node: pb.Node) -> tuple[str, str, int]:
        """(targeted value, error, count of allocs using it) for `node`."""
        if self.error:
            return "", self.error, 0
        hit = self._node_value.get(node.id)
        if hit is None:
            hit = resolve_target(self.attribute, node)
            self._node_value[node.id] = hit
        v, ok = hit
        if not ok:
            return v, f"missing property {self.attribute!r}", 0
        key = self.targeted(v)
        return key, "", self.combined_use().get(key, 0)

    def satisfies_distinct(self, node: pb.Node) -> tuple[bool, str]:
        value, err, used = self.used_count(node)
        if err:
            return False, err
        if used < self.allowed:
            return True, ""
        return False, f"distinct_property: {self.attribute}={value} used by {used} allocs"


def distinct_property_sets(ctx: EvalContext, job: pb.Job, tg: pb.TaskGroup) -> list[PropertySet]:
    """Property sets for the job's and the group's distinct_property
    constraints (the job's count allocs of every group)."""
    out: list[PropertySet] = []
    for cons, group in ((job.constraints, ""), (tg.constraints, tg.name)):
        for c in cons:
            if c.operand != DISTINCT_PROPERTY:
                continue
            allowed, err = 1, ""
            if c.r_target:
                try:
                    allowed = int(c.r_target)
                    if allowed < 0:
                        raise ValueError(c.r_target)
                except ValueError:
                    err = f"failed to convert RTarget {c.r_target!r} to uint64"
            out.append(
                PropertySet(ctx, job, c.l_target, task_group=group, allowed=allowed, error=err)
            )
    return out


# --------------------------------------------------------------------------- the checks


class FeasibilityChecker:
    """All feasibility checks of one job and group, with class memoisation.

    `set_job` once per job, `set_task_group` once per select; then
    `feasible(node)` for each candidate.
    """

    def __init__(self, ctx: EvalContext, *, distinct_hosts: bool = True) -> None:
        self.ctx = ctx
        self.use_distinct_hosts = distinct_hosts
        self.job: pb.Job | None = None
        self.job_constraints: tuple[pb.Constraint, ...] = ()
        self.job_distinct_hosts = False
        self.tg: pb.TaskGroup | None = None
        self.tg_cons = TaskGroupConstraints((), frozenset(), ())
        self.tg_distinct_hosts = False
        self.property_sets: list[PropertySet] = []
        self._psets_by_tg: dict[str, list[PropertySet]] = {}
        self._tg_cons_cache: dict[str, tuple[pb.TaskGroup, TaskGroupConstraints, bool]] = {}
        # per group: class -> passed the class-level checks (job + group);
        # those never depend on the plan, so they hold for the whole eval
        self._class_ok_by_tg: dict[str, dict[str, bool]] = {}
        self._class_ok: dict[str, bool] = {}
        self._memoisable = False

    def set_job(self, job: pb.Job) -> None:
        self.job = job
        self.job_constraints = tuple(job.constraints)
        self.job_distinct_hosts = distinct_hosts_enabled(job.constraints)
        self._psets_by_tg = {}
        self._tg_cons_cache = {}
        self._class_ok_by_tg = {}
        self.ctx.eligibility.set_job(job)

    def set_task_group(self, tg: pb.TaskGroup) -> None:
        assert self.job is not None, "set_job first"
        self.tg = tg
        cons = self._tg_cons_cache.get(tg.name)
        if cons is None or cons[0] is not tg:
            cons = (tg, task_group_constraints(tg), distinct_hosts_enabled(tg.constraints))
            self._tg_cons_cache[tg.name] = cons
        self.tg_cons, self.tg_distinct_hosts = cons[1], cons[2]
        elig = self.ctx.eligibility
        self._memoisable = not elig.job_escaped and not elig.tg_escaped.get(tg.name, False)
        self._class_ok = self._class_ok_by_tg.setdefault(tg.name, {})
        psets = self._psets_by_tg.get(tg.name)
        if psets is None:
            psets = distinct_property_sets(self.ctx, self.job, tg)
            self._psets_by_tg[tg.name] = psets
        else:
            for ps in psets:
                ps.populate_proposed()
        self.property_sets = psets

    # -- the memoised part: only node data covered by the computed class

    def _job_feasible(self, node: pb.Node, cls: str) -> bool:
        ctx = self.ctx
        elig = ctx.eligibility
        status = elig.job_status(cls)
        if status == ClassStatus.INELIGIBLE:
            ctx.filter_node(node, FILTER_CLASS_INELIGIBLE)
            return False
        if status == ClassStatus.ELIGIBLE:
            return True
        failed = meets_constraints(node, self.job_constraints)
        if status == ClassStatus.UNKNOWN:
            elig.set_job_eligibility(failed is None, cls)
        if failed is not None:
            ctx.filter_node(node, constraint_string(failed))
            return False
        return True

    def _tg_feasible(self, node: pb.Node, cls: str) -> bool:
        ctx = self.ctx
        elig = ctx.eligibility
        tg_name = self.tg.name if self.tg is not None else ""
        status = elig.tg_status(tg_name, cls)
        if status == ClassStatus.INELIGIBLE:
            ctx.filter_node(node, FILTER_CLASS_INELIGIBLE)
            return False
        if status == ClassStatus.ELIGIBLE:
            return True
        reason = ""
        tgc = self.tg_cons
        if not has_drivers(node, tgc.drivers):
            reason = FILTER_MISSING_DRIVERS
        else:
            failed = meets_constraints(node, tgc.constraints)
            if failed is not None:
                reason = constraint_string(failed)
            elif not has_devices(node, tgc.devices):
                reason = FILTER_MISSING_DEVICES
        if status == ClassStatus.UNKNOWN:
            elig.set_tg_eligibility(not reason, tg_name, cls)
        if reason:
            ctx.filter_node(node, reason)
            return False
        return True

    # -- the per-node part

    def _distinct_hosts_ok(self, node: pb.Node) -> bool:
        if not (self.job_distinct_hosts or self.tg_distinct_hosts):
            return True
        job = self.job
        tg = self.tg
        assert job is not None and tg is not None
        for a in self.ctx.proposed_allocs(node.id):
            if a.job_id != job.id or (a.namespace or "default") != (job.namespace or "default"):
                continue
            if self.job_distinct_hosts or a.task_group == tg.name:
                return False
        return True

    def feasible(self, node: pb.Node) -> bool:
        ctx = self.ctx
        cls = node.computed_class or ctx.computed_class(node)
        known = self._class_ok.get(cls)
        if known is None:
            ok = self._job_feasible(node, cls) and self._tg_feasible(node, cls)
            if self._memoisable:
                self._class_ok[cls] = ok
            if not ok:
                return False
        elif not known:
            ctx.filter_node(node, FILTER_CLASS_INELIGIBLE)
            return False
        if self.use_distinct_hosts and not self._distinct_hosts_ok(node):
            self.ctx.filter_node(node, DISTINCT_HOSTS)
            return False
        for ps in self.property_sets:
            ok, reason = ps.satisfies_distinct(node)
            if not ok:
                self.ctx.filter_node(node, reason)
                return False
        return True
