"""Periodic jobs in the state service: validation at registration, the
launch record written with the parent and with each child, and the
create-only registration that makes a launch happen once."""

from __future__ import annotations

import time

import grpc
import pytest

from corral.domain import periodic
from corral.testing import mock
from corral.v1 import job_pb2, job_pb2_grpc, query_pb2, state_pb2, state_pb2_grpc
from corral.v1 import structs_pb2 as pb


def periodic_job(job_id: str, **cfg: object) -> pb.Job:
    j = mock.job(job_id=job_id, count=1, job_type="batch")
    for name in ("version", "create_index", "modify_index", "job_modify_index", "status"):
        j.ClearField(name)  # type: ignore[arg-type]
    j.periodic.CopyFrom(pb.PeriodicConfig(enabled=True, **cfg))  # type: ignore[arg-type]
    return j


async def launches(channel: grpc.aio.Channel, job_id: str) -> list[pb.PeriodicLaunch]:
    resp = await state_pb2_grpc.StateStub(channel).PeriodicLaunches(
        state_pb2.PeriodicLaunchesRequest(namespace="default", job_id=job_id)
    )
    return list(resp.launches)


@pytest.mark.parametrize(
    ("cfg", "job_type", "field"),
    [
        ({"spec": "61 * * * *"}, "batch", "job.periodic.spec"),
        ({"crons": ["*/5 * * * *", "bogus"]}, "batch", "job.periodic.crons[1]"),
        ({"spec": "* * * * *", "crons": ["* * * * *"]}, "batch", "job.periodic.crons"),
        ({"spec": "* * * * *", "time_zone": "Mars/Olympus"}, "batch", "job.periodic.time_zone"),
        ({"spec": "0 0 1 1 * 2030"}, "batch", "job.periodic.spec"),
        ({}, "batch", "job.periodic.spec"),
        ({"spec": "* * * * *"}, "service", "job.periodic"),
    ],
)
async def test_invalid_periodic_block_is_refused_naming_the_field(
    channel: grpc.aio.Channel, cfg: dict[str, object], job_type: str, field: str
) -> None:
    job = periodic_job("bad-periodic", **cfg)
    job.type = job_type
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await job_pb2_grpc.JobStub(channel).Register(job_pb2.JobRegisterRequest(job=job))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert (err.value.details() or "").startswith(f"{field}:")


async def test_parent_records_its_registration_and_children_their_launch(
    channel: grpc.aio.Channel,
) -> None:
    stub = job_pb2_grpc.JobStub(channel)
    before = time.time_ns()
    parent = periodic_job("nightly", crons=["0 3 * * *", "0 15 * * *"], time_zone="Europe/Paris")
    resp = await stub.Register(job_pb2.JobRegisterRequest(job=parent))
    assert resp.eval_id == ""  # a periodic parent is never scheduled itself
    (first,) = await launches(channel, "nightly")
    assert before <= first.launch <= time.time_ns()

    # a child registered create-only records the launch its id encodes
    stored = (await stub.Get(job_pb2.JobGetRequest(job_id="nightly"))).job
    at = periodic.from_unix_ns(first.launch + 3600 * 10**9)
    child = periodic.derive_child(stored, at)
    resp = await stub.Register(
        job_pb2.JobRegisterRequest(job=child, enforce_index=True, job_modify_index=0)
    )
    assert resp.eval_id
    evals = await job_pb2_grpc.JobStub(channel).Evaluations(job_pb2.JobGetRequest(job_id=child.id))
    assert [e.triggered_by for e in evals.evals] == ["periodic-job"]
    (rec,) = await launches(channel, "nightly")
    assert rec.launch == int(at.timestamp()) * 10**9 and rec.modify_index == resp.index

    # the same tick registered again is refused, not launched twice
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.Register(
            job_pb2.JobRegisterRequest(job=child, enforce_index=True, job_modify_index=0)
        )
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION

    # an older child never moves the record back
    older = periodic.derive_child(stored, periodic.from_unix_ns(first.launch - 3600 * 10**9))
    await stub.Register(job_pb2.JobRegisterRequest(job=older))
    assert (await launches(channel, "nightly"))[0].launch == rec.launch

    listed = await stub.List(
        job_pb2.JobListRequest(query=query_pb2.QueryOptions(prefix="nightly/"))
    )
    assert {(j.id, j.parent_id) for j in listed.jobs} == {
        (child.id, "nightly"),
        (older.id, "nightly"),
    }
    kids = await stub.Get(job_pb2.JobGetRequest(job_id=child.id))
    assert not kids.job.HasField("periodic") and kids.job.type == "batch"

    # re-registering the parent keeps the record; purging drops it
    await stub.Register(job_pb2.JobRegisterRequest(job=parent))
    assert (await launches(channel, "nightly"))[0].launch == rec.launch
    await stub.Deregister(job_pb2.JobDeregisterRequest(job_id="nightly", purge=True))
    assert await launches(channel, "nightly") == []
