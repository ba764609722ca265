"""Feasibility (Nomad's feasible_test.go): candidate nodes, constraint
targets and operands, versions, drivers, devices, distinct_hosts,
distinct_property and computed-class memoisation."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from corral.domain import structs, topics
from corral.domain.store import StateStore
from corral.domain.structs import ClientStatus, DesiredStatus, Eligibility, NodeStatus
from corral.testing import mock
from corral.v1 import structs_pb2 as pb
from services.worker.scheduler.feasible.checker import (
    FILTER_CLASS_INELIGIBLE,
    FILTER_MISSING_DEVICES,
    FILTER_MISSING_DRIVERS,
    FeasibilityChecker,
)
from services.worker.scheduler.feasible.constraints import (
    MatchCache,
    check_constraint,
    resolve_target,
)
from services.worker.scheduler.feasible.context import EvalContext, EvalEligibility
from services.worker.scheduler.feasible.devices import has_devices
from services.worker.scheduler.feasible.versions import parse_version
from services.worker.scheduler.util import ready_nodes_in_dcs


def _ctx(
    nodes: Sequence[pb.Node],
    *,
    jobs: Sequence[pb.Job] = (),
    allocs: Sequence[pb.Allocation] = (),
    plan: pb.Plan | None = None,
) -> EvalContext:
    snap = StateStore.build(100, nodes=nodes, jobs=jobs, allocs=allocs)
    return EvalContext(snap, plan or pb.Plan(eval_id="eval-1"))


def _checker(ctx: EvalContext, job: pb.Job, tg_index: int = 0) -> FeasibilityChecker:
    fc = FeasibilityChecker(ctx)
    fc.set_job(job)
    fc.set_task_group(job.task_groups[tg_index])
    return fc


# --------------------------------------------------------------------------- candidates


def test_ready_nodes_in_dcs_filters_pools_globs_and_counts() -> None:
    ok1 = mock.node(datacenter="dc1")
    ok2 = mock.node(datacenter="dc2")
    other_dc = mock.node(datacenter="dc3")
    down = mock.node(status=NodeStatus.DOWN)
    draining = mock.node()
    draining.drain = True
    inelig = mock.node()
    inelig.scheduling_eligibility = Eligibility.INELIGIBLE
    other_pool = mock.node()
    other_pool.node_pool = "gpu"
    snap = StateStore.build(1, nodes=[ok1, ok2, other_dc, down, draining, inelig, other_pool])
    job = mock.job(datacenters=("dc1", "dc2"))
    nodes, not_ready, by_dc = ready_nodes_in_dcs(snap, job.datacenters, job.node_pool)
    assert {n.id for n in nodes} == {ok1.id, ok2.id}
    assert not_ready == {down.id, draining.id, inelig.id}
    assert by_dc == {"dc1": 1, "dc2": 1}

    # Nomad 1.5+ datacenter globs, mixed with plain names, each node once
    every = {ok1.id, ok2.id, other_dc.id, other_pool.id}
    picked = {ok1.id, other_dc.id, other_pool.id}  # dc1 by name, dc3 by glob; "dc?" is a name
    for dcs, want in (
        (["dc*"], every),
        (["*"], every),
        ([], every),
        (["dc1", "d*3", "dc?"], picked),
    ):
        job.datacenters[:] = dcs
        nodes, _, by_dc = ready_nodes_in_dcs(snap, job.datacenters, "all")
        assert sorted(n.id for n in nodes) == sorted(want), dcs


# --------------------------------------------------------------------------- targets


def test_ready_nodes_are_reused_until_a_node_changes() -> None:
    a, b = mock.node(datacenter="dc1"), mock.node(datacenter="dc1")
    job = mock.job(datacenters=("dc1",))
    store = StateStore()
    batch = pb.ChangeBatch(index=5)
    for n in (a, b):
        batch.events.add(topic=topics.NODE.name, type="NodeRegistration", node=n)
    store.apply(batch)
    first = store.snapshot()
    nodes, not_ready, by_dc = ready_nodes_in_dcs(first, job.datacenters)
    assert {n.id for n in nodes} == {a.id, b.id} and by_dc == {"dc1": 2}
    # callers own their copies: editing one answer does not leak into the next
    nodes.clear()
    not_ready.add("x")
    by_dc["dc1"] = 0
    # a commit that writes allocs, not nodes: the same nodes (cached), same answer
    other = pb.ChangeBatch(index=6)
    placed = mock.alloc(job, a)
    other.events.add(topic=topics.ALLOCATION.name, type="AllocationUpdated", allocation=placed)
    store.apply(other)
    second = store.snapshot()
    assert second.nodes_by_dc_map is first.nodes_by_dc_map
    nodes, not_ready, by_dc = ready_nodes_in_dcs(second, job.datacenters)
    assert {n.id for n in nodes} == {a.id, b.id}
    assert not_ready == set() and by_dc == {"dc1": 2}
    # a node write is seen at once
    down = pb.Node()
    down.CopyFrom(b)
    down.status = NodeStatus.DOWN
    third_batch = pb.ChangeBatch(index=7)
    third_batch.events.add(topic=topics.NODE.name, type="NodeUpdateStatus", node=down)
    store.apply(third_batch)
    nodes, not_ready, by_dc = ready_nodes_in_dcs(store.snapshot(), job.datacenters)
    assert [n.id for n in nodes] == [a.id]
    assert not_ready == {b.id} and by_dc == {"dc1": 1}
    # an older snapshot still answers for its own nodes
    nodes, _, _ = ready_nodes_in_dcs(first, job.datacenters)
    assert {n.id for n in nodes} == {a.id, b.id}


def test_resolve_target() -> None:
    n = mock.node(node_class="large", datacenter="dc9")
    n.node_pool = "prod"
    assert resolve_target("literal", n) == ("literal", True)
    assert resolve_target("${node.unique.id}", n) == (n.id, True)
    assert resolve_target("${node.unique.name}", n) == (n.name, True)
    assert resolve_target("${node.datacenter}", n) == ("dc9", True)
    assert resolve_target("${node.class}", n) == ("large", True)
    assert resolve_target("${node.pool}", n) == ("prod", True)
    assert resolve_target("${attr.kernel.name}", n) == ("linux", True)
    assert resolve_target("${meta.database}", n) == ("mysql", True)
    assert resolve_target("${attr.nope}", n) == ("", False)
    assert resolve_target("${meta.nope}", n) == ("", False)
    assert resolve_target("${node.bogus}", n) == ("", False)


# --------------------------------------------------------------------------- operands

CASES = [
    ("=", "foo", "foo", True, True, True),
    ("is", "foo", "foo", True, True, True),
    ("==", "foo", "bar", True, True, False),
    ("=", "", "", False, True, False),
    ("!=", "foo", "foo", True, True, False),
    ("!=", "foo", "bar", True, True, True),
    ("not", "", "bar", False, True, True),
    ("!=", "", "", False, False, False),
    ("<", "1", "2", True, True, True),
    ("<", "10", "9", True, True, False),  # numeric, not lexical
    ("<", "abc", "abd", True, True, True),  # lexical fallback
    ("<=", "2", "2", True, True, True),
    (">", "2.5", "2", True, True, True),
    (">=", "1", "2", True, True, False),
    (">", "", "2", False, True, False),
    ("is_set", "x", "", True, False, True),
    ("is_set", "", "", False, False, False),
    ("is_not_set", "", "", False, False, True),
    ("regexp", "foobarbaz", "[\\w]+bar", True, True, True),
    ("regexp", "foo", "^bar", True, True, False),
    ("regexp", "foo", "(", True, True, False),  # invalid pattern never matches
    ("set_contains", "a,b,c", "a, c", True, True, True),
    ("set_contains_all", "a,b,c", "a,d", True, True, False),
    ("set_contains_any", "a,b,c", "d,c", True, True, True),
    ("set_contains_any", "a,b,c", "d,e", True, True, False),
    ("version", "1.2.3", ">= 1.0, < 2.0", True, True, True),
    ("semver", "1.2.3", ">= 1.3", True, True, False),
    ("distinct_hosts", "", "", False, False, True),
    ("bogus", "a", "a", True, True, False),
]


@pytest.mark.parametrize(("op", "lval", "rval", "lok", "rok", "want"), CASES)
def test_check_constraint(op: str, lval: str, rval: str, lok: bool, rok: bool, want: bool) -> None:
    assert check_constraint(op, lval, rval, lok, rok, MatchCache()) is want


@pytest.mark.parametrize(
    ("version", "constraint", "want"),
    [
        ("1.2.3", "~> 1.0", True),
        ("2.0.1", "~> 1.0", False),
        ("1.2.3", "~> 1.2.0", True),
        ("1.3.0", "~> 1.2.0", False),
        ("v1.2.3", "= 1.2.3", True),
        ("1.2.3+ent", "= 1.2.3", True),
        ("1.2", "> 1.1.9", True),
        ("1.2.3-beta1", ">= 1.0", False),  # pre-releases need a pre-release constraint
        ("1.2.3-beta1", ">= 1.2.3-alpha", True),
        ("1.2.3", "!= 1.2.3", False),
        ("not-a-version", ">= 1", False),
        ("1.2.3", "garbage", False),
    ],
)
def test_version_operand(version: str, constraint: str, want: bool) -> None:
    assert check_constraint("version", version, constraint, True, True, MatchCache()) is want


@pytest.mark.parametrize(
    ("version", "constraint", "want"),
    [
        ("1.2.3-beta1", ">= 1.0", True),  # semver orders pre-releases normally
        ("1.2.3-beta1", "< 1.2.3", True),
        ("1.2.3-alpha.2", "> 1.2.3-alpha.10", False),  # numeric identifiers
        ("1.2.3", "~> 1.2", False),  # no pessimistic operator in semver
        ("1.0.0", "= 1", True),
    ],
)
def test_semver_operand(version: str, constraint: str, want: bool) -> None:
    assert check_constraint("semver", version, constraint, True, True, MatchCache()) is want


def test_parse_version_pads_segments() -> None:
    v = parse_version("1.2")
    assert v is not None and v.segments == (1, 2, 0) and v.specified == 2


# --------------------------------------------------------------------------- checker


def test_job_constraint_filters_and_memoises_by_class() -> None:
    a = mock.node(attributes={"kernel.name": "windows"})
    b = mock.node(attributes={"kernel.name": "windows"})
    good = mock.node()
    job = mock.job()
    ctx = _ctx([a, b, good], jobs=[job])
    fc = _checker(ctx, job)
    assert a.computed_class == b.computed_class != good.computed_class
    assert not fc.feasible(a)
    assert not fc.feasible(b)
    assert fc.feasible(good)
    m = ctx.metrics
    assert m.nodes_filtered == 2
    # b is skipped by its class's memo, and counted under the same constraint
    assert m.constraint_filtered["${attr.kernel.name} = linux"] == 2
    assert FILTER_CLASS_INELIGIBLE not in m.constraint_filtered
    assert ctx.eligibility.get_classes() == {a.computed_class: False, good.computed_class: True}
    assert not ctx.eligibility.has_escaped()


def test_class_filtered_counts_node_class() -> None:
    n = mock.node(node_class="small", attributes={"kernel.name": "darwin"})
    job = mock.job()
    ctx = _ctx([n], jobs=[job])
    assert not _checker(ctx, job).feasible(n)
    assert ctx.metrics.class_filtered["small"] == 1


def test_unique_constraint_escapes_class_memoisation() -> None:
    a = mock.node()
    b = mock.node()
    job = mock.job()
    job.constraints.append(pb.Constraint(l_target="${node.unique.id}", r_target=b.id, operand="="))
    ctx = _ctx([a, b], jobs=[job])
    fc = _checker(ctx, job)
    assert a.computed_class == b.computed_class
    assert not fc.feasible(a)
    assert fc.feasible(b)  # not filtered by a's (same) class
    assert ctx.eligibility.has_escaped()
    assert ctx.eligibility.get_classes() == {a.computed_class: True}


@pytest.mark.parametrize(
    "target", ["${attr.unique.hostname}", "${meta.unique.rack}", "${node.unique.name}"]
)
def test_task_constraint_on_unique_data_escapes_group(target: str) -> None:
    job = mock.job()
    job.task_groups[0].tasks[0].constraints.append(pb.Constraint(l_target=target, operand="is_set"))
    e = EvalEligibility()
    e.set_job(job)
    assert not e.job_escaped and e.tg_escaped["web"] and e.has_escaped()


def test_task_group_and_task_constraints() -> None:
    rack1 = mock.node(meta={"rack": "r1"})
    rack2 = mock.node(meta={"rack": "r2"})
    job = mock.job()
    job.task_groups[0].constraints.append(
        pb.Constraint(l_target="${meta.rack}", r_target="r1,r2", operand="set_contains_any")
    )
    job.task_groups[0].tasks[0].constraints.append(
        pb.Constraint(l_target="${meta.rack}", r_target="r2", operand="!=")
    )
    ctx = _ctx([rack1, rack2], jobs=[job])
    fc = _checker(ctx, job)
    assert fc.feasible(rack1)
    assert not fc.feasible(rack2)
    assert ctx.metrics.constraint_filtered["${meta.rack} != r2"] == 1


def test_drivers_must_be_detected_and_healthy() -> None:
    healthy = mock.node()
    sick = mock.node()
    sick.drivers["mock"].healthy = False
    missing = mock.node()
    del missing.drivers["mock"]
    del missing.attributes["driver.mock"]
    attr_only = mock.node()
    del attr_only.drivers["mock"]  # old-style fingerprint: driver.mock = "1"
    for n in (sick, missing, attr_only):
        n.computed_class = structs.computed_class(n)
    job = mock.job()
    ctx = _ctx([healthy, sick, missing, attr_only], jobs=[job])
    fc = _checker(ctx, job)
    assert fc.feasible(healthy)
    assert not fc.feasible(sick)
    assert not fc.feasible(missing)
    assert fc.feasible(attr_only)
    assert ctx.metrics.constraint_filtered[FILTER_MISSING_DRIVERS] == 2


def _gpu_node(count: int = 2, model: str = "1080ti", memory: str = "11") -> pb.Node:
    n = mock.node()
    n.node_resources.devices.add(
        vendor="nvidia",
        type="gpu",
        name=model,
        instance_ids=[f"{model}-{i}" for i in range(count)],
        attributes={"memory": memory},
    )
    n.computed_class = structs.computed_class(n)
    return n


@pytest.mark.parametrize(
    ("name", "count", "constraints", "want"),
    [
        ("gpu", 1, [], True),
        ("nvidia/gpu", 2, [], True),
        ("nvidia/gpu/1080ti", 1, [], True),
        ("nvidia/gpu/2080", 1, [], False),
        ("amd/gpu", 1, [], False),
        ("fpga", 1, [], False),
        ("gpu", 3, [], False),
        (
            "gpu",
            1,
            [pb.Constraint(l_target="${device.attr.memory}", r_target="10", operand=">")],
            True,
        ),
        (
            "gpu",
            1,
            [pb.Constraint(l_target="${device.model}", r_target="2080", operand="=")],
            False,
        ),
    ],
)
def test_has_devices(name: str, count: int, constraints: list[pb.Constraint], want: bool) -> None:
    req = pb.RequestedDevice(name=name, count=count, constraints=constraints)
    assert has_devices(_gpu_node(), [req], MatchCache()) is want


def test_device_requests_share_node_capacity() -> None:
    reqs = [pb.RequestedDevice(name="gpu", count=1), pb.RequestedDevice(name="gpu", count=1)]
    assert has_devices(_gpu_node(2), reqs, MatchCache())
    assert not has_devices(_gpu_node(1), reqs, MatchCache())


def test_devices_filter_in_checker() -> None:
    job = mock.job()
    job.task_groups[0].tasks[0].resources.devices.add(name="gpu", count=1)
    plain = mock.node()
    gpu = _gpu_node()
    ctx = _ctx([plain, gpu], jobs=[job])
    fc = _checker(ctx, job)
    assert not fc.feasible(plain)
    assert fc.feasible(gpu)
    assert ctx.metrics.constraint_filtered[FILTER_MISSING_DEVICES] == 1


# --------------------------------------------------------------------------- distinct_hosts


def test_distinct_hosts_job_level_counts_snapshot_and_plan() -> None:
    n1, n2, n3 = mock.node(), mock.node(), mock.node()
    job = mock.job()
    job.constraints.append(pb.Constraint(operand="distinct_hosts"))
    job.task_groups.add().CopyFrom(job.task_groups[0])
    job.task_groups[1].name = "other"
    existing = mock.alloc(job, n1, group="other")  # another group of the same job
    plan = pb.Plan(eval_id="e")
    plan.node_allocation[n2.id].allocs.append(mock.alloc(job, n2))
    ctx = _ctx([n1, n2, n3], jobs=[job], allocs=[existing], plan=plan)
    fc = _checker(ctx, job)
    assert not fc.feasible(n1)
    assert not fc.feasible(n2)
    assert fc.feasible(n3)
    assert ctx.metrics.constraint_filtered["distinct_hosts"] == 2
    assert ctx.eligibility.has_escaped()


def test_distinct_hosts_group_level_only_same_group_and_stops_free_node() -> None:
    n1, n2 = mock.node(), mock.node()
    job = mock.job()
    job.task_groups[0].constraints.append(pb.Constraint(operand="distinct_hosts", r_target="true"))
    job.task_groups.add().CopyFrom(job.task_groups[0])
    job.task_groups[1].name = "other"
    same = mock.alloc(job, n1)
    other_group = mock.alloc(job, n2, group="other")
    plan = pb.Plan(eval_id="e")
    ctx = _ctx([n1, n2], jobs=[job], allocs=[same, other_group], plan=plan)
    fc = _checker(ctx, job)
    assert not fc.feasible(n1)
    assert fc.feasible(n2)
    plan.node_update[n1.id].stops.add(alloc_id=same.id, desired_status=DesiredStatus.STOP)
    assert fc.feasible(n1)


def test_distinct_hosts_false_is_off_and_other_jobs_do_not_count() -> None:
    n1 = mock.node()
    job = mock.job()
    job.constraints.append(pb.Constraint(operand="distinct_hosts", r_target="false"))
    other = mock.job()
    other.constraints.append(pb.Constraint(operand="distinct_hosts"))
    ctx = _ctx([n1], jobs=[job, other], allocs=[mock.alloc(job, n1)])
    assert _checker(ctx, job).feasible(n1)
    assert _checker(ctx, other).feasible(n1)


# --------------------------------------------------------------------------- distinct_property


def _racks() -> list[pb.Node]:
    return [mock.node(meta={"rack": r}) for r in ("r1", "r1", "r2", "r3")]


def test_distinct_property_default_one_per_value() -> None:
    nodes = _racks()
    job = mock.job()
    job.constraints.append(pb.Constraint(l_target="${meta.rack}", operand="distinct_property"))
    plan = pb.Plan(eval_id="e")
    plan.node_allocation[nodes[2].id].allocs.append(mock.alloc(job, nodes[2]))
    ctx = _ctx(nodes, jobs=[job], allocs=[mock.alloc(job, nodes[0])], plan=plan)
    fc = _checker(ctx, job)
    assert [fc.feasible(n) for n in nodes] == [False, False, False, True]
    assert (
        ctx.metrics.constraint_filtered["distinct_property: ${meta.rack}=r1 used by 1 allocs"] == 2
    )


def test_distinct_property_with_count_and_terminal_allocs_ignored() -> None:
    nodes = _racks()
    job = mock.job()
    job.task_groups[0].constraints.append(
        pb.Constraint(l_target="${meta.rack}", r_target="2", operand="distinct_property")
    )
    allocs = [
        mock.alloc(job, nodes[0]),
        mock.alloc(job, nodes[1], client_status=ClientStatus.COMPLETE),
        mock.alloc(job, nodes[2]),
        mock.alloc(job, nodes[2]),
    ]
    ctx = _ctx(nodes, jobs=[job], allocs=allocs)
    fc = _checker(ctx, job)
    assert [fc.feasible(n) for n in nodes] == [True, True, False, True]


def test_distinct_property_sees_new_plan_entries_between_selects() -> None:
    nodes = _racks()
    job = mock.job()
    job.constraints.append(pb.Constraint(l_target="${meta.rack}", operand="distinct_property"))
    plan = pb.Plan(eval_id="e")
    ctx = _ctx(nodes, jobs=[job], plan=plan)
    fc = _checker(ctx, job)
    assert fc.feasible(nodes[3])
    plan.node_allocation[nodes[3].id].allocs.append(mock.alloc(job, nodes[3]))
    fc.set_task_group(job.task_groups[0])  # next select
    assert not fc.feasible(nodes[3])


def test_distinct_property_remove_and_replace() -> None:
    nodes = _racks()
    job = mock.job()
    job.constraints.append(pb.Constraint(l_target="${meta.rack}", operand="distinct_property"))
    old = mock.alloc(job, nodes[2])
    plan = pb.Plan(eval_id="e")
    ctx = _ctx(nodes, jobs=[job], allocs=[old], plan=plan)
    fc = _checker(ctx, job)
    assert not fc.feasible(nodes[2])
    plan.node_update[nodes[2].id].stops.add(alloc_id=old.id)  # destructive update
    fc.set_task_group(job.task_groups[0])
    assert fc.feasible(nodes[2])
    plan.node_allocation[nodes[2].id].allocs.append(mock.alloc(job, nodes[2]))
    fc.set_task_group(job.task_groups[0])
    assert not fc.feasible(nodes[2])


def test_distinct_property_in_place_update_counts_once() -> None:
    nodes = _racks()
    job = mock.job()
    job.task_groups[0].constraints.append(
        pb.Constraint(l_target="${meta.rack}", r_target="2", operand="distinct_property")
    )
    old = mock.alloc(job, nodes[2])
    plan = pb.Plan(eval_id="e")
    updated = structs.copy_msg(old)
    updated.job_version = 3
    plan.node_allocation[nodes[2].id].allocs.append(updated)
    ctx = _ctx(nodes, jobs=[job], allocs=[old], plan=plan)
    assert _checker(ctx, job).feasible(nodes[2])  # 1 of 2 used, not 2


def test_distinct_property_missing_property_and_bad_count() -> None:
    n = mock.node(meta={})
    job = mock.job()
    job.constraints.append(pb.Constraint(l_target="${meta.rack}", operand="distinct_property"))
    ctx = _ctx([n], jobs=[job])
    assert not _checker(ctx, job).feasible(n)
    assert "missing property '${meta.rack}'" in ctx.metrics.constraint_filtered

    bad = mock.job()
    bad.constraints.append(
        pb.Constraint(l_target="${meta.rack}", r_target="many", operand="distinct_property")
    )
    ctx = _ctx(_racks(), jobs=[bad])
    assert not _checker(ctx, bad).feasible(_racks()[0])


# --------------------------------------------------------------------------- eligibility


def test_eval_eligibility_merge() -> None:
    e = EvalEligibility()
    e.set_tg_eligibility(True, "a", "c1")
    e.set_tg_eligibility(False, "b", "c1")
    e.set_tg_eligibility(False, "b", "c2")
    e.set_job_eligibility(True, "c3")
    e.set_job_eligibility(False, "c2")
    assert e.get_classes() == {"c1": True, "c2": False, "c3": True}
    e.set_job_eligibility(False, "c1")
    assert e.get_classes()["c1"] is False
    assert e.quota_limit_reached() == ""
