"""Mandatory leader fencing and garbage decided on stored rows (issue #15),
against a real state service and PostgreSQL.

Found from outside: `ApplyPlans` without a leader id committed an alloc on a
node that does not exist and an over-capacity alloc; `UpsertEvals` was
unfenced the same way; `GarbageCollect` deleted a running job. Each refusal
here is checked with the census: same index, same rows."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence

import grpc
import pytest

from corral.domain import deployments
from corral.domain.store import StateSnapshot
from corral.domain.structs import ClientStatus, DesiredStatus, JobStatus, NodeStatus, copy_msg
from corral.testing import mock
from corral.v1 import state_pb2, state_pb2_grpc
from corral.v1 import structs_pb2 as pb
from services.state.app import StateApp
from services.worker.scheduler.core_sched import CORE_JOB_FORCE_GC, CoreScheduler, core_eval
from tests.integration.state.helpers import census, pending_eval

STALE = "10.9.9.9:1"  # an address that holds no leader lock


async def refused(call: Awaitable[object], code: grpc.StatusCode, needle: str) -> str:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await call
    details = err.value.details() or ""
    assert err.value.code() == code, details
    assert needle in details, details
    return details


async def seed(app: StateApp, *objs: object) -> int:
    """Write objects straight through the state's indexed write path."""
    async with app.db.write() as tx:
        for o in objs:
            o = copy_msg(o)  # type: ignore[type-var]
            if isinstance(o, pb.Node):
                tx.put_node(o)
            elif isinstance(o, pb.Job):
                tx.put_job(o)
            elif isinstance(o, pb.Allocation):
                tx.put_alloc(o)
            elif isinstance(o, pb.Evaluation):
                tx.put_eval(o)
            elif isinstance(o, pb.Deployment):
                tx.put_deployment(o)
    await app.feed.wait_for_index(tx.index, 10)
    return tx.index


# ---------------------------------------------------------------- ApplyPlans


async def test_apply_plans_needs_the_planner_leader(
    state_app: StateApp, state_stub: state_pb2_grpc.StateAsyncStub, planner_leader: str
) -> None:
    """Without a leader id (or with anyone else's), neither the placement
    on a node that does not exist nor the over-capacity one is written."""
    node, job = mock.node(cpu=1000), mock.job(job_id="fence-plan", count=2)
    await seed(state_app, node, job)
    huge = mock.alloc(job, node)
    huge.resources.cpu = 900_000
    ghost = mock.alloc(job, mock.node(), index=1)  # a node never registered
    plan = state_pb2.AppliedPlan(
        eval_id="e1", namespace="default", job_id=job.id, allocs=[huge, ghost]
    )
    before = await census(state_app.db)
    await refused(
        state_stub.ApplyPlans(state_pb2.ApplyPlansRequest(plans=[plan])),
        grpc.StatusCode.FAILED_PRECONDITION,
        "leader_id is required",
    )
    await refused(
        state_stub.ApplyPlans(state_pb2.ApplyPlansRequest(plans=[plan], leader_id=STALE)),
        grpc.StatusCode.FAILED_PRECONDITION,
        f"{STALE} is not the planner leader (current leader: {planner_leader})",
    )
    # a broker leader is not a planner leader
    with_broker = state_pb2.ApplyPlansRequest(plans=[plan], leader_id="test-broker:1")
    await refused(
        state_stub.ApplyPlans(with_broker),
        grpc.StatusCode.FAILED_PRECONDITION,
        "is not the planner leader",
    )
    assert await census(state_app.db) == before


async def test_apply_plans_refuses_a_placement_on_a_node_that_does_not_exist(
    state_app: StateApp, state_stub: state_pb2_grpc.StateAsyncStub, planner_leader: str
) -> None:
    """Decided on the rows the write reads: the whole group commit is
    refused, naming the plan and alloc at fault."""
    node, job = mock.node(), mock.job(job_id="ghost-node", count=2)
    await seed(state_app, node, job)
    good = state_pb2.AppliedPlan(
        eval_id="e1", namespace="default", job_id=job.id, allocs=[mock.alloc(job, node)]
    )
    ghost_node = mock.node()
    bad = state_pb2.AppliedPlan(
        eval_id="e2",
        namespace="default",
        job_id=job.id,
        allocs=[mock.alloc(job, node, index=1), mock.alloc(job, ghost_node, index=2)],
    )
    before = await census(state_app.db)
    await refused(
        state_stub.ApplyPlans(
            state_pb2.ApplyPlansRequest(plans=[good, bad], leader_id=planner_leader)
        ),
        grpc.StatusCode.FAILED_PRECONDITION,
        f"plans[1].allocs[1].node_id: node {ghost_node.id} does not exist",
    )
    assert await census(state_app.db) == before
    # the node registered since: the same plan commits
    await seed(state_app, ghost_node)
    resp = await state_stub.ApplyPlans(
        state_pb2.ApplyPlansRequest(plans=[good, bad], leader_id=planner_leader)
    )
    snap = await state_app.feed.wait_for_index(resp.indexes[-1], 10)
    assert len(snap.allocs_by_job("default", job.id)) == 3


