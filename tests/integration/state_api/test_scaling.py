"""Scaling policies and events against a real state service and PostgreSQL:
policies derived from the job at each registration with ids that outlive
versions, Job.Scale within the group's bounds (not during a deployment),
the events it records, and what a purge takes away."""

from __future__ import annotations

import grpc
from google.protobuf.struct_pb2 import Struct

from corral.testing import mock
from corral.v1 import job_pb2, job_pb2_grpc, query_pb2, scaling_pb2, scaling_pb2_grpc
from corral.v1 import structs_pb2 as pb
from services.state.app import StateApp
from tests.integration.state_api.test_namespaces_pools import refused


def scaled(job_id: str, count: int = 2, *, vertical: bool = True) -> pb.Job:
    j = mock.job(job_id=job_id, count=count)
    tg = j.task_groups[0]
    tg.scaling.min, tg.scaling.max = 1, 5
    tg.scaling.policy.update({"cooldown": "1m", "check": [{"cpu": [{"source": "nomad-apm"}]}]})
    if vertical:
        tg.tasks[0].scaling_policies.add(type="vertical_mem", max=2048)
    return j


async def _policies(
    stub: scaling_pb2_grpc.ScalingAsyncStub, *, job: str, type: str = ""
) -> list[str]:
    resp = await stub.ListPolicies(scaling_pb2.ScalingPolicyListRequest(job=job, type=type))
    return sorted(f"{p.type}:{p.target.get('Task', '')}" for p in resp.policies)


async def test_policies_follow_the_job(state_app: StateApp, channel: grpc.aio.Channel) -> None:
    jobs = job_pb2_grpc.JobStub(channel)
    scaling = scaling_pb2_grpc.ScalingStub(channel)
    await jobs.Register(job_pb2.JobRegisterRequest(job=scaled("api")))
    assert await _policies(scaling, job="api") == ["horizontal:", "vertical_mem:web"]
    listed = await scaling.ListPolicies(scaling_pb2.ScalingPolicyListRequest(job="api"))
    by_type = {p.type: p for p in listed.policies}
    horizontal = by_type["horizontal"]
    assert dict(horizontal.target) == {"Namespace": "default", "Job": "api", "Group": "web"}
    got = (await scaling.GetPolicy(scaling_pb2.ScalingPolicyGetRequest(id=horizontal.id))).policy
    assert (got.min, got.max, got.enabled) == (1, 5, True)
    assert got.policy["cooldown"] == "1m"
    # the job carries the stored policy, id included
    job = (await jobs.Get(job_pb2.JobGetRequest(job_id="api"))).job
    assert job.task_groups[0].scaling.id == horizontal.id
    assert job.task_groups[0].scaling.create_index == got.create_index

    # a new version keeps every id; the changed policy is written again
    changed = scaled("api")
    changed.task_groups[0].scaling.max = 8
    await jobs.Register(job_pb2.JobRegisterRequest(job=changed))
    again = (await scaling.GetPolicy(scaling_pb2.ScalingPolicyGetRequest(id=horizontal.id))).policy
    assert again.max == 8 and again.create_index == got.create_index
    assert again.modify_index > got.modify_index
    vertical = by_type["vertical_mem"]
    same = (await scaling.GetPolicy(scaling_pb2.ScalingPolicyGetRequest(id=vertical.id))).policy
    assert same.modify_index == vertical.modify_index  # unchanged: not rewritten

    # an identical registration is no new version (the ids matched)
    before = (await jobs.Get(job_pb2.JobGetRequest(job_id="api"))).job.version
    await jobs.Register(job_pb2.JobRegisterRequest(job=changed))
    assert (await jobs.Get(job_pb2.JobGetRequest(job_id="api"))).job.version == before

    # a policy the job no longer has is deleted; type filters by prefix
    await jobs.Register(job_pb2.JobRegisterRequest(job=scaled("api", vertical=False)))
    assert await _policies(scaling, job="api") == ["horizontal:"]
    assert await _policies(scaling, job="api", type="vertical") == []
    await refused(
        state_app,
        scaling.GetPolicy(scaling_pb2.ScalingPolicyGetRequest(id=vertical.id)),
        grpc.StatusCode.NOT_FOUND,
        "not found",
    )

    # purged, the job takes its policies and events with it
    await jobs.Scale(job_pb2.JobScaleRequest(job_id="api", group="web", count=3))
    await jobs.Deregister(job_pb2.JobDeregisterRequest(job_id="api", purge=True))
    assert await _policies(scaling, job="api") == []
    assert state_app.ctx.feed.snapshot().scaling_events_by_job("default", "api") is None


