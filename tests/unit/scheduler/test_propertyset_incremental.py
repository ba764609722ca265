"""PropertySet keeps per-node plan counts between selects; after any
sequence of placements, stops and evictions in the plan its counts must
equal those of a property set built from scratch (a full recount)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from corral.domain.store import StateStore
from corral.domain.structs import DesiredStatus
from corral.testing import mock
from corral.v1 import structs_pb2 as pb
from services.worker.scheduler import util
from services.worker.scheduler.feasible.context import EvalContext
from services.worker.scheduler.feasible.property_set import PropertySet


def _counts(ps: PropertySet) -> tuple[dict[str, int], dict[str, int], dict[str, int]]:
    return dict(ps.proposed), dict(ps.cleared), dict(ps.combined_use())


def test_incremental_counts_equal_full_recount_after_placements_and_removals() -> None:
    nodes = []
    for i in range(6):
        n = mock.node()
        n.meta["rack"] = f"r{i % 3}"
        nodes.append(n)
    job = mock.job()
    tg = job.task_groups[0].name
    existing = [mock.alloc(job, nodes[i]) for i in (0, 1, 2, 3)]
    ctx = EvalContext(StateStore.build(50, nodes=nodes, allocs=existing), pb.Plan(eval_id="e"))
    ps = PropertySet(ctx, job, "${meta.rack}", task_group=tg)
    plan = ctx.plan

    def check() -> None:
        ps.populate_proposed()
        fresh = PropertySet(ctx, job, "${meta.rack}", task_group=tg)
        assert _counts(ps) == _counts(fresh)

    check()
    # placements, several on the same node
    for i in (0, 4, 4, 5):
        plan.node_allocation[nodes[i].id].allocs.append(mock.alloc(job, nodes[i]))
        check()
    # a stop and an eviction of existing allocs
    plan.node_update[nodes[1].id].stops.add(alloc_id=existing[1].id)
    check()
    plan.node_update[nodes[2].id].stops.add(alloc_id=existing[2].id)
    check()
    # an in-place update of an existing alloc does not count twice
    upd = pb.Allocation()
    upd.CopyFrom(existing[3])
    plan.node_allocation[nodes[3].id].allocs.append(upd)
    check()
    # a placement that is itself stopped does not count
    stopped = mock.alloc(job, nodes[5])
    stopped.desired_status = DesiredStatus.STOP
    plan.node_allocation[nodes[5].id].allocs.append(stopped)
    check()
    # removals from the plan: drop a stop, drop a placement, drop a node entry
    del plan.node_update[nodes[1].id].stops[0]
    check()
    plan.node_allocation[nodes[4].id].allocs.pop()
    check()
    del plan.node_allocation[nodes[0].id]
    check()
    plan.node_update[nodes[1].id].stops.add(alloc_id=existing[1].id)
    check()
    assert sum(ps.combined_use().values()) == 4 - 2 + 2


# --- random sequences (hypothesis): the kept counts always equal a recount

_RACKS = 3
_NODES = 6

#: one plan edit: (kind, node index, alloc choice)
_Op = tuple[str, int, int]

_ops = st.lists(
    st.tuples(
        st.sampled_from(
            (
                "place",
                "place_stopped",
                "update_in_place",
                "stop",
                "evict",
                "unstop",
                "unplace",
                "drop_node",
                "place_other_group",
                "place_other_job",
            )
        ),
        st.integers(0, _NODES - 1),
        st.integers(0, 7),
    ),
    max_size=40,
)


def _apply(
    op: _Op,
    plan: pb.Plan,
    job: pb.Job,
    other: pb.Job,
    nodes: list[pb.Node],
    existing: list[pb.Allocation],
    serial: list[int],
) -> None:
    """Edit the plan the way the schedulers do (util's helpers), plus the
    removals they make by hand."""
    kind, i, k = op
    node = nodes[i]
    serial[0] += 1
    if kind in ("place", "place_stopped", "place_other_group", "place_other_job"):
        a = mock.alloc(other if kind == "place_other_job" else job, node, index=serial[0])
        if kind == "place_stopped":
            a.desired_status = DesiredStatus.STOP
        if kind == "place_other_group":
            a.task_group = "other-group"
        util.append_alloc(plan, a)
    elif kind == "update_in_place":
        old = existing[k % len(existing)]
        upd = pb.Allocation()
        upd.CopyFrom(old)
        util.append_alloc(plan, upd)
    elif kind == "stop":
        util.append_stopped_alloc(plan, existing[k % len(existing)], util.ALLOC_NOT_NEEDED)
    elif kind == "evict":
        util.append_preempted_alloc(plan, existing[k % len(existing)], "preemptor")
        util.append_stopped_alloc(plan, existing[k % len(existing)], "evicted")
    elif kind == "unstop":
        util.pop_update(plan, existing[k % len(existing)])
    elif kind == "unplace":
        lst = plan.node_allocation.get(node.id)
        if lst is not None and len(lst.allocs):
            del lst.allocs[k % len(lst.allocs)]
    elif kind == "drop_node":
        if node.id in plan.node_allocation:
            del plan.node_allocation[node.id]
        if node.id in plan.node_update:
            del plan.node_update[node.id]


@settings(max_examples=150, deadline=None, derandomize=True)
@given(ops=_ops, targets=st.sampled_from(((), ("r0",), ("r1", "r2"))), group=st.booleans())
def test_random_plan_edits_keep_counts_equal_to_a_recount(
    ops: list[_Op], targets: tuple[str, ...], group: bool
) -> None:
    nodes = []
    for i in range(_NODES):
        n = mock.node()
        n.meta["rack"] = f"r{i % _RACKS}"
        nodes.append(n)
    nodes.append(mock.node())  # no rack: never counted
    job, other = mock.job(), mock.job()
    tg = job.task_groups[0].name if group else ""
    existing = [mock.alloc(job, nodes[i], index=i) for i in (0, 1, 2, 3, 6)]
    existing.append(mock.alloc(other, nodes[4]))
    snap = StateStore.build(50, nodes=nodes, allocs=existing)
    ctx = EvalContext(snap, pb.Plan(eval_id="e"))
    kept = PropertySet(ctx, job, "${meta.rack}", task_group=tg, target_values=targets)
    serial = [100]
    for op in ops:
        _apply(op, ctx.plan, job, other, nodes, existing, serial)
        kept.populate_proposed()
        fresh = PropertySet(ctx, job, "${meta.rack}", task_group=tg, target_values=targets)
        assert _counts(kept) == _counts(fresh)
        assert kept.use_bounds() == fresh.use_bounds()
        for n in nodes:
            assert kept.used_count(n) == fresh.used_count(n)
