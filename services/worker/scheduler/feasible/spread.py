"""Spread scoring (Nomad's `scheduler/feasible/spread.go`).

A spread block names a node attribute and optionally target percentages of
the group's count per value. For each candidate node, each spread adds a
boost:

* with targets: ((desired − used − 1) / desired) × weight / Σweights, where
  `desired` = percent × count (values not listed share the remainder under
  the implicit target "*"; a value with no desired share gets the lowest
  boost seen so far, starting at −1);
* without targets (even spread): compares the node's value count with the
  least- and most-used values: below the minimum → positive, at the minimum
  with imbalance → (max − min) / min, balanced or above → negative;
* a node lacking the attribute gets −1.

The summed boost is appended as the "allocation-spread" score when non-zero.
Counts come from `PropertySet`s over the job's allocs in the snapshot and in
the plan being built, refreshed before every select.
"""

from __future__ import annotations

from dataclasses import dataclass

from corral.v1 import structs_pb2 as pb
from services.worker.scheduler.feasible.context import EvalContext
from services.worker.scheduler.feasible.property_set import PropertySet

IMPLICIT_TARGET = "*"
SCORER_NAME = "allocation-spread"

# how a cached per-value boost is used (see `SpreadScorer.score`)
FIXED = 0  # add it
TARGETED = 1  # add it; it may lower the lowest boost seen
LOWEST = 2  # a value with no desired share: add the lowest boost seen
_FIXED, _TARGETED, _LOWEST = FIXED, TARGETED, LOWEST


@dataclass(slots=True)
class _SpreadInfo:
    weight: int
    desired: dict[str, float]


class SpreadScorer:
    """Spread boosts for one job; `set_task_group` before each select."""

    def __init__(self, ctx: EvalContext) -> None:
        self.ctx = ctx
        self.job: pb.Job | None = None
        self.tg: pb.TaskGroup | None = None
        self._sets: dict[str, list[PropertySet]] = {}
        self._info: dict[str, dict[str, _SpreadInfo]] = {}
        self._sum_weights: dict[str, int] = {}
        self.lowest_boost = -1.0
        self.active: list[PropertySet] = []
        # per active spread: value -> (boost, kind), for the current select
        self._boosts: list[dict[str, tuple[float, int]]] = []

    def set_job(self, job: pb.Job) -> None:
        self.job = job
        self._sets = {}
        self._info = {}
        self._sum_weights = {}
        self.lowest_boost = -1.0

    def has_spreads(self) -> bool:
        return bool(self.active)

    def set_task_group(self, tg: pb.TaskGroup) -> None:
        job = self.job
        assert job is not None, "set_job first"
        self.tg = tg
        sets = self._sets.get(tg.name)
        if sets is None:
            sets = []
            for sp in [*job.spreads, *tg.spreads]:
                sets.append(
                    PropertySet(
                        self.ctx,
                        job,
                        sp.attribute,
                        task_group=tg.name,
                        target_values=[t.value for t in sp.spread_target],
                    )
                )
            self._sets[tg.name] = sets
            self._compute_info(job, tg)
        else:
            for ps in sets:
                ps.populate_proposed()
        self.active = sets
        self._boosts = [{} for _ in sets]

    def _compute_info(self, job: pb.Job, tg: pb.TaskGroup) -> None:
        infos: dict[str, _SpreadInfo] = {}
        total = tg.count
        sum_w = 0
        for sp in [*tg.spreads, *job.spreads]:
            si = _SpreadInfo(sp.weight, {})
            sum_desired = 0.0
            for t in sp.spread_target:
                d = t.percent / 100.0 * total
                si.desired[t.value] = d
                sum_desired += d
            if 0 < sum_desired < total:
                si.desired[IMPLICIT_TARGET] = total - sum_desired
            infos[sp.attribute] = si
            sum_w += sp.weight
        self._info[tg.name] = infos
        self._sum_weights[tg.name] = sum_w

    def score(self, node: pb.Node) -> float:
        """The node's summed spread boost (0 when there is nothing to say).

        Within one select the counts do not change, so each spread's boost
        is computed once per property value and reused for every node with
        that value (`_boosts`, emptied by `set_task_group`); only the
        "lowest boost seen" of zero-share values is read live, since it
        depends on the order nodes were scored in."""
        total = 0.0
        boosts = self._boosts
        nid = node.id
        for i, ps in enumerate(self.active):
            keys = ps.node_keys
            key = keys[nid] if nid in keys else ps.node_key(node)
            if key is None:
                total -= 1.0
                continue
            cache = boosts[i]
            hit = cache.get(key)
            if hit is None:
                hit = self._value_boost(ps, key)
                cache[key] = hit
            b, kind = hit
            if kind == _LOWEST:
                total += self.lowest_boost
                continue
            total += b
            if kind == _TARGETED and b < self.lowest_boost:
                self.lowest_boost = b
        return total

    def value_boost(self, i: int, key: str) -> tuple[float, int]:
        """(boost, kind) of the `i`th active spread for nodes whose value is
        `key`, for the current select (the per-value cache `score` uses)."""
        cache = self._boosts[i]
        hit = cache.get(key)
        if hit is None:
            hit = self._value_boost(self.active[i], key)
            cache[key] = hit
        return hit

    def _value_boost(self, ps: PropertySet, key: str) -> tuple[float, int]:
        """(boost, kind) of one spread for nodes whose value is `key`."""
        tg = self.tg
        assert tg is not None
        info = self._info[tg.name].get(ps.attribute)
        if info is None:
            return 0.0, _FIXED
        used = ps.combined_use().get(key, 0) + 1
        if not info.desired:
            return even_spread_boost(ps, None, current=used - 1), _FIXED
        desired = info.desired.get(key)
        if desired is None:
            desired = info.desired.get(IMPLICIT_TARGET)
            if desired is None:
                return -1.0, _FIXED
        if desired == 0:
            return 0.0, _LOWEST
        sum_w = self._sum_weights[tg.name] or 1
        return (desired - used) / desired * (info.weight / sum_w), _TARGETED


def even_spread_boost(
    ps: PropertySet, node: pb.Node | None, *, current: int | None = None
) -> float:
    """Boost for spreading evenly over a property's values. `current` is
    the node's value's use count when the caller already looked it up
    (the property resolved without error), saving a second lookup per node
    in the select loop."""
    combined = ps.combined_use()
    if not combined:
        return 0.0  # nothing placed yet: every node is as good
    if current is None:
        assert node is not None, "a node or its value's use count"
        _, err, current = ps.used_count(node)
        if err:
            return -1.0
    lo, hi = ps.use_bounds()
    if lo == 0:
        boost = -1.0
    else:
        boost = (lo - current) / lo
    if current != lo:
        return boost
    if lo == hi:
        return -1.0
    if lo == 0:
        return 1.0
    return (hi - lo) / lo
