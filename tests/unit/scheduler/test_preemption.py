"""Preemption (Nomad's preemption_test.go, resource dimensions): who may be
evicted, in which order, minimal sets, the max_parallel penalty, and the
per-scheduler enablement through the stacks."""

from __future__ import annotations

import pytest

from corral.domain import structs
from corral.domain.fit import Usage, node_capacity
from corral.domain.store import StateStore
from corral.domain.structs import JobType
from corral.testing import mock
from corral.v1 import structs_pb2 as pb
from services.worker.scheduler.feasible.context import EvalContext
from services.worker.scheduler.feasible.preemption import preempt_for_task_group, preemption_enabled
from services.worker.scheduler.feasible.stack import GenericStack, SelectOptions, SystemStack


def _node() -> pb.Node:
    n = mock.node(cpu=4000, memory_mb=4000, disk_mb=10000)
    n.reserved_resources.CopyFrom(pb.NodeReservedResources())
    n.computed_class = structs.computed_class(n)
    return n


def _victim(node: pb.Node, priority: int, cpu: int, mem: int, job_id: str = "") -> pb.Allocation:
    job = mock.job(priority=priority, job_id=job_id or None)
    a = mock.alloc(job, node)
    a.resources.CopyFrom(pb.Resources(cpu=cpu, memory_mb=mem))
    return a


def _preempt(
    node: pb.Node, current: list[pb.Allocation], ask: Usage, priority: int = 100, **kw: object
) -> list[pb.Allocation] | None:
    return preempt_for_task_group(
        capacity=node_capacity(node),
        current=current,
        ask=ask,
        priority=priority,
        namespace="default",
        job_id="preemptor",
        **kw,  # type: ignore[arg-type]
    )


def test_defaults_and_config() -> None:
    unset = pb.SchedulerConfiguration()
    assert preemption_enabled(unset, JobType.SYSTEM)
    for t in (JobType.SYSBATCH, JobType.BATCH, JobType.SERVICE):
        assert not preemption_enabled(unset, t)
    cfg = pb.SchedulerConfiguration(
        preemption_config=pb.PreemptionConfig(service_scheduler_enabled=True)
    )
    assert preemption_enabled(cfg, JobType.SERVICE)
    assert not preemption_enabled(cfg, JobType.SYSTEM)  # explicitly configured off


def test_nothing_needed_when_it_fits() -> None:
    n = _node()
    assert (
        _preempt(n, [_victim(n, 10, 1000, 1000)], Usage(cpu=1000, memory_mb=1000, allocs=1)) == []
    )


def test_lowest_priority_first() -> None:
    n = _node()
    low = _victim(n, 10, 2000, 2000)
    mid = _victim(n, 30, 2000, 2000)
    got = _preempt(n, [mid, low], Usage(cpu=2000, memory_mb=2000, allocs=1))
    assert got == [low]


def test_priority_delta_of_ten_is_required() -> None:
    n = _node()
    close = _victim(n, 91, 4000, 4000)
    assert _preempt(n, [close], Usage(cpu=1000, memory_mb=10, allocs=1)) is None
    exact = _victim(n, 90, 4000, 4000)
    assert _preempt(n, [exact], Usage(cpu=1000, memory_mb=10, allocs=1)) == [exact]


def test_same_job_is_never_preempted() -> None:
    n = _node()
    own = _victim(n, 10, 4000, 4000, job_id="preemptor")
    assert _preempt(n, [own], Usage(cpu=1000, memory_mb=10, allocs=1)) is None


def test_not_enough_preemptible_resources() -> None:
    n = _node()
    high = _victim(n, 95, 3000, 3000)
    low = _victim(n, 10, 500, 500)
    assert _preempt(n, [high, low], Usage(cpu=2000, memory_mb=2000, allocs=1)) is None


def test_closest_fit_within_a_priority_and_minimal_set() -> None:
    n = _node()
    small = [_victim(n, 20, 500, 500) for _ in range(4)]
    exact = _victim(n, 20, 2000, 2000)
    got = _preempt(n, [*small, exact], Usage(cpu=2000, memory_mb=2000, allocs=1))
    assert got == [exact]  # one alloc the size of the ask, not four small ones


def test_unneeded_higher_priority_victims_are_dropped() -> None:
    n = _node()
    # the greedy pass takes p20 (too small) and then p40; p20 alone is not
    # enough, p40 alone is: the p20 victim is dropped afterwards
    p20 = _victim(n, 20, 500, 500)
    p40 = _victim(n, 40, 2500, 2500)
    filler = _victim(n, 95, 1000, 1000)
    got = _preempt(n, [p20, p40, filler], Usage(cpu=2500, memory_mb=2500, allocs=1))
    assert got == [p40]


