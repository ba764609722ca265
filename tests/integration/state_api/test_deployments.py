"""Deployments in the state, against a real state service and PostgreSQL:
counts that follow plans and client health, the watcher's status write
(stability, auto-revert), Job.Revert and the public Deployment API."""

from __future__ import annotations

import grpc
import pytest

from corral.domain import deployments
from corral.domain.structs import SECOND, DeploymentStatus, copy_msg
from corral.testing import mock
from corral.v1 import (
    deployment_pb2,
    deployment_pb2_grpc,
    job_pb2,
    job_pb2_grpc,
    query_pb2,
    state_pb2,
    state_pb2_grpc,
)
from corral.v1 import structs_pb2 as pb
from services.state.app import StateApp
from services.state.writes.nodes import update_allocs
from services.state.writes.plans import apply_plan


def _job(job_id: str, *, auto_revert: bool = False, env: str = "1") -> pb.Job:
    j = mock.job(job_id=job_id, count=2)
    for name in ("version", "create_index", "modify_index", "job_modify_index", "status"):
        j.ClearField(name)  # type: ignore[arg-type]
    j.task_groups[0].tasks[0].env["V"] = env
    j.update.CopyFrom(
        pb.UpdateStrategy(
            max_parallel=1,
            min_healthy_time=SECOND,
            healthy_deadline=10 * SECOND,
            progress_deadline=60 * SECOND,
            auto_revert=auto_revert,
        )
    )
    return j


async def _register(channel: grpc.aio.Channel, job: pb.Job) -> pb.Job:
    stub = job_pb2_grpc.JobStub(channel)
    resp = await stub.Register(job_pb2.JobRegisterRequest(job=job))
    got = await stub.Get(
        job_pb2.JobGetRequest(job_id=job.id, query=query_pb2.QueryOptions(min_index=resp.index - 1))
    )
    return got.job


async def _deploy(state_app: StateApp, job: pb.Job, node: pb.Node) -> pb.Deployment:
    """What a scheduler's plan does: a deployment and two allocs in it."""
    d = deployments.new_deployment(job, 0)
    tg = job.task_groups[0]
    d.task_groups[tg.name].CopyFrom(deployments.group_state(job.update, tg))
    allocs = []
    for i in range(2):
        a = mock.alloc(job, node, index=i)
        a.deployment_id = d.id
        allocs.append(a)
    async with state_app.db.write() as tx:
        await apply_plan(
            tx,
            state_pb2.AppliedPlan(
                eval_id="e", namespace=job.namespace, job_id=job.id, allocs=allocs, deployment=d
            ),
            tx.index,
        )
    return d


async def _health(
    state_app: StateApp, node: pb.Node, job: pb.Job, healthy: bool, at: int = 0
) -> None:
    """A client reports every alloc of the job healthy (or unhealthy), at
    `at` by its clock (default: now)."""
    async with state_app.db.write() as tx:
        allocs = await tx.allocs_by_job(job.namespace, job.id)
        updates = []
        for a in allocs:
            u = pb.Allocation(
                id=a.id,
                node_id=node.id,
                client_status="running",
                deployment_id=a.deployment_id,
            )
            u.deployment_status.healthy = healthy
            u.deployment_status.timestamp = at or tx.now
            updates.append(u)
        await update_allocs(tx, updates, node.secret_id)


async def _stored(state_app: StateApp, deployment_id: str) -> pb.Deployment:
    async with state_app.db.write() as tx:
        d = await tx.get_deployment(deployment_id)
    assert d is not None
    return d


@pytest.fixture
async def node(state_app: StateApp) -> pb.Node:
    n = mock.node()
    async with state_app.db.write() as tx:
        tx.put_node(copy_msg(n))  # the stored copy keeps only the secret's hash
    return n


async def test_registration_refuses_what_is_not_implemented(channel: grpc.aio.Channel) -> None:
    for field, value, word in (("auto_promote", True, "canary"), ("health_check", "bogus", "")):
        job = _job("refused")
        setattr(job.update, field, value)
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await job_pb2_grpc.JobStub(channel).Register(job_pb2.JobRegisterRequest(job=job))
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert field in (err.value.details() or "") and word in (err.value.details() or "")


