"""The commit rule agrees everywhere: given the same random plan over the
same random existing allocs, the planner, the scheduler test harness and
the dry run build the same plan result (accepted nodes, live preemptions,
the canary correction, the rejected nodes), and the three appliers of that
result (the state's real `ApplyPlans` on PostgreSQL, the planner's overlay
and the harness) leave the same allocs and deployments behind.

Random plans: each existing alloc (any client and desired status, with or
without task states) is left alone, updated in place (the scheduler's stale
copy, with or without a forced lost/unknown status), stopped (with or
without a client status and a follow-up eval) or preempted; new allocs are
placed, some replacing an existing one; sometimes a stop names an alloc
already collected; sometimes the job was stopped after the scheduler's
snapshot; sometimes more allocs are placed on a second node that refuses
them (ineligible for the planner, named in `reject_nodes` for the harness),
the plan creating a deployment that lists every new alloc as a placed
canary, all at once or not. The production path is the planner's:
`evaluate_plan` on the state's own snapshot, `applied_plan`, then the state
write or the overlay.

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

from corral.domain.plan_commit import PlanEvaluation, applied_plan, new_alloc_ids, stamp_result
from corral.domain.store import StateSnapshot
from corral.domain.structs import (
    ClientStatus,
    DeploymentStatus,
    DesiredStatus,
    Eligibility,
    copy_msg,
    new_id,
)
from corral.testing import mock
from corral.testing.harness import Harness
from corral.v1 import state_pb2, state_pb2_grpc
from corral.v1 import structs_pb2 as pb
from services.planner.evaluate import evaluate_plan
from services.planner.overlay import Overlay
from services.state.app import StateApp
from services.worker.dry_run import DryRunPlanner
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
    #: new allocs placed on a second node
    elsewhere: int
    #: the second node refuses its part of the plan
    second_refuses: bool
    #: the plan creates a deployment with every new alloc a placed canary
    canaries: bool
    all_at_once: bool


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
        elsewhere=draw(st.integers(0, 2)),
        second_refuses=draw(st.booleans()),
        canaries=draw(st.booleans()),
        all_at_once=draw(st.booleans()),
    )


@dataclass(frozen=True)
class Built:
    job: pb.Job
    nodes: list[pb.Node]
    ev: pb.Evaluation
    allocs: list[pb.Allocation]
    plan: pb.Plan
    #: every alloc id the plan names
    ids: list[str]
    #: nodes that refuse their part (the harness's `reject_nodes`)
    refusing: set[str]


def build(sc: Scenario) -> Built:
    """Fresh objects for one example (new ids: examples share a database)."""
    job, node, second = mock.job(job_id=f"merge-{new_id()[:8]}"), mock.node(), mock.node()
    if sc.second_refuses:
        second.scheduling_eligibility = Eligibility.INELIGIBLE
    ev = mock.eval_for(job)
    allocs: list[pb.Allocation] = []
    plan = util.make_plan(ev, job)
    plan.all_at_once = sc.all_at_once
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
    new_allocs += [
        mock.alloc(job, second, index=30 + i, client_status="") for i in range(sc.elsewhere)
    ]
    for a in new_allocs:
        util.append_alloc(plan, a)
    ids = [a.id for a in allocs] + [a.id for a in new_allocs]
    if sc.stop_collected:
        gone = mock.alloc(job, node)
        util.append_stopped_alloc(plan, gone, util.ALLOC_NOT_NEEDED)
        ids.append(gone.id)
    if sc.canaries and new_allocs:
        plan.deployment.CopyFrom(
            pb.Deployment(
                id=new_id(),
                namespace=job.namespace,
                job_id=job.id,
                job_version=job.version,
                status=DeploymentStatus.RUNNING,
            )
        )
        state = plan.deployment.task_groups["web"]
        state.desired_canaries = state.desired_total = len(new_allocs)
        state.placed_canaries.extend(a.id for a in new_allocs)
        for a in new_allocs:
            a.deployment_id = plan.deployment.id
            a.deployment_status.canary = True
    if sc.job_stopped:
        job.stop = True  # stopped after the scheduler's snapshot
    refusing = {second.id} if sc.second_refuses and sc.elsewhere else set()
    return Built(job, [node, second], ev, allocs, plan, ids, refusing)


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


def readable(a: object) -> str:
    return "None" if a is None else str(a)


def normalized_deployment(d: pb.Deployment | None, seed_index: int, plan_index: int) -> object:
    """`d` without times and with its indexes by meaning (see `normalized`)."""
    if d is None:
        return None
    out = copy_msg(d)
    out.create_time = out.modify_time = 0
    for state in out.task_groups.values():
        state.require_progress_by = 0
    for name in ("create_index", "modify_index"):
        setattr(out, name, {seed_index: 1, plan_index: 2}.get(getattr(out, name), 3))
    return out.SerializeToString(deterministic=True)


def normalized_result(result: pb.PlanResult, seed_index: int, plan_index: int) -> object:
    """A plan result without its index numbers: each side has its own
    sequence, so the alloc index goes and the refresh index says only
    whether the scheduler must wait; the allocs' stamps are by meaning."""
    out = copy_msg(result)
    out.alloc_index = 0
    out.refresh_index = int(bool(out.refresh_index))
    for lst in out.node_allocation.values():
        del lst.allocs[:]
    allocs = {
        a.id: normalized(a, seed_index, plan_index)
        for lst in result.node_allocation.values()
        for a in lst.allocs
    }
    return out.SerializeToString(deterministic=True), allocs


