"""`pause_eval_broker` through the real processes: the operator sets it in
the state's scheduler configuration, the broker sees it in its replica and
stops handing evals out while still recording them; unsetting it hands out
what arrived meanwhile, to a dequeuer that was already waiting."""

from __future__ import annotations

import asyncio

from corral.security import transport
from corral.testing import mock
from corral.v1 import eval_pb2, eval_pb2_grpc, operator_pb2, operator_pb2_grpc
from corral.v1 import structs_pb2 as pb
from tests.cluster import Cluster
from tests.integration.broker.test_broker_process import (
    cluster,  # noqa: F401  (fixture)
    dequeue,
    finish,
    pending,
    write,
)


async def set_paused(cluster: Cluster, paused: bool) -> int:  # noqa: F811
    async with transport.dial(cluster.state_addr) as ch:
        resp = await operator_pb2_grpc.OperatorStub(ch).SchedulerSetConfiguration(
            operator_pb2.SchedulerSetConfigurationRequest(
                config=pb.SchedulerConfiguration(pause_eval_broker=paused)
            )
        )
    return int(resp.index)


async def ready_count(stub: eval_pb2_grpc.EvalAsyncStub) -> int:
    stats: eval_pb2.BrokerStats = await stub.Stats(eval_pb2.BrokerStatsRequest())
    return int(stats.total_ready)


async def test_paused_broker_records_but_hands_out_nothing_until_unpaused(
    cluster: Cluster,  # noqa: F811
) -> None:
    held = pending("held")
    await write(cluster.dsn, mock.job(job_id="held"), held)
    async with transport.dial(cluster.procs["broker"].address) as ch:
        stub = eval_pb2_grpc.EvalStub(ch)
        got = await dequeue(stub, 5000)
        assert got.eval.id == held.id  # outstanding while the broker is paused

        await set_paused(cluster, True)
        # written after the pause, so once the broker has it, it has the pause too
        late = pending("late")
        await write(cluster.dsn, mock.job(job_id="late"), late)
        for _ in range(400):  # up to 20 s for the broker's replica
            if await ready_count(stub) == 1:
                break
            await asyncio.sleep(0.05)
        else:
            raise AssertionError("the broker never recorded the eval written while paused")
        nothing = await dequeue(stub, 1000)
        assert not nothing.eval.id
        assert await ready_count(stub) == 1
        # what was outstanding is still acked with its token, from the feed
        await finish(cluster, stub, got)

        waiting = asyncio.create_task(dequeue(stub, 30_000))
        await set_paused(cluster, False)
        woken = await asyncio.wait_for(waiting, 30)
        assert woken.eval.id == late.id
        await finish(cluster, stub, woken)