# ---------------------------------------------------------------- broker writes


async def test_eval_and_deployment_writes_need_the_broker_leader(
    state_app: StateApp, state_stub: state_pb2_grpc.StateAsyncStub, broker_leader: str
) -> None:
    node, job = mock.node(), mock.job(job_id="fence-broker")
    alloc = mock.alloc(job, node)
    dep = deployments.new_deployment(job, 0)
    await seed(state_app, node, job, alloc, dep)
    transitions = [state_pb2.AllocTransition(alloc_id=alloc.id)]
    transitions[0].transition.migrate = True
    changed = copy_msg(dep)
    changed.status_description = "rewritten"

    def calls(leader_id: str) -> list[Callable[[], Awaitable[object]]]:
        # lazily: a grpc.aio stub starts its call when called, and the leader's
        # SetDeploymentStatus must not race the UpsertDeployments before it
        return [
            lambda: state_stub.UpsertEvals(
                state_pb2.UpsertEvalsRequest(evals=[pending_eval(job.id)], leader_id=leader_id)
            ),
            lambda: state_stub.UpdateAllocDesiredTransitions(
                state_pb2.UpdateAllocDesiredTransitionsRequest(
                    transitions=transitions, leader_id=leader_id
                )
            ),
            lambda: state_stub.UpsertDeployments(
                state_pb2.UpsertDeploymentsRequest(deployments=[changed], leader_id=leader_id)
            ),
            lambda: state_stub.SetDeploymentStatus(
                state_pb2.SetDeploymentStatusRequest(
                    deployment_id=dep.id, status="failed", leader_id=leader_id
                )
            ),
        ]

    before = await census(state_app.db)
    for call in calls(""):
        await refused(call(), grpc.StatusCode.FAILED_PRECONDITION, "leader_id is required")
    for call in calls(STALE):
        await refused(call(), grpc.StatusCode.FAILED_PRECONDITION, "is not the broker leader")
    assert await census(state_app.db) == before

    # the leader's own writes go through
    for call in calls(broker_leader)[:3]:
        await call()
    snap = await state_app.feed.wait_for_index(await state_app.db.latest_index(), 10)
    stored = snap.alloc_by_id(alloc.id)
    assert stored is not None and stored.desired_transition.migrate
    stored_dep = snap.deployment_by_id(dep.id)
    assert stored_dep is not None and stored_dep.status_description == "rewritten"


# ---------------------------------------------------------------- GarbageCollect


async def test_garbage_collect_refuses_what_is_not_garbage(
    state_app: StateApp, state_stub: state_pb2_grpc.StateAsyncStub
) -> None:
    """Issue #15: GarbageCollect deleted a running job. Every object named
    is checked on its stored row; one that is not garbage refuses the whole
    request, so even the garbage beside it stays."""
    node = mock.node()
    job = mock.job(job_id="alive")
    job.status = JobStatus.RUNNING
    running = mock.alloc(job, node, client_status=ClientStatus.RUNNING)
    stopping = mock.alloc(job, node, index=1, desired_status=DesiredStatus.STOP)
    pending = pending_eval(job.id)
    dep = deployments.new_deployment(job, 0)
    done = pending_eval(job.id, status="complete")
    await seed(state_app, node, job, running, stopping, pending, dep, done)

    cases = [
        (
            state_pb2.GarbageCollectRequest(jobs=[state_pb2.JobRef(job_id=job.id)]),
            "job default/alive",
        ),
        (state_pb2.GarbageCollectRequest(eval_ids=[pending.id]), f"eval {pending.id}"),
        (state_pb2.GarbageCollectRequest(alloc_ids=[running.id]), f"alloc {running.id}"),
        # told to stop, but its client still runs it
        (state_pb2.GarbageCollectRequest(alloc_ids=[stopping.id]), "still running"),
        (state_pb2.GarbageCollectRequest(node_ids=[node.id]), f"node {node.id}"),
        (state_pb2.GarbageCollectRequest(deployment_ids=[dep.id]), f"deployment {dep.id}"),
        # real garbage beside something that is not: nothing goes
        (
            state_pb2.GarbageCollectRequest(eval_ids=[done.id], alloc_ids=[running.id]),
            f"alloc {running.id}",
        ),
    ]
    before = await census(state_app.db)
    for request, needle in cases:
        details = await refused(
            state_stub.GarbageCollect(request), grpc.StatusCode.FAILED_PRECONDITION, needle
        )
        assert "is not garbage" in details
    assert await census(state_app.db) == before


