"""Spread scoring (Nomad's spread_test.go): targets, implicit target,
even spread, missing attributes, plan-aware counts, and placements that
follow the requested percentages end to end."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import pytest

from corral.domain.store import StateStore
from corral.domain.structs import DesiredStatus
from corral.testing import mock
from corral.v1 import structs_pb2 as pb
from services.worker.scheduler.feasible.context import EvalContext
from services.worker.scheduler.feasible.spread import SpreadScorer, even_spread_boost
from services.worker.scheduler.feasible.stack import GenericStack, SelectOptions


def _ctx(
    nodes: Sequence[pb.Node], allocs: Sequence[pb.Allocation] = (), plan: pb.Plan | None = None
) -> EvalContext:
    snap = StateStore.build(7, nodes=nodes, allocs=allocs)
    return EvalContext(snap, plan or pb.Plan(eval_id="spread-eval"))


def _scorer(ctx: EvalContext, job: pb.Job) -> SpreadScorer:
    s = SpreadScorer(ctx)
    s.set_job(job)
    s.set_task_group(job.task_groups[0])
    return s


def _dc_job(count: int, targets: dict[str, int], weight: int = 100) -> pb.Job:
    job = mock.job(count=count, datacenters=("dc1", "dc2", "dc3"))
    job.task_groups[0].spreads.add(
        attribute="${node.datacenter}",
        weight=weight,
        spread_target=[pb.SpreadTarget(value=v, percent=p) for v, p in targets.items()],
    )
    return job


def test_targeted_spread_scores() -> None:
    dc1, dc2 = mock.node(datacenter="dc1"), mock.node(datacenter="dc2")
    job = _dc_job(10, {"dc1": 80, "dc2": 20})
    allocs = [mock.alloc(job, dc1, index=i) for i in range(2)]  # 2 of 8 desired in dc1
    ctx = _ctx([dc1, dc2], allocs)
    s = _scorer(ctx, job)
    assert s.has_spreads()
    # dc1: desired 8, used 2 (+1) -> (8-3)/8 ; dc2: desired 2, used 0 (+1) -> (2-1)/2
    assert s.score(dc1) == pytest.approx(5 / 8)
    assert s.score(dc2) == pytest.approx(0.5)


def test_implicit_target_takes_the_remainder() -> None:
    dc1, dc3 = mock.node(datacenter="dc1"), mock.node(datacenter="dc3")
    job = _dc_job(10, {"dc1": 50})
    ctx = _ctx([dc1, dc3])
    s = _scorer(ctx, job)
    # dc3 is not a target: it shares the implicit remainder of 5
    assert s.score(dc3) == pytest.approx((5 - 1) / 5)


def test_value_without_share_gets_lowest_boost() -> None:
    dc1, dc3 = mock.node(datacenter="dc1"), mock.node(datacenter="dc3")
    job = _dc_job(10, {"dc1": 100})
    ctx = _ctx([dc1, dc3])
    s = _scorer(ctx, job)
    assert s.score(dc3) == -1.0  # neither a target nor an implicit remainder


def test_zero_percent_target_gets_lowest_boost_seen() -> None:
    dc1, dc2 = mock.node(datacenter="dc1"), mock.node(datacenter="dc2")
    job = _dc_job(4, {"dc1": 100, "dc2": 0})
    ctx = _ctx([dc1, dc2])
    s = _scorer(ctx, job)
    assert s.score(dc2) == -1.0  # the floor before any lower boost was seen
    allocs = [mock.alloc(job, dc1, index=i) for i in range(10)]  # far over target
    ctx = _ctx([dc1, dc2], allocs)
    s = _scorer(ctx, job)
    low = s.score(dc1)
    assert low == pytest.approx((4 - 11) / 4)
    assert s.score(dc2) == pytest.approx(low)


def test_missing_attribute_scores_minus_one() -> None:
    n = mock.node(meta={})
    job = mock.job(count=3)
    job.task_groups[0].spreads.add(attribute="${meta.rack}", weight=50)
    s = _scorer(_ctx([n]), job)
    assert s.score(n) == -1.0


def test_weights_are_relative() -> None:
    n = mock.node(datacenter="dc1", meta={"rack": "r1"})
    job = _dc_job(10, {"dc1": 100}, weight=75)
    job.spreads.add(
        attribute="${meta.rack}",
        weight=25,
        spread_target=[pb.SpreadTarget(value="r1", percent=100)],
    )
    s = _scorer(_ctx([n]), job)
    # each: (10-1)/10 times its weight share
    assert s.score(n) == pytest.approx(0.9 * 0.75 + 0.9 * 0.25)


def test_even_spread_boost() -> None:
    a1, a2, b = (mock.node(meta={"rack": r}) for r in ("a", "a", "b"))
    c = mock.node(meta={"rack": "c"})
    job = mock.job(count=6)
    job.task_groups[0].spreads.add(attribute="${meta.rack}", weight=100)
    # nothing placed yet: no opinion
    s = _scorer(_ctx([a1, b, c]), job)
    assert s.score(a1) == 0.0
    allocs = [mock.alloc(job, a1), mock.alloc(job, a2, index=1), mock.alloc(job, b, index=2)]
    ctx = _ctx([a1, a2, b, c], allocs)
    s = _scorer(ctx, job)
    ps = s.active[0]
    assert even_spread_boost(ps, a1) == pytest.approx((1 - 2) / 1)  # above the minimum
    assert even_spread_boost(ps, b) == pytest.approx((2 - 1) / 1)  # at the minimum, imbalanced
    assert even_spread_boost(ps, c) == pytest.approx(1.0)  # a new value beats both


def test_even_spread_balanced_is_negative() -> None:
    a, b = mock.node(meta={"rack": "a"}), mock.node(meta={"rack": "b"})
    job = mock.job(count=4)
    job.task_groups[0].spreads.add(attribute="${meta.rack}", weight=100)
    ctx = _ctx([a, b], [mock.alloc(job, a), mock.alloc(job, b, index=1)])
    s = _scorer(ctx, job)
    assert s.score(a) == -1.0


def test_plan_placements_and_stops_are_counted() -> None:
    dc1 = mock.node(datacenter="dc1")
    job = _dc_job(10, {"dc1": 50, "dc2": 50})
    existing = mock.alloc(job, dc1)
    plan = pb.Plan(eval_id="e")
    ctx = _ctx([dc1], [existing], plan)
    s = _scorer(ctx, job)
    assert s.score(dc1) == pytest.approx((5 - 2) / 5)
    plan.node_allocation[dc1.id].allocs.append(mock.alloc(job, dc1, index=1))
    s.set_task_group(job.task_groups[0])
    assert s.score(dc1) == pytest.approx((5 - 3) / 5)
    plan.node_update[dc1.id].stops.add(alloc_id=existing.id, desired_status=DesiredStatus.STOP)
    s.set_task_group(job.task_groups[0])
    assert s.score(dc1) == pytest.approx((5 - 2) / 5)


def _place(job: pb.Job, nodes: list[pb.Node]) -> Counter[str]:
    snap = StateStore.build(11, nodes=nodes, jobs=[job])
    plan = pb.Plan(eval_id="place-eval")
    ctx = EvalContext(snap, plan)
    stack = GenericStack(False, ctx)
    stack.set_job(job)
    stack.set_nodes(nodes)
    tg = job.task_groups[0]
    placed: Counter[str] = Counter()
    for i in range(tg.count):
        opt = stack.select(tg, SelectOptions(alloc_name=f"{job.id}.web[{i}]"))
        assert opt is not None
        plan.node_allocation[opt.node.id].allocs.append(mock.alloc(job, opt.node, index=i))
        placed[opt.node.datacenter] += 1
    return placed


def test_spread_placements_follow_targets() -> None:
    nodes = [mock.node(datacenter=dc) for dc in ("dc1",) * 10 + ("dc2",) * 10]
    job = _dc_job(10, {"dc1": 70, "dc2": 30})
    assert _place(job, nodes) == Counter({"dc1": 7, "dc2": 3})


def test_even_spread_placements_balance() -> None:
    nodes = [mock.node(datacenter=dc) for dc in ("dc1",) * 12 + ("dc2",) * 4 + ("dc3",) * 2]
    job = mock.job(count=9, datacenters=("dc1", "dc2", "dc3"))
    job.task_groups[0].spreads.add(attribute="${node.datacenter}", weight=100)
    assert _place(job, nodes) == Counter({"dc1": 3, "dc2": 3, "dc3": 3})