async def test_scale_within_bounds_and_its_events(
    state_app: StateApp, channel: grpc.aio.Channel
) -> None:
    jobs = job_pb2_grpc.JobStub(channel)
    await jobs.Register(job_pb2.JobRegisterRequest(job=scaled("web", vertical=False)))
    for count, needle in (
        (6, "group count was greater than scaling policy maximum: 6 > 5"),
        (0, "group count was less than scaling policy minimum: 0 < 1"),
    ):
        await refused(
            state_app,
            jobs.Scale(job_pb2.JobScaleRequest(job_id="web", group="web", count=count)),
            grpc.StatusCode.INVALID_ARGUMENT,
            needle,
        )
    await refused(
        state_app,
        jobs.Scale(job_pb2.JobScaleRequest(job_id="web", group="db", count=2)),
        grpc.StatusCode.INVALID_ARGUMENT,
        "task group 'db' specified for scaling does not exist in job",
    )
    meta = Struct()
    meta.update({"reason": "cpu high", "value": 91.5})
    up = await jobs.Scale(
        job_pb2.JobScaleRequest(job_id="web", group="web", count=4, message="up", meta=meta)
    )
    assert up.eval_id
    # no count: an event only (an autoscaler reporting a problem)
    before = (await jobs.Get(job_pb2.JobGetRequest(job_id="web"))).job
    noted = await jobs.Scale(
        job_pb2.JobScaleRequest(job_id="web", group="web", message="no metrics", error=True)
    )
    assert noted.eval_id == "" and noted.index > up.index
    after = (await jobs.Get(job_pb2.JobGetRequest(job_id="web"))).job
    assert after.version == before.version and after.task_groups[0].count == 4
    await refused(
        state_app,
        jobs.Scale(job_pb2.JobScaleRequest(job_id="web", group="web", count=3, error=True)),
        grpc.StatusCode.INVALID_ARGUMENT,
        "a scaling event with error set takes no count",
    )

    status = await jobs.ScaleStatus(job_pb2.JobGetRequest(job_id="web"))
    web = status.task_groups["web"]
    assert web.desired == 4 and status.job_id == "web" and not status.job_stopped
    events = list(web.events)
    assert [(e.message, e.error, e.HasField("count")) for e in events] == [
        ("no metrics", True, False),
        ("up", False, True),
    ]
    assert events[1].count == 4 and events[1].previous_count == 2
    assert events[1].eval_id == up.eval_id and events[1].meta["reason"] == "cpu high"
    assert events[0].create_index == noted.index

    # only the newest 20 are kept
    for i in range(25):
        await jobs.Scale(job_pb2.JobScaleRequest(job_id="web", group="web", message=f"n{i}"))
    status = await jobs.ScaleStatus(job_pb2.JobGetRequest(job_id="web"))
    kept = [e.message for e in status.task_groups["web"].events]
    assert len(kept) == 20 and kept[0] == "n24" and kept[-1] == "n5"


async def test_scaling_is_blocked_while_a_deployment_is_active(
    state_app: StateApp, channel: grpc.aio.Channel
) -> None:
    jobs = job_pb2_grpc.JobStub(channel)
    await jobs.Register(job_pb2.JobRegisterRequest(job=scaled("rolling", vertical=False)))
    job = (await jobs.Get(job_pb2.JobGetRequest(job_id="rolling"))).job
    d = pb.Deployment(
        id="d-rolling",
        namespace="default",
        job_id="rolling",
        job_version=job.version,
        job_create_index=job.create_index,
        status="running",
    )
    async with state_app.ctx.write() as tx:
        tx.put_deployment(d)
    await refused(
        state_app,
        jobs.Scale(job_pb2.JobScaleRequest(job_id="rolling", group="web", count=3)),
        grpc.StatusCode.FAILED_PRECONDITION,
        "job scaling blocked due to active deployment",
    )
    d.status = "successful"
    async with state_app.ctx.write() as tx:
        tx.put_deployment(d)
    resp = await jobs.Scale(job_pb2.JobScaleRequest(job_id="rolling", group="web", count=3))
    assert resp.eval_id


async def test_policies_of_every_namespace(channel: grpc.aio.Channel) -> None:
    scaling = scaling_pb2_grpc.ScalingStub(channel)
    jobs = job_pb2_grpc.JobStub(channel)
    await jobs.Register(job_pb2.JobRegisterRequest(job=scaled("everywhere", vertical=False)))
    everything = await scaling.ListPolicies(
        scaling_pb2.ScalingPolicyListRequest(query=query_pb2.QueryOptions(namespace="*"))
    )
    assert "everywhere" in {p.target["Job"] for p in everything.policies}
    elsewhere = await scaling.ListPolicies(
        scaling_pb2.ScalingPolicyListRequest(query=query_pb2.QueryOptions(namespace="nope"))
    )
    assert not elsewhere.policies
