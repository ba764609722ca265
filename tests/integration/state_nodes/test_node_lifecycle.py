"""Node lifecycle against a real state service and PostgreSQL: heartbeats
that do not write, a missed TTL making the node down (or disconnected) with
node-update evals, the reconnect ordering of seed 003, blocking client
alloc queries, eligibility and drain."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import grpc
import pytest

from corral.domain.structs import ClientStatus
from corral.security import transport
from corral.testing import mock
from corral.v1 import node_pb2, node_pb2_grpc
from corral.v1 import structs_pb2 as pb
from services.state.app import StateApp, StateSettings
from services.state.handlers import node as node_handler
from services.state.heartbeat import HeartbeatSettings
from services.state.writes import nodes as node_writes
from tests.wait import until

FAST = HeartbeatSettings(
    min_ttl=0.5, grace=0.3, failover_ttl=5.0, max_per_second=1000, drain_interval=0.2
)


@pytest.fixture
async def app(fresh_pg_dsn: str) -> AsyncIterator[StateApp]:
    a = StateApp(StateSettings(dsn=fresh_pg_dsn, heartbeat=FAST))
    await a.start()
    await until(lambda: a.heartbeats.enabled)
    try:
        yield a
    finally:
        await a.stop()


@pytest.fixture
async def nodes(app: StateApp) -> AsyncIterator[node_pb2_grpc.NodeAsyncStub]:
    async with transport.dial(app.server.bound_address) as ch:
        yield node_pb2_grpc.NodeStub(ch)


async def place(app: StateApp, node: pb.Node, job: pb.Job) -> pb.Allocation:
    alloc = mock.alloc(job, node, client_status=ClientStatus.RUNNING)
    async with app.db.write() as tx:
        tx.put_job(job)
        alloc.alloc_modify_index = tx.index
        tx.put_alloc(alloc)
    await app.feed.wait_for_index(tx.index, 10)
    return alloc


async def register_ready(app: StateApp, nodes: node_pb2_grpc.NodeAsyncStub) -> pb.Node:
    node = mock.node(status="initializing")
    resp = await nodes.Register(node_pb2.NodeRegisterRequest(node=node))
    assert resp.heartbeat_ttl_ms >= 500
    resp = await nodes.UpdateStatus(
        node_pb2.NodeUpdateStatusRequest(node_id=node.id, status="ready", secret_id=node.secret_id)
    )
    await app.feed.wait_for_index(resp.index, 10)
    return node


def status(app: StateApp, node_id: str) -> str:
    n = app.feed.snapshot().node_by_id(node_id)
    return n.status if n else ""


async def test_heartbeats_do_not_write_and_a_missed_ttl_makes_the_node_down(
    app: StateApp, nodes: node_pb2_grpc.NodeAsyncStub
) -> None:
    node = await register_ready(app, nodes)
    await place(app, node, mock.job(job_id="web", count=1))
    before = await app.db.latest_index()
    for _ in range(5):
        await nodes.UpdateStatus(
            node_pb2.NodeUpdateStatusRequest(
                node_id=node.id, status="ready", secret_id=node.secret_id
            )
        )
        await asyncio.sleep(0.2)
    assert await app.db.latest_index() == before  # heartbeats write nothing
    await until(lambda: status(app, node.id) == "down")
    evals = app.feed.snapshot().evals_by_job("default", "web")
    assert [(e.triggered_by, e.node_id) for e in evals] == [("node-update", node.id)]


async def test_a_ready_nodes_heartbeat_skips_the_write_and_keeps_it_alive_past_its_ttl(
    app: StateApp, nodes: node_pb2_grpc.NodeAsyncStub
) -> None:
    """The steady heartbeat (ready, and ready in the leader's replica, its
    timer running) only resets the timer: no write transaction, no batch,
    no index, however many TTLs it keeps the node alive for."""
    node = await register_ready(app, nodes)
    before_index = await app.db.latest_index()
    before_ops = app.ctx.batcher.ops
    deadline = time.monotonic() + 3 * (FAST.min_ttl * 2 + FAST.grace)
    beats = 0
    while time.monotonic() < deadline:
        resp = await nodes.UpdateStatus(
            node_pb2.NodeUpdateStatusRequest(
                node_id=node.id, status="ready", secret_id=node.secret_id
            )
        )
        beats += 1
        assert resp.index >= before_index and resp.heartbeat_ttl_ms >= 500
        assert status(app, node.id) == "ready"
        await asyncio.sleep(FAST.min_ttl / 4)  # the client's cadence, well inside the TTL
    assert beats > 10
    assert app.ctx.batcher.ops == before_ops  # not one heartbeat went through the batcher
    assert await app.db.latest_index() == before_index
    assert app.heartbeats.running(node.id)
    # the wrong secret is still refused on the fast path
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await nodes.UpdateStatus(
            node_pb2.NodeUpdateStatusRequest(node_id=node.id, status="ready", secret_id="nope")
        )
    assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED


async def test_a_heartbeat_while_the_timer_expires_goes_through_the_write(
    app: StateApp, nodes: node_pb2_grpc.NodeAsyncStub
) -> None:
    """An expiry stops the node's timer before its write: a heartbeat that
    finds no timer running may race that write, so it is written (ordered
    after it) rather than answered from the replica, and starts the timer
    again."""
    node = await register_ready(app, nodes)
    app.heartbeats.forget(node.id)  # what an expiry does before it writes
    before_ops = app.ctx.batcher.ops
    await _heartbeat(nodes, app, node)
    assert app.ctx.batcher.ops == before_ops + 1
    assert app.heartbeats.running(node.id)
    assert status(app, node.id) == "ready"


async def test_a_heartbeat_of_a_node_the_committed_row_holds_down_is_written(
    app: StateApp, nodes: node_pb2_grpc.NodeAsyncStub
) -> None:
    """Only a node already ready skips the write: one the committed row
    holds down comes back through the write (its event recorded, its
    index moved)."""
    node = await register_ready(app, nodes)
    async with app.db.write() as tx:
        await node_writes.update_status(tx, node.id, "down")
    await app.feed.wait_for_index(tx.index, 10)
    resp = await nodes.UpdateStatus(
        node_pb2.NodeUpdateStatusRequest(node_id=node.id, status="ready", secret_id=node.secret_id)
    )
    assert resp.index > tx.index
    await app.feed.wait_for_index(resp.index, 10)
    stored = app.feed.snapshot().node_by_id(node.id)
    assert stored is not None and stored.status == "ready"
    assert stored.modify_index == resp.index
    assert stored.events[-1].message == "Node reregistered by heartbeat"


async def test_a_standby_relays_heartbeats_to_the_leader_over_one_held_channel(
    app: StateApp,
    nodes: node_pb2_grpc.NodeAsyncStub,
    fresh_pg_dsn: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Timers live on the leader: a standby relays each heartbeat there
    (the leader answers a ready node's from its replica, writing nothing)
    over one channel it keeps, looking the leader up once per
    `LEADER_LOOKUP_S` rather than per heartbeat, and a node heartbeating
    only through the standby stays ready past its TTL."""
    monkeypatch.setattr(node_handler, "LEADER_LOOKUP_S", 3600.0)
    node = await register_ready(app, nodes)
    standby = StateApp(StateSettings(dsn=fresh_pg_dsn, heartbeat=FAST))
    await standby.start()
    try:
        assert not standby.heartbeats.enabled
        assert standby.node_service is not None
        lookups = 0
        look_up = standby.node_service.leader_address

        async def counted() -> str:
            nonlocal lookups
            lookups += 1
            return await look_up()

        standby.node_service.leader_address = counted
        before_ops = (app.ctx.batcher.ops, standby.ctx.batcher.ops)
        before_index = await app.db.latest_index()
        async with transport.dial(standby.server.bound_address) as ch:
            via_standby = node_pb2_grpc.NodeStub(ch)
            deadline = time.monotonic() + 2 * (FAST.min_ttl * 2 + FAST.grace)
            while time.monotonic() < deadline:
                resp = await via_standby.UpdateStatus(
                    node_pb2.NodeUpdateStatusRequest(
                        node_id=node.id, status="ready", secret_id=node.secret_id
                    )
                )
                assert resp.leader_address == app.ctx.address
                assert status(app, node.id) == "ready"
                await asyncio.sleep(FAST.min_ttl / 4)
        assert standby.node_service.relayed_to == [app.ctx.address]
        assert lookups == 1
        assert (app.ctx.batcher.ops, standby.ctx.batcher.ops) == before_ops
        assert await app.db.latest_index() == before_index
    finally:
        await standby.stop()


