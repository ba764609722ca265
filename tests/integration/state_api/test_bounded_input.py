"""Input no scheduler or database can cope with is refused at the door:
INVALID_ARGUMENT naming the field, nothing written (the index does not
move), never INTERNAL. The cases were found from outside: a count of
2**31 - 1 that made a worker grow until it was killed, 2,001 groups, NUL
bytes and a 200-character namespace that reached PostgreSQL."""

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
