"""The worker process's in-flight placements (feasible/inflight.py): what one
scheduler loop placed counts on its nodes for the other loops until their
snapshot holds it, so evals planning side by side on one snapshot do not
bid for the same capacity (issue 30), while an eval alone plans exactly as
without it."""

from __future__ import annotations

from typing import Any

from prometheus_client import REGISTRY, generate_latest

from corral.domain import structs
from corral.domain.fit import Usage, allocs_fit, node_capacity
from corral.domain.store import StateSnapshot, StateStore
from corral.domain.structs import JobType
from corral.testing import mock
from corral.testing.harness import Harness
from corral.v1 import structs_pb2 as pb
from services.worker import metrics
from services.worker.planner_bridge import accepted_nodes
from services.worker.scheduler.factory import new_scheduler
from services.worker.scheduler.feasible.context import EvalContext
from services.worker.scheduler.feasible.inflight import InFlightPlacements
from services.worker.scheduler.feasible.preemption import preempt_for_task_group


class Recorder:
    """A planner that accepts every plan without committing it: the plan
    stays in flight, as a sibling loop's does while another eval plans."""

    def __init__(self) -> None:
        self.plans: list[pb.Plan] = []

    def submit_plan(self, plan: pb.Plan) -> tuple[pb.PlanResult, StateSnapshot | None]:
        self.plans.append(structs.copy_msg(plan))
        result = pb.PlanResult()
        for node_id, allocs in plan.node_allocation.items():
            result.node_allocation[node_id].CopyFrom(allocs)
        return result, None

    def update_eval(self, ev: pb.Evaluation) -> None:
        pass

    def create_eval(self, ev: pb.Evaluation) -> None:
        pass

    def reblock_eval(self, ev: pb.Evaluation) -> None:
        pass


def _placed(plan: pb.Plan) -> dict[str, list[pb.Allocation]]:
    return {n: list(lst.allocs) for n, lst in plan.node_allocation.items() if lst.allocs}


def _schedule(
    h: Harness, job: pb.Job, inflight: InFlightPlacements | None, snap: StateSnapshot
) -> pb.Plan:
    """One eval of `job` on `snap`; its plan, left in flight."""
    ev = mock.eval_for(h.job(job.namespace, job.id))
    planner = Recorder()
    if inflight is not None:
        inflight.begin(ev.id, snap.index)
    new_scheduler(JobType.SERVICE, snap, planner, inflight=inflight).process(ev)
    (plan,) = planner.plans
    return plan


def _cluster(nodes: int, busy_mhz: int) -> tuple[Harness, list[pb.Node]]:
    """`nodes` nodes of 4,000 MHz; the first runs `busy_mhz` already, so
    binpack makes every eval want it first."""
    h = Harness()
    ns = [mock.node(node_id=f"00000000-0000-4000-8000-{i:012d}") for i in range(nodes)]
    h.upsert_nodes(*ns)
    filler = mock.job(job_id="filler", count=1, cpu=busy_mhz)
    h.upsert_jobs(filler)
    h.upsert_allocs(mock.alloc(h.job(filler.namespace, filler.id), ns[0]))
    return h, ns


def _overcommitted(snap: StateSnapshot, plans: list[pb.Plan]) -> list[str]:
    """Nodes whose snapshot allocs plus every plan's placements do not fit."""
    out = []
    for node_id in {n for p in plans for n in _placed(p)}:
        node = snap.node_by_id(node_id)
        assert node is not None
        allocs = [a for a in snap.allocs_by_node(node_id) if not structs.alloc_terminal(a)]
        for p in plans:
            allocs += _placed(p).get(node_id, [])
        if not allocs_fit(node, allocs).fits:
            out.append(node_id)
    return out


