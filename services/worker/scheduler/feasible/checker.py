"""Feasibility: which nodes *may* run a task group, regardless of load
(Nomad's `scheduler/feasible/feasible.go`; the operators are in
`constraints`, devices in `devices`, `distinct_property` in `property_set`).

Checks run in Nomad's order: job constraints; task-group drivers; task
group + task constraints; devices; then host volumes (per alloc: a
`per_alloc` volume names the alloc's own), distinct_hosts and
distinct_property, which depend on what already runs where. The first three
groups only read node data that the computed node class covers, so their
outcome is memoised per class in `EvalEligibility` (and reported to blocked
evals) unless a constraint targets unique node data, which "escapes" the
class. Filtered nodes are counted in the metric (`nodes_filtered`,
`class_filtered` by node class, `constraint_filtered` by reason).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from corral.domain import volumes
from corral.v1 import structs_pb2 as pb
from services.worker.scheduler.feasible.constraints import (
    DISTINCT_HOSTS,
    DISTINCT_PROPERTY,
    MatchCache,
    check_constraint,
    constraint_string,
    resolve_target,
)
from services.worker.scheduler.feasible.context import ClassStatus, EvalContext, target_escapes
from services.worker.scheduler.feasible.devices import has_devices
from services.worker.scheduler.feasible.property_set import PropertySet, distinct_property_sets

FILTER_CLASS_INELIGIBLE = "computed class ineligible"
FILTER_MISSING_DRIVERS = "missing drivers"
FILTER_MISSING_DEVICES = "missing devices"
FILTER_MISSING_HOST_VOLUMES = "missing compatible host volumes"


# --------------------------------------------------------------------------- checkers


def meets_constraints(
    node: pb.Node, constraints: Sequence[pb.Constraint], cache: MatchCache
) -> pb.Constraint | None:
    """The first constraint `node` fails, or None."""
    for c in constraints:
        if c.operand in (DISTINCT_HOSTS, DISTINCT_PROPERTY):
            continue
        lval, lok = resolve_target(c.l_target, node)
        rval, rok = resolve_target(c.r_target, node)
        if not check_constraint(c.operand, lval, rval, lok, rok, cache):
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


def distinct_hosts_blocked(
    proposed: Iterable[pb.Allocation], job: pb.Job, task_group: str, *, job_level: bool
) -> bool:
    """Do a node's `proposed` allocs rule it out under distinct_hosts: an
    alloc of the job (job-level constraint) or of its group?"""
    ns = job.namespace or "default"
    for a in proposed:
        if a.job_id != job.id or (a.namespace or "default") != ns:
            continue
        if job_level or a.task_group == task_group:
            return True
    return False


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
        # per group: class -> why it failed the class-level checks (job +
        # group; "" = passed); those never depend on the plan, so they hold
        # for the whole eval
        self._class_failure_by_tg: dict[str, dict[str, str]] = {}
        self._class_failure: dict[str, str] = {}
        self._memoisable = False
        self._class_level = False
        #: for the select loop: the group's class memo (class -> why it
        #: failed, "" = passed), and whether a node whose class passed needs
        #: no further check (no distinct_hosts, no distinct_property), so
        #: `feasible` need not be called for it
        self.class_memo: dict[str, str] = self._class_failure
        self.plain = False
        #: the alloc being placed (its name picks per_alloc volumes)
        self.alloc_name = ""
        self.host_volumes = False

    def set_job(self, job: pb.Job) -> None:
        self.job = job
        self.job_constraints = tuple(job.constraints)
        self.job_distinct_hosts = distinct_hosts_enabled(job.constraints)
        self._psets_by_tg = {}
        self._tg_cons_cache = {}
        self._class_failure_by_tg = {}
        self.ctx.eligibility.set_job(job)

    def set_task_group(self, tg: pb.TaskGroup, alloc_name: str = "") -> None:
        assert self.job is not None, "set_job first"
        self.tg = tg
        self.alloc_name = alloc_name
        self.host_volumes = bool(volumes.host_requests(tg.volumes))
        cons = self._tg_cons_cache.get(tg.name)
        if cons is None or cons[0] is not tg:
            cons = (tg, task_group_constraints(tg), distinct_hosts_enabled(tg.constraints))
            self._tg_cons_cache[tg.name] = cons
        self.tg_cons, self.tg_distinct_hosts = cons[1], cons[2]
        elig = self.ctx.eligibility
        self._memoisable = not elig.job_escaped and not elig.tg_escaped.get(tg.name, False)
        self._class_level = not any(
            target_escapes(c.l_target) or target_escapes(c.r_target)
            for c in (*self.job_constraints, *cons[1].constraints)
        )
        self._class_failure = self._class_failure_by_tg.setdefault(tg.name, {})
        psets = self._psets_by_tg.get(tg.name)
        if psets is None:
            psets = distinct_property_sets(self.ctx, self.job, tg)
            self._psets_by_tg[tg.name] = psets
        else:
            for ps in psets:
                ps.populate_proposed()
        self.property_sets = psets
        self.class_memo = self._class_failure
        self.plain = (
            not psets
            and not self.host_volumes
            and not (
                self.use_distinct_hosts and (self.job_distinct_hosts or self.tg_distinct_hosts)
            )
        )

    # -- the memoised part: only node data covered by the computed class

    @property
    def class_level(self) -> bool:
        """No constraint of the job or group targets unique node data, so
        the class-level checks (all but distinct_*) hold for every node of
        a class. (Memoisation also stops at distinct_* constraints, which
        `EvalEligibility` counts as escaping for blocked evals.)"""
        return self._class_level

    def class_reason(self, node: pb.Node, *, record: bool) -> str:
        """Why `node`'s class fails the job's and group's class-level checks
        ("" when it passes). `record` memoises the outcome and reports it to
        `EvalEligibility` as visiting a node of the class does; without it
        nothing is written (the class may not be visited at all)."""
        cls = node.computed_class or self.ctx.computed_class(node)
        reason = self._class_failure.get(cls)
        if reason is not None:
            return reason
        reason = self._job_reason(node, cls, record) or self._tg_reason(node, cls, record)
        if record and self._memoisable:
            self._class_failure[cls] = reason
        return reason

    def _job_reason(self, node: pb.Node, cls: str, record: bool = True) -> str:
        """Why the job's constraints rule the node out ("" when they do not)."""
        elig = self.ctx.eligibility
        status = elig.job_status(cls)
        if status == ClassStatus.INELIGIBLE:
            return elig.job_reasons.get(cls, FILTER_CLASS_INELIGIBLE)
        if status == ClassStatus.ELIGIBLE:
            return ""
        failed = meets_constraints(node, self.job_constraints, self.ctx.match_cache)
        reason = constraint_string(failed) if failed is not None else ""
        if status == ClassStatus.UNKNOWN and record:
            elig.set_job_eligibility(not reason, cls, reason)
        return reason

    def _tg_reason(self, node: pb.Node, cls: str, record: bool = True) -> str:
        """Why the group's drivers, constraints or devices rule the node out."""
        elig = self.ctx.eligibility
        tg_name = self.tg.name if self.tg is not None else ""
        status = elig.tg_status(tg_name, cls)
        if status == ClassStatus.INELIGIBLE:
            return elig.tg_reasons.get((tg_name, cls), FILTER_CLASS_INELIGIBLE)
        if status == ClassStatus.ELIGIBLE:
            return ""
        reason = ""
        tgc = self.tg_cons
        if not has_drivers(node, tgc.drivers):
            reason = FILTER_MISSING_DRIVERS
        else:
            failed = meets_constraints(node, tgc.constraints, self.ctx.match_cache)
            if failed is not None:
                reason = constraint_string(failed)
            elif not has_devices(node, tgc.devices, self.ctx.match_cache):
                reason = FILTER_MISSING_DEVICES
        if status == ClassStatus.UNKNOWN and record:
            elig.set_tg_eligibility(not reason, tg_name, cls, reason)
        return reason

    # -- the per-node part

    def _distinct_hosts_ok(self, node: pb.Node) -> bool:
        if not (self.job_distinct_hosts or self.tg_distinct_hosts):
            return True
        assert self.job is not None and self.tg is not None
        proposed = self.ctx.proposed_allocs(node.id)
        return not distinct_hosts_blocked(
            proposed, self.job, self.tg.name, job_level=self.job_distinct_hosts
        )

    @property
    def distinct_hosts(self) -> bool:
        """Whether the group's nodes must not run the job (or group) yet."""
        return self.use_distinct_hosts and (self.job_distinct_hosts or self.tg_distinct_hosts)

    @property
    def property_sets_free(self) -> bool:
        """No distinct_property constraint applies to the group."""
        return not self.property_sets

    def feasible(self, node: pb.Node) -> bool:
        ctx = self.ctx
        cls = node.computed_class or ctx.computed_class(node)
        # the class-level checks, memoised per class: a node skipped by the
        # memo is counted under the reason its class failed, as the first was
        reason = self._class_failure.get(cls)
        if reason is None:
            reason = self._job_reason(node, cls) or self._tg_reason(node, cls)
            if self._memoisable:
                self._class_failure[cls] = reason
        if reason:
            ctx.filter_node(node, reason)
            return False
        # not memoised per class: a node's volumes are its own, and a
        # per_alloc volume differs from alloc to alloc (Nomad's "available"
        # checks)
        if self.host_volumes:
            assert self.tg is not None
            if not volumes.node_offers(node, self.tg.volumes, self.alloc_name):
                ctx.filter_node(node, FILTER_MISSING_HOST_VOLUMES)
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
