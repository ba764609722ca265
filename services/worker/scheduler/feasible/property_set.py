"""Property sets for `distinct_property` (Nomad's `propertyset.go`): how
many allocs of a job or group already use each value of a node property,
in the state and in the plan being built."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from corral.domain.structs import ClientStatus, DesiredStatus
from corral.v1 import structs_pb2 as pb
from services.worker.scheduler.feasible.constraints import DISTINCT_PROPERTY, resolve_target
from services.worker.scheduler.feasible.context import EvalContext

_TERMINAL_DESIRED = (DesiredStatus.STOP, DesiredStatus.EVICT)
_TERMINAL_CLIENT = ClientStatus.TERMINAL


class PropertySet:
    """How many of the job's (or one group's) allocs sit on nodes with each
    value of a node property, counting the snapshot and the plan being built
    (Nomad's propertySet; used by distinct_property and spread).

    The counts are kept incrementally: each plan node's contribution is
    remembered with a fingerprint of its plan lists, and a refresh
    (`populate_proposed`, before each select) recounts only the nodes whose
    lists changed and applies the difference to the per-value counts, the
    combined use and a histogram of use counts. Reads (`used_count`,
    `use_bounds`) are then O(1) per node, where they used to rebuild the
    combined counts from every placement in the plan (the quadratic path of
    Nomad's #11712)."""

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
        #: node id -> its targeted value, or None when the node lacks it
        #: (filled by `node_key`; read directly in the select loop)
        self.node_keys: dict[str, str | None] = {}
        self.existing: dict[str, int] = {}
        self.proposed: dict[str, int] = {}
        self.cleared: dict[str, int] = {}
        # existing + proposed - cleared per value (clamped at 0; a value is
        # listed while it has existing or proposed uses), and how many
        # values have each non-zero count (for the least/most used)
        self._combined: dict[str, int] = {}
        self._hist: dict[int, int] = {}
        self._bounds: tuple[int, int] | None = None
        # plan node id -> (fingerprint of its list, targeted value, count)
        self._placed: dict[str, tuple[tuple[int, str], str, int]] = {}
        self._stopped: dict[str, tuple[tuple[int, str], str, int]] = {}
        # where this set stands in the context's plan-edit journal
        self._journal_epoch = -1
        self._journal_pos = 0
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

    def node_key(self, node: pb.Node) -> str | None:
        """The node's targeted value (None when it lacks the property),
        resolved once per node; None for every node when the set is in error."""
        nid = node.id
        try:
            return self.node_keys[nid]
        except KeyError:
            pass
        if self.error:
            return None
        hit = self._node_value.get(nid)
        if hit is None:
            hit = resolve_target(self.attribute, node)
            self._node_value[nid] = hit
        key = self.targeted(hit[0]) if hit[1] else None
        self.node_keys[nid] = key
        return key

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
        for key in counts:
            self._recombine(key)

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

    def _count_placed(self, allocs: Iterable[pb.Allocation]) -> int:
        n = 0
        for a in allocs:
            if (
                a.desired_status not in _TERMINAL_DESIRED
                and a.client_status not in _TERMINAL_CLIENT
                and self._wanted(a)
                and not self._counted_in_existing(a)
            ):
                n += 1
        return n

    def _count_stopped(self, stops: Iterable[pb.AllocStop]) -> int:
        snap = self.ctx.snapshot
        n = 0
        for s in stops:
            old = snap.alloc_by_id(s.alloc_id)
            if old is not None and self._wanted(old):
                n += 1
        return n

    def populate_proposed(self) -> None:
        """Bring the counts up to date with the plan (call before each select).

        While the context journals plan edits (`EvalContext.track_plan_edits`)
        only the journaled nodes are recounted; otherwise every plan node is
        looked at and only those whose placement or stop list changed since
        the last refresh (length or last element differ, as `EvalContext`'s
        proposed-alloc cache checks) are recounted. Either way the
        difference is applied to the per-value counts."""
        ctx = self.ctx
        plan = ctx.plan
        edited = ctx.journal_since(self._journal_epoch, self._journal_pos)
        nodes = None if edited is None else list(dict.fromkeys(edited))
        changed: set[str] = set()
        self._refresh(
            plan.node_allocation,
            lambda lst: lst.allocs,
            lambda a: a.id,
            self._placed,
            self.proposed,
            self._count_placed,
            changed,
            nodes,
        )
        self._refresh(
            plan.node_update,
            lambda lst: lst.stops,
            lambda s: s.alloc_id,
            self._stopped,
            self.cleared,
            self._count_stopped,
            changed,
            nodes,
        )
        if edited is not None:
            self._journal_pos += len(edited)
        elif ctx.journal is not None:
            self._journal_epoch = ctx.journal_epoch
            self._journal_pos = len(ctx.journal)
        for key in changed:
            self._recombine(key)

    def _refresh(
        self,
        lists: Mapping[str, Any],
        entries_of: Callable[[Any], Sequence[Any]],
        id_of: Callable[[Any], str],
        cache: dict[str, tuple[tuple[int, str], str, int]],
        counts: dict[str, int],
        count: Callable[[Any], int],
        changed: set[str],
        nodes: list[str] | None,
    ) -> None:
        """Recount the plan's per-node lists (placements or stops) that
        changed since the last refresh into `counts` by value, `cache`
        remembering each node's fingerprint, value and count; the values
        whose count moved join `changed`. `nodes`: only those (the
        journaled edits), recounted whatever their fingerprint; None: every
        plan node is looked at."""
        seen = 0
        for node_id in nodes if nodes is not None else lists:
            lst = lists.get(node_id)
            hit = cache.get(node_id)
            if lst is None:  # (journaled) the node's entry left the plan
                if hit is not None:
                    self._drop(cache, counts, node_id, changed)
                continue
            entries = entries_of(lst)
            size = len(entries)
            fp = (size, id_of(entries[size - 1]) if size else "")
            if hit is not None:
                seen += 1
                if hit[0] == fp and nodes is None:
                    continue
            v, ok = self._value_of_node_id(node_id)
            if not ok:
                cache[node_id] = (fp, "", 0)
                continue
            key = self.targeted(v)
            n = count(entries)
            old = hit[2] if hit is not None else 0
            cache[node_id] = (fp, key, n)
            if n != old:
                _bump(counts, key, n - old)
                changed.add(key)
        if nodes is None and seen < len(cache):  # node entries dropped from the plan
            for node_id in [k for k in cache if k not in lists]:
                self._drop(cache, counts, node_id, changed)

    @staticmethod
    def _drop(
        cache: dict[str, tuple[tuple[int, str], str, int]],
        counts: dict[str, int],
        node_id: str,
        changed: set[str],
    ) -> None:
        """A node's entry left the plan: take back what it counted."""
        _, key, n = cache.pop(node_id)
        if n:
            _bump(counts, key, -n)
            changed.add(key)

    def _recombine(self, key: str) -> None:
        """Recompute one value's combined use and the count histogram."""
        e = self.existing.get(key, 0)
        p = self.proposed.get(key, 0)
        combined = self._combined
        old = combined.get(key, 0)
        if e > 0 or p > 0:
            new = max(e + p - self.cleared.get(key, 0), 0)
            combined[key] = new
        else:
            new = 0
            combined.pop(key, None)
        if new == old:
            return
        hist = self._hist
        if old > 0:
            left = hist[old] - 1
            if left:
                hist[old] = left
            else:
                del hist[old]
        if new > 0:
            hist[new] = hist.get(new, 0) + 1
        self._bounds = None

    def invalidate(self) -> None:
        """Recount every plan node at the next refresh (after editing plan
        entries in place rather than appending)."""
        for cache in (self._placed, self._stopped):
            for node_id, (_, key, n) in cache.items():
                cache[node_id] = ((-1, ""), key, n)
        self._journal_epoch = -1

    def combined_use(self) -> dict[str, int]:
        """existing + proposed − stopped, per (targeted) value (read-only)."""
        return self._combined

    def use_bounds(self) -> tuple[int, int]:
        """Least and most uses among values in use (0, 0 if none); values
        whose count dropped to zero do not set the minimum, as in Nomad."""
        if self._bounds is None:
            hist = self._hist
            self._bounds = (min(hist), max(hist)) if hist else (0, 0)
        return self._bounds

    def used_count(self, node: pb.Node) -> tuple[str, str, int]:
        """(targeted value, error, count of allocs using it) for `node`."""
        if self.error:
            return "", self.error, 0
        key = self.node_key(node)
        if key is None:
            return self._node_value[node.id][0], f"missing property {self.attribute!r}", 0
        return key, "", self._combined.get(key, 0)

    def satisfies_distinct(self, node: pb.Node) -> tuple[bool, str]:
        value, err, used = self.used_count(node)
        if err:
            return False, err
        if used < self.allowed:
            return True, ""
        return False, f"distinct_property: {self.attribute}={value} used by {used} allocs"


def _bump(counts: dict[str, int], key: str, delta: int) -> None:
    n = counts.get(key, 0) + delta
    if n:
        counts[key] = n
    else:
        del counts[key]


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
