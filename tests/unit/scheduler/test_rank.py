"""Ranking (Nomad's rank_test.go): fit scores, exhaustion, ports, devices,
job anti-affinity, reschedule penalty, node affinity, normalization and the
resources handed to the new alloc."""

from __future__ import annotations

import random
from collections.abc import Sequence

import pytest

from corral.domain import structs
from corral.domain.fit import Capacity, Usage, node_capacity
from corral.domain.store import StateStore
from corral.domain.structs import DesiredStatus
from corral.testing import mock
from corral.v1 import structs_pb2 as pb
from services.worker.scheduler.feasible.constraints import MatchCache
from services.worker.scheduler.feasible.context import EvalContext
from services.worker.scheduler.feasible.rank import (
    Ranker,
    affinity_score,
    score_fit_binpack,
    score_fit_spread,
)


def _node(cpu: int = 2048, memory_mb: int = 2048) -> pb.Node:
    n = mock.node(cpu=cpu, memory_mb=memory_mb)
    n.reserved_resources.CopyFrom(pb.NodeReservedResources())
    n.computed_class = structs.computed_class(n)
    return n


def _ctx(
    nodes: Sequence[pb.Node],
    *,
    allocs: Sequence[pb.Allocation] = (),
    plan: pb.Plan | None = None,
    config: pb.SchedulerConfiguration | None = None,
    pools: Sequence[pb.NodePool] = (),
) -> EvalContext:
    snap = StateStore.build(
        100, nodes=nodes, allocs=allocs, scheduler_config=config, node_pools=pools
    )
    return EvalContext(snap, plan or pb.Plan(eval_id="e"))


def _ranker(ctx: EvalContext, job: pb.Job, **kw: object) -> Ranker:
    r = Ranker(ctx, random.Random(1))
    r.set_job(job)
    r.set_task_group(job.task_groups[0], **kw)  # type: ignore[arg-type]
    return r


def _job(cpu: int = 1024, memory_mb: int = 1024, count: int = 10) -> pb.Job:
    return mock.job(cpu=cpu, memory_mb=memory_mb, count=count)


# --------------------------------------------------------------------------- fit scores


def _cap(cpu: int = 1000, mem: int = 1000) -> Capacity:
    return Capacity(cpu, 4, mem, 1000, 250, 0, cpu, mem)


@pytest.mark.parametrize(
    ("cpu", "mem", "binpack", "spread"),
    [
        (0, 0, 0.0, 18.0),  # empty node: worst for binpack, best for spread
        (1000, 1000, 18.0, 0.0),  # full node
        (500, 500, 20 - 2 * 10**0.5, 2 * 10**0.5 - 2),
        (1000, 0, 20 - 11, 9.0),
    ],
)
def test_fit_scores(cpu: int, mem: int, binpack: float, spread: float) -> None:
    used = Usage(cpu=cpu, memory_mb=mem)
    assert score_fit_binpack(_cap(), used) == pytest.approx(binpack)
    assert score_fit_spread(_cap(), used) == pytest.approx(spread)


def test_fit_score_is_clamped() -> None:
    over = Usage(cpu=2000, memory_mb=2000)
    assert score_fit_binpack(_cap(), over) == 18.0
    assert score_fit_spread(_cap(), over) == 0.0


# --------------------------------------------------------------------------- binpack


def test_binpack_prefers_fuller_node_and_normalizes() -> None:
    empty = _node()
    half = _node()
    other = mock.job()
    existing = mock.alloc(other, half)
    existing.resources.CopyFrom(pb.Resources(cpu=1024, memory_mb=1024))
    job = _job()
    ctx = _ctx([empty, half], allocs=[existing])
    r = _ranker(ctx, job)
    o_empty = r.rank(empty)
    o_half = r.rank(half)
    assert o_empty is not None and o_half is not None
    assert o_half.final_score > o_empty.final_score
    # full after placement: 18/18
    assert o_half.scores["binpack"] == pytest.approx(1.0)
    assert o_empty.scores["binpack"] == pytest.approx((20 - 2 * 10**0.5) / 18)
    assert o_half.final_score == pytest.approx(1.0)  # mean of one score


