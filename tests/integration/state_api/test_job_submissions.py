"""Job submissions (Nomad's job_submission table) against a real state
service: the file a version was registered with is kept with that version,
bounded in size and in how many versions keep one, and purged with the job."""

from __future__ import annotations

import grpc
import pytest

from corral.testing import mock
from corral.v1 import job_pb2, job_pb2_grpc, query_pb2
from corral.v1 import structs_pb2 as pb
from services.state.app import StateApp
from services.state.db.database import SUBMISSIONS_KEPT


def _job(job_id: str, env: str = "1") -> pb.Job:
    j = mock.job(job_id=job_id, count=1)
    for name in ("version", "create_index", "modify_index", "job_modify_index", "status"):
        j.ClearField(name)  # type: ignore[arg-type]
    j.task_groups[0].tasks[0].env["V"] = env
    return j


def _sub(source: str, **flags: str) -> pb.JobSubmission:
    return pb.JobSubmission(
        source=source, format="hcl2", variable_flags=flags, variables='x = "1"\n'
    )


async def _get(
    stub: job_pb2_grpc.JobStub, job_id: str, version: int | None = None
) -> pb.JobSubmission:
    req = job_pb2.JobSubmissionRequest(job_id=job_id, query=query_pb2.QueryOptions())
    if version is not None:
        req.version = version
    resp: job_pb2.JobSubmissionResponse = await stub.GetSubmission(req)  # type: ignore[misc]
    return resp.submission


async def test_a_version_keeps_the_file_it_was_registered_with(channel: grpc.aio.Channel) -> None:
    stub = job_pb2_grpc.JobStub(channel)
    first = await stub.Register(
        job_pb2.JobRegisterRequest(job=_job("sub"), submission=_sub("job v0", env="a b"))
    )
    got = await _get(stub, "sub")
    assert (got.source, got.format, dict(got.variable_flags), got.variables) == (
        "job v0", "hcl2", {"env": "a b"}, 'x = "1"\n'
    )  # fmt: skip
    assert (got.namespace, got.job_id, got.version) == ("default", "sub", 0)
    assert got.job_modify_index == first.job_modify_index

    # the same spec again: no new version, and its submission stays the first
    await stub.Register(job_pb2.JobRegisterRequest(job=_job("sub"), submission=_sub("other")))
    assert (await _get(stub, "sub", 0)).source == "job v0"

    # a changed spec: a new version with its own submission; the old one stays
    await stub.Register(job_pb2.JobRegisterRequest(job=_job("sub", "2"), submission=_sub("v1")))
    assert (await _get(stub, "sub")).source == "v1"
    assert (await _get(stub, "sub", 0)).source == "job v0"


async def test_only_the_newest_versions_keep_theirs_and_purge_removes_them(
    state_app: StateApp, channel: grpc.aio.Channel
) -> None:
    stub = job_pb2_grpc.JobStub(channel)
    last = SUBMISSIONS_KEPT + 2
    for v in range(last + 1):
        await stub.Register(
            job_pb2.JobRegisterRequest(job=_job("many", str(v)), submission=_sub(f"v{v}"))
        )
    kept = [v for v in range(last + 1) if await state_app.db.job_submission("default", "many", v)]
    assert kept == list(range(last + 1 - SUBMISSIONS_KEPT, last + 1))
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await _get(stub, "many", 0)
    assert err.value.code() == grpc.StatusCode.NOT_FOUND
    assert "job source not found" in (err.value.details() or "")

    await stub.Deregister(job_pb2.JobDeregisterRequest(job_id="many", purge=True))
    assert not [
        v for v in range(last + 1) if await state_app.db.job_submission("default", "many", v)
    ]


async def test_a_registration_without_a_file_keeps_none(channel: grpc.aio.Channel) -> None:
    stub = job_pb2_grpc.JobStub(channel)
    await stub.Register(job_pb2.JobRegisterRequest(job=_job("bare")))
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await _get(stub, "bare")
    assert err.value.code() == grpc.StatusCode.NOT_FOUND


async def test_a_file_over_the_limit_is_discarded_with_a_warning(
    state_app: StateApp, channel: grpc.aio.Channel
) -> None:
    stub = job_pb2_grpc.JobStub(channel)
    big = "#" * (state_app.ctx.job_max_source_size + 1)
    resp = await stub.Register(job_pb2.JobRegisterRequest(job=_job("big"), submission=_sub(big)))
    assert (
        resp.eval_id and "exceeds maximum" in resp.warnings and "will be discarded" in resp.warnings
    )
    with pytest.raises(grpc.aio.AioRpcError):
        await _get(stub, "big")


async def test_an_unknown_format_is_refused_and_nothing_is_written(
    state_app: StateApp, channel: grpc.aio.Channel
) -> None:
    stub = job_pb2_grpc.JobStub(channel)
    before = await state_app.db.latest_index()
    bad = pb.JobSubmission(source="x", format="yaml")
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.Register(job_pb2.JobRegisterRequest(job=_job("fmt"), submission=bad))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "submission.format" in (err.value.details() or "")
    assert await state_app.db.latest_index() == before
