"""Stacks and the eval context (Nomad's stack_test.go, select_test.go,
context_test.go): visit limits, low-score skipping, resuming iteration,
deterministic shuffles, preferred nodes, metrics, the system stack, and
proposed allocs."""

from __future__ import annotations

from collections.abc import Sequence

from corral.domain import structs
from corral.domain.store import StateStore
from corral.domain.structs import ClientStatus, DesiredStatus
from corral.testing import mock
from corral.v1 import structs_pb2 as pb
from services.worker.scheduler.feasible.context import EvalContext
from services.worker.scheduler.feasible.stack import (
    GenericStack,
    RankedNode,
    SelectOptions,
    SystemStack,
    shuffle_seed,
)


def _ctx(
    nodes: Sequence[pb.Node],
    *,
    allocs: Sequence[pb.Allocation] = (),
    eval_id: str = "stack-eval",
    index: int = 50,
) -> EvalContext:
    snap = StateStore.build(index, nodes=nodes, allocs=allocs)
    return EvalContext(snap, pb.Plan(eval_id=eval_id))


def _stack(
    ctx: EvalContext, job: pb.Job, nodes: list[pb.Node], *, batch: bool = False
) -> GenericStack:
    s = GenericStack(batch, ctx)
    s.set_job(job)
    s.set_nodes(nodes)
    return s


def _place(ctx: EvalContext, job: pb.Job, opt: RankedNode, index: int) -> None:
    ctx.plan.node_allocation[opt.node.id].allocs.append(mock.alloc(job, opt.node, index=index))


# --------------------------------------------------------------------------- limits


def test_service_limit_is_log2_of_nodes_and_batch_is_two() -> None:
    nodes = [mock.node() for _ in range(100)]
    job = mock.job()
    ctx = _ctx(nodes)
    s = _stack(ctx, job, nodes)
    assert s.limit == 7
    assert s.select(job.task_groups[0]) is not None
    assert ctx.metrics.nodes_evaluated == 7  # every node feasible: exactly the limit
    assert len(ctx.metrics.score_meta_data) == 5

    ctx = _ctx(nodes)
    b = _stack(ctx, mock.batch_job(), nodes, batch=True)
    assert b.limit == 2
    assert _stack(_ctx(nodes[:1]), job, nodes[:1]).limit == 2


def test_infeasible_nodes_do_not_count_toward_the_limit() -> None:
    bad = [mock.node(attributes={"kernel.name": "windows"}) for _ in range(5)]
    good = [mock.node() for _ in range(5)]
    nodes = bad + good
    job = mock.job()
    ctx = _ctx(nodes)
    s = _stack(ctx, job, nodes)
    assert s.limit == 4
    s.source.set_nodes(nodes)  # the infeasible nodes first
    assert s.select(job.task_groups[0]) is not None
    m = ctx.metrics
    assert (m.nodes_evaluated, m.nodes_filtered) == (9, 5)
    # the four skipped by their class's memo count under the constraint too
    assert m.constraint_filtered["${attr.kernel.name} = linux"] == 5
    assert "computed class ineligible" not in m.constraint_filtered


def test_affinity_or_spread_raises_limit() -> None:
    nodes = [mock.node() for _ in range(150)]
    job = mock.job(count=3)
    job.affinities.add(l_target="${node.datacenter}", r_target="dc1", operand="=", weight=50)
    ctx = _ctx(nodes)
    s = _stack(ctx, job, nodes)
    s.select(job.task_groups[0])
    assert ctx.metrics.nodes_evaluated == 100

    job = mock.job(count=120)
    job.task_groups[0].spreads.add(attribute="${node.datacenter}", weight=50)
    ctx = _ctx(nodes)
    s = _stack(ctx, job, nodes)
    s.select(job.task_groups[0])
    assert ctx.metrics.nodes_evaluated == 120


def test_low_scoring_nodes_are_skipped_for_better_ones() -> None:
    penalized = [mock.node() for _ in range(3)]
    good = [mock.node() for _ in range(3)]
    nodes = penalized + good
    job = mock.job()
    ctx = _ctx(nodes)
    s = GenericStack(True, ctx)  # batch: limit 2
    s.set_job(job)
    s.set_nodes(nodes)
    s.source.set_nodes(nodes)  # keep the penalized nodes first
    opts = SelectOptions(penalty_node_ids={n.id for n in penalized})
    opt = s.select(job.task_groups[0], opts)
    assert opt is not None and opt.node.id in {n.id for n in good}
    assert ctx.metrics.nodes_evaluated == 5  # 3 skipped + the 2 of the limit


