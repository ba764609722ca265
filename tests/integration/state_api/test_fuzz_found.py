"""Input the fuzz test (tests/fuzz) found answered with the wrong status:
each is now refused with the status naming the problem, and writes
nothing."""

from __future__ import annotations

import grpc
import pytest

from corral.domain import structs
from corral.testing import mock
from corral.v1 import job_pb2, job_pb2_grpc, node_pb2, node_pb2_grpc
from corral.v1 import structs_pb2 as pb
from services.state.app import StateApp


async def _refused(state_app: StateApp, call: object, needle: str) -> None:
    before = await state_app.db.latest_index()
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await call  # type: ignore[misc]
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, err.value.details()
    assert needle in (err.value.details() or ""), err.value.details()
    assert await state_app.db.latest_index() == before


async def test_a_drain_deadline_past_any_time_is_refused(
    state_app: StateApp, channel: grpc.aio.Channel
) -> None:
    """A deadline of 7.4e18 ns made now + deadline overflow int64: INTERNAL
    ("Value out of range") from the write."""
    nodes = node_pb2_grpc.NodeStub(channel)
    node = mock.node()
    await nodes.Register(node_pb2.NodeRegisterRequest(node=node))
    huge = pb.DrainStrategy(deadline=7_427_928_804_145_758_231)
    await _refused(
        state_app,
        nodes.UpdateDrain(node_pb2.NodeUpdateDrainRequest(node_id=node.id, drain_strategy=huge)),
        "drain_strategy.deadline: must be at most 876000 hours",
    )
    # the longest deadline allowed is still a valid time
    longest = pb.DrainStrategy(deadline=100 * 365 * 24 * structs.HOUR)
    resp = await nodes.UpdateDrain(
        node_pb2.NodeUpdateDrainRequest(node_id=node.id, drain_strategy=longest)
    )
    assert resp.index > 0


async def test_a_status_echoing_a_huge_id_still_reaches_the_caller(
    state_app: StateApp, channel: grpc.aio.Channel
) -> None:
    """NOT_FOUND "node '<10,000 characters>' not found" made a trailer over
    the client's metadata limit: the caller got RESOURCE_EXHAUSTED ("received
    metadata size exceeds hard limit") and never the status."""
    nodes = node_pb2_grpc.NodeStub(channel)
    for node_id in ("é" * 5_000, "x" * 10_000, "😀" * 3_000):
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await nodes.Get(node_pb2.NodeGetRequest(node_id=node_id))
        assert err.value.code() == grpc.StatusCode.NOT_FOUND, err.value.details()
        details = err.value.details() or ""
        assert details.startswith("node '") and details.endswith(" ... (truncated)"), details


def _job_with(field: str, value: int) -> pb.Job:
    job = mock.job(count=1)
    tg = job.task_groups[0]
    if field.startswith("update."):
        tg.update.max_parallel = 1
        setattr(tg.update, field.split(".")[1], value)
    elif field.startswith("reschedule_policy."):
        setattr(tg.reschedule_policy, field.split(".")[1], value)
    elif field.startswith("disconnect."):
        setattr(tg.disconnect, field.split(".")[1], value)
    else:
        setattr(tg.tasks[0], field, value)
    return job


@pytest.mark.parametrize(
    ("field", "value", "problem"),
    [
        # made the planner's plan merge overflow (now + progress_deadline):
        # every plan of the job failed, its eval never placed anything
        ("update.progress_deadline", 2**63 - 1, "must be at most 876000 hours"),
        ("update.healthy_deadline", 2**62, "must be at most 876000 hours"),
        ("reschedule_policy.interval", 2**63 - 1, "must be at most 876000 hours"),
        ("disconnect.lost_after", 2**63 - 1, "must be at most 876000 hours"),
        ("kill_timeout", 2**63 - 1, "must be at most 876000 hours"),
    ],
)
async def test_durations_past_any_time_are_refused(
    state_app: StateApp, channel: grpc.aio.Channel, field: str, value: int, problem: str
) -> None:
    job = _job_with(field, value)
    await _refused(
        state_app,
        job_pb2_grpc.JobStub(channel).Register(job_pb2.JobRegisterRequest(job=job)),
        f"job.task_groups[0].{'tasks[0].' if '.' not in field else ''}{field}: {problem}",
    )


async def test_a_growing_reschedule_delay_needs_a_ceiling(
    state_app: StateApp, channel: grpc.aio.Channel
) -> None:
    """An exponential delay without max_delay doubles on each reschedule,
    past the int64 clock after some thirty."""
    job = mock.job(count=1)
    job.task_groups[0].reschedule_policy.CopyFrom(
        pb.ReschedulePolicy(delay=30 * structs.SECOND, delay_function="exponential", unlimited=True)
    )
    await _refused(
        state_app,
        job_pb2_grpc.JobStub(channel).Register(job_pb2.JobRegisterRequest(job=job)),
        "job.task_groups[0].reschedule_policy.max_delay: must be at least delay",
    )


async def test_an_eval_priority_out_of_range_is_refused(
    state_app: StateApp, channel: grpc.aio.Channel
) -> None:
    """eval_priority 2**31 - 1 was written on the eval; the worker's update
    of it was then refused by the state, which the broker answered INTERNAL."""
    jobs = job_pb2_grpc.JobStub(channel)
    for priority in (2**31 - 1, 101, -1):
        await _refused(
            state_app,
            jobs.Register(job_pb2.JobRegisterRequest(job=mock.job(), eval_priority=priority)),
            "eval_priority: must be between 1 and 100",
        )
    resp = await jobs.Register(job_pb2.JobRegisterRequest(job=mock.job(), eval_priority=100))
    assert resp.eval_id


async def test_scale_holds_a_job_to_the_bounds_of_register(
    state_app: StateApp, channel: grpc.aio.Channel
) -> None:
    """Job.Scale took any count: 2**31 - 1 was registered and the worker's
    scheduler spun on it until killed (a bound Job.Register had since
    d0339f1). The fuzz saw it as a worker that would not stop on SIGTERM."""
    jobs = job_pb2_grpc.JobStub(channel)
    job = mock.job(count=0)
    for name in ("a", "b"):
        g = job.task_groups.add()
        g.CopyFrom(job.task_groups[0])
        g.name = name
        g.count = 100_000
    await jobs.Register(job_pb2.JobRegisterRequest(job=job))
    for count in (2**31 - 1, 100_001):
        await _refused(
            state_app,
            jobs.Scale(job_pb2.JobScaleRequest(job_id=job.id, group="web", count=count)),
            "count: must be between 0 and 100000",
        )
    await _refused(
        state_app,
        jobs.Scale(job_pb2.JobScaleRequest(job_id=job.id, group="web", count=2)),
        "count: would make the job ask for 200002 allocations, more than 200000",
    )
    # within the bounds it scales
    resp = await jobs.Scale(job_pb2.JobScaleRequest(job_id=job.id, group="a", count=99_999))
    assert resp.index > 0 and resp.eval_id