def test_evals_on_one_snapshot_collide_without_claims_and_not_with_them() -> None:
    h, nodes = _cluster(2, busy_mhz=2500)  # limit 2: each eval sees both nodes
    jobs = [mock.job(job_id=f"j{i}", count=1, cpu=1000) for i in range(2)]
    h.upsert_jobs(*jobs)
    snap = h.snapshot()

    alone = [_schedule(h, j, None, snap) for j in jobs]
    # each eval alone picks the fullest node: together they overflow it
    assert [list(_placed(p)) for p in alone] == [[nodes[0].id], [nodes[0].id]]
    assert _overcommitted(snap, alone) == [nodes[0].id]

    shared = InFlightPlacements()
    side_by_side = [_schedule(h, j, shared, snap) for j in jobs]
    assert [list(_placed(p)) for p in side_by_side] == [[nodes[0].id], [nodes[1].id]]
    assert _overcommitted(snap, side_by_side) == []


def test_many_evals_side_by_side_place_everything_and_never_overcommit() -> None:
    h, _ = _cluster(40, busy_mhz=2000)
    jobs = [mock.job(job_id=f"w{i}", count=25, cpu=500, memory_mb=256) for i in range(6)]
    h.upsert_jobs(*jobs)
    snap = h.snapshot()
    shared = InFlightPlacements()
    plans = [_schedule(h, j, shared, snap) for j in jobs]
    assert _overcommitted(snap, plans) == []
    assert sum(len(a) for p in plans for a in _placed(p).values()) == 150
    without = [_schedule(h, j, None, snap) for j in jobs]
    assert _overcommitted(snap, without)  # the collisions the registry removes


def test_an_eval_alone_places_exactly_as_without_claims() -> None:
    h, _ = _cluster(50, busy_mhz=1500)
    job = mock.job(job_id="solo", count=30, cpu=300)
    h.upsert_jobs(job)
    snap = h.snapshot()
    ev = mock.eval_for(h.job(job.namespace, job.id))

    def placements(inflight: InFlightPlacements | None) -> list[tuple[str, str]]:
        planner = Recorder()
        if inflight is not None:
            inflight.begin(ev.id, snap.index)
        new_scheduler(JobType.SERVICE, snap, planner, inflight=inflight).process(ev)
        (plan,) = planner.plans
        return sorted((a.name, n) for n, allocs in _placed(plan).items() for a in allocs)

    registry = InFlightPlacements()
    assert placements(registry) == placements(None)
    assert registry.count() == 30  # its own placements are claimed, for the others


# ------------------------------------------------------------------ the registry

CLAIM = (100, 0, 256, 150, 1)


def test_claims_are_foreign_to_other_evals_until_their_snapshot_holds_them() -> None:
    r = InFlightPlacements()
    r.begin("a", 10)
    r.begin("b", 10)
    assert r.version("n1") == 0 and r.foreign("n1", "b", 10) is None
    assert r.claim("a", "n1", 0, CLAIM)
    assert r.claim("a", "n1", r.version("n1"), CLAIM)
    assert r.claim("a", "n2", 0, CLAIM)
    assert r.foreign("n1", "b", 10) == (200, 0, 512, 300, 2)
    assert r.foreign("n1", "a", 10) is None  # its own are in its plan

    r.settle("a", {"n1"}, 15)  # n2 was rejected: its claim will never commit
    assert r.foreign("n1", "b", 10) == (200, 0, 512, 300, 2)  # committed after 10
    assert r.foreign("n1", "b", 15) is None  # a snapshot at 15 holds them
    assert r.foreign("n2", "b", 10) is None

    r.end("a")
    assert r.count() == 2  # b's snapshot (10) still lacks them
    r.begin("b", 16)  # b refreshed past 15: nobody needs them any more
    assert r.count() == 0