def test_spread_algorithm_prefers_emptier_node() -> None:
    empty = _node()
    half = _node()
    existing = mock.alloc(mock.job(), half)
    existing.resources.CopyFrom(pb.Resources(cpu=1024, memory_mb=1024))
    cfg = pb.SchedulerConfiguration(scheduler_algorithm="spread")
    ctx = _ctx([empty, half], allocs=[existing], config=cfg)
    r = _ranker(ctx, _job())
    o_empty, o_half = r.rank(empty), r.rank(half)
    assert o_empty is not None and o_half is not None
    assert o_empty.final_score > o_half.final_score


def test_a_node_pool_sets_its_own_algorithm_over_the_clusters() -> None:
    """Nomad's WithNodePool: a pool's scheduler_algorithm wins for its
    jobs; the cluster's stays for every other pool."""
    empty = _node()
    half = _node()
    for n in (empty, half):
        n.node_pool = "spready"
    existing = mock.alloc(mock.job(), half)
    existing.resources.CopyFrom(pb.Resources(cpu=1024, memory_mb=1024))
    pool = pb.NodePool(
        name="spready",
        scheduler_config=pb.NodePoolSchedulerConfiguration(scheduler_algorithm="spread"),
    )
    cfg = pb.SchedulerConfiguration(scheduler_algorithm="binpack")
    ctx = _ctx([empty, half], allocs=[existing], config=cfg, pools=[pool])
    job = _job()
    job.node_pool = "spready"
    r = _ranker(ctx, job)
    o_empty, o_half = r.rank(empty), r.rank(half)
    assert o_empty is not None and o_half is not None
    assert o_empty.final_score > o_half.final_score  # spread, from the pool
    other = _job()
    other.node_pool = "default"
    r = _ranker(ctx, other)
    o_empty, o_half = r.rank(empty), r.rank(half)
    assert o_empty is not None and o_half is not None
    assert o_half.final_score > o_empty.final_score  # binpack, the cluster's


@pytest.mark.parametrize(
    ("job_kw", "dimension"),
    [({"cpu": 4096, "memory_mb": 1}, "cpu"), ({"cpu": 1, "memory_mb": 4096}, "memory")],
)
def test_exhausted_node_records_dimension_and_class(job_kw: dict[str, int], dimension: str) -> None:
    n = _node()
    n.node_class = "small"
    ctx = _ctx([n])
    r = _ranker(ctx, _job(**job_kw))
    assert r.rank(n) is None
    m = ctx.metrics
    assert m.nodes_exhausted == 1
    assert m.dimension_exhausted[dimension] == 1
    assert m.class_exhausted["small"] == 1


def test_disk_and_cores_dimensions() -> None:
    n = _node()
    job = _job(cpu=1, memory_mb=1)
    job.task_groups[0].ephemeral_disk.size_mb = n.node_resources.disk_mb + 1
    ctx = _ctx([n])
    assert _ranker(ctx, job).rank(n) is None
    assert ctx.metrics.dimension_exhausted["disk"] == 1

    job = _job(cpu=0, memory_mb=1)
    job.task_groups[0].tasks[0].resources.cores = 5
    ctx = _ctx([n])
    assert _ranker(ctx, job).rank(n) is None
    assert ctx.metrics.dimension_exhausted["cores"] == 1


def test_plan_stops_free_capacity_and_plan_placements_use_it() -> None:
    n = _node()
    other = mock.job()
    existing = mock.alloc(other, n)
    existing.resources.CopyFrom(pb.Resources(cpu=2048, memory_mb=2048))
    plan = pb.Plan(eval_id="e")
    ctx = _ctx([n], allocs=[existing], plan=plan)
    job = _job()
    r = _ranker(ctx, job)
    assert r.rank(n) is None
    plan.node_update[n.id].stops.add(alloc_id=existing.id, desired_status=DesiredStatus.STOP)
    assert r.rank(n) is not None
    big = mock.alloc(other, n)
    big.resources.CopyFrom(pb.Resources(cpu=2000, memory_mb=10))
    plan.node_allocation[n.id].allocs.append(big)
    assert r.rank(n) is None


def test_ranking_does_not_mutate_snapshot_messages() -> None:
    n = _node()
    existing = mock.alloc(mock.job(), n)
    before = existing.SerializeToString()
    ctx = _ctx([n], allocs=[existing])
    job = _job()
    job.task_groups[0].networks.add(dynamic_ports=[pb.Port(label="http")])
    r = _ranker(ctx, job)
    opt = r.rank(n)
    assert opt is not None
    r.finalize(opt)
    assert ctx.snapshot.alloc_by_id(existing.id).SerializeToString() == before  # type: ignore[union-attr]