async def test_promote_only_healthy_canaries(
    state_app: StateApp, channel: grpc.aio.Channel, node: pb.Node
) -> None:
    spec = _job("canaried")
    spec.update.canary = 2
    job = await _register(channel, spec)
    d = await _deploy(state_app, job, node)
    async with state_app.db.write() as tx:  # the scheduler placed both as canaries
        allocs = await tx.allocs_by_job(job.namespace, job.id)
        found = await tx.get_deployment(d.id)
        assert found is not None
        stored = copy_msg(found)
        for a in allocs:
            a = copy_msg(a)
            a.deployment_status.canary = True
            tx.put_alloc(a)
            stored.task_groups["web"].placed_canaries.append(a.id)
        tx.put_deployment(stored)
    api = deployment_pb2_grpc.DeploymentStub(channel)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await api.Promote(deployment_pb2.DeploymentPromoteRequest(deployment_id=d.id, all=True))
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    await _health(state_app, node, job, True)
    async with state_app.db.write() as tx:  # the canary flag survives the client's report
        assert all(a.deployment_status.canary for a in await tx.allocs_by_job("default", job.id))
    resp = await api.Promote(deployment_pb2.DeploymentPromoteRequest(deployment_id=d.id))
    assert resp.eval_id
    assert (await _stored(state_app, d.id)).task_groups["web"].promoted


async def test_counts_follow_plans_and_client_health(
    state_app: StateApp, channel: grpc.aio.Channel, node: pb.Node
) -> None:
    job = await _register(channel, _job("counted"))
    d = await _deploy(state_app, job, node)
    stored = await _stored(state_app, d.id)
    assert stored.task_groups["web"].placed_allocs == 2
    assert stored.task_groups["web"].require_progress_by > 0
    before = stored.task_groups["web"].require_progress_by
    await _health(state_app, node, job, True)
    stored = await _stored(state_app, d.id)
    assert stored.task_groups["web"].healthy_allocs == 2
    assert stored.task_groups["web"].require_progress_by >= before
    # a repeated report changes nothing
    await _health(state_app, node, job, True)
    assert (await _stored(state_app, d.id)).task_groups["web"].healthy_allocs == 2


async def test_a_client_clock_far_ahead_does_not_push_the_deadline(
    state_app: StateApp, channel: grpc.aio.Channel, node: pb.Node
) -> None:
    """A health report stamped near the end of time (a clock far ahead, or
    a lying node; the gRPC fuzzer sent one) moves the progress deadline from
    the server's clock, never beyond it (it overflowed int64 before)."""
    job = await _register(channel, _job("far-ahead"))
    d = await _deploy(state_app, job, node)
    await _health(state_app, node, job, True, at=2**63 - 10)
    stored = (await _stored(state_app, d.id)).task_groups["web"]
    assert stored.healthy_allocs == 2
    assert 0 < stored.require_progress_by < 2**62


async def test_success_marks_the_version_stable_and_ends_the_deployment(
    state_app: StateApp, channel: grpc.aio.Channel, node: pb.Node, broker_leader: str
) -> None:
    job = await _register(channel, _job("stable"))
    d = await _deploy(state_app, job, node)
    state = state_pb2_grpc.StateStub(channel)
    # decided on the stored counts: not before every alloc is healthy
    with pytest.raises(grpc.aio.AioRpcError) as early:
        await state.SetDeploymentStatus(
            state_pb2.SetDeploymentStatusRequest(
                leader_id=broker_leader, deployment_id=d.id, status="successful"
            )
        )
    assert early.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "leader" not in (early.value.details() or "")
    await _health(state_app, node, job, True)
    resp = await state.SetDeploymentStatus(
        state_pb2.SetDeploymentStatusRequest(
            leader_id=broker_leader,
            deployment_id=d.id,
            status=DeploymentStatus.SUCCESSFUL,
            status_description=deployments.DESC_SUCCESSFUL,
        )
    )
    versions = await job_pb2_grpc.JobStub(channel).Versions(
        job_pb2.JobVersionsRequest(
            job_id=job.id, query=query_pb2.QueryOptions(min_index=resp.index - 1)
        )
    )
    assert [v.stable for v in versions.versions] == [True]
    assert (await _stored(state_app, d.id)).status == DeploymentStatus.SUCCESSFUL
    # decided on the stored row: an ended deployment cannot end again
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await state.SetDeploymentStatus(
            state_pb2.SetDeploymentStatusRequest(
                leader_id=broker_leader, deployment_id=d.id, status="failed"
            )
        )
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION


