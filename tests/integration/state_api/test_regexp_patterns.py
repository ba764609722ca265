"""Issue 26, finding 1: a `regexp` target is compiled by RE2 (Go's syntax,
linear time) when the job is registered, as Nomad's `Constraint.Validate`
does; what RE2 refuses is INVALID_ARGUMENT naming the field, and nothing is
written. (The scheduler side, a catastrophic pattern placed in bounded
time, is tests/unit/scheduler/test_regexp_linear.py.)"""

from __future__ import annotations

from collections.abc import Callable

import grpc
import pytest

from corral.testing import mock
from corral.v1 import job_pb2, job_pb2_grpc
from corral.v1 import structs_pb2 as pb
from services.state.app import StateApp

LOOKAHEAD = "^(?=web)"  # Python's re takes it; RE2 and Go refuse it
BACKREFERENCE = r"(a)\1"


def _job_constraint(j: pb.Job) -> None:
    del j.constraints[:]
    j.constraints.add(l_target="${attr.kernel.name}", operand="regexp", r_target=LOOKAHEAD)


def _group_constraint(j: pb.Job) -> None:
    j.task_groups[0].constraints.add(
        l_target="${meta.rack}", operand="regexp", r_target=BACKREFERENCE
    )


def _task_affinity(j: pb.Job) -> None:
    j.task_groups[0].tasks[0].affinities.add(
        l_target="${node.class}", operand="regexp", r_target="a{1001}", weight=50
    )


def _device_constraint(j: pb.Job) -> None:
    dev = j.task_groups[0].tasks[0].resources.devices.add(name="gpu", count=1)
    dev.constraints.add(l_target="${device.model}", operand="regexp", r_target="(")


def _datacenter_too_long(j: pb.Job) -> None:
    j.datacenters[:] = ["*" + "a" * 1_000_000]


@pytest.mark.parametrize(
    ("mutate", "field", "problem"),
    [
        (_job_constraint, "job.constraints[0].r_target", "invalid perl operator: (?="),
        (
            _group_constraint,
            "job.task_groups[0].constraints[0].r_target",
            "invalid escape sequence: \\1",
        ),
        (
            _task_affinity,
            "job.task_groups[0].tasks[0].affinities[0].r_target",
            "invalid repetition size",
        ),
        (
            _device_constraint,
            "job.task_groups[0].tasks[0].resources.devices[0].constraints[0].r_target",
            "missing )",
        ),
        (_datacenter_too_long, "job.datacenters[0]", "longer than 128"),
    ],
)
async def test_patterns_re2_refuses_are_refused_at_registration(
    state_app: StateApp,
    channel: grpc.aio.Channel,
    mutate: Callable[[pb.Job], None],
    field: str,
    problem: str,
) -> None:
    job = mock.job(count=1)
    mutate(job)
    before = await state_app.db.latest_index()
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await job_pb2_grpc.JobStub(channel).Register(job_pb2.JobRegisterRequest(job=job))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, err.value.details()
    details = err.value.details() or ""
    assert details.startswith(field), details
    assert problem in details, details
    assert await state_app.db.latest_index() == before


async def test_go_syntax_python_lacks_is_accepted(
    state_app: StateApp, channel: grpc.aio.Channel
) -> None:
    """`\\pL` (a Unicode class) is Go and RE2 syntax that Python's re refuses;
    the catastrophic `(a+)+$` compiles (RE2 runs it in linear time)."""
    job = mock.job(count=1)
    job.constraints.add(l_target="${node.unique.name}", operand="regexp", r_target=r"^\pL+")
    job.constraints.add(l_target="${meta.x}", operand="regexp", r_target="^(a+)+$")
    resp = await job_pb2_grpc.JobStub(channel).Register(job_pb2.JobRegisterRequest(job=job))
    assert resp.index > 0