# --------------------------------------------------------------------------- ports and devices


def test_ports_assigned_and_reported_in_alloc_resources() -> None:
    n = _node()
    n.node_resources.min_dynamic_port = 25000
    n.node_resources.max_dynamic_port = 25100
    job = _job()
    tg = job.task_groups[0]
    tg.networks.add(
        reserved_ports=[pb.Port(label="admin", value=8080)],
        dynamic_ports=[pb.Port(label="http", to=-1)],
    )
    tg.tasks[0].resources.networks.add(dynamic_ports=[pb.Port(label="task")])
    ctx = _ctx([n])
    r = _ranker(ctx, job)
    opt = r.rank(n)
    assert opt is not None
    r.finalize(opt)
    res = opt.alloc_resources
    assert len(res.networks) == 2
    group = res.networks[0]
    assert group.reserved_ports[0].value == 8080
    dyn = group.dynamic_ports[0].value
    assert 25000 <= dyn <= 25100 and group.dynamic_ports[0].to == dyn
    task_port = opt.task_resources["web"].networks[0].dynamic_ports[0].value
    assert 25000 <= task_port <= 25100 and task_port != dyn


def test_static_port_taken_exhausts_node() -> None:
    n = _node()
    n.reserved_resources.reserved_host_ports = "8000-8100"
    job = _job()
    job.task_groups[0].networks.add(reserved_ports=[pb.Port(label="http", value=8080)])
    ctx = _ctx([n])
    assert _ranker(ctx, job).rank(n) is None
    (dim,) = ctx.metrics.dimension_exhausted.keys()
    assert dim.startswith("network: reserved port collision http=8080")


def test_static_port_used_by_existing_alloc_exhausts_node() -> None:
    n = _node()
    other = mock.alloc(mock.job(), n)
    other.resources.networks.add(reserved_ports=[pb.Port(label="x", value=9000)])
    job = _job(cpu=1, memory_mb=1)
    job.task_groups[0].networks.add(reserved_ports=[pb.Port(label="y", value=9000)])
    ctx = _ctx([n], allocs=[other])
    assert _ranker(ctx, job).rank(n) is None
    assert ctx.metrics.nodes_exhausted == 1


def test_devices_assigned_from_free_instances() -> None:
    n = _node()
    n.node_resources.devices.add(vendor="nvidia", type="gpu", name="t4", instance_ids=["a", "b"])
    used = mock.alloc(mock.job(), n)
    used.resources.CopyFrom(pb.Resources(cpu=1, memory_mb=1))
    used.resources.allocated_devices.add(vendor="nvidia", type="gpu", name="t4", device_ids=["a"])
    job = _job(cpu=1, memory_mb=1)
    job.task_groups[0].tasks[0].resources.devices.add(name="nvidia/gpu", count=1)
    ctx = _ctx([n], allocs=[used])
    r = _ranker(ctx, job)
    opt = r.rank(n)
    assert opt is not None
    r.finalize(opt)
    assert list(opt.alloc_resources.allocated_devices[0].device_ids) == ["b"]
    assert list(opt.task_resources["web"].allocated_devices[0].device_ids) == ["b"]

    job.task_groups[0].tasks[0].resources.devices[0].count = 2
    ctx = _ctx([n], allocs=[used])
    assert _ranker(ctx, job).rank(n) is None
    assert "devices: no devices match request" in ctx.metrics.dimension_exhausted


# --------------------------------------------------------------------------- other scores


def test_job_anti_affinity_penalty() -> None:
    n = _node(cpu=100000, memory_mb=100000)
    job = _job(count=4)
    plan = pb.Plan(eval_id="e")
    plan.node_allocation[n.id].allocs.append(mock.alloc(job, n))
    ctx = _ctx([n], allocs=[mock.alloc(job, n, index=1)], plan=plan)
    opt = _ranker(ctx, job).rank(n)
    assert opt is not None
    # two collisions: -(2+1)/4
    assert opt.scores["job-anti-affinity"] == pytest.approx(-0.75)
    assert opt.final_score == pytest.approx((opt.scores["binpack"] - 0.75) / 2)


def test_other_groups_and_jobs_do_not_collide() -> None:
    n = _node(cpu=100000, memory_mb=100000)
    job = _job()
    ctx = _ctx([n], allocs=[mock.alloc(mock.job(), n)])
    opt = _ranker(ctx, job).rank(n)
    assert opt is not None and "job-anti-affinity" not in opt.scores


