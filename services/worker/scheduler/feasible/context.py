"""The evaluation context (Nomad's `scheduler/feasible/context.go`): what the
feasibility and ranking code share while one eval is scheduled.

* the read-only state snapshot and the plan being built (the plan is a
  protobuf the schedulers mutate directly, so caches here key on a cheap
  per-node fingerprint of the plan instead of on change notifications);
* the metrics of the current placement attempt (`pb.AllocMetric`), reset by
  every `select`, with Nomad's helpers `filter_node`, `exhausted_node` and
  `score_node` (top-5 scores kept, as Nomad does);
* `EvalEligibility`: per computed node class, whether the job and each task
  group were found feasible, and whether some constraint targets unique node
  data so class memoisation cannot be trusted ("escaped"). The blocked-evals
  tracker uses both to decide which capacity changes should wake the eval.
"""

from __future__ import annotations

import heapq
import logging
from dataclasses import dataclass, field

from corral.domain import structs
from corral.domain.plan_commit import live_allocs, proposed_allocs
from corral.domain.store import StateSnapshot
from corral.v1 import structs_pb2 as pb
from services.worker.scheduler.feasible.constraints import MatchCache
from services.worker.scheduler.feasible.inflight import Claim, InFlightPlacements

#: number of best-scored nodes whose scores are kept in the metric
MAX_RETAINED_NODE_SCORES = 5
NORM_SCORER_NAME = "normalized-score"

_LOG = logging.getLogger("corral.scheduler")

_UNIQUE_PREFIXES = ("${node.unique.", "${attr.unique.", "${meta.unique.")


def target_escapes(target: str) -> bool:
    """A constraint target naming node-unique data defeats class memoisation."""
    return target.startswith(_UNIQUE_PREFIXES)


def constraint_escapes(c: pb.Constraint) -> bool:
    """Escaped: targets unique node data, or is a distinct_* constraint whose
    outcome depends on which node already runs what (conservative: blocked
    evals with such constraints are woken by any class)."""
    return (
        target_escapes(c.l_target)
        or target_escapes(c.r_target)
        or c.operand in ("distinct_hosts", "distinct_property")
    )


class ClassStatus:
    UNKNOWN = 0
    INELIGIBLE = 1
    ELIGIBLE = 2
    ESCAPED = 3


@dataclass
class EvalEligibility:
    """Feasibility of computed node classes for the job and its groups."""

    job: dict[str, bool] = field(default_factory=dict)
    job_escaped: bool = False
    task_groups: dict[str, dict[str, bool]] = field(default_factory=dict)
    tg_escaped: dict[str, bool] = field(default_factory=dict)
    quota_reached: str = ""
    # why a class was found ineligible (the constraint, missing drivers...):
    # nodes skipped by the class memo are counted under the same reason, so
    # two nodes failing one constraint report it twice, not once plus one
    # "computed class ineligible" (Nomad counts the second under the class)
    job_reasons: dict[str, str] = field(default_factory=dict)
    tg_reasons: dict[tuple[str, str], str] = field(default_factory=dict)

    def set_job(self, job: pb.Job) -> None:
        self.job_escaped = any(constraint_escapes(c) for c in job.constraints)
        for tg in job.task_groups:
            escaped = any(constraint_escapes(c) for c in tg.constraints) or any(
                constraint_escapes(c) for t in tg.tasks for c in t.constraints
            )
            self.tg_escaped[tg.name] = escaped

    def has_escaped(self) -> bool:
        return self.job_escaped or any(self.tg_escaped.values())

    def get_classes(self) -> dict[str, bool]:
        """Class -> eligible, merged as Nomad does: a class is eligible if
        some group found it eligible and the job did not rule it out."""
        elig: dict[str, bool] = {}
        for classes in self.task_groups.values():
            for cls, ok in classes.items():
                if ok:
                    elig[cls] = True
                else:
                    elig.setdefault(cls, False)
        for cls, ok in self.job.items():
            if ok:
                elig.setdefault(cls, True)
            else:
                elig[cls] = False
        return elig

    def job_status(self, cls: str) -> int:
        if self.job_escaped:
            return ClassStatus.ESCAPED
        ok = self.job.get(cls)
        if ok is None:
            return ClassStatus.UNKNOWN
        return ClassStatus.ELIGIBLE if ok else ClassStatus.INELIGIBLE

    def set_job_eligibility(self, eligible: bool, cls: str, reason: str = "") -> None:
        self.job[cls] = eligible
        if reason:
            self.job_reasons[cls] = reason

    def tg_status(self, tg: str, cls: str) -> int:
        if self.tg_escaped.get(tg, False):
            return ClassStatus.ESCAPED
        classes = self.task_groups.get(tg)
        if classes is None:
            return ClassStatus.UNKNOWN
        ok = classes.get(cls)
        if ok is None:
            return ClassStatus.UNKNOWN
        return ClassStatus.ELIGIBLE if ok else ClassStatus.INELIGIBLE

    def set_tg_eligibility(self, eligible: bool, tg: str, cls: str, reason: str = "") -> None:
        self.task_groups.setdefault(tg, {})[cls] = eligible
        if reason:
            self.tg_reasons[(tg, cls)] = reason

    def quota_limit_reached(self) -> str:
        """Name of the quota that blocked placement ("" — no quotas here)."""
        return self.quota_reached


