"""Selection stacks: the schedulers' one entry point for "where should this
alloc go?" (Nomad's `scheduler/feasible/stack.go` and `select.go`).

`GenericStack` (service, batch) walks a deterministically shuffled node list
from where the previous select stopped, filters by feasibility, ranks the
feasible nodes that fit and keeps the best of the first `limit` of them:

* limit: batch 2 (power of two choices); service max(2, ⌈log2 n⌉); when the
  group has affinities or spreads, max(100, count) so the scores mean
  something;
* up to 3 nodes scoring ≤ 0 are skipped and only used when nothing better
  turns up;
* preferred nodes (sticky or migrating ephemeral disk) are tried first;
* if nothing fits and preemption is enabled for the job's scheduler type,
  the select is retried allowing preemption (Nomad's generic scheduler does
  this retry itself).

`SystemStack` (system, sysbatch) takes the first feasible node that fits, in
the given order, with no limit and no shuffling; preemption follows the
scheduler configuration (system on by default).

Both fill `ctx.metrics` for the select: nodes evaluated/filtered/exhausted,
the top-5 node scores and the allocation time (ns).
"""

from __future__ import annotations

import hashlib
import math
import random
import time
from dataclasses import dataclass, field, replace

from corral.domain.structs import JobType
from corral.v1 import structs_pb2 as pb
from services.worker.scheduler.feasible import class_index
from services.worker.scheduler.feasible.checker import FeasibilityChecker
from services.worker.scheduler.feasible.context import EvalContext
from services.worker.scheduler.feasible.preemption import preemption_enabled
from services.worker.scheduler.feasible.rank import RankedNode, Ranker
from services.worker.scheduler.feasible.spread import SpreadScorer

__all__ = ["GenericStack", "RankedNode", "SelectOptions", "SystemStack"]

# the skip rule and the spread/affinity limit live with the class index,
# which computes the same walk
SKIP_SCORE_THRESHOLD = class_index.SKIP_SCORE_THRESHOLD
MAX_SKIP = class_index.MAX_SKIP
NODE_LIMIT_FOR_FEASIBILITY_CHECKS = class_index.NODE_LIMIT_FOR_FEASIBILITY_CHECKS


@dataclass
class SelectOptions:
    alloc_name: str = ""
    penalty_node_ids: set[str] = field(default_factory=set)  # reschedule penalty (score -1)
    preferred_nodes: list[pb.Node] = field(default_factory=list)  # sticky/migrate: try first
    preempt: bool = False


def shuffle_seed(eval_id: str, index: int) -> int:
    """Seed of the node shuffle: the eval id mixed with the snapshot index,
    so retries of one eval on one snapshot visit nodes in the same order."""
    h = int.from_bytes(hashlib.blake2b(eval_id.encode(), digest_size=8).digest(), "big")
    return h ^ index


class _NodeSource:
    """Candidate nodes visited round-robin from where the last select
    stopped; each select sees every node at most once (Nomad's
    StaticIterator)."""

    __slots__ = ("nodes", "offset", "seen")

    def __init__(self) -> None:
        self.nodes: list[pb.Node] = []
        self.offset = 0
        self.seen = 0

    def set_nodes(self, nodes: list[pb.Node]) -> None:
        self.nodes = nodes
        self.offset = 0
        self.seen = 0

    def reset(self) -> None:
        self.seen = 0