async def test_disconnect_and_the_reconnect_ordering_of_seed_003(
    app: StateApp, nodes: node_pb2_grpc.NodeAsyncStub
) -> None:
    node = await register_ready(app, nodes)
    job = mock.job(job_id="edge", count=1)
    job.task_groups[0].max_client_disconnect = 60 * 1_000_000_000
    alloc = await place(app, node, job)
    await until(lambda: status(app, node.id) == "disconnected")
    update = pb.Allocation(id=alloc.id, node_id=node.id, client_status="running")
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await nodes.UpdateAlloc(
            node_pb2.NodeUpdateAllocRequest(allocs=[update], secret_id=node.secret_id)
        )
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "not allowed to update allocs while in status disconnected" in (
        err.value.details() or ""
    )
    # heartbeat first: disconnected -> ready is coerced to initializing
    await nodes.UpdateStatus(
        node_pb2.NodeUpdateStatusRequest(node_id=node.id, status="ready", secret_id=node.secret_id)
    )
    assert status(app, node.id) == "initializing" or await _wait_status(
        app, node.id, "initializing"
    )
    await nodes.UpdateAlloc(
        node_pb2.NodeUpdateAllocRequest(allocs=[update], secret_id=node.secret_id)
    )
    resp = await nodes.UpdateStatus(
        node_pb2.NodeUpdateStatusRequest(node_id=node.id, status="ready", secret_id=node.secret_id)
    )
    await app.feed.wait_for_index(resp.index, 10)
    assert status(app, node.id) == "ready"