def test_a_claim_fails_when_another_eval_claimed_on_the_node_since() -> None:
    r = InFlightPlacements()
    seen = r.version("n1")
    assert r.claim("b", "n1", seen, CLAIM)
    assert not r.claim("a", "n1", seen, CLAIM)  # a ranked n1 before b's claim
    assert r.foreign("n1", "b", 0) is None  # a claimed nothing
    assert r.claim("a", "n1", None, CLAIM)  # forced
    assert r.foreign("n1", "b", 0) == CLAIM
    assert r.outcomes == {"claimed": 1, "conflict": 1, "forced": 1}

    metrics.PLACEMENT_CLAIMS.source = r
    try:
        text = generate_latest(REGISTRY).decode()
    finally:
        metrics.PLACEMENT_CLAIMS.source = None
    assert 'corral_worker_placement_claims_total{outcome="conflict"} 1.0' in text


def test_an_eval_ending_drops_what_it_did_not_commit() -> None:
    r = InFlightPlacements()
    r.begin("a", 5)
    assert r.claim("a", "n1", 0, CLAIM)
    r.end("a")
    assert r.foreign("n1", "b", 0) is None and r.count() == 0


def test_an_all_at_once_plan_with_a_rejected_node_commits_nothing() -> None:
    plan = pb.Plan(eval_id="a", all_at_once=True)
    plan.node_allocation["n1"].allocs.add(id="x")
    plan.node_allocation["n2"].allocs.add(id="y")
    result = pb.PlanResult(alloc_index=9, rejected_nodes=["n2"])
    assert accepted_nodes(plan, result) == set()
    plan.all_at_once = False
    assert accepted_nodes(plan, result) == {"n1"}


def test_the_context_reads_a_nodes_claims_again_only_when_they_changed() -> None:
    node = mock.node()
    snap = StateStore.build(20, nodes=[node])
    r = InFlightPlacements()
    ctx = EvalContext(snap, pb.Plan(eval_id="mine"), inflight=r)
    assert ctx.foreign_usage(node.id) is None and ctx.claims_seen(node.id) == 0
    assert r.claim("theirs", node.id, 0, CLAIM)
    assert ctx.foreign_usage(node.id) == CLAIM
    assert ctx.claims_seen(node.id) == r.version(node.id)
    assert EvalContext(snap, pb.Plan(eval_id="x")).foreign_usage(node.id) is None


def test_a_placement_claimed_first_by_another_loop_is_chosen_again() -> None:
    h, nodes = _cluster(2, busy_mhz=2500)
    job = mock.job(job_id="late", count=1, cpu=1000)
    h.upsert_jobs(job)
    snap = h.snapshot()

    class Interleaved(InFlightPlacements):
        """Another loop claims node 0's last room just before this eval's
        first claim, as if the interpreter switched loops mid-select."""

        def __init__(self) -> None:
            super().__init__()
            self.raced = False

        def claim(self, eval_id: str, node_id: str, seen: int | None, usage: Any) -> bool:
            if not self.raced:
                self.raced = True
                assert node_id == nodes[0].id  # the fullest node, chosen first
                assert super().claim("sibling", node_id, None, (1000, 0, 256, 150, 1))
            return super().claim(eval_id, node_id, seen, usage)

    registry = Interleaved()
    plan = _schedule(h, job, registry, snap)
    assert list(_placed(plan)) == [nodes[1].id]  # node 0 is full with the sibling's


def test_claimed_capacity_counts_for_preemption_but_is_never_evicted() -> None:
    node = mock.node()
    low = mock.job(job_id="low", priority=10, cpu=1500)
    running = mock.alloc(low, node)
    cap = node_capacity(node)
    ask = Usage(cpu=2000, memory_mb=256, allocs=1)

    def victims(claimed: Any) -> list[pb.Allocation] | None:
        return preempt_for_task_group(
            capacity=cap,
            current=[running],
            ask=ask,
            priority=80,
            namespace="default",
            job_id="high",
            claimed=claimed,
        )

    assert victims(None) == []  # 1,500 + 2,000 MHz fits without evicting
    assert victims((1500, 0, 256, 150, 1)) == [running]  # with 1,500 claimed it does not
    assert victims((3900, 0, 256, 150, 1)) is None  # nothing evictable frees enough
