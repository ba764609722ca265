"""Routing committed changes (nomad/fsm.go's broker hooks): restore on
takeover, pending -> broker, blocked -> tracker, complete -> untrack, a node
becoming ready or an alloc finishing unblocks its class, and a replica
re-bootstrap re-routes what the gap hid without running anything twice."""

from __future__ import annotations

from corral.domain import structs
from corral.domain.store import StateSnapshot, StateStore
from corral.domain.topics import EventType
from corral.testing import mock
from corral.v1 import structs_pb2 as pb
from services.broker.blocked_evals import BlockedEvals
from services.broker.feed import FeedRouter
from tests.unit.broker.test_eval_broker import broker, ev


def router() -> tuple[FeedRouter, list[tuple[list[str], int]]]:
    released: list[tuple[list[str], int]] = []
    b = broker()
    blocked = BlockedEvals(lambda evs, i: released.append(([e.id for e in evs], i)))
    blocked.set_enabled(True)
    return FeedRouter(b, blocked), released


def batch(index: int, *objs: pb.Evaluation | pb.Node | pb.Allocation) -> pb.ChangeBatch:
    out = pb.ChangeBatch(index=index)
    for o in objs:
        if isinstance(o, pb.Evaluation):
            out.events.add(topic="Evaluation", evaluation=o)
        elif isinstance(o, pb.Node):
            out.events.add(topic="Node", node=o)
        else:
            out.events.add(topic="Allocation", allocation=o)
    return out


async def test_restore_then_route_pending_blocked_complete() -> None:
    r, released = router()
    p = ev(job="p")
    b = ev(job="b", status="blocked", escaped_computed_class=True)
    done = ev(job="d", status="complete")
    snap = StateStore.build(10, evals=[p, b, done])
    assert r.restore(snap) == (1, 1)
    assert r.broker.stats().total_ready == 1 and r.blocked.total_blocked == 1
    # later batches: a new pending eval is enqueued; the blocked job completes
    p2 = ev(job="p2")
    b_done = ev(job="b", status="complete")
    r.on_batch(batch(11, p2, b_done), snap)
    assert r.broker.stats().total_ready == 2
    assert r.blocked.total_blocked == 0 and not released


async def test_node_ready_and_alloc_terminal_unblock_their_class() -> None:
    r, released = router()
    node = mock.node(node_class="gpu", status="initializing")
    other = mock.node(node_class="cpu")
    gpu_eval = ev(job="g", status="blocked")
    gpu_eval.class_eligibility[node.computed_class] = True
    gpu_eval.class_eligibility[other.computed_class] = False
    snap = StateStore.build(5, nodes=[node, other], evals=[gpu_eval])
    r.restore(snap)
    r.on_batch(batch(6, other), snap)  # already ready: nothing new
    assert not released
    ready = pb.Node()
    ready.CopyFrom(node)
    ready.status = "ready"
    snap = StateStore.build(7, nodes=[ready, other])
    r.on_batch(batch(7, ready), snap)
    assert released == [([gpu_eval.id], 7)]
    # an alloc on the cpu node finishing releases nothing captured by gpu...
    again = ev(job="g2", status="blocked", snapshot_index=8)
    again.class_eligibility[ready.computed_class] = True
    again.class_eligibility[other.computed_class] = False
    r.on_batch(batch(8, again), snap)
    alloc = mock.alloc(mock.job(), other)
    alloc.client_status = "complete"
    r.on_batch(batch(9, alloc), snap)
    assert len(released) == 1
    # ...one on the gpu node does
    alloc2 = mock.alloc(mock.job(), ready)
    alloc2.client_status = "failed"
    r.on_batch(batch(10, alloc2), snap)
    assert released[-1] == ([again.id], 10)


async def test_replica_reset_reroutes_the_gap_without_requeueing_outstanding() -> None:
    r, released = router()
    running = ev(job="run")
    stale_blocked = ev(job="sb", status="blocked", escaped_computed_class=True)
    snap = StateStore.build(3, evals=[running, stale_blocked])
    r.restore(snap)
    got = await r.broker.dequeue(["service"], 0.1)
    assert got is not None and got[0].id == running.id
    # the gap: a new pending eval, the blocked one completed, a node joined
    gap_pending = ev(job="gap")
    sb_done = ev(job="sb", status="complete")
    sb_done.id = stale_blocked.id
    new_blocked = ev(job="nb", status="blocked", escaped_computed_class=True, snapshot_index=4)
    node = mock.node()
    r.on_reset(
        StateStore.build(20, evals=[running, sb_done, gap_pending, new_blocked], nodes=[node])
    )
    # the stale blocked eval was dropped, the new one tracked then released
    # by the node that became ready in the gap
    assert released == [([new_blocked.id], 20)]
    assert r.blocked.total_blocked == 0
    nxt = await r.broker.dequeue(["service"], 0.1)
    assert nxt is not None and nxt[0].id == gap_pending.id
    r.broker.ack(running.id, got[1])
    # the outstanding eval was not queued behind itself
    assert await r.broker.dequeue(["service"], 0.05) is None


