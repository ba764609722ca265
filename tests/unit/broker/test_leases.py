"""Worker leases in the in-memory broker: a lapsed lease nacks the worker's
evals at once (long before the nack timer), heartbeats keep a slow worker's
lease, an eval whose plan is in the planner is nacked when the planner has
confirmed the revoked token, and dequeues without a worker id have only the
nack timer."""

from __future__ import annotations

import asyncio

from services.broker.config import BrokerSettings
from services.broker.eval_broker import EvalBroker
from tests.unit.broker.test_eval_broker import ev
from tests.wait import until

LEASED = BrokerSettings(
    nack_timeout=30.0, initial_nack_delay=0.0, subsequent_nack_delay=0.0, worker_lease_ttl=0.2
)


def broker() -> EvalBroker:
    b = EvalBroker(LEASED)
    b.set_enabled(True)
    return b


async def test_a_lapsed_lease_nacks_the_workers_evals_at_once() -> None:
    b = broker()
    mine, other = ev(), ev()
    b.enqueue(mine)
    b.enqueue(other)
    got = await b.dequeue(["service"], 0.1, worker_id="w1")
    unleased = await b.dequeue(["service"], 0.1)
    assert got is not None and unleased is not None
    assert len(b.leases) == 1
    # no heartbeat: after the 0.2 s ttl the eval is ready again (nack timer: 30 s)
    again = await b.dequeue(["service"], 2.0, worker_id="w2")
    assert again is not None and again[0].id == got[0].id
    assert b.stats().total_unacked == 2  # w2's, and the one without a lease
    assert not b.leases.alive("w1")


async def test_heartbeats_keep_the_lease_of_a_slow_worker() -> None:
    # a ttl ten heartbeats long: at 0.2 s, one sleep stretched past it on a
    # loaded machine lapsed the lease (the test flaked)
    b = EvalBroker(LEASED.model_copy(update={"worker_lease_ttl": 1.0}))
    b.set_enabled(True)
    e = ev()
    b.enqueue(e)
    got = await b.dequeue(["service"], 0.1, worker_id="slow")
    assert got is not None
    for _ in range(25):  # 2.5 s, two and a half ttls
        assert b.heartbeat("slow") == 1
        await asyncio.sleep(0.1)
    assert b.stats().total_unacked == 1
    b.ack(e.id, got[1])
    assert b.heartbeat("slow") == 0


async def test_an_eval_whose_plan_is_in_the_planner_is_nacked_when_the_planner_is_done() -> None:
    """The plan fence (plan_fence.py): with a planner holding this term's
    key, a lapsed lease revokes the token there first; the eval is nacked
    only once the planner confirms that no plan of it is in flight."""
    b = broker()
    planner = b.fence.connect("planner:1")
    first = planner.updates.get_nowait()
    assert first is not None and first.key and first.term == b.fence.term
    e = ev()
    b.enqueue(e)
    got = await b.dequeue(["service"], 0.1, worker_id="w1")
    assert got is not None
    await until(lambda: not b.leases.alive("w1"), timeout=5)
    revoked = await asyncio.wait_for(planner.updates.get(), 5)
    assert revoked is not None and list(revoked.revoked) == [got[1]]
    await asyncio.sleep(0.1)
    assert b.stats().total_unacked == 1  # not nacked under the planner's feet
    b.fence.confirm(planner, [got[1]])  # plan applied: now it goes back
    again = await b.dequeue(["service"], 1.0)
    assert again is not None and again[0].id == e.id


async def test_a_revocation_owed_by_a_disconnected_planner_waits_for_its_return() -> None:
    b = broker()
    gone = b.fence.connect("planner:1")
    b.fence.disconnect(gone)  # it had the key: it may still hold a plan
    e = ev()
    b.enqueue(e)
    got = await b.dequeue(["service"], 0.1, worker_id="w1")
    assert got is not None
    await until(lambda: not b.leases.alive("w1"), timeout=5)
    await asyncio.sleep(0.1)
    assert b.stats().total_unacked == 1
    back = b.fence.connect("planner:1")
    hello = back.updates.get_nowait()
    assert hello is not None and list(hello.revoked) == [got[1]]
    b.fence.confirm(back, [got[1]])
    again = await b.dequeue(["service"], 1.0)
    assert again is not None and again[0].id == e.id


async def test_losing_leadership_forgets_the_leases() -> None:
    b = broker()
    b.heartbeat("w1")
    b.set_enabled(False)
    assert len(b.leases) == 0