def test_max_parallel_penalty_prefers_other_groups() -> None:
    n = _node()
    a = _victim(n, 10, 2000, 2000, job_id="a")
    b = _victim(n, 10, 1000, 1000, job_id="b")
    b2 = _victim(n, 10, 1000, 1000, job_id="b2")
    key_a = ("default", "a", "web")
    ask = Usage(cpu=2000, memory_mb=2000, allocs=1)
    assert _preempt(n, [a, b, b2], ask) == [a]
    # group a already lost its max_parallel worth of allocs in this plan
    got = _preempt(n, [a, b, b2], ask, max_parallel_of={key_a: 1}, already_preempted={key_a: 1})
    assert got is not None and {x.id for x in got} == {b.id, b2.id}


def test_priority_looked_up_when_alloc_lacks_it() -> None:
    n = _node()
    v = _victim(n, 10, 4000, 4000)
    v.job_priority = 0
    assert _preempt(n, [v], Usage(cpu=1000, allocs=1)) == [v]  # unknown priority counts as 0
    got = _preempt(n, [v], Usage(cpu=1000, allocs=1), priority_of={v.job_id: 10})
    assert got == [v]


# --------------------------------------------------------------------------- stacks


def _full_cluster(
    config: pb.SchedulerConfiguration | None,
) -> tuple[EvalContext, pb.Node, pb.Allocation]:
    n = _node()
    low_job = mock.job(priority=20, cpu=4000, memory_mb=4000)
    victim = mock.alloc(low_job, n)
    snap = StateStore.build(5, nodes=[n], jobs=[low_job], allocs=[victim], scheduler_config=config)
    return EvalContext(snap, pb.Plan(eval_id="p")), n, victim


@pytest.mark.parametrize("enabled", [False, True])
def test_generic_stack_retries_with_preemption_when_enabled(enabled: bool) -> None:
    cfg = pb.SchedulerConfiguration(
        preemption_config=pb.PreemptionConfig(service_scheduler_enabled=enabled)
    )
    ctx, n, victim = _full_cluster(cfg)
    job = mock.job(priority=80, cpu=1000, memory_mb=1000)
    stack = GenericStack(False, ctx)
    stack.set_job(job)
    stack.set_nodes([n])
    opt = stack.select(job.task_groups[0], SelectOptions())
    if not enabled:
        assert opt is None
        assert ctx.metrics.nodes_exhausted == 1
        return
    assert opt is not None and [a.id for a in opt.preempted_allocs] == [victim.id]


def test_explicit_preempt_option_works_even_if_config_off() -> None:
    ctx, n, victim = _full_cluster(None)
    job = mock.job(priority=80, cpu=1000, memory_mb=1000)
    stack = GenericStack(True, ctx)
    stack.set_job(job)
    stack.set_nodes([n])
    opt = stack.select(job.task_groups[0], SelectOptions(preempt=True))
    assert opt is not None and opt.preempted_allocs[0].id == victim.id


def test_system_stack_preempts_by_default_sysbatch_does_not() -> None:
    ctx, n, victim = _full_cluster(None)
    job = mock.system_job(priority=80, cpu=1000, memory_mb=1000)
    stack = SystemStack(False, ctx)
    stack.set_job(job)
    stack.set_nodes([n])
    opt = stack.select(job.task_groups[0])
    assert opt is not None and opt.preempted_allocs[0].id == victim.id

    ctx, n, _ = _full_cluster(None)
    sb = mock.sysbatch_job(priority=80, cpu=1000, memory_mb=1000)
    stack = SystemStack(True, ctx)
    stack.set_job(sb)
    stack.set_nodes([n])
    assert stack.select(sb.task_groups[0]) is None


def test_plan_preemptions_free_the_node_for_the_next_select() -> None:
    ctx, n, victim = _full_cluster(None)
    job = mock.system_job(priority=80, cpu=1000, memory_mb=1000)
    ctx.plan.node_preemptions[n.id].stops.add(alloc_id=victim.id, desired_status="evict")
    stack = SystemStack(False, ctx)
    stack.set_job(job)
    stack.set_nodes([n])
    opt = stack.select(job.task_groups[0])
    assert opt is not None and opt.preempted_allocs == []