async def test_scheduler_config_pauses_and_unpauses_the_broker() -> None:
    r, _ = router()
    paused = pb.SchedulerConfiguration(pause_eval_broker=True)
    snap = StateStore.build(5, evals=[ev(job="a")], scheduler_config=paused)
    r.restore(snap)  # a leader taking over a paused cluster starts paused
    assert r.broker.paused
    assert await r.broker.dequeue(["service"], 0.05) is None
    assert r.broker.stats().total_ready == 1
    resumed = pb.ChangeBatch(index=6)
    resumed.events.add(topic="Operator", scheduler_config=pb.SchedulerConfiguration())
    r.on_batch(resumed, snap)
    assert not r.broker.paused
    got = await r.broker.dequeue(["service"], 0.05)
    assert got is not None
    again = pb.ChangeBatch(index=7)
    again.events.add(topic="Operator", scheduler_config=paused)
    r.on_batch(again, snap)
    assert r.broker.paused


async def test_blocked_write_of_an_outstanding_eval_is_left_to_its_decision() -> None:
    """A reblock writes the eval as blocked while its worker still holds it;
    the worker's decision (routed after the batch's events) tracks it and
    acks it: the router must not track it first on its own."""
    r, _ = router()
    e = ev(job="rb", triggered_by="queued-allocs")
    snap = StateStore.build(3, evals=[e])
    r.restore(snap)
    got = await r.broker.dequeue(["service"], 0.1)
    assert got is not None
    reblocked = pb.Evaluation()
    reblocked.CopyFrom(e)
    reblocked.status = "blocked"
    r.on_batch(batch(4, reblocked), snap)
    assert r.blocked.total_blocked == 0
    # once acked, a blocked write (another leader's restore, a new eval) is tracked
    r.broker.ack(e.id, got[1])
    r.on_batch(batch(5, reblocked), snap)
    assert r.blocked.tracked(e.id)


async def test_a_plans_eval_bump_does_not_run_the_eval_again() -> None:
    r, _ = router()
    running = ev(job="run")
    snap = StateStore.build(3, evals=[running])
    r.restore(snap)
    got = await r.broker.dequeue(["service"], 0.1)
    assert got is not None
    # the plan's commit bumps the outstanding eval's modify index
    bumped = pb.Evaluation()
    bumped.CopyFrom(running)
    bumped.modify_index = 4
    plan_batch = pb.ChangeBatch(index=4)
    plan_batch.events.add(topic="Evaluation", type=EventType.PLAN_RESULT, evaluation=bumped)
    r.on_batch(plan_batch, snap)
    r.broker.ack(running.id, got[1])
    assert await r.broker.dequeue(["service"], 0.05) is None

    # the same event written as an ordinary update would run it again
    r2, _ = router()
    r2.restore(snap)
    got = await r2.broker.dequeue(["service"], 0.1)
    assert got is not None
    r2.on_batch(batch(4, bumped), snap)
    r2.broker.ack(running.id, got[1])
    again = await r2.broker.dequeue(["service"], 0.1)
    assert again is not None and again[0].id == running.id


def decided(
    index: int, token: str, outcome: pb.Evaluation | None, *created: pb.Evaluation
) -> tuple[pb.ChangeBatch, StateSnapshot]:
    """The batch a State.DecideEval writes, and the store after it (the
    snapshot the replica hands its listeners)."""
    evals = [*created, *([outcome] if outcome is not None else [])]
    b = batch(index, *evals)
    held = outcome.id if outcome is not None else created[0].previous_eval
    b.eval_decisions.add(eval_id=held, token=token, outcome=outcome is not None)
    return b, StateStore.build(index, evals=evals)


