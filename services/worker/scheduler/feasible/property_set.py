"""Property sets for `distinct_property` (Nomad's `propertyset.go`): how
many allocs of a job or group already use each value of a node property,
in the state and in the plan being built."""

from __future__ import annotations

from collections.abc import Iterable

from corral.structs import ClientStatus, DesiredStatus
from corral.v1 import structs_pb2 as pb
from services.worker.scheduler.feasible.constraints import DISTINCT_PROPERTY, resolve_target
from services.worker.scheduler.feasible.context import EvalContext

_TERMINAL_DESIRED = (DesiredStatus.STOP, DesiredStatus.EVICT)
_TERMINAL_CLIENT = ClientStatus.TERMINAL


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