def test_skipped_nodes_are_used_when_nothing_better_exists() -> None:
    nodes = [mock.node() for _ in range(2)]
    job = mock.job()
    ctx = _ctx(nodes)
    s = _stack(ctx, job, nodes, batch=True)
    opt = s.select(job.task_groups[0], SelectOptions(penalty_node_ids={n.id for n in nodes}))
    assert opt is not None and opt.final_score < 0


# --------------------------------------------------------------------------- iteration


def test_shuffle_is_deterministic_per_eval_and_index() -> None:
    nodes = [mock.node() for _ in range(30)]
    job = mock.job()
    order1 = _stack(_ctx(nodes), job, nodes).source.nodes
    order2 = _stack(_ctx(nodes), job, nodes).source.nodes
    order3 = _stack(_ctx(nodes, eval_id="other"), job, nodes).source.nodes
    assert [n.id for n in order1] == [n.id for n in order2]
    assert [n.id for n in order1] != [n.id for n in order3]
    assert sorted(n.id for n in order1) == sorted(n.id for n in nodes)
    assert shuffle_seed("a", 1) != shuffle_seed("a", 2)


def test_set_nodes_reuses_shuffle_only_for_the_same_list() -> None:
    nodes = [mock.node() for _ in range(20)]
    job = mock.job()
    s = _stack(_ctx(nodes), job, nodes)
    first = s.source.nodes
    s.set_nodes([nodes[0]])
    s.set_nodes(nodes)
    assert s.source.nodes is first and s.source.offset == 0
    other = [mock.node() for _ in range(20)]
    s.set_nodes(other)
    assert {n.id for n in s.source.nodes} == {n.id for n in other}


def test_successive_selects_resume_where_the_last_stopped() -> None:
    nodes = [mock.node(cpu=100000, memory_mb=100000) for _ in range(8)]
    job = mock.batch_job(count=8)
    ctx = _ctx(nodes)
    s = _stack(ctx, job, nodes, batch=True)
    tg = job.task_groups[0]
    seen: set[str] = set()
    for i in range(4):
        opt = s.select(tg)
        assert opt is not None
        seen.update(m.node_id for m in ctx.metrics.score_meta_data)
        _place(ctx, job, opt, i)
    assert len(seen) == 8  # 4 selects x 2 nodes each, no node visited twice


def test_preferred_nodes_tried_first_then_all() -> None:
    nodes = [mock.node() for _ in range(10)]
    job = mock.job()
    preferred = mock.node()
    ctx = _ctx([*nodes, preferred])
    s = _stack(ctx, job, nodes)
    opt = s.select(job.task_groups[0], SelectOptions(preferred_nodes=[preferred]))
    assert opt is not None and opt.node.id == preferred.id
    assert s.source.nodes is not None and len(s.source.nodes) == 10  # restored

    full = mock.node(cpu=100, memory_mb=100)
    opt = s.select(job.task_groups[0], SelectOptions(preferred_nodes=[full]))
    assert opt is not None and opt.node.id in {n.id for n in nodes}


def test_nothing_fits_returns_none_with_metrics() -> None:
    nodes = [mock.node(cpu=600) for _ in range(3)]
    job = mock.job(cpu=1000)
    ctx = _ctx(nodes)
    s = _stack(ctx, job, nodes)
    assert s.select(job.task_groups[0]) is None
    m = ctx.metrics
    assert m.nodes_evaluated == 3 and m.nodes_exhausted == 3
    assert m.dimension_exhausted["cpu"] == 3
    assert m.allocation_time > 0


def test_driver_filter_and_binpack_overflow() -> None:
    no_driver = mock.node()
    del no_driver.drivers["mock"]
    del no_driver.attributes["driver.mock"]
    no_driver.computed_class = structs.computed_class(no_driver)
    small = mock.node(cpu=500)
    roomy = mock.node()
    nodes = [no_driver, small, roomy]
    job = mock.job(cpu=1000)
    ctx = _ctx(nodes)
    s = _stack(ctx, job, nodes)
    opt = s.select(job.task_groups[0])
    assert opt is not None and opt.node.id == roomy.id
    m = ctx.metrics
    assert m.constraint_filtered["missing drivers"] == 1
    assert m.dimension_exhausted["cpu"] == 1


def test_metrics_reset_per_select() -> None:
    nodes = [mock.node() for _ in range(4)]
    job = mock.job()
    ctx = _ctx(nodes)
    s = _stack(ctx, job, nodes)
    s.select(job.task_groups[0])
    first = ctx.metrics
    s.select(job.task_groups[0])
    assert ctx.metrics is not first
    assert ctx.metrics.nodes_evaluated == 2