async def _wait_status(app: StateApp, node_id: str, want: str) -> bool:
    await until(lambda: status(app, node_id) == want)
    return True


async def test_get_client_allocs_blocks_until_the_node_allocs_change(
    app: StateApp, nodes: node_pb2_grpc.NodeAsyncStub
) -> None:
    node = await register_ready(app, nodes)
    first = await nodes.GetClientAllocs(
        node_pb2.NodeClientAllocsRequest(node_id=node.id, secret_id=node.secret_id)
    )
    assert first.index >= 1 and not first.allocs
    waiter = asyncio.ensure_future(
        nodes.GetClientAllocs(
            node_pb2.NodeClientAllocsRequest(
                node_id=node.id,
                min_index=first.index,
                wait_ms=20_000,
                secret_id=node.secret_id,
            )
        )
    )
    await asyncio.sleep(0.2)
    assert not waiter.done()
    alloc = await place(app, node, mock.job(job_id="pull", count=1))
    resp = await asyncio.wait_for(waiter, 10)
    assert list(resp.allocs) == [alloc.id]
    assert [a.id for a in resp.full_allocs] == [alloc.id]
    assert [j.id for j in resp.jobs] == ["pull"]

    # the next answer lists every alloc of the node but carries only what
    # changed since, with its job: the client already has the rest
    other = await place(app, node, mock.job(job_id="pull-2", count=1))
    nxt = await nodes.GetClientAllocs(
        node_pb2.NodeClientAllocsRequest(
            node_id=node.id, min_index=resp.index, wait_ms=20_000, secret_id=node.secret_id
        )
    )
    assert set(nxt.allocs) == {alloc.id, other.id}
    assert [a.id for a in nxt.full_allocs] == [other.id]
    assert [j.id for j in nxt.jobs] == ["pull-2"]
    # from index 0 (a client starting over) it carries every live alloc again
    again = await nodes.GetClientAllocs(
        node_pb2.NodeClientAllocsRequest(node_id=node.id, secret_id=node.secret_id)
    )
    assert {a.id for a in again.full_allocs} == {alloc.id, other.id}
    assert {j.id for j in again.jobs} == {"pull", "pull-2"}


