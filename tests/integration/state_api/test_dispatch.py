"""Job.Dispatch against a real state service and PostgreSQL: the child job,
its eval at the same index, and every refusal naming its problem."""

from __future__ import annotations

import re

import grpc
import pytest

from corral.domain import dispatch
from corral.v1 import job_pb2, job_pb2_grpc, query_pb2
from corral.v1 import structs_pb2 as pb
from services.state.app import StateApp
from tests.integration.state_api.test_jobs import job


def parameterized(job_id: str, payload: str = "optional") -> pb.Job:
    j = job(job_id, type="batch")
    j.meta["owner"] = "ops"
    j.parameterized.CopyFrom(
        pb.ParameterizedConfig(payload=payload, meta_required=["input"], meta_optional=["mode"])
    )
    j.task_groups[0].tasks[0].dispatch_payload.file = "input/data.txt"
    return j


async def test_dispatch_writes_the_child_and_its_eval_at_one_index(
    state_app: StateApp, channel: grpc.aio.Channel
) -> None:
    stub = job_pb2_grpc.JobStub(channel)
    reg = await stub.Register(job_pb2.JobRegisterRequest(job=parameterized("render")))
    assert reg.eval_id == ""  # a parameterized parent is never scheduled itself
    resp = await stub.Dispatch(
        job_pb2.JobDispatchRequest(
            job_id="render", payload=b"frame 7", meta={"input": "scene.blend", "mode": "fast"}
        )
    )
    assert re.fullmatch(r"render/dispatch-\d{10}-[0-9a-f]{8}", resp.dispatched_job_id)
    assert resp.eval_id and resp.eval_create_index == resp.index == resp.job_create_index
    batch = (await state_app.db.read_log(resp.index - 1, 1))[0]
    kinds = [(e.topic, e.type) for e in batch.events]
    assert kinds == [("Job", "JobRegistered"), ("Evaluation", "EvaluationUpdated")]
    ev = batch.events[1].evaluation
    assert ev.id == resp.eval_id and ev.job_id == resp.dispatched_job_id
    assert ev.type == "batch" and ev.triggered_by == "job-register"

    got = await stub.Get(job_pb2.JobGetRequest(job_id=resp.dispatched_job_id))
    child = got.job
    assert child.dispatched and child.parent_id == "render"
    assert child.name == child.id == resp.dispatched_job_id
    assert not child.HasField("parameterized")
    assert child.payload == b"frame 7"
    assert dict(child.meta) == {"owner": "ops", "input": "scene.blend", "mode": "fast"}
    assert child.task_groups[0].tasks[0].dispatch_payload.file == "input/data.txt"
    assert child.version == 0 and child.status == "pending"

    prefixed = await stub.Dispatch(
        job_pb2.JobDispatchRequest(
            job_id="render", meta={"input": "b"}, id_prefix_template="nightly"
        )
    )
    assert re.fullmatch(r"render/dispatch-nightly-\d{10}-[0-9a-f]{8}", prefixed.dispatched_job_id)
    listed = await stub.List(
        job_pb2.JobListRequest(query=query_pb2.QueryOptions(prefix="render/dispatch-"))
    )
    assert {j.id for j in listed.jobs} == {resp.dispatched_job_id, prefixed.dispatched_job_id}


async def _refused(
    stub: job_pb2_grpc.JobAsyncStub, req: job_pb2.JobDispatchRequest
) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.Dispatch(req)
    return err.value


@pytest.mark.parametrize(
    ("payload_rule", "payload", "meta", "needle"),
    [
        ("required", b"", {"input": "x"}, "payload: payload is required"),
        ("forbidden", b"data", {"input": "x"}, "payload: payload is forbidden"),
        (
            "optional",
            b"x" * (dispatch.PAYLOAD_LIMIT + 1),
            {"input": "x"},
            f"payload: payload is {dispatch.PAYLOAD_LIMIT + 1} bytes, more than the 16384",
        ),
        ("optional", b"", {}, "meta: missing required meta keys: input"),
        (
            "optional",
            b"",
            {"input": "x", "colour": "red"},
            "meta: meta keys not allowed by the parameterized job: colour",
        ),
    ],
)
async def test_bad_dispatches_are_refused_and_nothing_is_written(
    state_app: StateApp,
    channel: grpc.aio.Channel,
    payload_rule: str,
    payload: bytes,
    meta: dict[str, str],
    needle: str,
) -> None:
    stub = job_pb2_grpc.JobStub(channel)
    parent = f"bad-{payload_rule}-{len(payload)}-{len(meta)}"
    await stub.Register(job_pb2.JobRegisterRequest(job=parameterized(parent, payload_rule)))
    before = await state_app.db.latest_index()
    err = await _refused(
        stub, job_pb2.JobDispatchRequest(job_id=parent, payload=payload, meta=meta)
    )
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert needle in (err.details() or "")
    assert await state_app.db.latest_index() == before