def test_placements_spread_by_anti_affinity_and_fill_capacity() -> None:
    nodes = [mock.node(cpu=2100, memory_mb=4096) for _ in range(4)]
    job = mock.job(count=8, cpu=1000, memory_mb=256)
    ctx = _ctx(nodes)
    s = _stack(ctx, job, nodes)
    tg = job.task_groups[0]
    for i in range(8):
        opt = s.select(tg)
        assert opt is not None, i
        _place(ctx, job, opt, i)
    counts = sorted(len(v.allocs) for v in ctx.plan.node_allocation.values())
    assert counts == [2, 2, 2, 2]
    assert s.select(tg) is None  # 2000 of 2000 MHz used everywhere


def test_select_returns_resources_ready_for_the_alloc() -> None:
    n = mock.node()
    job = mock.job(cpu=300, memory_mb=200)
    job.task_groups[0].networks.add(dynamic_ports=[pb.Port(label="http")])
    ctx = _ctx([n])
    opt = _stack(ctx, job, [n]).select(job.task_groups[0])
    assert opt is not None
    res = opt.alloc_resources
    assert (res.cpu, res.memory_mb) == (300, 200)
    assert len(res.networks) == 1 and res.networks[0].dynamic_ports[0].value >= 20000
    assert opt.task_resources["web"].cpu == 300


# --------------------------------------------------------------------------- system stack


def test_system_stack_takes_first_feasible_node_in_order() -> None:
    bad = mock.node(attributes={"kernel.name": "windows"})
    good1, good2 = mock.node(), mock.node()
    job = mock.system_job()
    ctx = _ctx([bad, good1, good2])
    s = SystemStack(False, ctx)
    s.set_job(job)
    s.set_nodes([bad, good1, good2])
    opt = s.select(job.task_groups[0])
    assert opt is not None and opt.node.id == good1.id
    assert ctx.metrics.nodes_evaluated == 2 and ctx.metrics.nodes_filtered == 1
    assert set(opt.scores) == {"binpack"}


def test_system_stack_single_node_filtered_vs_exhausted() -> None:
    job = mock.system_job(cpu=10000)
    small = mock.node()
    ctx = _ctx([small])
    s = SystemStack(False, ctx)
    s.set_job(job)
    s.set_nodes([small])
    assert s.select(job.task_groups[0]) is None
    assert ctx.metrics.nodes_exhausted == 1 and ctx.metrics.nodes_filtered == 0


# --------------------------------------------------------------------------- context


def test_proposed_allocs() -> None:
    n = mock.node()
    job = mock.job()
    running = mock.alloc(job, n)
    stopping = mock.alloc(job, n, index=1)
    updated = mock.alloc(job, n, index=2)
    done = mock.alloc(job, n, index=3, client_status=ClientStatus.COMPLETE)
    server_stopped = mock.alloc(job, n, index=4, desired_status=DesiredStatus.STOP)
    preempted = mock.alloc(mock.job(), n)
    ctx = _ctx([n], allocs=[running, stopping, updated, done, server_stopped, preempted])
    ids = {a.id for a in ctx.proposed_allocs(n.id)}
    assert ids == {running.id, stopping.id, updated.id, preempted.id}

    plan = ctx.plan
    plan.node_update[n.id].stops.add(alloc_id=stopping.id)
    plan.node_preemptions[n.id].stops.add(alloc_id=preempted.id)
    new_version = structs.copy_msg(updated)
    new_version.job_version = 7
    plan.node_allocation[n.id].allocs.append(new_version)
    fresh = mock.alloc(job, n, index=5)
    plan.node_allocation[n.id].allocs.append(fresh)
    proposed = ctx.proposed_allocs(n.id)
    assert {a.id for a in proposed} == {running.id, updated.id, fresh.id}
    assert [a.job_version for a in proposed if a.id == updated.id] == [7]
    assert ctx.proposed_allocs(n.id) is proposed  # cached while the plan is unchanged
    assert ctx.proposed_allocs("no-such-node") == []


def test_proposed_allocs_cache_follows_plan_changes() -> None:
    n = mock.node()
    job = mock.job()
    a = mock.alloc(job, n)
    ctx = _ctx([n], allocs=[a])
    assert len(ctx.proposed_allocs(n.id)) == 1
    ctx.plan.node_update[n.id].stops.add(alloc_id=a.id)
    assert ctx.proposed_allocs(n.id) == []
    del ctx.plan.node_update[n.id]
    assert len(ctx.proposed_allocs(n.id)) == 1
