"""Class-level scoring (feasible/class_index.py, issue 30): selects computed
per class of identical nodes place, score and count exactly as the node
walk, with the plan followed by journal instead of walked per select.

The package's conftest replays every indexed select with the walk
(`class_index.VERIFY`); these tests add whole evals compared against the
old path (no journal, no index), so the journal's incremental counts are
checked too, and the worker's in-flight claims between two selects."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator

import pytest

from corral.domain.store import StateStore
from corral.domain.structs import ClientStatus, JobType
from corral.testing import mock
from corral.testing.harness import Harness
from corral.v1 import structs_pb2 as pb
from services.worker.scheduler.feasible import class_index
from services.worker.scheduler.feasible.context import EvalContext
from services.worker.scheduler.feasible.inflight import InFlightPlacements
from services.worker.scheduler.feasible.property_set import PropertySet
from services.worker.scheduler.feasible.stack import GenericStack
from services.worker.scheduler.placement import Placer

EVAL_ID = "00000000-0000-4000-8000-0000000c1a55"


@pytest.fixture
def indexed(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """Counts the selects the index answered (the rest walked)."""
    answered = [0]
    select = class_index.ClassIndex.select

    def counting(self: class_index.ClassIndex, *args: object) -> object:
        found = select(self, *args)  # type: ignore[arg-type]
        if found is not None:
            answered[0] += 1
        return found

    monkeypatch.setattr(class_index.ClassIndex, "select", counting)
    yield answered


def _cluster(n: int = 60) -> list[pb.Node]:
    """Nodes of several sizes, datacenters, racks and classes; every fifth
    has room for one dynamic port only."""
    nodes = []
    for i in range(n):
        node = mock.node(
            node_id=f"00000000-0000-4000-8000-{i:012d}",
            datacenter=("dc1", "dc2", "dc3")[i % 3],
            node_class=("small", "large")[i % 2],
            cpu=(4000, 8000)[i % 2],
            memory_mb=(8192, 16384)[i % 2],
            meta={"rack": f"r{i % 7}"},
        )
        if i % 5 == 0:
            node.node_resources.min_dynamic_port = 21000
            node.node_resources.max_dynamic_port = 21000
        nodes.append(node)
    return nodes


def _run(h: Harness, job: pb.Job) -> str:
    """Schedule `job` once (fixed eval id: fixed node order); a digest of
    every placement's node, metric counts and top scores, keyed by name."""
    ev = mock.eval_for(h.job(job.namespace, job.id))
    ev.id = EVAL_ID
    h.upsert_evals(ev)
    before = len(h.plans)
    h.process(JobType.SERVICE, ev)
    placed = [a for p in h.plans[before:] for lst in p.node_allocation.values() for a in lst.allocs]
    snap = h.store.snapshot()
    stopped = sorted(
        _name(snap.alloc_by_id(s.alloc_id)) for p in h.plans[before:] for s in _stops(p)
    )
    rows = sorted(
        (
            a.name,
            a.node_id,
            a.metrics.nodes_evaluated,
            a.metrics.nodes_filtered,
            a.metrics.nodes_exhausted,
            sorted(a.metrics.class_filtered.items()),
            sorted(a.metrics.dimension_exhausted.items()),
            [
                (s.node_id, s.norm_score, sorted(s.scores.items()))
                for s in a.metrics.score_meta_data
            ],
        )
        for a in placed
    )
    return json.dumps([rows, stopped])


def _name(a: pb.Allocation | None) -> str:
    return a.name if a is not None else ""


def _stops(plan: pb.Plan) -> list[pb.AllocStop]:
    return [s for lst in plan.node_update.values() for s in lst.stops]


def _old_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """The scheduler as before: no plan-edit journal, so no index and the
    property sets walk the plan before every select."""
    monkeypatch.setattr(Placer, "begin_placements", lambda self, selects: None)


def _even_spread(job: pb.Job) -> None:
    job.task_groups[0].spreads.add(attribute="${meta.rack}", weight=50)


def _targeted_spread(job: pb.Job) -> None:
    job.task_groups[0].spreads.add(
        attribute="${node.datacenter}",
        weight=70,
        spread_target=[
            pb.SpreadTarget(value="dc1", percent=60),
            pb.SpreadTarget(value="dc2", percent=30),
        ],
    )
    _even_spread(job)