async def test_garbage_collect_deletes_real_garbage(
    state_app: StateApp, state_stub: state_pb2_grpc.StateAsyncStub
) -> None:
    """What the core scheduler collects passes: a dead job with its ended
    allocs, evals and deployment (active still, but its job goes with it),
    and a down node with nothing live on it."""
    node = mock.node(status=NodeStatus.DOWN)
    job = mock.job(job_id="finished")
    job.status, job.stop = JobStatus.DEAD, True
    ended = mock.alloc(job, node, client_status=ClientStatus.COMPLETE)
    ev = pending_eval(job.id, status="complete")
    dep = deployments.new_deployment(job, 0)
    await seed(state_app, node, job, ended, ev, dep)
    resp = await state_stub.GarbageCollect(
        state_pb2.GarbageCollectRequest(
            eval_ids=[ev.id],
            alloc_ids=[ended.id],
            jobs=[state_pb2.JobRef(namespace="default", job_id=job.id)],
            node_ids=[node.id],
            deployment_ids=[dep.id],
        )
    )
    snap = await state_app.feed.wait_for_index(resp.index, 10)
    assert snap.job_by_id("default", job.id) is None
    assert snap.alloc_by_id(ended.id) is None and snap.eval_by_id(ev.id) is None
    assert snap.node_by_id(node.id) is None and snap.deployment_by_id(dep.id) is None


class RecordingGC:
    """The worker's CorePlanner deletions (services/worker/planner_bridge.py),
    recorded as the GarbageCollect requests it sends, in order."""

    def __init__(self) -> None:
        self.requests: list[state_pb2.GarbageCollectRequest] = []

    def submit_plan(self, plan: pb.Plan) -> tuple[pb.PlanResult, StateSnapshot | None]:
        raise AssertionError("the core scheduler submits no plans")

    def update_eval(self, ev: pb.Evaluation) -> None:
        raise AssertionError("core evals are not stored")

    create_eval = reblock_eval = update_eval

    def delete_evals(self, eval_ids: Sequence[str], alloc_ids: Sequence[str]) -> None:
        self.requests.append(
            state_pb2.GarbageCollectRequest(eval_ids=eval_ids, alloc_ids=alloc_ids)
        )

    def delete_jobs(self, jobs: Sequence[tuple[str, str]]) -> None:
        refs = [state_pb2.JobRef(namespace=ns, job_id=job_id) for ns, job_id in jobs]
        self.requests.append(state_pb2.GarbageCollectRequest(jobs=refs))

    def delete_nodes(self, node_ids: Sequence[str]) -> None:
        self.requests.append(state_pb2.GarbageCollectRequest(node_ids=node_ids))

    def delete_deployments(self, deployment_ids: Sequence[str]) -> None:
        self.requests.append(state_pb2.GarbageCollectRequest(deployment_ids=deployment_ids))


async def test_what_the_core_scheduler_collects_the_state_deletes(
    state_app: StateApp, state_stub: state_pb2_grpc.StateAsyncStub
) -> None:
    """The state's rules must never refuse what the core scheduler picks
    (a refused request fails the whole GC run): `force-gc` on the state's
    own snapshot, every request it makes then accepted. A stopped job whose
    alloc its client still runs is left for a later run, by both."""
    up, down = mock.node(), mock.node(status=NodeStatus.DOWN)
    gone = mock.job(job_id="gc-gone")
    gone.status, gone.stop = JobStatus.DEAD, True
    gone_ev = pending_eval(gone.id, status="complete")
    gone_alloc = mock.alloc(gone, down, client_status=ClientStatus.COMPLETE, eval_id=gone_ev.id)
    orphan = mock.alloc(gone, down, index=1, client_status=ClientStatus.COMPLETE)  # no eval
    gone_dep = deployments.new_deployment(gone, 0)
    gone_dep.status = "successful"
    draining = mock.job(job_id="gc-draining")
    draining.status, draining.stop = JobStatus.DEAD, True
    still_running = mock.alloc(draining, up, desired_status=DesiredStatus.STOP)
    web = mock.job(job_id="gc-web")
    web.status = JobStatus.RUNNING
    web_ev = pending_eval(web.id, status="complete")
    web_alloc = mock.alloc(web, up, eval_id=web_ev.id)
    await seed(
        state_app,
        *(up, down, gone, gone_ev, gone_alloc, orphan, gone_dep),
        *(draining, still_running, web, web_ev, web_alloc),
    )

    recorder = RecordingGC()
    CoreScheduler(state_app.feed.snapshot(), recorder, logging.getLogger("gc-test")).process(
        core_eval(CORE_JOB_FORCE_GC)
    )
    assert recorder.requests
    for request in recorder.requests:
        await state_stub.GarbageCollect(request)  # none refused

    snap = await state_app.feed.wait_for_index(await state_app.db.latest_index(), 10)
    assert snap.job_by_id("default", gone.id) is None and snap.node_by_id(down.id) is None
    assert snap.alloc_by_id(orphan.id) is None and snap.deployment_by_id(gone_dep.id) is None
    for kept in (draining, web):
        assert snap.job_by_id("default", kept.id) is not None
    assert snap.alloc_by_id(still_running.id) is not None
    assert snap.eval_by_id(web_ev.id) is not None and snap.node_by_id(up.id) is not None