async def test_dispatch_of_unknown_plain_or_stopped_jobs_is_refused(
    state_app: StateApp, channel: grpc.aio.Channel
) -> None:
    stub = job_pb2_grpc.JobStub(channel)
    err = await _refused(stub, job_pb2.JobDispatchRequest(job_id="no-such-job"))
    assert err.code() == grpc.StatusCode.NOT_FOUND

    await stub.Register(job_pb2.JobRegisterRequest(job=job("plain-batch", type="batch")))
    err = await _refused(stub, job_pb2.JobDispatchRequest(job_id="plain-batch"))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "is not a parameterized job" in (err.details() or "")

    await stub.Register(job_pb2.JobRegisterRequest(job=parameterized("stopped-parent")))
    await stub.Deregister(job_pb2.JobDeregisterRequest(job_id="stopped-parent"))
    err = await _refused(
        stub, job_pb2.JobDispatchRequest(job_id="stopped-parent", meta={"input": "x"})
    )
    assert err.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "is stopped" in (err.details() or "")


async def test_a_child_of_a_child_cannot_be_dispatched(
    state_app: StateApp, channel: grpc.aio.Channel
) -> None:
    stub = job_pb2_grpc.JobStub(channel)
    await stub.Register(job_pb2.JobRegisterRequest(job=parameterized("nested")))
    child = await stub.Dispatch(job_pb2.JobDispatchRequest(job_id="nested", meta={"input": "x"}))
    err = await _refused(
        stub, job_pb2.JobDispatchRequest(job_id=child.dispatched_job_id, meta={"input": "x"})
    )
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    err = await _refused(
        stub,
        job_pb2.JobDispatchRequest(
            job_id="nested", meta={"input": "x"}, id_prefix_template="bad prefix!"
        ),
    )
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert (err.details() or "").startswith("id_prefix_template:")


async def test_only_dispatch_makes_a_dispatched_job_and_parameterized_is_for_life(
    state_app: StateApp, channel: grpc.aio.Channel
) -> None:
    stub = job_pb2_grpc.JobStub(channel)
    forged = parameterized("forged")
    forged.ClearField("parameterized")
    forged.dispatched = True
    err = await _register_refused(stub, forged)
    assert "job.dispatched: is set only by dispatching a parameterized job" in err

    await stub.Register(job_pb2.JobRegisterRequest(job=job("turned", type="batch")))
    err = await _register_refused(stub, parameterized("turned"))
    assert "job.parameterized: job 'turned' is not parameterized" in err

    await stub.Register(job_pb2.JobRegisterRequest(job=parameterized("kept")))
    plain = parameterized("kept")
    plain.ClearField("parameterized")
    err = await _register_refused(stub, plain)
    assert "job.parameterized: job 'kept' is parameterized" in err

    # a dispatched child may get new versions (e.g. `job inspect` edited and run)
    resp = await stub.Dispatch(job_pb2.JobDispatchRequest(job_id="kept", meta={"input": "x"}))
    child = (await stub.Get(job_pb2.JobGetRequest(job_id=resp.dispatched_job_id))).job
    child.priority = 80
    again = await stub.Register(job_pb2.JobRegisterRequest(job=child))
    assert again.version == 1
    child.dispatched = False
    err = await _register_refused(stub, child)
    assert "job.dispatched: is read-only" in err


async def _register_refused(stub: job_pb2_grpc.JobAsyncStub, j: pb.Job) -> str:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.Register(job_pb2.JobRegisterRequest(job=j))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    return err.value.details() or ""
