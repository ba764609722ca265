"""Class-level scoring: one generic select computed over classes of
identical nodes with numpy instead of node by node (issue 30).

A select of `GenericStack` walks the shuffled nodes from where the last one
stopped, filters the infeasible, ranks those that fit, skips up to three
scoring ≤ 0, and keeps the best of the first `limit` ranked (with spreads
or affinities `limit` is the group's count: a 1,200-alloc spread eval
visited ~2,500 nodes per placement, 3 million node visits in all).

For most asks a node's outcome depends on nothing that differs between
nodes of one class in the same state:

* feasibility on the node's computed class (no constraint on unique data);
* fit and the bin-packing score on the class's capacity and the node's
  summed usage (its proposed allocs plus the other loops' claims);
* job anti-affinity on how many allocs of the job and group it holds;
* the spread boost on the node's value of each spread attribute, which
  `SpreadScorer` already computes once per value and select;
* affinity on the class (or on the node, when it targets unique data).

So the index keeps, per node in the stack's shuffled order, its class id
and the id of its usage state, and per (class, usage) state the ask's
exceeded dimension and fit score, each computed once by the `Ranker`
itself (`fit_outcome`, the scalar code: floats come out bit for bit). A
select then gathers those per node, adds the other scores in the order
`Ranker._score` adds them (IEEE additions and divisions, so again the
same bits), and finds the walk's window, its skips, its best node, its
counts and its top five scores with array operations. The result, the
metric and where the next select starts are exactly those of the walk;
`VERIFY` (set by the scheduler tests) replays every select with the walk
and compares.

Usage states change only where the plan changed, which the context's
plan-edit journal names (`EvalContext.track_plan_edits`), and where the
worker's other loops claimed (`InFlightPlacements.changes_since`): each
select re-reads those nodes only.

A group's dynamic ports join the usage state as the node's free ports in
its dynamic range (-1 when its ports already collide), read once an ask
has networks. Asks the index does not cover fall back to the walk: static
ports or devices (which depend on which ports and instances a node has
free), eviction, host volumes (a node's own, per alloc),
`distinct_property`, constraints on unique node data, spreads whose
targets give a value no share (their boost depends on the order nodes were
scored in), and fewer nodes than `MIN_NODES`. Short walks
walk too (`MIN_VISITS`): binpack alone ranks ⌈log2 n⌉ nodes, a few dozen
visits that cost less than the index's passes over every node.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeVar

import numpy as np
import numpy.typing as npt

from corral.domain.fit import Capacity, Usage
from corral.v1 import structs_pb2 as pb
from services.worker.scheduler.feasible.checker import FeasibilityChecker, distinct_hosts_blocked
from services.worker.scheduler.feasible.constraints import DISTINCT_HOSTS
from services.worker.scheduler.feasible.context import (
    MAX_RETAINED_NODE_SCORES,
    EvalContext,
    target_escapes,
)
from services.worker.scheduler.feasible.rank import (
    RankedNode,
    Ranker,
    affinity_score,
    job_collisions,
)
from services.worker.scheduler.feasible.spread import LOWEST, SCORER_NAME, TARGETED, SpreadScorer

__all__ = ["MIN_NODES", "MIN_VISITS", "VERIFY", "ClassIndex"]

#: nodes scoring at or below this are skipped while better ones may come
SKIP_SCORE_THRESHOLD = 0.0
#: at most this many low-scoring nodes are skipped
MAX_SKIP = 3
#: the visit limit for groups with affinities or spreads (Nomad's
#: node_limit_for_feasibility_checks default)
NODE_LIMIT_FOR_FEASIBILITY_CHECKS = 100

#: below this many candidate nodes the walk is as cheap as the arrays
MIN_NODES = 64
#: the index answers a select whose limit, or the last select's visits,
#: reach this (every spread or affinity select does): shorter walks
#: (binpack ranks ⌈log2 n⌉ nodes) cost less than the index's passes over
#: every node
MIN_VISITS = NODE_LIMIT_FOR_FEASIBILITY_CHECKS
#: replay every indexed select with the node walk and fail on any
#: difference (the scheduler tests turn it on)
VERIFY = False

_Ints = npt.NDArray[np.int64]
_Floats = npt.NDArray[np.float64]
_Bools = npt.NDArray[np.bool_]
_T = TypeVar("_T", bound=np.generic)
_StateKey = tuple[int, int, int, int, int, int, int]


@dataclass(slots=True)
class _Spread:
    """One active spread over the node list: each node's value id, and
    the values (None: the node lacks the attribute)."""

    ids: _Ints
    values: list[str | None]


@dataclass(slots=True)
class _GroupView:
    """What the index knows of one task group: per class why it fails
    (0 = feasible), per node whether it is feasible, its spread values,
    its affinity score and its allocs of the job and group."""

    tg: pb.TaskGroup
    class_reason: _Ints
    reasons: list[str]
    feasible: _Bools
    spreads: list[_Spread]
    affinity: _Floats | None
    collisions: _Ints
    recorded: _Bools  # per class: eligibility reported (a node was visited)
    unrecorded: int  # classes not reported yet
    #: per class, the id of its (node class, filter reason) in `filters`
    #: (0: the class is feasible)
    filter_key: _Ints
    filters: list[tuple[str, str]]
    #: distinct_hosts: None when off, else whether it is job-level, and
    #: per node whether it is ruled out (it holds the job or group)
    distinct_job_level: bool | None
    blocked: _Bools | None


@dataclass(slots=True)
class _AskTable:
    """Per usage state: the ask's exceeded dimension id (0 = fits) and
    fit score, as lists (grown as states appear) and arrays."""

    dims: list[int]
    fits: list[float]
    dim_array: _Ints
    fit_array: _Floats


class ClassIndex:
    """Class-level selects for one `GenericStack` (see module docstring)."""

    def __init__(
        self,
        ctx: EvalContext,
        checker: FeasibilityChecker,
        ranker: Ranker,
        spread: SpreadScorer,
    ) -> None:
        self.ctx = ctx
        self.checker = checker
        self.ranker = ranker
        self.spread = spread
        self._nodes: list[pb.Node] | None = None
        self._pos: dict[str, int] = {}
        self._cls: _Ints = np.zeros(0, np.int64)
        self._reps: list[pb.Node] = []
        self._caps: list[Capacity] = []
        self._state: _Ints = np.zeros(0, np.int64)
        self._state_ids: dict[_StateKey, int] = {}
        self._states: list[_StateKey] = []
        #: whether states count free dynamic ports (since an ask had networks)
        self._ports = False
        self._dims: list[str] = [""]
        self._dim_ids: dict[str, int] = {"": 0}
        self._asks: dict[tuple[object, ...], _AskTable] = {}
        self._views: dict[str, _GroupView] = {}
        self._epoch = -1  # the plan-edit journal's epoch and position read
        self._journal_pos = 0
        self._claims_pos = 0  # position in the worker's claim log

    def reset(self) -> None:
        """Forget the job's group views (a new job was set)."""
        self._views = {}
        self._asks = {}

    # ------------------------------------------------------------ the select

    def usable(self) -> bool:
        """Can the current select be computed per class?"""
        checker = self.checker
        return (
            self.ctx.journal is not None
            and checker.property_sets_free
            and not checker.host_volumes
            and checker.class_level
            and self.ranker.class_scorable()
        )

    def select(
        self, tg: pb.TaskGroup, nodes: list[pb.Node], offset: int, limit: int
    ) -> tuple[RankedNode | None, int] | None:
        """The walk's choice over `nodes` starting at `offset`, and how many
        nodes it visited; None when this select needs the walk. Records
        the walk's metric counts and top scores in the context."""
        n = len(nodes)
        if nodes is not self._nodes:
            self._build(nodes)
        if self.ranker.needs_network and not self._ports:
            self._ports = True
            self._epoch = -1  # re-read every node's state, with its ports
        self._refresh()
        view = self._view(tg)
        by_order, targeted, spread_sum = self._spread_scores(view)
        if not by_order:
            return None
        table = self._ask_table()
        state = self._state
        dim = table.dim_array[state]
        feasible = view.feasible if view.blocked is None else view.feasible & ~view.blocked
        ranked = feasible & (dim == 0)
        pos = np.flatnonzero(ranked)
        k = int(np.searchsorted(pos, offset))
        order = np.concatenate((pos[k:], pos[:k]))  # ranked nodes, walk order

        # the scores, added in `Ranker._score`'s order
        fit = table.fit_array[state[order]]
        coll = view.collisions[order]
        total = fit.copy()
        count = np.ones(len(order), np.int64)
        has_coll = coll > 0
        anti: _Floats | None = None
        if has_coll.any():
            anti = -(coll + 1) / max(tg.count, 1)
            total = np.where(has_coll, total + anti, total)
            count += has_coll
        penalty: _Bools | None = None
        if self.ranker.penalty_node_ids:
            at = [self._pos[i] for i in self.ranker.penalty_node_ids if i in self._pos]
            if at:
                penalty = np.isin(order, np.array(at, np.int64))
                total = np.where(penalty, total - 1.0, total)
                count += penalty
        aff: _Floats | None = None
        if view.affinity is not None:
            aff = view.affinity[order]
            total = total + aff
            count += 1
        spread: _Floats | None = None
        if spread_sum is not None:
            spread = spread_sum[order]
            nonzero = spread != 0.0
            total = np.where(nonzero, total + spread, total)
            count += nonzero
        final = total / count

        # the walk: the first MAX_SKIP ranked nodes scoring ≤ 0 are set aside
        # and taken only if the walk ends before `limit` others were
        nonpos = final <= SKIP_SCORE_THRESHOLD
        skip = nonpos & (np.cumsum(nonpos) <= MAX_SKIP)
        cand = np.flatnonzero(~skip)
        if len(cand) >= limit:
            last = int(cand[limit - 1])
            taken = cand[:limit]
            visited = (int(order[last]) - offset) % n + 1
            seen = last + 1  # ranked nodes visited
        else:
            taken = np.concatenate((cand, np.flatnonzero(skip)[: limit - len(cand)]))
            visited = n
            seen = len(order)
        best: int | None = None
        if len(taken):
            best = int(taken[int(np.argmax(final[taken]))])  # first of equals

        self._count_window(view, feasible, dim, offset, visited)
        if targeted:
            self._lower_lowest_boost(view, order[:seen])
        # top scores: the best five ranked nodes visited, earlier first on ties
        ctx = self.ctx
        for j in _top_positions(final[:seen], MAX_RETAINED_NODE_SCORES):
            node = nodes[int(order[j])]
            scores = _scores(j, fit, anti, coll, penalty, aff, spread)
            meta = {
                "binpack": scores["binpack"],
                "job-anti-affinity": 0.0,
                "node-reschedule-penalty": 0.0,
                "node-affinity": 0.0,
            }
            meta.update(scores)
            ctx.record_node_scores(node.id, meta, float(final[j]))
        if best is None:
            return None, visited
        chosen = nodes[int(order[best])]
        option = RankedNode(
            chosen, float(final[best]), _scores(best, fit, anti, coll, penalty, aff, spread)
        )
        return option, visited

    def _count_window(
        self, view: _GroupView, feasible_all: _Bools, dim: _Ints, offset: int, visited: int
    ) -> None:
        """The metric counts of the visited nodes: evaluated, filtered by
        class reason or distinct_hosts, exhausted by dimension; and the
        eligibility of the classes visited, as the walk reports it."""
        cls = _window(self._cls, offset, visited)
        wdim = _window(dim, offset, visited)
        feasible = _window(feasible_all, offset, visited)
        ctx = self.ctx
        ctx.visits += visited
        if view.unrecorded:
            seen = np.bincount(cls, minlength=len(self._reps)) > 0
            for found in np.flatnonzero(seen & ~view.recorded):
                self.checker.class_reason(self._reps[int(found)], record=True)
                view.recorded[int(found)] = True
                view.unrecorded -= 1
        if len(view.filters) > 1:
            per_key = np.bincount(view.filter_key[cls], minlength=len(view.filters))
            for key in np.flatnonzero(per_key[1:]):
                node_class, reason = view.filters[int(key) + 1]
                ctx.count_filtered(node_class, reason, int(per_key[int(key) + 1]))
        if view.blocked is not None:
            # class-feasible nodes the distinct_hosts check ruled out
            ruled_out = _window(view.feasible, offset, visited) & ~feasible
            if ruled_out.any():
                per_class = np.bincount(cls[ruled_out], minlength=len(self._reps))
                for found in np.flatnonzero(per_class):
                    c = int(found)
                    ctx.count_filtered(self._reps[c].node_class, DISTINCT_HOSTS, int(per_class[c]))
        full = feasible & (wdim != 0)
        if full.any():
            ndims = len(self._dims)
            ncls = len(self._reps)
            keys = np.bincount(cls[full] * ndims + wdim[full], minlength=ncls * ndims)
            for key in np.flatnonzero(keys):
                c, d = divmod(int(key), ndims)
                ctx.count_exhausted(self._reps[c].node_class, self._dims[d], int(keys[key]))

    # ------------------------------------------------------------ spreads

    def _spread_scores(self, view: _GroupView) -> tuple[bool, bool, _Floats | None]:
        """Each node's summed spread boost for this select (None: no
        spreads), after False when a value's boost depends on the order
        nodes are scored in, and whether some value has a target."""
        sp = self.spread
        if not sp.active:
            return True, False, None
        targeted = False
        total: _Floats = np.zeros(len(self._cls))
        for i, s in enumerate(view.spreads):
            table = np.empty(len(s.values))
            for j, value in enumerate(s.values):
                if value is None:
                    table[j] = -1.0
                    continue
                b, kind = sp.value_boost(i, value)
                if kind == LOWEST:
                    return False, False, None
                targeted = targeted or kind == TARGETED
                table[j] = b
            total = total + table[s.ids]
        return True, targeted, total

    def _lower_lowest_boost(self, view: _GroupView, scored: _Ints) -> None:
        """The walk lowers the spread's lowest boost seen with every
        targeted value it scores; do the same for the ranked nodes visited."""
        sp = self.spread
        for i, s in enumerate(view.spreads):
            for j in np.unique(s.ids[scored]):
                value = s.values[int(j)]
                if value is None:
                    continue
                b, kind = sp.value_boost(i, value)
                if kind == TARGETED and b < sp.lowest_boost:
                    sp.lowest_boost = b

    # ------------------------------------------------------------ state

    def _build(self, nodes: list[pb.Node]) -> None:
        """Classes of a new node list: computed class and capacity (the
        class does not cover `max_allocs`)."""
        ctx = self.ctx
        ranker = self.ranker
        self._nodes = nodes
        self._pos = {node.id: i for i, node in enumerate(nodes)}
        keys: dict[tuple[object, ...], int] = {}
        reps: list[pb.Node] = []
        caps: list[Capacity] = []
        cls = np.empty(len(nodes), np.int64)
        for i, node in enumerate(nodes):
            cap = ranker.capacity(node)
            key = (
                node.computed_class or ctx.computed_class(node),
                cap.cpu,
                cap.cores,
                cap.memory_mb,
                cap.disk_mb,
                cap.mhz_per_core,
                cap.max_allocs,
            )
            c = keys.get(key)
            if c is None:
                c = keys[key] = len(reps)
                reps.append(node)
                caps.append(cap)
            cls[i] = c
        self._cls = cls
        self._reps = reps
        self._caps = caps
        self._state = np.zeros(len(nodes), np.int64)
        self._state_ids = {}
        self._states = []
        self._asks = {}
        self._views = {}
        self._ports = False
        self._epoch = -1

    def _refresh(self) -> None:
        """Re-read the usage of nodes whose plan entries or claims changed
        since the last select (of every node after a journal reset)."""
        ctx = self.ctx
        inflight = ctx.inflight
        edited = ctx.journal_since(self._epoch, self._journal_pos)
        claimed: list[str] | None = []
        if inflight is not None:
            # the log position before the claims are read: a claim landing
            # meanwhile is read again at the next select
            self._claims_pos, claimed = inflight.changes_since(self._claims_pos)
        if edited is None or claimed is None:
            assert ctx.journal is not None
            self._epoch = ctx.journal_epoch
            self._journal_pos = len(ctx.journal)
            for i in range(len(self._cls)):
                self._update(i)
            for view in self._views.values():
                view.collisions = self._collisions(view.tg)
                view.blocked = self._blocked(view.tg, view.distinct_job_level)
            return
        self._journal_pos += len(edited)
        pos = self._pos
        for node_id in {*edited, *claimed}:
            at = pos.get(node_id)
            if at is not None:
                self._update(at)
                for view in self._views.values():
                    view.collisions[at] = self._node_collisions(view.tg, at)
                    if view.blocked is not None:
                        view.blocked[at] = self._node_blocked(view, at)

    def _update(self, i: int) -> None:
        """Node `i`'s usage state from its proposed allocs and claims."""
        assert self._nodes is not None
        node = self._nodes[i]
        ctx = self.ctx
        proposed = ctx.proposed_allocs(node.id)
        foreign = ctx.foreign_usage(node.id) if ctx.inflight is not None else None
        used = self.ranker.usage(node, proposed, foreign)
        room = self.ranker.dynamic_room(node, proposed) if self._ports else 0
        key = (
            int(self._cls[i]),
            used.cpu,
            used.cores,
            used.memory_mb,
            used.disk_mb,
            used.allocs,
            room,
        )
        sid = self._state_ids.get(key)
        if sid is None:
            sid = self._state_ids[key] = len(self._states)
            self._states.append(key)
        self._state[i] = sid

    def _node_collisions(self, tg: pb.TaskGroup, i: int) -> int:
        """Allocs of the job and group `tg` on node `i` (anti-affinity)."""
        assert self._nodes is not None and self.ranker.job is not None
        proposed = self.ctx.proposed_allocs(self._nodes[i].id)
        return job_collisions(proposed, self.ranker.job.id, tg.name)

    def _node_blocked(self, view: _GroupView, i: int) -> bool:
        """Does distinct_hosts rule node `i` out for the view's group?"""
        assert self._nodes is not None and self.ranker.job is not None
        proposed = self.ctx.proposed_allocs(self._nodes[i].id)
        job_level = bool(view.distinct_job_level)
        return distinct_hosts_blocked(proposed, self.ranker.job, view.tg.name, job_level=job_level)

    def _blocked(self, tg: pb.TaskGroup, job_level: bool | None) -> _Bools | None:
        """Per node, whether distinct_hosts rules it out (None when off)."""
        if job_level is None:
            return None
        assert self._nodes is not None and self.ranker.job is not None
        job = self.ranker.job
        proposed = self.ctx.proposed_allocs
        return np.array(
            [
                distinct_hosts_blocked(proposed(n.id), job, tg.name, job_level=job_level)
                for n in self._nodes
            ],
            np.bool_,
        )

    def _collisions(self, tg: pb.TaskGroup) -> _Ints:
        """Allocs of the job and group `tg` on every node."""
        return np.array([self._node_collisions(tg, i) for i in range(len(self._cls))], np.int64)

    def _ask_table(self) -> _AskTable:
        """The current ask's outcome per usage state (new states computed
        with the ranker's own `fit_outcome`)."""
        ranker = self.ranker
        key = ranker.ask_key
        table = self._asks.get(key)
        if table is None:
            empty_i: _Ints = np.zeros(0, np.int64)
            empty_f: _Floats = np.zeros(0)
            table = self._asks[key] = _AskTable([], [], empty_i, empty_f)
        states = self._states
        if len(table.dims) < len(states):
            caps = self._caps
            for c, cpu, cores, mem, disk, allocs, room in states[len(table.dims) :]:
                used = Usage(cpu, cores, mem, disk, allocs)
                dim, fit = ranker.fit_outcome(caps[c], used, room)
                d = self._dim_ids.get(dim)
                if d is None:
                    d = self._dim_ids[dim] = len(self._dims)
                    self._dims.append(dim)
                table.dims.append(d)
                table.fits.append(fit)
            table.dim_array = np.array(table.dims, np.int64)
            table.fit_array = np.array(table.fits, np.float64)
        return table

    def _view(self, tg: pb.TaskGroup) -> _GroupView:
        view = self._views.get(tg.name)
        if view is not None and view.tg is tg:
            return view
        checker = self.checker
        reasons = [""]
        reason_ids = {"": 0}
        class_reason = np.zeros(len(self._reps), np.int64)
        for c, rep in enumerate(self._reps):
            r = checker.class_reason(rep, record=False)
            rid = reason_ids.get(r)
            if rid is None:
                rid = reason_ids[r] = len(reasons)
                reasons.append(r)
            class_reason[c] = rid
        feasible: _Bools = (class_reason == 0)[self._cls]
        filters: list[tuple[str, str]] = [("", "")]
        filter_ids: dict[tuple[str, str], int] = {}
        filter_key = np.zeros(len(self._reps), np.int64)
        for c, rep in enumerate(self._reps):
            if class_reason[c]:
                pair = (rep.node_class, reasons[int(class_reason[c])])
                fid = filter_ids.get(pair)
                if fid is None:
                    fid = filter_ids[pair] = len(filters)
                    filters.append(pair)
                filter_key[c] = fid
        distinct = checker.job_distinct_hosts if checker.distinct_hosts else None
        view = _GroupView(
            tg=tg,
            class_reason=class_reason,
            reasons=reasons,
            feasible=feasible,
            spreads=self._spread_values(),
            affinity=self._affinities(),
            collisions=self._collisions(tg),
            recorded=np.zeros(len(self._reps), np.bool_),
            unrecorded=len(self._reps),
            filter_key=filter_key,
            filters=filters,
            distinct_job_level=distinct,
            blocked=self._blocked(tg, distinct),
        )
        self._views[tg.name] = view
        return view

    def _spread_values(self) -> list[_Spread]:
        assert self._nodes is not None
        out: list[_Spread] = []
        for ps in self.spread.active:
            ids: dict[str | None, int] = {}
            per_node = np.empty(len(self._nodes), np.int64)
            for i, node in enumerate(self._nodes):
                key = ps.node_key(node)
                j = ids.get(key)
                if j is None:
                    j = ids[key] = len(ids)
                per_node[i] = j
            out.append(_Spread(per_node, list(ids)))
        return out

    def _affinities(self) -> _Floats | None:
        """Each node's affinity score (once per class unless an affinity
        targets unique node data)."""
        affinities = self.ranker.affinities
        if not affinities:
            return None
        assert self._nodes is not None
        cache = self.ctx.match_cache
        per_node = any(target_escapes(a.l_target) or target_escapes(a.r_target) for a in affinities)
        if per_node:
            return np.array([affinity_score(affinities, n, cache) for n in self._nodes])
        per_class = np.array([affinity_score(affinities, r, cache) for r in self._reps])
        out: _Floats = per_class[self._cls]
        return out