async def test_eligibility_and_drain_migrate_allocs_in_batches(
    app: StateApp, nodes: node_pb2_grpc.NodeAsyncStub
) -> None:
    node = await register_ready(app, nodes)
    job = mock.job(job_id="drained", count=3)
    job.task_groups[0].migrate.max_parallel = 2
    async with app.db.write() as tx:
        tx.put_job(job)
        for i in range(3):
            tx.put_alloc(mock.alloc(job, node, index=i))
    resp = await nodes.UpdateEligibility(
        node_pb2.NodeUpdateEligibilityRequest(node_id=node.id, eligibility="ineligible")
    )
    await app.feed.wait_for_index(resp.index, 10)
    assert app.feed.snapshot().nodes[node.id].scheduling_eligibility == "ineligible"
    await nodes.UpdateDrain(
        node_pb2.NodeUpdateDrainRequest(
            node_id=node.id, drain_strategy=pb.DrainStrategy(deadline=3600 * 10**9)
        )
    )

    def migrating() -> int:
        return sum(
            1 for a in app.feed.snapshot().allocs_by_node(node.id) if a.desired_transition.migrate
        )

    await until(lambda: migrating() == 2)
    await asyncio.sleep(0.5)
    assert migrating() == 2  # max_parallel at a time
    # the scheduler would stop them; the client reports them complete
    snap = app.feed.snapshot()
    done = [
        pb.Allocation(id=a.id, node_id=node.id, client_status="complete")
        for a in snap.allocs_by_node(node.id)
        if a.desired_transition.migrate
    ]
    async with app.db.write() as tx:
        for d in done:
            cur = (await tx.get_allocs([d.id]))[d.id]
            cur.desired_status = "stop"
            tx.put_alloc(cur)
    await until(lambda: migrating() == 3)
    async with app.db.write() as tx:
        for a in await tx.allocs_by_node(node.id):
            a.desired_status = "stop"
            tx.put_alloc(a)
    await until(lambda: not app.feed.snapshot().nodes[node.id].drain)
    assert app.feed.snapshot().nodes[node.id].scheduling_eligibility == "ineligible"
    assert [e.triggered_by for e in app.feed.snapshot().evals_by_job("default", "drained")].count(
        "node-drain"
    ) >= 2


MINUTE_NS = 60 * 1_000_000_000


async def _disconnected_with_unknown_alloc(
    app: StateApp,
    nodes: node_pb2_grpc.NodeAsyncStub,
    job_id: str,
    *,
    unknown_since: int = 0,
    count: int = 1,
) -> tuple[pb.Node, list[pb.Allocation], pb.Evaluation]:
    """A ready node whose allocs' group has lost_after misses its TTL and
    goes disconnected; then what the scheduler's node-update eval leaves:
    the allocs unknown (AllocState) and one pending max-disconnect-timeout
    follow-up eval they name."""
    node = await register_ready(app, nodes)
    job = mock.job(job_id=job_id, count=count)
    job.task_groups[0].disconnect.lost_after = MINUTE_NS
    allocs = [mock.alloc(job, node, index=i) for i in range(count)]
    async with app.db.write() as tx:
        tx.put_job(job)
        for a in allocs:
            tx.put_alloc(a)
    await until(lambda: status(app, node.id) == "disconnected")
    since = unknown_since or time.time_ns()
    timeout = mock.eval_for(job, triggered_by="max-disconnect-timeout")
    timeout.wait_until = since + MINUTE_NS
    async with app.db.write() as tx:
        tx.put_eval(timeout)
        for a in allocs:
            a.client_status = ClientStatus.UNKNOWN
            a.alloc_states.add(field="client_status", value=ClientStatus.UNKNOWN, time=since)
            a.followup_eval_id = timeout.id
            tx.put_alloc(a)
    await app.feed.wait_for_index(tx.index, 10)
    return node, allocs, timeout


def _eval(app: StateApp, eval_id: str) -> pb.Evaluation:
    ev = app.feed.snapshot().eval_by_id(eval_id)
    assert ev is not None
    return ev


async def _heartbeat(nodes: node_pb2_grpc.NodeAsyncStub, app: StateApp, node: pb.Node) -> None:
    resp = await nodes.UpdateStatus(
        node_pb2.NodeUpdateStatusRequest(node_id=node.id, status="ready", secret_id=node.secret_id)
    )
    await app.feed.wait_for_index(resp.index, 10)


async def test_a_reconnecting_node_that_misses_its_ttl_again_stays_disconnected(
    app: StateApp, nodes: node_pb2_grpc.NodeAsyncStub
) -> None:
    """Heartbeat after a disconnect (initializing, allocs still unknown),
    then silence again: its allocs are inside lost_after, so the node goes
    back to disconnected, not down (which would lose them early)."""
    node, _, _ = await _disconnected_with_unknown_alloc(app, nodes, "flaky")
    await _heartbeat(nodes, app, node)
    assert status(app, node.id) == "initializing"
    await until(lambda: status(app, node.id) != "initializing")
    assert status(app, node.id) == "disconnected"


