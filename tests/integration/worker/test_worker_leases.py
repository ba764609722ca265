"""Worker leases over real processes (issue 19): a worker killed with -9
while it holds an eval loses its lease, and another worker gets the eval
within 10 s (the nack timeout stays at its 60 s default); a worker busy in
a long scheduling run keeps its lease (the heartbeat does not wait for the
scheduler); a dequeue acked without its outcome written is refused, and
the eval does not stay pending: a real worker schedules it."""

from __future__ import annotations

import time
from collections.abc import Callable

import grpc
import pytest

from corral.security import transport
from corral.v1 import eval_pb2, eval_pb2_grpc, worker_pb2
from tests.cluster import Cluster
from tests.integration.worker.test_worker_process import (
    add_nodes,
    admin,
    eval_status,
    job,
    placed,
    plan_commits,
    register,
)
from tests.leaders import in_office
from tests.wait import until


async def start_servers(c: Cluster, *broker_args: str) -> None:
    c.start("state")
    broker = c.start("broker", *broker_args)
    c.start("planner", "--broker-addr", c.broker_addr)
    await in_office(broker.address)  # the tests call it with bare stubs


async def test_a_killed_workers_eval_is_redelivered_within_10_s(
    make_cluster: Callable[..., Cluster],
) -> None:
    c = make_cluster()
    await start_servers(c)  # default nack timeout (60 s) and lease ttl (5 s)
    c.start(
        "worker",
        "--num-schedulers",
        "1",
        env={"CORRAL_WORKER_FAULT": "stall-before-ack"},
        name="doomed",
    )
    await add_nodes(c.dsn)
    eval_id = await register(c, job("leased", count=2))
    await until(lambda: "stalling before ack" in c.log("doomed"))
    # its plan committed; the outcome and the ack (one State.DecideEval) never go out
    assert placed(c.dsn, "leased") == 2
    assert eval_status(c.dsn, eval_id) == "pending"
    c.start("worker", "--num-schedulers", "1", name="rescuer")
    killed = time.monotonic()
    c.kill("doomed")

    async def rescued() -> bool:
        listed = await admin(c, "rescuer", "List", worker_pb2.WorkerListRequest())
        return sum(w.evals_processed for w in listed.workers) >= 1

    await until(rescued, timeout=10, what="the killed worker's eval run by the rescuer")
    print(f"killed worker's eval redelivered and run in {time.monotonic() - killed:.1f} s")
    assert "lost its lease: nacked 1 eval(s) " + eval_id in c.log("broker")
    assert placed(c.dsn, "leased") == 2
    assert plan_commits(c.dsn, "leased") == 1  # the redelivery planned nothing new


async def test_a_slow_worker_keeps_its_lease(make_cluster: Callable[..., Cluster]) -> None:
    c = make_cluster()
    await start_servers(c, "--worker-lease-ttl", "2")
    c.start(
        "worker", "--num-schedulers", "1", env={"CORRAL_WORKER_FAULT": "busy-scheduler"}, name="w"
    )
    await add_nodes(c.dsn)
    eval_id = await register(c, job("slow", count=2))
    await until(lambda: "busy scheduler on eval" in c.log("w"))
    started = time.monotonic()
    await until(lambda: eval_status(c.dsn, eval_id) == "complete", timeout=30)
    assert time.monotonic() - started > 2 * 2  # the run outlived two lease ttls ...
    assert "lost its lease" not in c.log("broker")  # ... and kept its lease
    assert plan_commits(c.dsn, "slow") == 1


async def test_ack_without_the_outcome_written_does_not_leave_the_eval_pending(
    make_cluster: Callable[..., Cluster],
) -> None:
    c = make_cluster()
    await start_servers(c, "--worker-lease-ttl", "2")
    await add_nodes(c.dsn)
    eval_id = await register(c, job("careless", count=2))
    async with transport.dial(c.broker_addr) as ch:
        stub = eval_pb2_grpc.EvalStub(ch)
        got = await stub.Dequeue(
            eval_pb2.EvalDequeueRequest(
                schedulers=["service"], timeout_ms=5000, scheduler_version=1, worker_id="careless"
            )
        )
        assert got.eval.id == eval_id
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stub.Ack(eval_pb2.EvalAckRequest(eval_id=eval_id, token=got.token))
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    # the careless caller neither nacks nor heartbeats: its lease lapses and
    # a real worker schedules the eval
    c.start("worker", "--num-schedulers", "1")
    await until(lambda: eval_status(c.dsn, eval_id) == "complete", timeout=20)
    assert placed(c.dsn, "careless") == 2