async def test_failure_with_auto_revert_registers_the_stable_version_again(
    state_app: StateApp, channel: grpc.aio.Channel, node: pb.Node, broker_leader: str
) -> None:
    v0 = await _register(channel, _job("revert", auto_revert=True, env="good"))
    d0 = await _deploy(state_app, v0, node)
    await _health(state_app, node, v0, True)
    state = state_pb2_grpc.StateStub(channel)
    await state.SetDeploymentStatus(
        state_pb2.SetDeploymentStatusRequest(
            leader_id=broker_leader, deployment_id=d0.id, status="successful"
        )
    )
    v1 = await _register(channel, _job("revert", auto_revert=True, env="bad"))
    assert v1.version == 1
    d1 = await _deploy(state_app, v1, node)
    # the watcher's reasons must hold on the stored deployment
    for reason in (deployments.DESC_FAILED_ALLOCS, deployments.DESC_PROGRESS_DEADLINE):
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await state.SetDeploymentStatus(
                state_pb2.SetDeploymentStatusRequest(
                    leader_id=broker_leader,
                    deployment_id=d1.id,
                    status="failed",
                    status_description=reason,
                )
            )
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "leader" not in (err.value.details() or "")
    await _health(state_app, node, v1, False)
    resp = await state.SetDeploymentStatus(
        state_pb2.SetDeploymentStatusRequest(
            leader_id=broker_leader,
            deployment_id=d1.id,
            status="failed",
            status_description=deployments.DESC_FAILED_ALLOCS,
        )
    )
    assert resp.reverted and resp.reverted_job_version == 2
    versions = await job_pb2_grpc.JobStub(channel).Versions(
        job_pb2.JobVersionsRequest(
            job_id="revert", query=query_pb2.QueryOptions(min_index=resp.index - 1)
        )
    )
    by_version = {v.version: v for v in versions.versions}
    assert sorted(by_version) == [0, 1, 2]
    assert by_version[2].task_groups[0].tasks[0].env["V"] == "good"
    stored = await _stored(state_app, d1.id)
    assert stored.status == DeploymentStatus.FAILED
    assert stored.status_description.endswith("rolling back to job version 0")


async def test_job_revert_and_the_deployment_api(
    state_app: StateApp, channel: grpc.aio.Channel, node: pb.Node
) -> None:
    await _register(channel, _job("api", env="a"))
    v1 = await _register(channel, _job("api", env="b"))
    d = await _deploy(state_app, v1, node)
    api = deployment_pb2_grpc.DeploymentStub(channel)
    listed = await api.List(deployment_pb2.DeploymentListRequest(job_id="api"))
    assert [x.id for x in listed.deployments] == [d.id]
    got = await api.Get(deployment_pb2.DeploymentGetRequest(deployment_id=d.id[:8]))
    assert got.deployment.id == d.id and len(got.allocs) == 2

    paused = await api.Pause(deployment_pb2.DeploymentPauseRequest(deployment_id=d.id, pause=True))
    assert not paused.eval_id
    assert (await _stored(state_app, d.id)).status == DeploymentStatus.PAUSED
    resumed = await api.Pause(deployment_pb2.DeploymentPauseRequest(deployment_id=d.id))
    assert resumed.eval_id
    failed = await api.Fail(deployment_pb2.DeploymentFailRequest(deployment_id=d.id))
    assert failed.eval_id and not failed.reverted  # no auto_revert asked
    assert (await _stored(state_app, d.id)).status == DeploymentStatus.FAILED

    jobs = job_pb2_grpc.JobStub(channel)
    resp = await jobs.Revert(job_pb2.JobRevertRequest(job_id="api", version=0))
    assert resp.version == 2 and resp.eval_id
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await jobs.Revert(
            job_pb2.JobRevertRequest(
                job_id="api", version=1, enforce_prior_version=True, prior_version=1
            )
        )
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION


async def test_manual_health_is_set_through_the_api(
    state_app: StateApp, channel: grpc.aio.Channel, node: pb.Node
) -> None:
    spec = _job("manual")
    spec.update.health_check = "manual"
    job = await _register(channel, spec)
    d = await _deploy(state_app, job, node)
    async with state_app.db.write() as tx:
        a, b = sorted(await tx.allocs_by_job("default", "manual"), key=lambda x: x.name)
    api = deployment_pb2_grpc.DeploymentStub(channel)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await api.SetAllocHealth(
            deployment_pb2.DeploymentAllocHealthRequest(
                deployment_id=d.id, healthy_alloc_ids=["not-in-it"]
            )
        )
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    resp = await api.SetAllocHealth(
        deployment_pb2.DeploymentAllocHealthRequest(
            deployment_id=d.id, healthy_alloc_ids=[a.id], unhealthy_alloc_ids=[b.id]
        )
    )
    assert resp.eval_id
    state = (await _stored(state_app, d.id)).task_groups["web"]
    assert (state.healthy_allocs, state.unhealthy_allocs) == (1, 1)
