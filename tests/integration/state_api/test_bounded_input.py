"""Input no scheduler or database can cope with is refused at the door:
INVALID_ARGUMENT naming the field, nothing written (the index does not
move), never INTERNAL. The cases were found from outside: a count of
2**31 - 1 that made a worker grow until it was killed, 2,001 groups, NUL
bytes and a 200-character namespace that reached PostgreSQL; and (issue 26)
regular expressions RE2 refuses."""

from __future__ import annotations

from collections.abc import Callable

import grpc
import pytest

from corral.testing import mock
from corral.v1 import job_pb2, job_pb2_grpc, node_pb2, node_pb2_grpc
from corral.v1 import structs_pb2 as pb
from services.state.app import StateApp


def _huge_count(j: pb.Job) -> None:
    j.task_groups[0].count = 2_147_483_647


def _many_groups(j: pb.Job) -> None:
    for i in range(2_000):
        g = j.task_groups.add()
        g.CopyFrom(j.task_groups[0])
        g.name = f"g{i}"
        g.count = 1


def _many_allocs(j: pb.Job) -> None:
    for i in range(3):
        g = j.task_groups.add()
        g.CopyFrom(j.task_groups[0])
        g.name = f"big{i}"
        g.count = 100_000


def _nul_in_meta(j: pb.Job) -> None:
    j.meta["owner"] = "a\x00b"


def _nul_in_task_config(j: pb.Job) -> None:
    j.task_groups[0].tasks[0].config["command"] = "/bin/sh\x00"


def _long_namespace(j: pb.Job) -> None:
    j.namespace = "n" * 200


def _bad_namespace(j: pb.Job) -> None:
    j.namespace = "team a/../b"


# issue 26, finding 1: a `regexp` target RE2 refuses (lookaround,
# backreferences, too large) is refused at registration naming it, as Nomad's
# Constraint.Validate; tests/unit/scheduler/test_regexp_linear.py shows the
# scheduler matching a catastrophic pattern in bounded time
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
        (_huge_count, "job.task_groups[0].count", "between 0 and 100000"),
        (_many_groups, "job.task_groups", "more than 1000"),
        (_many_allocs, "job.task_groups", "more than 200000"),
        (_nul_in_meta, "job.meta[owner]", "NUL"),
        (_nul_in_task_config, "job.task_groups[0].tasks[0].config", "NUL"),
        (_long_namespace, "job.namespace", "longer than 128"),
        (_bad_namespace, "job.namespace", "letters, digits"),
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
async def test_unbounded_jobs_are_refused_and_write_nothing(
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
    assert details.startswith(field) and problem in details, details
    assert await state_app.db.latest_index() == before


async def test_nul_bytes_in_ids_and_nodes_are_refused(
    state_app: StateApp, channel: grpc.aio.Channel
) -> None:
    before = await state_app.db.latest_index()
    jobs = job_pb2_grpc.JobStub(channel)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await jobs.Deregister(job_pb2.JobDeregisterRequest(job_id="web\x00"))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    node = mock.node()
    node.attributes["kernel.name"] = "linux\x00"
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await node_pb2_grpc.NodeStub(channel).Register(node_pb2.NodeRegisterRequest(node=node))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "node.attributes[kernel.name]" in (err.value.details() or "")
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