def _affinity(job: pb.Job) -> None:
    job.affinities.add(l_target="${node.class}", r_target="large", operand="=", weight=60)
    job.task_groups[0].affinities.add(
        l_target="${attr.unique.hostname}", r_target="host-00000000", operand="=", weight=-30
    )
    _even_spread(job)


def _constrained(job: pb.Job) -> None:
    job.constraints.add(l_target="${meta.rack}", r_target="r0,r1,r2,r3", operand="set_contains_any")
    job.task_groups[0].constraints.add(l_target="${node.class}", r_target="small", operand="!=")


def _binpack_only(job: pb.Job) -> None:
    pass


def _distinct_hosts_job(job: pb.Job) -> None:
    job.constraints.add(operand="distinct_hosts", r_target="true")
    _even_spread(job)


def _distinct_hosts_group(job: pb.Job) -> None:
    job.task_groups[0].constraints.add(operand="distinct_hosts")
    job.task_groups[0].affinities.add(
        l_target="${meta.rack}", r_target="r3", operand="=", weight=40
    )


def _dynamic_ports(job: pb.Job) -> None:
    job.task_groups[0].networks.add(dynamic_ports=[pb.Port(label="http")])
    _even_spread(job)


SHAPES: dict[str, Callable[[pb.Job], None]] = {
    "binpack": _binpack_only,
    "even spread": _even_spread,
    "targeted spread": _targeted_spread,
    "affinities": _affinity,
    "constraints": _constrained,
    "dynamic ports": _dynamic_ports,
    "distinct hosts (job)": _distinct_hosts_job,
    "distinct hosts (group)": _distinct_hosts_group,
}


def _scenario(shape: str, *, count: int = 70) -> tuple[Harness, pb.Job]:
    h = Harness()
    nodes = _cluster()
    h.upsert_nodes(*nodes)
    job = mock.job(job_id=f"ci-{shape.replace(' ', '-')}", count=count, cpu=1500, memory_mb=2048)
    job.datacenters[:] = ["dc1", "dc2", "dc3"]
    SHAPES[shape](job)
    h.upsert_jobs(job)
    stored = h.job(job.namespace, job.id)
    # some allocs already run: job anti-affinity and spread counts start non-zero
    h.upsert_allocs(*(_alloc(stored, nodes[i], i) for i in range(0, 12, 3)))
    return h, stored


def _alloc(job: pb.Job, node: pb.Node, i: int) -> pb.Allocation:
    """An alloc with a fixed id (ids order the state's lists)."""
    a = mock.alloc(job, node, index=i)
    a.id = f"00000000-0000-4000-8000-a110c{i:07d}"
    return a