class _BaseStack:
    def __init__(self, ctx: EvalContext, *, generic: bool) -> None:
        self.ctx = ctx
        seed = shuffle_seed(ctx.plan.eval_id, ctx.snapshot.index)
        self.seed = seed
        self.port_rng = random.Random(seed + 1)
        self.source = _NodeSource()
        self.checker = FeasibilityChecker(ctx, distinct_hosts=generic)
        self.spread = SpreadScorer(ctx) if generic else None
        self.ranker = Ranker(ctx, self.port_rng, spread=self.spread, generic=generic)
        self.job: pb.Job | None = None
        self._job_key: tuple[str, str, int, int] | None = None
        self.preempt_enabled = False

    def set_job(self, job: pb.Job) -> None:
        key = (job.namespace, job.id, job.version, job.job_modify_index)
        if key == self._job_key:
            return
        self._job_key = key
        self.job = job
        self.checker.set_job(job)
        self.ranker.set_job(job)
        if self.spread is not None:
            self.spread.set_job(job)
        self.preempt_enabled = preemption_enabled(
            self.ctx.snapshot.scheduler_config, job.type or JobType.SERVICE
        )

    def _next_ranked(self) -> RankedNode | None:
        """The next feasible node that fits, ranked; None when every node
        was seen in this select."""
        src = self.source
        nodes = src.nodes
        n = len(nodes)
        ctx = self.ctx
        checker = self.checker
        ranker = self.ranker
        # a node of a class already known to fail is filtered, and one of a
        # class known to pass needs no other check when the group has no
        # distinct_* constraints: `checker.feasible` inlined for both
        memo = checker.class_memo
        plain = checker.plain
        while src.seen < n:
            node = nodes[src.offset]
            src.offset = src.offset + 1 if src.offset + 1 < n else 0
            src.seen += 1
            ctx.visits += 1  # ctx.evaluate_node(), inlined
            reason = memo.get(node.computed_class or ctx.computed_class(node))
            if reason:
                ctx.filter_node(node, reason)
                continue
            if (reason is None or not plain) and not checker.feasible(node):
                continue
            option = ranker.rank(node)
            if option is not None:
                return option
        return None

    def _prepare(self, tg: pb.TaskGroup, options: SelectOptions, evict: bool) -> None:
        assert self.job is not None, "set_job before select"
        self.ctx.reset()
        self.source.reset()
        self.checker.set_task_group(tg, options.alloc_name)
        if self.spread is not None:
            self.spread.set_task_group(tg)
        self.ranker.set_task_group(tg, evict=evict, penalty_node_ids=options.penalty_node_ids)

    def _finish(self, option: RankedNode | None, start: int) -> RankedNode | None:
        self.ctx.populate_score_meta_data()
        if option is not None:
            self.ranker.finalize(option)
        self.ctx.metrics.allocation_time = time.perf_counter_ns() - start
        return option


class GenericStack(_BaseStack):
    """Placement for service and batch jobs (see module docstring)."""

    def __init__(self, batch: bool, ctx: EvalContext) -> None:
        super().__init__(ctx, generic=True)
        assert self.spread is not None
        self.index = class_index.ClassIndex(ctx, self.checker, self.ranker, self.spread)
        self._visits = 0  # nodes the last select visited
        #: selects the placement loop still expects (`expect_selects`)
        self._remaining = 0
        #: the class index answered a select of this placement loop: its
        #: fixed cost is paid, the next long selects only re-read edited nodes
        self._indexed = False
        self.batch = batch
        self.limit = 2
        self._shuffled_input: list[pb.Node] | None = None
        self._shuffled_key: tuple[int, str, str] = (0, "", "")
        self._shuffled: list[pb.Node] = []

    def set_nodes(self, nodes: list[pb.Node]) -> None:
        """Shuffle (deterministically) and use `nodes` as the candidates.
        Setting the same list object again reuses its shuffle (so switching
        to one node and back, as in-place update checks do, is cheap)."""
        if len(nodes) <= 1:
            # a single node (in-place update checks, system placements)
            # needs no shuffle and keeps the cached shuffle of the full list
            self.source.set_nodes(list(nodes))
            self.limit = 2
            return
        key = (len(nodes), nodes[0].id, nodes[-1].id)
        if nodes is not self._shuffled_input or key != self._shuffled_key:
            shuffled = list(nodes)
            random.Random(self.seed).shuffle(shuffled)
            self._shuffled = shuffled
            self._shuffled_input = nodes  # held so its identity stays unique
            self._shuffled_key = key
        self.source.set_nodes(self._shuffled)
        limit = 2
        n = len(nodes)
        if not self.batch and n > 0:
            limit = max(limit, math.ceil(math.log2(n)))
        self.limit = limit

    def select(self, tg: pb.TaskGroup, options: SelectOptions | None = None) -> RankedNode | None:
        opts = options or SelectOptions()
        if opts.preferred_nodes:
            saved = (self.source.nodes, self.source.offset)
            self.source.set_nodes(list(opts.preferred_nodes))
            try:
                option = self.select(tg, replace(opts, preferred_nodes=[]))
            finally:
                self.source.nodes, self.source.offset = saved
            if option is not None:
                return option
            opts = replace(opts, preferred_nodes=[])
        option = self._select(tg, opts)
        if option is None and not opts.preempt and self.preempt_enabled:
            option = self._select(tg, replace(opts, preempt=True))
        return option

    def expect_selects(self, selects: int) -> None:
        """The placement loop about to start makes about `selects` selects."""
        self._remaining = selects
        self._indexed = False

    def _index_pays(self, limit: int, n: int) -> bool:
        """Whether this select should go to the class index. The index
        reads every node's usage once per placement loop (its fixed cost,
        about one walk over all `n` nodes, more with in-flight claims
        re-read), then each select costs only the nodes edited since; a
        walk costs the nodes it visits. So the index answers when the walks
        left in the loop would visit at least every node once: spreads or
        affinities (the limit is the group's count) over many placements,
        or long walks (few nodes feasible or fitting) over enough of them.
        A loop of a few placements walks even when each walk is long: in a
        nearly full 5,000-node cluster, building the index for the handful
        of replacements of a node-down eval tripled W4's replacement times
        (issue 30)."""
        if n < class_index.MIN_NODES:
            return False
        per_select = max(limit, self._visits)
        if per_select < class_index.MIN_VISITS:
            return False  # a short walk (binpack's ⌈log2 n⌉) costs less than a select
        return self._indexed or per_select * max(self._remaining, 1) >= n

    def set_job(self, job: pb.Job) -> None:
        key = self._job_key
        super().set_job(job)
        if self._job_key != key:
            self.index.reset()

    def _select(self, tg: pb.TaskGroup, opts: SelectOptions) -> RankedNode | None:
        start = time.perf_counter_ns()
        self._prepare(tg, opts, opts.preempt)
        limit = self.limit
        if self.ranker.has_affinities() or (self.spread is not None and self.spread.has_spreads()):
            limit = max(tg.count, NODE_LIMIT_FOR_FEASIBILITY_CHECKS)
        src = self.source
        n = len(src.nodes)
        pays = self._index_pays(limit, n)
        self._remaining = max(self._remaining - 1, 0)
        if pays and self.index.usable():
            offset = src.offset
            lowest = self.spread.lowest_boost if self.spread is not None else 0.0
            found = self.index.select(tg, src.nodes, offset, limit)
            if found is not None:
                option, visited = found
                self._indexed = True
                src.offset = (offset + visited) % n
                src.seen = self._visits = visited
                if class_index.VERIFY:
                    self._verify(option, offset, lowest, limit)
                return self._finish(option, start)
        option = self._walk(limit)
        self._visits = src.seen
        return self._finish(option, start)

    def _walk(self, limit: int) -> RankedNode | None:
        """The select node by node: the best of the first `limit` ranked."""
        skipped: list[RankedNode] = []
        skip_used = 0
        taken = 0
        best: RankedNode | None = None
        while taken < limit:
            option = self._next_ranked()
            while (
                option is not None
                and option.final_score <= SKIP_SCORE_THRESHOLD
                and len(skipped) < MAX_SKIP
            ):
                skipped.append(option)
                option = self._next_ranked()
            if option is None:
                if skip_used >= len(skipped):
                    break
                option = skipped[skip_used]
                skip_used += 1
            taken += 1
            if best is None or option.final_score > best.final_score:
                best = option
        return best

    def _verify(self, option: RankedNode | None, offset: int, lowest: float, limit: int) -> None:
        """Replay a class-level select with the node walk; fail on any
        difference in the choice, its score, the metric or the next start
        (`class_index.VERIFY`, for the tests)."""
        ctx = self.ctx
        src = self.source
        spread = self.spread
        got = (_outcome(option), _metric_counts(ctx), src.offset, spread and spread.lowest_boost)
        src.offset = offset
        if spread is not None:
            spread.lowest_boost = lowest
        ctx.reset()
        src.reset()
        walked = self._walk(limit)
        want = (_outcome(walked), _metric_counts(ctx), src.offset, spread and spread.lowest_boost)
        if got != want:
            raise AssertionError(f"class-level select differs from the walk: {got} != {want}")