async def test_a_disconnected_node_whose_allocs_expired_goes_down(
    app: StateApp, nodes: node_pb2_grpc.NodeAsyncStub
) -> None:
    """Once every unknown alloc is past lost_after, the next missed TTL
    makes the node down."""
    long_ago = time.time_ns() - 2 * MINUTE_NS
    node, _, _ = await _disconnected_with_unknown_alloc(app, nodes, "gone", unknown_since=long_ago)
    await until(lambda: status(app, node.id) == "down")
    stored = app.feed.snapshot().node_by_id(node.id)
    assert stored is not None
    assert [e.message for e in stored.events][-2:] == [
        "Node heartbeat missed",
        "Node heartbeat missed",
    ]


async def test_a_first_time_initializing_node_that_misses_its_ttl_goes_down(
    app: StateApp, nodes: node_pb2_grpc.NodeAsyncStub
) -> None:
    node = mock.node(status="initializing")
    await nodes.Register(node_pb2.NodeRegisterRequest(node=node))
    job = mock.job(job_id="fresh", count=1)
    job.task_groups[0].disconnect.lost_after = MINUTE_NS
    await place(app, node, job)
    await until(lambda: status(app, node.id) not in ("", "initializing"))
    assert status(app, node.id) == "down"


async def test_reconnected_allocs_cancel_their_disconnect_timeout_eval(
    app: StateApp, nodes: node_pb2_grpc.NodeAsyncStub
) -> None:
    """Nomad PR #25923: when the client reports the unknown allocs, their
    follow-up eval is canceled once no live alloc still waits on it, and
    their followup_eval_id is cleared; a reconnect eval is created."""
    node, allocs, timeout = await _disconnected_with_unknown_alloc(app, nodes, "back", count=2)
    await _heartbeat(nodes, app, node)

    first = pb.Allocation(id=allocs[0].id, node_id=node.id, client_status="running")
    resp = await nodes.UpdateAlloc(
        node_pb2.NodeUpdateAllocRequest(allocs=[first], secret_id=node.secret_id)
    )
    await app.feed.wait_for_index(resp.index, 10)
    snap = app.feed.snapshot()
    assert snap.allocs[allocs[0].id].followup_eval_id == ""
    assert snap.allocs[allocs[1].id].followup_eval_id == timeout.id
    assert _eval(app, timeout.id).status == "pending"  # the other alloc still waits

    second = pb.Allocation(id=allocs[1].id, node_id=node.id, client_status="failed")
    resp = await nodes.UpdateAlloc(
        node_pb2.NodeUpdateAllocRequest(allocs=[second], secret_id=node.secret_id)
    )
    await app.feed.wait_for_index(resp.index, 10)
    canceled = _eval(app, timeout.id)
    assert canceled.status == "canceled"
    assert canceled.status_description == "allocs reconnected"
    assert app.feed.snapshot().allocs[allocs[1].id].followup_eval_id == ""
    triggers = [e.triggered_by for e in app.feed.snapshot().evals_by_job("default", "back")]
    assert "reconnect" in triggers


