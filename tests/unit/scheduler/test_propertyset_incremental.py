"""PropertySet keeps per-node plan counts between selects; after any
sequence of placements, stops and evictions in the plan its counts must
equal those of a property set built from scratch (a full recount)."""

from __future__ import annotations

from corral.store import StateStore
from corral.structs import DesiredStatus
from corral.testing import mock
from corral.v1 import structs_pb2 as pb
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
