"""Nothing stays stuck in a real broker process (issue 19): an Ack of an
eval still pending in the state is refused and the eval stays outstanding,
so a nack redelivers it; the first delivery's late decision acks nothing;
the normal path (the holder's decision, acked from the feed) releases it;
and the leader's reconciler finds evals of the state its feed lost (a
test-only fault drops every eval change the router sees)."""

from __future__ import annotations

from collections.abc import Callable

import grpc
import pytest

from corral.domain.structs import copy_msg
from corral.security import transport
from corral.testing import mock
from corral.v1 import eval_pb2, eval_pb2_grpc
from tests.cluster import Cluster
from tests.integration.broker.test_broker_process import (
    FAST,
    decide,
    dequeue,
    eval_rows,
    finish,
    held,
    ignored,
    pending,
    write,
)
from tests.wait import until


async def test_ack_of_a_pending_eval_is_refused_and_it_is_redelivered(
    make_cluster: Callable[..., Cluster],
) -> None:
    c = make_cluster()
    c.start("state")
    broker = c.start("broker", *FAST, "--initial-nack-delay", "0")
    e = pending("unwritten")
    await write(c.dsn, mock.job(job_id="unwritten"), e)
    async with transport.dial(broker.address) as ch:
        stub = eval_pb2_grpc.EvalStub(ch)
        got = await dequeue(stub)
        assert got.eval.id == e.id
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stub.Ack(eval_pb2.EvalAckRequest(eval_id=e.id, token=got.token))
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "still pending in the state" in (err.value.details() or "")
        assert "Traceback" not in (err.value.details() or "")
        stats = await stub.Stats(eval_pb2.BrokerStatsRequest())
        assert stats.total_unacked == 1  # still held with its token
        await stub.Nack(eval_pb2.EvalAckRequest(eval_id=e.id, token=got.token))
        again = await dequeue(stub, 5000)
        assert again.eval.id == e.id
        # the first delivery decides late: written, but it acks nothing
        late = copy_msg(got.eval)
        late.status = "failed"
        await decide(c, got.token, late)
        await ignored(c, e.id)
        assert await held(stub, e.id)
        # the redelivery's decision is the one the broker acks
        await finish(c, stub, again)
    assert eval_rows(c.dsn, "unwritten")[e.id][0] == "complete"
    assert "refused the ack of eval " + e.id in c.log("broker")


async def test_the_reconciler_puts_back_evals_the_feed_lost(
    make_cluster: Callable[..., Cluster],
) -> None:
    c = make_cluster()
    c.start("state")
    broker = c.start(
        "broker",
        *FAST,
        "--reconcile-interval",
        "0.5",
        env={"CORRAL_BROKER_FAULT": "drop-feed-evals"},
    )
    lost = pending("lost")
    lost_blocked = pending("lost-blocked", status="blocked", escaped_computed_class=True)
    await write(c.dsn, mock.job(job_id="lost"), mock.job(job_id="lost-blocked"), lost)
    await write(c.dsn, lost_blocked)
    async with transport.dial(broker.address) as ch:
        stub = eval_pb2_grpc.EvalStub(ch)
        got = await dequeue(stub, 20_000)
        assert got.eval.id == lost.id

        async def tracked() -> bool:
            stats = await stub.Stats(eval_pb2.BrokerStatsRequest())
            return stats.total_blocked == 1

        await until(tracked, timeout=20, what="the lost blocked eval tracked again")
    log = c.log("broker")
    assert f"pending eval {lost.id} of job lost was unknown to the broker; re-enqueued" in log
    assert f"blocked eval {lost_blocked.id} of job lost-blocked was unknown" in log