@dataclass
class InState:
    seed: StateSnapshot
    seed_index: int
    evaluation: PlanEvaluation
    write: state_pb2.AppliedPlan
    after: StateSnapshot
    #: 0: nothing to write
    plan_index: int


async def apply_in_state(
    app: StateApp,
    stub: state_pb2_grpc.StateAsyncStub,
    b: Built,
    planner_leader: str,
) -> InState:
    """Seed, then decide and commit `b.plan` the planner's way."""
    async with app.db.write() as tx:
        tx.put_job(b.job)
        for node in b.nodes:
            tx.put_node(copy_msg(node))
        tx.put_eval(b.ev)
        for a in b.allocs:
            a = copy_msg(a)
            a.alloc_modify_index = tx.index  # as the harness's seeding does
            tx.put_alloc(a)
    seed = await app.feed.wait_for_index(tx.index, 10)
    evaluation = evaluate_plan(seed, b.plan)
    assert {r.node_id for r in evaluation.rejections} == b.refusing, evaluation.rejections
    write = applied_plan(seed, b.plan, evaluation.result, now=1)
    if evaluation.is_noop():  # the planner answers without a write (index 0)
        return InState(seed, tx.index, evaluation, write, seed, 0)
    resp = await stub.ApplyPlans(
        state_pb2.ApplyPlansRequest(leader_id=planner_leader, plans=[write])
    )
    index = resp.indexes[0]
    after = await app.feed.wait_for_index(index, 10)
    # what the planner's applier does to the result once written
    stamp_result(evaluation.result, index, new_alloc_ids(seed, evaluation.result))
    return InState(seed, tx.index, evaluation, write, after, index)