_Fingerprint = tuple[int, str, int, str, int, str]


class EvalContext:
    """Shared state of one eval's placement work (see module docstring)."""

    def __init__(
        self,
        snapshot: StateSnapshot,
        plan: pb.Plan,
        log: logging.Logger | None = None,
        inflight: InFlightPlacements | None = None,
    ) -> None:
        self.snapshot = snapshot
        self.plan = plan
        self.log = log or _LOG
        #: what the worker's other loops claimed and this snapshot lacks
        #: (feasible/inflight.py); None outside a worker: Nomad's view
        self.inflight = inflight
        self._foreign: dict[str, tuple[int, Claim | None]] = {}
        self._metrics = pb.AllocMetric()
        # per-node counts of the current select, kept in plain ints and
        # dicts and written into the protobuf metric when it is read (a
        # protobuf map increment per visited node cost more than the rest
        # of the visit): nodes evaluated; (class, constraint) filtered;
        # (class, dimension) exhausted
        self.visits = 0  # nodes evaluated, not yet in the metric
        self._filtered: dict[tuple[str, str], int] = {}
        self._exhausted: dict[tuple[str, str], int] = {}
        self.eligibility = EvalEligibility()
        #: regexp patterns and version constraints parsed for this eval
        self.match_cache = MatchCache()
        self._base: dict[str, list[pb.Allocation]] = {}
        self._proposed: dict[str, tuple[_Fingerprint, list[pb.Allocation]]] = {}
        self._computed_class: dict[str, str] = {}
        self._scores: dict[str, float] = {}
        self._top: list[tuple[float, int, str, dict[str, float]]] = []
        self._seq = 0
        #: the plan-edit journal (`track_plan_edits`): node ids whose plan
        #: entries changed, in order; None while edits are not tracked
        self.journal: list[str] | None = None
        #: bumped when tracking starts or everything is invalidated: a
        #: reader that saw another epoch recounts the whole plan
        self.journal_epoch = 0

    # ------------------------------------------------------------ metrics

    @property
    def metrics(self) -> pb.AllocMetric:
        """The current placement attempt's metric, with every count so far."""
        if self.visits or self._filtered or self._exhausted:
            self._flush_counts()
        return self._metrics

    @metrics.setter
    def metrics(self, value: pb.AllocMetric) -> None:
        self.visits = 0
        self._filtered = {}
        self._exhausted = {}
        self._metrics = value

    def _flush_counts(self) -> None:
        m = self._metrics
        m.nodes_evaluated += self.visits
        self.visits = 0
        if self._filtered:
            for (cls, constraint), n in self._filtered.items():
                m.nodes_filtered += n
                if cls:
                    m.class_filtered[cls] += n
                if constraint:
                    m.constraint_filtered[constraint] += n
            self._filtered = {}
        if self._exhausted:
            for (cls, dim), n in self._exhausted.items():
                m.nodes_exhausted += n
                if cls:
                    m.class_exhausted[cls] += n
                if dim:
                    m.dimension_exhausted[dim] += n
            self._exhausted = {}

    def reset(self) -> None:
        """Start the metrics of a new placement attempt."""
        self.metrics = pb.AllocMetric()
        self._scores = {}
        self._top = []

    def evaluate_node(self) -> None:
        self.visits += 1

    def filter_node(self, node: pb.Node, constraint: str) -> None:
        key = (node.node_class, constraint)
        f = self._filtered
        f[key] = f.get(key, 0) + 1

    def exhausted_node(self, node: pb.Node, dimension: str) -> None:
        key = (node.node_class, dimension)
        e = self._exhausted
        e[key] = e.get(key, 0) + 1

    def count_filtered(self, node_class: str, reason: str, n: int) -> None:
        """`filter_node` for `n` nodes of one node class at once."""
        key = (node_class, reason)
        f = self._filtered
        f[key] = f.get(key, 0) + n

    def count_exhausted(self, node_class: str, dimension: str, n: int) -> None:
        """`exhausted_node` for `n` nodes of one node class at once."""
        key = (node_class, dimension)
        e = self._exhausted
        e[key] = e.get(key, 0) + n

    def score_node(self, node: pb.Node, name: str, score: float) -> None:
        """Record one scorer's value; the normalized score closes the node's
        entry and competes for the top-5 kept in the metric."""
        if name != NORM_SCORER_NAME:
            self._scores[name] = score
            return
        self._seq += 1
        item = (score, -self._seq, node.id, self._scores)
        self._scores = {}
        if len(self._top) < MAX_RETAINED_NODE_SCORES:
            heapq.heappush(self._top, item)
        elif item > self._top[0]:
            heapq.heapreplace(self._top, item)

    def keeps_score(self, final: float) -> bool:
        """Would a node scoring `final` now enter the retained top scores?
        (A later node never wins a tie, so only a higher score enters a
        full set.) Lets the ranker skip building the metric's score map for
        the nodes that would be dropped at once."""
        top = self._top
        return len(top) < MAX_RETAINED_NODE_SCORES or final > top[0][0]

    def record_node_scores(self, node_id: str, scores: dict[str, float], final: float) -> None:
        """All of a node's scorer values and its normalized score at once
        (the fast path of `score_node`)."""
        self._seq += 1
        item = (final, -self._seq, node_id, scores)
        top = self._top
        if len(top) < MAX_RETAINED_NODE_SCORES:
            heapq.heappush(top, item)
        elif item > top[0]:
            heapq.heapreplace(top, item)

    def discard_scores(self) -> None:
        """Forget scores gathered for a node that was then rejected."""
        self._scores = {}

    def retained_scores(self) -> list[tuple[float, str, dict[str, float]]]:
        """The retained top scores, best first: (score, node id, scorers)."""
        return [(s, node_id, scores) for s, _, node_id, scores in sorted(self._top, reverse=True)]

    def populate_score_meta_data(self) -> None:
        """Move the retained top scores into the metric, best first."""
        del self.metrics.score_meta_data[:]
        for score, _, node_id, scores in sorted(self._top, reverse=True):
            self.metrics.score_meta_data.add(node_id=node_id, scores=scores, norm_score=score)

    # ------------------------------------------------------------ nodes

    def computed_class(self, node: pb.Node) -> str:
        if node.computed_class:
            return node.computed_class
        cls = self._computed_class.get(node.id)
        if cls is None:
            cls = structs.computed_class(node)
            self._computed_class[node.id] = cls
        return cls

    # ------------------------------------------------------------ proposed allocs

    def existing_allocs(self, node_id: str) -> list[pb.Allocation]:
        """Non-terminal allocs on the node in the snapshot (cached: the
        snapshot never changes)."""
        base = self._base.get(node_id)
        if base is None:
            base = self._base[node_id] = live_allocs(self.snapshot, node_id)
        return base

    def _fingerprint(self, node_id: str) -> _Fingerprint:
        plan = self.plan
        nu = np_ = na = 0
        lu = lp = la = ""
        upd = plan.node_update.get(node_id)
        if upd is not None and (nu := len(upd.stops)):
            lu = upd.stops[nu - 1].alloc_id
        pre = plan.node_preemptions.get(node_id)
        if pre is not None and (np_ := len(pre.stops)):
            lp = pre.stops[np_ - 1].alloc_id
        alc = plan.node_allocation.get(node_id)
        if alc is not None and (na := len(alc.allocs)):
            la = alc.allocs[na - 1].id
        return (nu, lu, np_, lp, na, la)

    def proposed_allocs(self, node_id: str) -> list[pb.Allocation]:
        """What the node would run if the plan were applied (the commit
        rule's `proposed_allocs`, the planner checks fit on the same).

        Cached per node; the cache entry is reused while the plan's lists for
        the node keep the same length and last element. Call
        `invalidate(node_id)` after editing a plan entry in place."""
        fp = self._fingerprint(node_id)
        hit = self._proposed.get(node_id)
        if hit is not None and hit[0] == fp:
            return hit[1]
        base = self.existing_allocs(node_id)
        nu, _, np_, _, na, _ = fp
        out = proposed_allocs(base, self.plan, node_id) if nu or np_ or na else base
        self._proposed[node_id] = (fp, out)
        return out

    def foreign_usage(self, node_id: str) -> Claim | None:
        """What the worker's other loops claimed on the node and this
        snapshot lacks (cpu MHz, cores, memory, disk, allocs), or None;
        re-read only when the node's claims changed."""
        inflight = self.inflight
        if inflight is None:
            return None
        version = inflight.versions.get(node_id, 0)  # before the claims: see inflight.py
        hit = self._foreign.get(node_id)
        if hit is not None and hit[0] == version:
            return hit[1]
        usage = inflight.foreign(node_id, self.plan.eval_id, self.snapshot.index)
        self._foreign[node_id] = (version, usage)
        return usage

    def claims_seen(self, node_id: str) -> int:
        """The version of the node's claims its last `foreign_usage` read."""
        hit = self._foreign.get(node_id)
        return hit[0] if hit is not None else 0

    def track_plan_edits(self) -> None:
        """From now on every edit of the plan's entries for a node is
        reported with `invalidate(node_id)` (the placement loop's edits:
        `Placer.new_alloc`, the stops of replaced allocs and their undo).

        Readers that keep counts over the plan (`PropertySet`, the stack's
        `ClassIndex`) then recount only the journaled nodes before a select
        instead of walking every plan entry (a walk per select made a
        1,200-alloc eval quadratic). Before tracking starts they walk the
        plan, so the reconcile phase's edits need no reporting."""
        self.journal = []
        self.journal_epoch += 1

    def journal_since(self, epoch: int, cursor: int) -> list[str] | None:
        """Node ids edited since a reader's (`epoch`, `cursor`), or None
        when the reader must recount the whole plan (not tracking, or
        another epoch)."""
        journal = self.journal
        if journal is None or epoch != self.journal_epoch:
            return None
        return journal[cursor:]

    def invalidate(self, node_id: str | None = None) -> None:
        """Drop cached proposed allocs (of one node, or all), and journal
        the edit for the plan's readers (`track_plan_edits`)."""
        if node_id is None:
            self._proposed.clear()
            if self.journal is not None:
                self.journal_epoch += 1
                self.journal = []
        else:
            self._proposed.pop(node_id, None)
            if self.journal is not None:
                self.journal.append(node_id)

    def plan_preempted_ids(self) -> set[str]:
        out: set[str] = set()
        for lst in self.plan.node_preemptions.values():
            out.update(s.alloc_id for s in lst.stops)
        return out
