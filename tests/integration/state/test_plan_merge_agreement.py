"""The three appliers of a plan agree: the state's real `ApplyPlans` on
PostgreSQL, the planner's overlay and the scheduler test harness, given the
same random plan over the same random existing allocs, leave the same
allocs behind.

Random plans: each existing alloc (any client and desired status, with or
without task states) is left alone, updated in place (the scheduler's stale
copy, with or without a forced lost/unknown status), stopped (with or
without a client status and a follow-up eval) or preempted; new allocs are
placed, some replacing an existing one; sometimes a stop names an alloc
already collected; sometimes the job was stopped after the scheduler's
snapshot. The production path is the planner's: `evaluate_plan` on the
state's own snapshot, `applied_plan`, then the state write or the overlay.

Compared: every field of every alloc, except what only one side can stamp:
times (`create_time`, `modify_time`, `alloc_states[].time`: each side has
its own clock) and the raw index numbers (each side has its own index
sequence, and the overlay writes before the commit index is known). Indexes
are compared by meaning instead: "the plan's index" or "the seed's index".
"""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from corral.domain.plan_commit import applied_plan
from corral.domain.store import StateSnapshot
from corral.domain.structs import ClientStatus, DesiredStatus, copy_msg, new_id
from corral.testing import mock
from corral.testing.harness import Harness
from corral.v1 import state_pb2, state_pb2_grpc
from corral.v1 import structs_pb2 as pb
from services.planner.evaluate import evaluate_plan
from services.planner.overlay import Overlay
from services.state.app import StateApp
from services.worker.scheduler import util

CLIENT_STATUSES = [
    ClientStatus.PENDING,
    ClientStatus.RUNNING,
    ClientStatus.COMPLETE,
    ClientStatus.FAILED,
    ClientStatus.LOST,
    ClientStatus.UNKNOWN,
]


@dataclass(frozen=True)
class Existing:
    client_status: str
    desired_status: str
    task_states: bool
    #: "keep", "update", "stop" or "preempt"
    op: str
    #: update: the client status the scheduler's copy carries;
    #: stop: the client status the stop forces ("" for none)
    client_status_in_plan: str
    followup: bool


@dataclass(frozen=True)
class Scenario:
    existing: list[Existing]
    #: per new placement: the index of the existing alloc it replaces, or None
    placements: list[int | None]
    stop_collected: bool
    job_stopped: bool


def existing_allocs() -> st.SearchStrategy[Existing]:
    return st.builds(
        Existing,
        client_status=st.sampled_from(CLIENT_STATUSES),
        desired_status=st.sampled_from([DesiredStatus.RUN, DesiredStatus.STOP]),
        task_states=st.booleans(),
        op=st.sampled_from(["keep", "update", "stop", "preempt"]),
        client_status_in_plan=st.sampled_from(["", *CLIENT_STATUSES]),
        followup=st.booleans(),
    )


@st.composite
def scenarios(draw: st.DrawFn) -> Scenario:
    existing = draw(st.lists(existing_allocs(), max_size=4))
    replaces = st.none() | st.integers(0, len(existing) - 1) if existing else st.none()
    return Scenario(
        existing=existing,
        placements=draw(st.lists(replaces, max_size=3)),
        stop_collected=draw(st.booleans()),
        job_stopped=draw(st.booleans()),
    )


def build(
    sc: Scenario,
) -> tuple[pb.Job, pb.Node, pb.Evaluation, list[pb.Allocation], pb.Plan, list[str]]:
    """Fresh objects for one example (new ids: examples share a database)."""
    job, node = mock.job(job_id=f"merge-{new_id()[:8]}"), mock.node()
    ev = mock.eval_for(job)
    allocs: list[pb.Allocation] = []
    plan = util.make_plan(ev, job)
    for i, e in enumerate(sc.existing):
        a = mock.alloc(job, node, index=i, client_status=e.client_status)
        a.desired_status = e.desired_status
        if e.task_states:
            a.task_states["web"].state = "running"
            a.client_description = "reported by the client"
        allocs.append(a)
    new_allocs: list[pb.Allocation] = []
    for i, replaces in enumerate(sc.placements):
        a = mock.alloc(job, node, index=10 + i, client_status="")
        if replaces is not None:
            a.previous_allocation = allocs[replaces].id
        new_allocs.append(a)
    if any(e.op == "preempt" for e in sc.existing) and not new_allocs:
        # a preemption makes room for a placement (the plan applier ignores
        # preemptions on a node the plan places nothing on)
        new_allocs.append(mock.alloc(job, node, index=20, client_status=""))
    for a, e in zip(allocs, sc.existing, strict=True):
        if e.op == "update":
            u = copy_msg(a)  # the scheduler's copy: stale client fields
            u.task_states.clear()
            u.client_status = e.client_status_in_plan
            u.client_description = ""
            u.job_version = job.version + 1
            u.desired_status = DesiredStatus.RUN
            util.append_alloc(plan, u)
        elif e.op == "stop":
            followup = new_id() if e.followup else ""
            util.append_stopped_alloc(
                plan, a, util.ALLOC_NOT_NEEDED, e.client_status_in_plan, followup
            )
        elif e.op == "preempt":
            util.append_preempted_alloc(plan, a, new_allocs[0].id)
    for a in new_allocs:
        util.append_alloc(plan, a)
    ids = [a.id for a in allocs] + [a.id for a in new_allocs]
    if sc.stop_collected:
        gone = mock.alloc(job, node)
        util.append_stopped_alloc(plan, gone, util.ALLOC_NOT_NEEDED)
        ids.append(gone.id)
    if sc.job_stopped:
        job.stop = True  # stopped after the scheduler's snapshot
    return job, node, ev, allocs, plan, ids