def apply_in_harness(b: Built) -> tuple[Harness, int, pb.PlanResult]:
    h = Harness()
    h.upsert_nodes(*b.nodes)
    h.upsert_jobs(b.job, keep_indexes=True)
    h.upsert_evals(b.ev)
    seed_index = h.upsert_allocs(*b.allocs)
    h.reject_nodes = set(b.refusing)
    result, _ = h.submit_plan(copy_msg(b.plan))
    return h, seed_index, result


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    derandomize=True,
)
@given(sc=scenarios())
async def test_planner_harness_and_dry_run_commit_a_plan_alike(
    state_app: StateApp,
    state_stub: state_pb2_grpc.StateAsyncStub,
    planner_leader: str,
    sc: Scenario,
) -> None:
    b = build(sc)
    st_ = await apply_in_state(state_app, state_stub, b, planner_leader)
    seed_index, plan_index = st_.seed_index, st_.plan_index

    overlay = Overlay()
    overlay.snapshot(st_.seed)
    overlay.add(st_.write)
    overlaid = overlay.snapshot(st_.seed)

    h, h_seed_index, h_result = apply_in_harness(b)
    harnessed = h.snapshot()
    h_plan_index = h_result.alloc_index if plan_index else -1

    # the result: the planner's and the harness's the same
    result = st_.evaluation.result
    assert normalized_result(h_result, h_seed_index, h_plan_index) == normalized_result(
        result, seed_index, plan_index
    ), f"harness result differs:\n{readable(h_result)}\nvs\n{readable(result)}"
    if not b.refusing:
        # the dry run commits what the planner does when every node accepts
        dry, _ = DryRunPlanner(st_.seed).submit_plan(copy_msg(b.plan))
        unstamped = evaluate_plan(st_.seed, b.plan).result
        assert normalized_result(dry, 0, 0) == normalized_result(unstamped, 0, 0)

    # what it writes: the allocs and deployments the three appliers leave
    for alloc_id in b.ids:
        state_a = st_.after.alloc_by_id(alloc_id)
        overlay_a, harness_a = overlaid.alloc_by_id(alloc_id), harnessed.alloc_by_id(alloc_id)
        want = normalized(state_a, seed_index, plan_index)
        assert normalized(overlay_a, seed_index, 0) == want, (
            f"overlay differs from state:\n{readable(overlay_a)}\nvs\n{readable(state_a)}"
        )
        assert normalized(harness_a, h_seed_index, h_plan_index) == want, (
            f"harness differs from state:\n{readable(harness_a)}\nvs\n{readable(state_a)}"
        )
    if b.plan.HasField("deployment"):
        dep_id = b.plan.deployment.id
        state_d = st_.after.deployment_by_id(dep_id)
        want_d = normalized_deployment(state_d, seed_index, plan_index)
        overlay_d = overlaid.deployment_by_id(dep_id)
        harness_d = harnessed.deployment_by_id(dep_id)
        assert normalized_deployment(overlay_d, seed_index, 0) == want_d
        assert normalized_deployment(harness_d, h_seed_index, h_plan_index) == want_d, (
            f"harness differs from state:\n{readable(harness_d)}\nvs\n{readable(state_d)}"
        )
        if state_d is not None:
            # the canary correction: only the canaries the result placed are listed
            accepted_ids = {a.id for lst in result.node_allocation.values() for a in lst.allocs}
            canaries = set(b.plan.deployment.task_groups["web"].placed_canaries)
            assert set(state_d.task_groups["web"].placed_canaries) == canaries & accepted_ids
    # the merge really ran: every accepted placement of a live job exists,
    # none of a stopped job, none on a refusing node
    existing = {a.id for a in b.allocs}
    accepted = {a.id for lst in result.node_allocation.values() for a in lst.allocs}
    placed = [a for lst in b.plan.node_allocation.values() for a in lst.allocs]
    for a in placed:
        created = a.id in accepted and not sc.job_stopped
        assert (st_.after.alloc_by_id(a.id) is not None) == (created or a.id in existing)
    # both real appliers bumped the plan's eval to the plan's index, if they wrote
    stored_ev, harness_ev = st_.after.eval_by_id(b.ev.id), harnessed.eval_by_id(b.ev.id)
    assert stored_ev is not None and harness_ev is not None
    if plan_index:
        assert stored_ev.modify_index == plan_index
        assert harness_ev.modify_index == h_result.alloc_index
    else:
        assert stored_ev.modify_index == seed_index
        assert harness_ev.modify_index < h_seed_index