def _window(values: npt.NDArray[_T], offset: int, visited: int) -> npt.NDArray[_T]:
    """`values` of the `visited` nodes from `offset`, wrapping around."""
    end = offset + visited
    n = len(values)
    if end <= n:
        return values[offset:end]
    return np.concatenate((values[offset:], values[: end - n]))


def _top_positions(scores: _Floats, k: int) -> list[int]:
    """Positions of the `k` highest scores, earlier first among equals
    (the context's retained scores), in position order."""
    n = len(scores)
    if n <= k:
        return list(range(n))
    kth = np.partition(scores, n - k)[n - k]  # the kth highest
    above = np.flatnonzero(scores > kth)
    ties = np.flatnonzero(scores == kth)[: k - len(above)]
    return sorted(int(i) for i in np.concatenate((above, ties)))


def _scores(
    j: int,
    fit: _Floats,
    anti: _Floats | None,
    coll: _Ints,
    penalty: _Bools | None,
    aff: _Floats | None,
    spread: _Floats | None,
) -> dict[str, float]:
    """The scorer values of the `j`th ranked node, as `Ranker._score`
    lists them."""
    scores = {"binpack": float(fit[j])}
    if anti is not None and coll[j] > 0:
        scores["job-anti-affinity"] = float(anti[j])
    if penalty is not None and penalty[j]:
        scores["node-reschedule-penalty"] = -1.0
    if aff is not None:
        scores["node-affinity"] = float(aff[j])
    if spread is not None and spread[j] != 0.0:
        scores[SCORER_NAME] = float(spread[j])
    return scores
