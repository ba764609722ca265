"""Job.Evaluate and Job.Stable against a real state service and PostgreSQL
(Nomad's force-evaluate and job stability): an eval of the job as it
stands, failed allocs forced to reschedule only where Nomad would, periodic
and parameterized jobs refused; one version marked stable or not, the
current one's job row with it."""

from __future__ import annotations

import grpc
import pytest

from corral.domain.structs import HOUR, ClientStatus, Trigger, copy_msg
from corral.testing import mock
from corral.v1 import eval_pb2, eval_pb2_grpc, job_pb2, job_pb2_grpc, query_pb2
from corral.v1 import structs_pb2 as pb
from services.state.app import StateApp


def _spec(job_id: str, *, env: str = "1", reschedules: bool = True) -> pb.Job:
    j = mock.job(job_id=job_id, count=3)
    for name in ("version", "create_index", "modify_index", "job_modify_index", "status"):
        j.ClearField(name)  # type: ignore[arg-type]
    j.task_groups[0].tasks[0].env["V"] = env
    policy = pb.ReschedulePolicy(attempts=2 if reschedules else 0, interval=HOUR)
    j.task_groups[0].reschedule_policy.CopyFrom(policy)
    return j


async def _register(channel: grpc.aio.Channel, job: pb.Job) -> job_pb2.JobRegisterResponse:
    resp: job_pb2.JobRegisterResponse = await job_pb2_grpc.JobStub(channel).Register(
        job_pb2.JobRegisterRequest(job=job)
    )
    return resp


async def _current(channel: grpc.aio.Channel, job_id: str, index: int) -> pb.Job:
    got = await job_pb2_grpc.JobStub(channel).Get(
        job_pb2.JobGetRequest(job_id=job_id, query=query_pb2.QueryOptions(min_index=index - 1))
    )
    return got.job


async def _allocs(state_app: StateApp, job: pb.Job, node: pb.Node) -> dict[str, pb.Allocation]:
    """A failed alloc not yet replaced, a failed one already replaced, a
    running one."""
    made = {
        "failed": mock.alloc(job, node, index=0, client_status=ClientStatus.FAILED),
        "replaced": mock.alloc(job, node, index=1, client_status=ClientStatus.FAILED),
        "running": mock.alloc(job, node, index=2),
    }
    made["replaced"].next_allocation = made["running"].id
    async with state_app.db.write() as tx:
        for a in made.values():
            tx.put_alloc(copy_msg(a))
    return made


async def _stored(state_app: StateApp, alloc_id: str) -> pb.Allocation:
    async with state_app.db.write() as tx:
        found = (await tx.get_allocs([alloc_id]))[alloc_id]
    return found


@pytest.mark.parametrize("reschedules", [True, False])
async def test_evaluate_forces_only_failed_allocs_not_yet_replaced(
    state_app: StateApp, channel: grpc.aio.Channel, reschedules: bool
) -> None:
    registered = await _register(channel, _spec("ev", reschedules=reschedules))
    job = await _current(channel, "ev", registered.index)
    node = mock.node()
    made = await _allocs(state_app, job, node)
    jobs = job_pb2_grpc.JobStub(channel)
    resp = await jobs.Evaluate(job_pb2.JobEvaluateRequest(job_id="ev", force_reschedule=True))
    assert resp.eval_id and resp.index > registered.index
    assert resp.eval_create_index == resp.index and resp.job_modify_index == job.job_modify_index
    ev = await eval_pb2_grpc.EvalsStub(channel).Get(
        eval_pb2.EvalGetRequest(
            eval_id=resp.eval_id, query=query_pb2.QueryOptions(min_index=resp.index - 1)
        )
    )
    assert ev.eval.triggered_by == Trigger.JOB_REGISTER and ev.eval.job_id == "ev"
    forced = {
        name
        for name, a in made.items()
        if (await _stored(state_app, a.id)).desired_transition.force_reschedule
    }
    # a group whose policy never reschedules is left alone, as Nomad's
    assert forced == ({"failed"} if reschedules else set())


async def test_evaluate_without_force_only_creates_an_eval(
    state_app: StateApp, channel: grpc.aio.Channel
) -> None:
    registered = await _register(channel, _spec("plain"))
    job = await _current(channel, "plain", registered.index)
    made = await _allocs(state_app, job, mock.node())
    resp = await job_pb2_grpc.JobStub(channel).Evaluate(job_pb2.JobEvaluateRequest(job_id="plain"))
    assert resp.eval_id
    assert not (await _stored(state_app, made["failed"].id)).desired_transition.force_reschedule


async def test_evaluate_refuses_what_nomad_refuses(channel: grpc.aio.Channel) -> None:
    periodic = _spec("nightly")
    periodic.type = "batch"
    periodic.task_groups[0].ClearField("reschedule_policy")
    periodic.periodic.CopyFrom(pb.PeriodicConfig(enabled=True, crons=["0 3 * * *"]))
    await _register(channel, periodic)
    jobs = job_pb2_grpc.JobStub(channel)
    for job_id, code, text in (
        ("nightly", grpc.StatusCode.INVALID_ARGUMENT, "can't evaluate periodic job"),
        ("no-such-job", grpc.StatusCode.NOT_FOUND, "not found"),
    ):
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await jobs.Evaluate(job_pb2.JobEvaluateRequest(job_id=job_id))
        assert err.value.code() == code and text in (err.value.details() or "")


async def test_stable_marks_one_version(channel: grpc.aio.Channel) -> None:
    await _register(channel, _spec("st", env="1"))
    second = await _register(channel, _spec("st", env="2"))
    assert second.version == 1
    jobs = job_pb2_grpc.JobStub(channel)

    async def stability(index: int) -> dict[int, bool]:
        got = await jobs.Versions(
            job_pb2.JobVersionsRequest(
                job_id="st", query=query_pb2.QueryOptions(min_index=index - 1)
            )
        )
        return {v.version: v.stable for v in got.versions}

    resp = await jobs.Stable(job_pb2.JobStableRequest(job_id="st", version=0, stable=True))
    assert resp.job_modify_index == second.job_modify_index
    assert await stability(resp.index) == {0: True, 1: False}
    assert not (await _current(channel, "st", resp.index)).stable
    resp = await jobs.Stable(job_pb2.JobStableRequest(job_id="st", version=1, stable=True))
    assert await stability(resp.index) == {0: True, 1: True}
    assert (await _current(channel, "st", resp.index)).stable
    resp = await jobs.Stable(job_pb2.JobStableRequest(job_id="st", version=0, stable=False))
    assert await stability(resp.index) == {0: False, 1: True}
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await jobs.Stable(job_pb2.JobStableRequest(job_id="st", version=7, stable=True))
    assert err.value.code() == grpc.StatusCode.NOT_FOUND
    assert "at version 7 not found" in (err.value.details() or "")