def test_reschedule_penalty() -> None:
    a, b = _node(), _node()
    ctx = _ctx([a, b])
    r = _ranker(ctx, _job(), penalty_node_ids={a.id})
    oa, ob = r.rank(a), r.rank(b)
    assert oa is not None and ob is not None
    assert oa.scores["node-reschedule-penalty"] == -1.0
    assert "node-reschedule-penalty" not in ob.scores
    assert oa.final_score < ob.final_score


def test_node_affinity() -> None:
    n = mock.node(meta={"rack": "r1"}, node_class="large")
    affs = [
        pb.Affinity(l_target="${meta.rack}", r_target="r1", operand="=", weight=50),
        pb.Affinity(l_target="${node.class}", r_target="small", operand="=", weight=50),
        pb.Affinity(l_target="${attr.kernel.name}", r_target="linux", operand="=", weight=-100),
    ]
    assert affinity_score(affs, n, MatchCache()) == pytest.approx((50 - 100) / 200)
    assert affinity_score([], n, MatchCache()) == 0.0

    job = _job(cpu=1, memory_mb=1)
    job.affinities.append(affs[0])
    job.task_groups[0].tasks[0].affinities.append(affs[1])
    ctx = _ctx([n])
    r = _ranker(ctx, job)
    assert r.has_affinities()
    opt = r.rank(n)
    assert opt is not None and opt.scores["node-affinity"] == pytest.approx(0.5)


def test_score_metadata_keeps_top_five() -> None:
    nodes = [_node() for _ in range(8)]
    allocs = []
    for i, n in enumerate(nodes):  # increasingly full nodes score higher
        a = mock.alloc(mock.job(), n)
        a.resources.CopyFrom(pb.Resources(cpu=100 * i, memory_mb=100 * i))
        allocs.append(a)
    ctx = _ctx(nodes, allocs=allocs)
    r = _ranker(ctx, _job(cpu=10, memory_mb=10))
    for n in nodes:
        assert r.rank(n) is not None
    ctx.populate_score_meta_data()
    meta = ctx.metrics.score_meta_data
    assert [m.node_id for m in meta] == [n.id for n in reversed(nodes)][:5]
    assert meta[0].norm_score >= meta[-1].norm_score
    assert "binpack" in meta[0].scores


# --------------------------------------------------------------------------- resources


def test_finalize_totals_and_memory_oversubscription() -> None:
    n = _node()
    job = _job(cpu=100, memory_mb=100)
    tg = job.task_groups[0]
    tg.tasks[0].resources.memory_max_mb = 300
    side = tg.tasks.add()
    side.CopyFrom(tg.tasks[0])
    side.name = "side"
    side.resources.memory_max_mb = 0
    for enabled, want_max in ((False, 200), (True, 400)):
        cfg = pb.SchedulerConfiguration(memory_oversubscription_enabled=enabled)
        ctx = _ctx([n], config=cfg)
        r = _ranker(ctx, job)
        opt = r.rank(n)
        assert opt is not None
        r.finalize(opt)
        res = opt.alloc_resources
        assert (res.cpu, res.memory_mb, res.disk_mb) == (200, 200, tg.ephemeral_disk.size_mb)
        assert res.memory_max_mb == want_max
        assert set(opt.task_resources) == {"web", "side"}


@pytest.mark.parametrize(("cluster", "pool", "want_max"), [(False, True, 300), (True, False, 0)])
def test_a_node_pool_sets_memory_oversubscription(cluster: bool, pool: bool, want_max: int) -> None:
    n = _node()
    job = _job(cpu=100, memory_mb=100)
    job.node_pool = "p"
    job.task_groups[0].tasks[0].resources.memory_max_mb = 300
    own = pb.NodePoolSchedulerConfiguration(memory_oversubscription_enabled=pool)
    ctx = _ctx(
        [n],
        config=pb.SchedulerConfiguration(memory_oversubscription_enabled=cluster),
        pools=[pb.NodePool(name="p", scheduler_config=own)],
    )
    r = _ranker(ctx, job)
    opt = r.rank(n)
    assert opt is not None
    r.finalize(opt)
    assert opt.alloc_resources.memory_max_mb == (want_max or 100)


def test_capacity_cached_per_node() -> None:
    n = _node()
    ctx = _ctx([n])
    r = _ranker(ctx, _job())
    assert r.capacity(n) is r.capacity(n)
    assert r.capacity(n) == node_capacity(n)
