"""Planner processes (`python -m services.planner`) with a real broker process
and an in-process state service on the module's PostgreSQL: the token check,
a standby's answer, and a crash between evaluate and apply
(`CORRAL_PLANNER_FAULT=exit-before-apply`) that commits nothing while the
retry after a restart succeeds."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest

from corral.errors import LEADER_METADATA_KEY
from corral.structs import ClientStatus, EvalStatus, JobType, Trigger, new_id
from corral.testing import mock
from corral.testing.invariants import check_state, errors, fetch_snapshot
from corral.v1 import eval_pb2, eval_pb2_grpc, plan_pb2, plan_pb2_grpc
from corral.v1 import structs_pb2 as pb
from services.planner.applier import FAULT_EXIT_STATUS
from services.state.app import StateApp
from tests.integration.planner.conftest import seed

ROOT = Path(__file__).resolve().parents[3]

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("services.broker.__main__") is None
    or importlib.util.find_spec("corral.leader") is None,
    reason="needs the broker process and corral.leader",
)


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen[bytes]
    address: str
    log: Path

    def alive(self) -> bool:
        return self.popen.poll() is None

    async def wait(self, timeout: float) -> int | None:
        """Exit status, polling without blocking the event loop (the state
        service these processes talk to runs on it)."""
        deadline = time.monotonic() + timeout
        while self.popen.poll() is None and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        return self.popen.poll()

    async def stop(self) -> None:
        if self.alive():
            os.killpg(self.popen.pid, signal.SIGTERM)
            if await self.wait(15) is None:
                os.killpg(self.popen.pid, signal.SIGKILL)
                self.popen.wait(10)


async def spawn(
    tmp: Path, name: str, module: str, args: list[str], env: dict[str, str] | None = None
) -> Proc:
    ready = tmp / f"{name}.ready.json"
    log = tmp / f"{name}.log"
    ready.unlink(missing_ok=True)
    popen = subprocess.Popen(
        [sys.executable, "-m", module, "--ready-file", str(ready), *args],
        cwd=ROOT,
        env={**os.environ, "CORRAL_LOG_FORMAT": "text", **(env or {})},
        stdout=log.open("ab"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if ready.exists():
            return Proc(name, popen, json.loads(ready.read_text())["address"], log)
        if popen.poll() is not None:
            break
        await asyncio.sleep(0.05)
    raise RuntimeError(f"{name} not ready:\n{log.read_text(errors='replace')[-3000:]}")


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("planner-procs")


@pytest.fixture(scope="module")
async def broker(pg_dsn: str, state_addr: str, workdir: Path) -> AsyncIterator[Proc]:
    proc = await spawn(
        workdir,
        "broker",
        "services.broker",
        ["--dsn", pg_dsn, "--state-addr", state_addr, "--listen", "127.0.0.1:0"],
    )
    yield proc
    await proc.stop()


def planner_args(pg_dsn: str, state_addr: str, broker: Proc) -> list[str]:
    return [
        "--dsn",
        pg_dsn,
        "--state-addr",
        state_addr,
        "--broker-addr",
        broker.address,
        "--listen",
        "127.0.0.1:0",
    ]


@pytest.fixture
async def channels() -> AsyncIterator[dict[str, grpc.aio.Channel]]:
    opened: dict[str, grpc.aio.Channel] = {}
    yield opened
    for ch in opened.values():
        await ch.close()


def plan_stub(channels: dict[str, grpc.aio.Channel], address: str) -> plan_pb2_grpc.PlanAsyncStub:
    if address not in channels:
        channels[address] = grpc.aio.insecure_channel(address)
    return plan_pb2_grpc.PlanStub(channels[address])


async def wait_leader(stub: plan_pb2_grpc.PlanAsyncStub, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            stats = await stub.Stats(plan_pb2.PlanStatsRequest(), timeout=5)
            if stats.enabled:
                return
        except grpc.aio.AioRpcError:
            pass
        await asyncio.sleep(0.1)
    raise TimeoutError("planner did not become leader")


async def outstanding_eval(
    state_app: StateApp, broker: Proc, job: pb.Job, node: pb.Node
) -> tuple[pb.Evaluation, str, int]:
    """Seed a node, a job and its pending eval; dequeue it from the broker."""
    ev = pb.Evaluation(
        id=new_id(),
        namespace=job.namespace,
        priority=job.priority,
        type=JobType.SERVICE,
        triggered_by=Trigger.JOB_REGISTER,
        job_id=job.id,
        status=EvalStatus.PENDING,
    )
    index = await seed(state_app, nodes=[node], jobs=[job])
    async with state_app.db.write() as tx:
        tx.put_eval(ev)
    async with grpc.aio.insecure_channel(broker.address) as ch:
        stub = eval_pb2_grpc.EvalStub(ch)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            resp = await stub.Dequeue(
                eval_pb2.EvalDequeueRequest(
                    schedulers=[JobType.SERVICE], timeout_ms=1000, scheduler_version=1
                ),
                timeout=10,
            )
            if resp.eval.id == ev.id:
                return resp.eval, resp.token, max(index, tx.index)
            if resp.eval.id:  # some other test's eval: hand it back
                await stub.Ack(eval_pb2.EvalAckRequest(eval_id=resp.eval.id, token=resp.token))
    raise TimeoutError("eval never dequeued")


def placement_plan(
    ev: pb.Evaluation, token: str, job: pb.Job, node: pb.Node, index: int
) -> pb.Plan:
    plan = pb.Plan(
        eval_id=ev.id, eval_token=token, priority=ev.priority, job=job, snapshot_index=index
    )
    for i in range(2):
        a = mock.alloc(job, node, index=i, client_status=ClientStatus.PENDING, eval_id=ev.id)
        plan.node_allocation[node.id].allocs.append(a)
    return plan


async def test_token_check_standby_and_commit(
    pg_dsn: str,
    state_app: StateApp,
    state_addr: str,
    broker: Proc,
    workdir: Path,
    channels: dict[str, grpc.aio.Channel],
) -> None:
    leader = await spawn(
        workdir, "planner-a", "services.planner", planner_args(pg_dsn, state_addr, broker)
    )
    standby: Proc | None = None
    try:
        stub = plan_stub(channels, leader.address)
        await wait_leader(stub)
        standby = await spawn(
            workdir, "planner-b", "services.planner", planner_args(pg_dsn, state_addr, broker)
        )
        node, job = mock.node(), mock.job()
        ev, token, index = await outstanding_eval(state_app, broker, job, node)

        # a stale token is refused before anything is queued
        stale = placement_plan(ev, "not-" + token, job, node, index)
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stub.Submit(plan_pb2.PlanSubmitRequest(plan=stale), timeout=30)
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION

        # a standby points at the leader
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await plan_stub(channels, standby.address).Submit(
                plan_pb2.PlanSubmitRequest(plan=stale), timeout=30
            )
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
        md = dict(err.value.trailing_metadata() or ())
        assert md.get(LEADER_METADATA_KEY) == leader.address

        # a malformed plan names the field
        bad = placement_plan(ev, token, job, node, index)
        bad.node_allocation[node.id].allocs[0].id = ""
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stub.Submit(plan_pb2.PlanSubmitRequest(plan=bad), timeout=30)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert f"plan.node_allocation[{node.id}].allocs[0].id" in (err.value.details() or "")

        good = placement_plan(ev, token, job, node, index)
        resp = await stub.Submit(plan_pb2.PlanSubmitRequest(plan=good), timeout=30)
        assert resp.index == resp.result.alloc_index > index
        assert len(resp.result.node_allocation[node.id].allocs) == 2
        stats = await stub.Stats(plan_pb2.PlanStatsRequest())
        assert stats.enabled and stats.plans_applied >= 1 and stats.commits >= 1

        # the leader goes away: the standby takes over and commits the next plan
        await leader.stop()
        taken_over = plan_stub(channels, standby.address)
        await wait_leader(taken_over)
        more = placement_plan(ev, token, job, node, resp.index)
        resp2 = await taken_over.Submit(plan_pb2.PlanSubmitRequest(plan=more), timeout=30)
        assert resp2.index > resp.index
    finally:
        await leader.stop()
        if standby is not None:
            await standby.stop()
    assert not errors(await check_state(state_addr))


async def test_crash_between_evaluate_and_apply_commits_nothing(
    pg_dsn: str,
    state_app: StateApp,
    state_addr: str,
    broker: Proc,
    workdir: Path,
    channels: dict[str, grpc.aio.Channel],
) -> None:
    args = planner_args(pg_dsn, state_addr, broker)
    faulty = await spawn(
        workdir,
        "planner-faulty",
        "services.planner",
        args,
        {"CORRAL_PLANNER_FAULT": "exit-before-apply"},
    )
    try:
        stub = plan_stub(channels, faulty.address)
        await wait_leader(stub)
        node, job = mock.node(), mock.job()
        ev, token, index = await outstanding_eval(state_app, broker, job, node)
        plan = placement_plan(ev, token, job, node, index)
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stub.Submit(plan_pb2.PlanSubmitRequest(plan=plan), timeout=30)
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
        assert await faulty.wait(15) == FAULT_EXIT_STATUS
    finally:
        await faulty.stop()
    snap = await fetch_snapshot(state_addr)
    assert snap.allocs_by_job(job.namespace, job.id) == []

    restarted = await spawn(workdir, "planner-restarted", "services.planner", args)
    try:
        stub = plan_stub(channels, restarted.address)
        await wait_leader(stub)
        resp = await stub.Submit(plan_pb2.PlanSubmitRequest(plan=plan), timeout=30)
        assert resp.result.alloc_index > index and not resp.result.rejected_nodes
    finally:
        await restarted.stop()
    snap = await fetch_snapshot(state_addr)
    assert len(snap.allocs_by_job(job.namespace, job.id)) == 2
    assert not errors(await check_state(state_addr))