def normalized(a: pb.Allocation | None, seed_index: int, plan_index: int) -> object:
    """`a` without what only one side can stamp (see the module docstring)."""
    if a is None:
        return None
    out = copy_msg(a)
    out.create_time = out.modify_time = 0
    for s in out.alloc_states:
        s.time = 0
    for name in ("create_index", "modify_index", "alloc_modify_index"):
        value = getattr(out, name)
        setattr(out, name, {seed_index: 1, plan_index: 2}.get(value, 3))
    return out.SerializeToString(deterministic=True)


def readable(a: pb.Allocation | None) -> str:
    return "None" if a is None else str(a)


async def apply_in_state(
    app: StateApp,
    stub: state_pb2_grpc.StateAsyncStub,
    job: pb.Job,
    node: pb.Node,
    ev: pb.Evaluation,
    allocs: list[pb.Allocation],
    plan: pb.Plan,
    planner_leader: str,
) -> tuple[StateSnapshot, int, StateSnapshot, int, state_pb2.AppliedPlan]:
    """Seed, then commit `plan` the planner's way; the seed snapshot and
    index, the snapshot after and the plan's index (0: nothing to write),
    and the write."""
    async with app.db.write() as tx:
        tx.put_job(job)
        tx.put_node(copy_msg(node))
        tx.put_eval(ev)
        for a in allocs:
            a = copy_msg(a)
            a.alloc_modify_index = tx.index  # as the harness's seeding does
            tx.put_alloc(a)
    seed = await app.feed.wait_for_index(tx.index, 10)
    evaluation = evaluate_plan(seed, plan)
    assert not evaluation.partial, evaluation.rejections
    write = applied_plan(seed, plan, evaluation.result, now=1)
    if evaluation.is_noop():  # the planner answers without a write (index 0)
        return seed, tx.index, seed, 0, write
    resp = await stub.ApplyPlans(
        state_pb2.ApplyPlansRequest(leader_id=planner_leader, plans=[write])
    )
    after = await app.feed.wait_for_index(resp.indexes[0], 10)
    return seed, tx.index, after, resp.indexes[0], write


def apply_in_harness(
    job: pb.Job, node: pb.Node, ev: pb.Evaluation, allocs: list[pb.Allocation], plan: pb.Plan
) -> tuple[Harness, int, int]:
    h = Harness()
    h.upsert_nodes(node)
    h.upsert_jobs(job, keep_indexes=True)
    h.upsert_evals(ev)
    seed_index = h.upsert_allocs(*allocs)
    result, _ = h.submit_plan(copy_msg(plan))
    return h, seed_index, result.alloc_index


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    derandomize=True,
)
@given(sc=scenarios())
async def test_state_overlay_and_harness_apply_a_plan_alike(
    state_app: StateApp,
    state_stub: state_pb2_grpc.StateAsyncStub,
    planner_leader: str,
    sc: Scenario,
) -> None:
    job, node, ev, allocs, plan, ids = build(sc)
    seed, seed_index, after, plan_index, write = await apply_in_state(
        state_app, state_stub, job, node, ev, allocs, plan, planner_leader
    )

    overlay = Overlay()
    overlay.snapshot(seed)
    overlay.add(write)
    overlaid = overlay.snapshot(seed)

    h, h_seed_index, h_plan_index = apply_in_harness(job, node, ev, allocs, plan)
    harnessed = h.snapshot()

    for alloc_id in ids:
        state_a = after.alloc_by_id(alloc_id)
        overlay_a, harness_a = overlaid.alloc_by_id(alloc_id), harnessed.alloc_by_id(alloc_id)
        want = normalized(state_a, seed_index, plan_index)
        assert normalized(overlay_a, seed_index, 0) == want, (
            f"overlay differs from state:\n{readable(overlay_a)}\nvs\n{readable(state_a)}"
        )
        assert normalized(harness_a, h_seed_index, h_plan_index if plan_index else -1) == want, (
            f"harness differs from state:\n{readable(harness_a)}\nvs\n{readable(state_a)}"
        )
    # the merge really ran: every placement of a live job exists, none of a stopped one
    placed = [a.id for lst in plan.node_allocation.values() for a in lst.allocs]
    for alloc_id in placed:
        assert (after.alloc_by_id(alloc_id) is None) == (
            sc.job_stopped and alloc_id not in {a.id for a in allocs}
        )
    # both real appliers bumped the plan's eval to the plan's index, if they wrote
    stored_ev, harness_ev = after.eval_by_id(ev.id), harnessed.eval_by_id(ev.id)
    assert stored_ev is not None and harness_ev is not None
    if plan_index:
        assert stored_ev.modify_index == plan_index
        assert harness_ev.modify_index == h_plan_index
    else:
        assert stored_ev.modify_index == seed_index
        assert harness_ev.modify_index < h_seed_index