async def test_a_reconnect_cancels_the_timeout_eval_a_delayed_reschedule_displaced(
    app: StateApp, nodes: node_pb2_grpc.NodeAsyncStub
) -> None:
    """Issue 33: a disconnected alloc whose replacement is delayed names
    the alloc-reschedule eval, not the max-disconnect-timeout one. When it
    reports in, both are canceled: the timeout only marks unknown allocs
    lost, and none of the job is left unknown. While another alloc of the
    job is still unknown, the timeout stays pending."""
    node, allocs, timeout = await _disconnected_with_unknown_alloc(app, nodes, "delayed", count=2)
    job = app.feed.snapshot().job_by_id("default", "delayed")
    assert job is not None
    resched = mock.eval_for(job, triggered_by="alloc-reschedule")
    resched.wait_until = time.time_ns() + MINUTE_NS
    async with app.db.write() as tx:
        tx.put_eval(resched)
        for a in allocs:
            cur = (await tx.get_allocs([a.id]))[a.id]
            cur.followup_eval_id = resched.id
            tx.put_alloc(cur)
    await _heartbeat(nodes, app, node)

    first = pb.Allocation(id=allocs[0].id, node_id=node.id, client_status="running")
    resp = await nodes.UpdateAlloc(
        node_pb2.NodeUpdateAllocRequest(allocs=[first], secret_id=node.secret_id)
    )
    await app.feed.wait_for_index(resp.index, 10)
    assert _eval(app, resched.id).status == "pending"  # the other alloc names it
    assert _eval(app, timeout.id).status == "pending"  # the other alloc is unknown

    second = pb.Allocation(id=allocs[1].id, node_id=node.id, client_status="running")
    resp = await nodes.UpdateAlloc(
        node_pb2.NodeUpdateAllocRequest(allocs=[second], secret_id=node.secret_id)
    )
    await app.feed.wait_for_index(resp.index, 10)
    for ev in (resched, timeout):
        canceled = _eval(app, ev.id)
        assert (canceled.status, canceled.status_description) == ("canceled", "allocs reconnected")


async def test_a_client_reporting_itself_down_records_no_missed_heartbeat(
    app: StateApp, nodes: node_pb2_grpc.NodeAsyncStub
) -> None:
    """Nomad's TestClientEndpoint_UpdateStatus_HeartbeatRecovery: only the
    heartbeat timer records "Node heartbeat missed"; a node's own
    UpdateStatus(down) records nothing, and coming back from down records
    "Node reregistered by heartbeat"."""
    node = await register_ready(app, nodes)
    for status in ("down", "initializing"):
        resp = await nodes.UpdateStatus(
            node_pb2.NodeUpdateStatusRequest(
                node_id=node.id, status=status, secret_id=node.secret_id
            )
        )
        await app.feed.wait_for_index(resp.index, 10)
    stored = app.feed.snapshot().node_by_id(node.id)
    assert stored is not None and stored.modify_index == resp.index
    assert [e.message for e in stored.events] == [
        "Node registered",
        "Node reregistered by heartbeat",
    ]


async def test_a_down_node_brought_back_by_a_heartbeat_records_reregistered(
    app: StateApp, nodes: node_pb2_grpc.NodeAsyncStub
) -> None:
    node = await register_ready(app, nodes)
    await until(lambda: status(app, node.id) == "down")
    resp = await nodes.UpdateStatus(
        node_pb2.NodeUpdateStatusRequest(
            node_id=node.id, status="initializing", secret_id=node.secret_id
        )
    )
    await app.feed.wait_for_index(resp.index, 10)
    stored = app.feed.snapshot().node_by_id(node.id)
    assert stored is not None and stored.status == "initializing"
    assert stored.events[-1].message == "Node reregistered by heartbeat"
    assert stored.events[-1].subsystem == "Cluster"

    await until(lambda: status(app, node.id) == "down")
    await _heartbeat(nodes, app, node)
    stored = app.feed.snapshot().node_by_id(node.id)
    assert stored is not None and stored.status == "ready"
    assert stored.events[-1].message == "Node reregistered by heartbeat"


async def test_drain_times_are_the_servers_not_the_callers(
    app: StateApp, nodes: node_pb2_grpc.NodeAsyncStub
) -> None:
    node = await register_ready(app, nodes)
    before = time.time_ns()
    # a force deadline in the past would force the drain at once
    sent = pb.DrainStrategy(deadline=0, force_deadline=1, started_at=1)
    resp = await nodes.UpdateDrain(
        node_pb2.NodeUpdateDrainRequest(node_id=node.id, drain_strategy=sent)
    )
    await app.feed.wait_for_index(resp.index, 10)
    stored = app.feed.snapshot().nodes[node.id].drain_strategy
    assert stored.force_deadline == 0 and stored.started_at >= before
    sent = pb.DrainStrategy(deadline=3600 * 10**9, force_deadline=1, started_at=1)
    resp = await nodes.UpdateDrain(
        node_pb2.NodeUpdateDrainRequest(node_id=node.id, drain_strategy=sent)
    )
    await app.feed.wait_for_index(resp.index, 10)
    stored = app.feed.snapshot().nodes[node.id].drain_strategy
    assert stored.force_deadline == stored.started_at + 3600 * 10**9
    assert stored.started_at >= before
