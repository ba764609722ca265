"""The public Job API against a real state service and PostgreSQL."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import grpc
import pytest

from corral.testing import mock
from corral.v1 import job_pb2, job_pb2_grpc, query_pb2
from corral.v1 import structs_pb2 as pb
from services.state.app import StateApp
from services.state.db.database import WriteTx


def job(job_id: str, **kw: object) -> pb.Job:
    j = mock.job(job_id=job_id, count=2)
    for name in ("version", "create_index", "modify_index", "job_modify_index", "status"):
        j.ClearField(name)  # type: ignore[arg-type]
    for k, v in kw.items():
        setattr(j, k, v)
    return j


async def test_register_writes_job_and_eval_at_one_index(
    state_app: StateApp, channel: grpc.aio.Channel
) -> None:
    stub = job_pb2_grpc.JobStub(channel)
    resp = await stub.Register(job_pb2.JobRegisterRequest(job=job("atomic")))
    batch = (await state_app.db.read_log(resp.index - 1, 1))[0]
    assert batch.index == resp.index
    kinds = [(e.topic, e.type) for e in batch.events]
    assert kinds == [("Job", "JobRegistered"), ("Evaluation", "EvaluationUpdated")]
    assert batch.events[1].evaluation.id == resp.eval_id
    assert batch.events[1].evaluation.status == "pending"
    assert batch.events[1].evaluation.job_modify_index == resp.job_modify_index == resp.index


async def test_injected_failure_mid_registration_leaves_neither(
    state_app: StateApp, channel: grpc.aio.Channel, monkeypatch: pytest.MonkeyPatch
) -> None:
    stub = job_pb2_grpc.JobStub(channel)
    before = await state_app.db.latest_index()

    def boom(self: WriteTx, ev: pb.Evaluation, *args: object, **kw: object) -> None:
        raise RuntimeError("injected failure after the job was written")

    monkeypatch.setattr(WriteTx, "put_eval", boom)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.Register(job_pb2.JobRegisterRequest(job=job("half")))
    assert err.value.code() == grpc.StatusCode.INTERNAL
    monkeypatch.undo()
    assert await state_app.db.latest_index() == before
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.Get(job_pb2.JobGetRequest(job_id="half"))
    assert err.value.code() == grpc.StatusCode.NOT_FOUND
    async with state_app.db.write() as tx:
        assert await tx.get_job("default", "half") is None
        assert not await tx.evals_by_job("default", "half")


async def test_versions_check_index_and_identical_reregistration(
    state_app: StateApp, channel: grpc.aio.Channel
) -> None:
    stub = job_pb2_grpc.JobStub(channel)
    first = await stub.Register(job_pb2.JobRegisterRequest(job=job("versioned")))
    same = await stub.Register(job_pb2.JobRegisterRequest(job=job("versioned")))
    assert same.version == first.version == 0 and same.eval_id != first.eval_id
    assert same.job_modify_index == first.job_modify_index
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.Register(
            job_pb2.JobRegisterRequest(
                job=job("versioned", priority=70), enforce_index=True, job_modify_index=1
            )
        )
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "conflicting job modify index" in (err.value.details() or "")
    changed = await stub.Register(
        job_pb2.JobRegisterRequest(
            job=job("versioned", priority=70),
            enforce_index=True,
            job_modify_index=first.job_modify_index,
        )
    )
    assert changed.version == 1
    await state_app.feed.wait_for_index(changed.index, 10)
    versions = await stub.Versions(job_pb2.JobVersionsRequest(job_id="versioned"))
    assert [v.version for v in versions.versions] == [1, 0]


Mutate = Callable[[pb.Job], None]


def _neg_memory(j: pb.Job) -> None:
    j.task_groups[0].tasks[0].resources.memory_mb = -1


def _no_id(j: pb.Job) -> None:
    j.id = ""


def _bad_type(j: pb.Job) -> None:
    j.type = "bogus"


def _dup_group(j: pb.Job) -> None:
    j.task_groups.append(j.task_groups[0])


def _huge(j: pb.Job) -> None:
    j.meta["blob"] = "x" * (1024 * 1024 + 10)


def _bad_operand(j: pb.Job) -> None:
    j.constraints[0].operand = "~~"


def _neg_count(j: pb.Job) -> None:
    j.task_groups[0].count = -2


def _dup_action(j: pb.Job) -> None:
    j.task_groups[0].tasks[0].actions.extend([pb.Action(name="a", command="x")] * 2)


def _action_without_command(j: pb.Job) -> None:
    j.task_groups[0].tasks[0].actions.add(name="a")


@pytest.mark.parametrize(
    ("mutate", "needle"),
    [
        (_no_id, "job.id: is required"),
        (_dup_action, "job.task_groups[0].tasks[0].actions[1].name: action 'a' is defined more"),
        (_action_without_command, "actions[0].command: action 'a': command cannot be empty"),
        (_bad_type, "job.type: unknown value 'bogus'"),
        (_neg_memory, "job.task_groups[0].tasks[0].resources.memory_mb: must not be negative"),
        (_dup_group, "job.task_groups[1].name: duplicate task group"),
        (_huge, "bytes, more than"),
        (_bad_operand, "job.constraints[0].operand"),
        (_neg_count, "job.task_groups[0].count: must be between 0 and 100000"),
    ],
)
async def test_bad_jobs_are_refused_and_nothing_is_written(
    state_app: StateApp, channel: grpc.aio.Channel, mutate: Mutate, needle: str
) -> None:
    stub = job_pb2_grpc.JobStub(channel)
    before = await state_app.db.latest_index()
    bad = job("bad")
    mutate(bad)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.Register(job_pb2.JobRegisterRequest(job=bad))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert needle in (err.value.details() or ""), err.value.details()
    assert await state_app.db.latest_index() == before


async def test_a_jobs_actions_are_kept_and_read_back(
    state_app: StateApp, channel: grpc.aio.Channel
) -> None:
    stub = job_pb2_grpc.JobStub(channel)
    j = job("with-actions")
    j.task_groups[0].tasks[0].actions.extend(
        [
            pb.Action(name="greet", command="/bin/sh", args=["-c", "echo hi"]),
            pb.Action(name="id", command="id"),
        ]
    )
    await stub.Register(job_pb2.JobRegisterRequest(job=j))
    got = (await stub.Get(job_pb2.JobGetRequest(job_id="with-actions"))).job
    assert got.task_groups[0].tasks[0].actions == j.task_groups[0].tasks[0].actions


async def test_blocking_list_wakes_on_a_change_and_times_out_cleanly(
    state_app: StateApp, channel: grpc.aio.Channel
) -> None:
    stub = job_pb2_grpc.JobStub(channel)
    first = await stub.List(job_pb2.JobListRequest())
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    timed_out = await stub.List(
        job_pb2.JobListRequest(
            query=query_pb2.QueryOptions(min_index=first.meta.index, wait_ms=300)
        )
    )
    assert loop.time() - t0 >= 0.3 and timed_out.meta.index == first.meta.index
    waiter = asyncio.ensure_future(
        stub.List(
            job_pb2.JobListRequest(
                query=query_pb2.QueryOptions(min_index=first.meta.index, wait_ms=20_000)
            )
        )
    )
    await asyncio.sleep(0.1)
    assert not waiter.done()
    reg = await stub.Register(job_pb2.JobRegisterRequest(job=job("wakes")))
    woke = await asyncio.wait_for(waiter, 10)
    assert woke.meta.index >= reg.index
    assert "wakes" in [j.id for j in woke.jobs]


async def test_pagination_prefix_and_deregister(
    state_app: StateApp, channel: grpc.aio.Channel
) -> None:
    stub = job_pb2_grpc.JobStub(channel)
    last = None
    for i in range(5):
        last = await stub.Register(job_pb2.JobRegisterRequest(job=job(f"page-{i}")))
    assert last is not None
    await state_app.feed.wait_for_index(last.index, 10)
    seen: list[str] = []
    token = ""
    while True:
        resp = await stub.List(
            job_pb2.JobListRequest(
                query=query_pb2.QueryOptions(prefix="page-", per_page=2, next_token=token)
            )
        )
        seen += [j.id for j in resp.jobs]
        token = resp.meta.next_token
        if not token:
            break
    assert seen == [f"page-{i}" for i in range(5)]
    stop = await stub.Deregister(job_pb2.JobDeregisterRequest(job_id="page-0"))
    await state_app.feed.wait_for_index(stop.index, 10)
    got = await stub.Get(job_pb2.JobGetRequest(job_id="page-0"))
    assert got.job.stop and got.job.version == 1
    purge = await stub.Deregister(job_pb2.JobDeregisterRequest(job_id="page-1", purge=True))
    await state_app.feed.wait_for_index(purge.index, 10)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.Get(job_pb2.JobGetRequest(job_id="page-1"))
    assert err.value.code() == grpc.StatusCode.NOT_FOUND