@pytest.mark.parametrize("shape", list(SHAPES))
def test_an_eval_places_as_the_node_walk_did(
    shape: str, indexed: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    h, job = _scenario(shape)
    new = _run(h, job)
    assert indexed[0] > 0
    with monkeypatch.context() as m:
        _old_path(m)
        h2, job2 = _scenario(shape)
        calls = indexed[0]
        old = _run(h2, job2)
        assert indexed[0] == calls  # the old path never asked the index
    assert new == old


def test_a_cluster_too_small_fails_the_rest_as_the_walk(
    indexed: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """More allocs than fit: the last selects find nothing, exhausting
    every node (and the skipped low scorers are used first)."""
    h, job = _scenario("even spread", count=400)
    new = _run(h, job)
    assert indexed[0] > 0
    with monkeypatch.context() as m:
        _old_path(m)
        h2, job2 = _scenario("even spread", count=400)
        old = _run(h2, job2)
    assert new == old
    assert h.evals[-1].failed_tg_allocs


def test_destructive_updates_stop_and_replace_as_the_walk(
    indexed: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A changed task replaces every alloc: each placement stops its
    predecessor in the plan first (journaled), then picks a node; failed
    allocs are rescheduled away from their node (penalty)."""

    def build() -> tuple[Harness, pb.Job]:
        h, job = _scenario("even spread", count=30)
        running = [
            a
            for a in h.store.snapshot().allocs_by_job(job.namespace, job.id)
            if a.client_status == ClientStatus.RUNNING
        ]
        running.sort(key=lambda a: a.id)
        node = h.store.snapshot().node_by_id(running[0].node_id)
        assert node is not None
        failed = _alloc(job, node, 20)
        failed.client_status = ClientStatus.FAILED
        h.upsert_allocs(failed)
        changed = pb.Job()
        changed.CopyFrom(job)
        changed.task_groups[0].tasks[0].env["VERSION"] = "2"
        h.upsert_jobs(changed)
        return h, h.job(job.namespace, job.id)

    h, job = build()
    new = _run(h, job)
    assert indexed[0] > 0
    with monkeypatch.context() as m:
        _old_path(m)
        h2, job2 = build()
        old = _run(h2, job2)
    assert new == old
    assert json.loads(new)[1]  # predecessors were stopped


def test_claims_of_other_loops_between_selects_are_seen() -> None:
    """The index re-reads a node another loop claimed on since the last
    select (VERIFY replays the select with the walk, which reads every
    node's claims afresh)."""
    nodes = _cluster(40)
    job = mock.job(count=20, cpu=1500, memory_mb=2048)
    job.datacenters[:] = ["dc1", "dc2", "dc3"]
    _even_spread(job)
    snap = StateStore.build(5, nodes=nodes, jobs=[job])
    inflight = InFlightPlacements()
    inflight.begin("other", 5)
    ctx = EvalContext(snap, pb.Plan(eval_id="mine"), inflight=inflight)
    ctx.track_plan_edits()
    stack = GenericStack(False, ctx)
    stack.set_job(job)
    stack.set_nodes(nodes)
    tg = job.task_groups[0]
    first = stack.select(tg)
    assert first is not None
    for node in nodes[:20]:  # fill half the cluster from another loop
        assert inflight.claim("other", node.id, None, (8000, 0, 16384, 0, 1))
    second = stack.select(tg)
    assert second is not None
    assert second.node.id not in {n.id for n in nodes[:20]}


def test_journaled_property_counts_match_a_fresh_count() -> None:
    """A property set refreshed by journal holds what one built from
    scratch on the same plan counts."""
    nodes = _cluster(30)
    job = mock.job(count=10)
    job.datacenters[:] = ["dc1", "dc2", "dc3"]
    snap = StateStore.build(5, nodes=nodes, jobs=[job])
    plan = pb.Plan(eval_id="e")
    ctx = EvalContext(snap, plan)
    ctx.track_plan_edits()
    ps = PropertySet(ctx, job, "${meta.rack}", task_group="web")
    for i in (0, 1, 1, 5, 8):
        a = mock.alloc(job, nodes[i], index=i)
        plan.node_allocation[nodes[i].id].allocs.append(a)
        ctx.invalidate(nodes[i].id)
    ps.populate_proposed()
    fresh = PropertySet(EvalContext(snap, plan), job, "${meta.rack}", task_group="web")
    assert ps.combined_use() == fresh.combined_use()
    assert ps.use_bounds() == fresh.use_bounds()
    del plan.node_allocation[nodes[1].id]
    ctx.invalidate(nodes[1].id)
    ps.populate_proposed()
    fresh = PropertySet(EvalContext(snap, plan), job, "${meta.rack}", task_group="web")
    assert ps.combined_use() == fresh.combined_use()


def test_a_placement_loop_too_short_to_pay_for_the_index_walks(indexed: list[int]) -> None:
    """The index reads every node once per placement loop: a loop whose
    walks would visit fewer nodes in all (a few replacements in a large
    cluster) walks instead; a long one (many spread placements) asks the
    index. Placements are the walk's either way (VERIFY)."""
    nodes = _cluster(500)

    def run(count: int) -> int:
        h = Harness()
        h.upsert_nodes(*nodes)
        job = mock.job(job_id=f"loop-{count}", count=count, cpu=100, memory_mb=64)
        job.datacenters[:] = ["dc1", "dc2", "dc3"]
        _even_spread(job)
        h.upsert_jobs(job)
        before = indexed[0]
        _run(h, h.job(job.namespace, job.id))
        return indexed[0] - before

    # a spread select visits up to 100 nodes: 2 placements visit 200 < 500
    assert run(2) == 0
    # 30 placements would visit 3,000: the index answers from the second on
    assert run(30) > 0