def _outcome(option: RankedNode | None) -> tuple[str, float, dict[str, float]] | None:
    if option is None:
        return None
    return option.node.id, option.final_score, dict(option.scores)


def _metric_counts(ctx: EvalContext) -> tuple[object, ...]:
    """The select's metric so far: counts by class, reason and dimension,
    and the retained top scores."""
    m = ctx.metrics
    return (
        m.nodes_evaluated,
        m.nodes_filtered,
        m.nodes_exhausted,
        dict(m.class_filtered),
        dict(m.constraint_filtered),
        dict(m.class_exhausted),
        dict(m.dimension_exhausted),
        ctx.retained_scores(),
    )


class SystemStack(_BaseStack):
    """Placement for system and sysbatch jobs: the first feasible node that
    fits, trying nodes in the order given."""

    def __init__(self, sysbatch: bool, ctx: EvalContext) -> None:
        super().__init__(ctx, generic=False)
        self.sysbatch = sysbatch

    def set_nodes(self, nodes: list[pb.Node]) -> None:
        self.source.set_nodes(nodes)

    def set_job(self, job: pb.Job) -> None:
        super().set_job(job)
        self.preempt_enabled = preemption_enabled(
            self.ctx.snapshot.scheduler_config,
            JobType.SYSBATCH if self.sysbatch else JobType.SYSTEM,
        )

    def select(self, tg: pb.TaskGroup, options: SelectOptions | None = None) -> RankedNode | None:
        opts = options or SelectOptions()
        start = time.perf_counter_ns()
        self._prepare(tg, opts, opts.preempt or self.preempt_enabled)
        return self._finish(self._next_ranked(), start)