async def test_a_decision_acks_with_its_outcome_and_a_stale_token_is_ignored() -> None:
    """One hop per decision: the worker's outcome write carries its token, and
    the broker acks from the feed (cancelling what the run's snapshot covered,
    as Nomad's Eval.Update + Eval.Ack do); the follow-up written with it waits
    behind the eval and runs after the ack."""
    r, _ = router()
    acked: list[str] = []
    r.on_ack = acked.append
    e = ev(job="d", create_index=3, modify_index=3)
    covered = ev(job="d", create_index=4, modify_index=4)
    r.restore(StateStore.build(4, evals=[e, covered]))
    got = await r.broker.dequeue(["service"], 0.1)
    assert got is not None and got[0].id == e.id
    # a decision with another token (a worker whose lease lapsed) acks nothing
    done = pb.Evaluation()
    done.CopyFrom(e)
    done.status, done.snapshot_index = "complete", 4
    stale, snap = decided(5, "not-" + got[1], done)
    r.on_batch(stale, snap)
    assert r.broker.outstanding_token(e.id) == got[1] and not acked
    # the holder's decision acks it, with a follow-up created by the run
    follow = ev(job="d", previous_eval=e.id, wait=1)
    follow.modify_index = 6
    mine, snap = decided(6, got[1], done, follow)
    r.on_batch(mine, snap)
    assert acked == [e.id] and not r.broker.outstanding_token(e.id)
    # the covered eval was superseded; the delayed follow-up is kept
    assert [c.id for c in r.broker.take_cancelable(10)] == [covered.id]
    assert r.broker.tracked(follow.id)


async def test_a_decision_of_created_evals_only_does_not_ack() -> None:
    r, _ = router()
    e = ev(job="c")
    r.restore(StateStore.build(3, evals=[e]))
    got = await r.broker.dequeue(["service"], 0.1)
    assert got is not None
    blocked = ev(job="c", status="blocked", previous_eval=e.id)
    first, snap = decided(4, got[1], None, blocked)
    r.on_batch(first, snap)
    assert r.broker.outstanding_token(e.id) == got[1]  # still held: the plan is next
    assert r.blocked.tracked(blocked.id)


async def test_a_blocked_outcome_is_tracked_again_and_acked() -> None:
    """The reblock: the eval goes back to the tracker (not run again by the
    router's own blocked routing) and is acked in the same step."""
    r, _ = router()
    e = ev(job="rb", triggered_by="queued-allocs")
    r.restore(StateStore.build(3, evals=[e]))
    got = await r.broker.dequeue(["service"], 0.1)
    assert got is not None
    reblocked = pb.Evaluation()
    reblocked.CopyFrom(e)
    reblocked.status = "blocked"
    b, snap = decided(4, got[1], reblocked)
    r.on_batch(b, snap)
    assert r.blocked.tracked(e.id) and r.blocked.total_blocked == 1
    assert not r.broker.outstanding_token(e.id)


async def test_a_ready_node_whose_class_changes_unblocks_the_new_class() -> None:
    """Dynamic node metadata (`node meta apply`) changes a ready node's
    computed class: an eval blocked because the old class did not fit is
    tried again (the new class is unknown to it), as Nomad's FSM unblocks
    on every upsert of a ready node. The same node again does nothing."""
    r, released = router()
    node = mock.node()
    blocked = ev(job="rack", status="blocked")
    blocked.class_eligibility[node.computed_class] = False
    snap = StateStore.build(5, nodes=[node], evals=[blocked])
    r.restore(snap)
    r.on_batch(batch(6, node), snap)
    assert not released
    changed = pb.Node()
    changed.CopyFrom(node)
    changed.meta["rack"] = "r7"
    changed.computed_class = structs.computed_class(changed)
    assert changed.computed_class != node.computed_class
    snap = StateStore.build(7, nodes=[changed])
    r.on_batch(batch(7, changed), snap)
    assert released == [([blocked.id], 7)]


async def test_a_snapshot_restore_starts_the_broker_over_from_the_restored_state() -> None:
    """Unlike a replica reset, a restore replaced the state: what the broker
    held (ready, outstanding, blocked) is dropped, and the restored state's
    pending and blocked evals are all it holds afterwards."""
    r, _ = router()
    ready = ev(job="ready")
    outstanding = ev(job="out")
    blocked = ev(job="blk", status="blocked", escaped_computed_class=True)
    r.restore(StateStore.build(3, evals=[ready, outstanding, blocked]))
    got = await r.broker.dequeue(["service"], 0.1)
    assert got is not None
    restored_pending = ev(job="restored")
    restored_blocked = ev(job="rb", status="blocked", escaped_computed_class=True)
    r.on_restore(StateStore.build(40, evals=[restored_pending, restored_blocked]))
    assert r.enabled
    assert r.broker.known_ids() == {restored_pending.id}
    assert r.blocked.tracked(restored_blocked.id) and not r.blocked.tracked(blocked.id)
    nxt = await r.broker.dequeue(["service"], 0.1)
    assert nxt is not None and nxt[0].id == restored_pending.id
    assert await r.broker.dequeue(["service"], 0.05) is None


async def test_a_restore_while_not_leader_changes_nothing() -> None:
    r, _ = router()
    r.on_restore(StateStore.build(9, evals=[ev(job="x")]))
    assert not r.enabled and r.broker.known_ids() == set()
