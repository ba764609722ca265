"""Routes committed state changes to the broker and the blocked tracker, as
Nomad's FSM does after each Raft apply: a pending eval is enqueued, a
blocked one tracked, a complete one untracks its job's blocked eval; a node
that becomes ready or eligible, or an alloc that finishes on a node, frees
capacity and unblocks what it can; the scheduler configuration's
`pause_eval_broker` pauses and unpauses the broker.

A worker decides the eval it holds with one write to the state
(`State.DecideEval`: the evals its run created, the outcome); the batch
carries the decision with the dequeue's token, and the router acks the
eval here when it is still outstanding with that token (a stale token, from
a worker whose lease lapsed, is ignored: the eval's redelivery decides it
again). A decision that only created evals restarts the nack timer.

A blocked eval the broker still holds outstanding is being reblocked by its
worker: the decision that comes with the write (routed after the batch's
events) tracks it and acks it, so the router leaves its event alone rather
than tracking it twice."""

from __future__ import annotations

import logging
from collections.abc import Callable

from corral.domain import topics
from corral.domain.store import StateSnapshot
from corral.domain.structs import ClientStatus, EvalStatus, node_ready
from corral.domain.topics import EventType
from corral.v1 import structs_pb2 as pb
from services.broker.blocked_evals import BlockedEvals
from services.broker.eval_broker import EvalBroker

log = logging.getLogger(__name__)


class FeedRouter:
    def __init__(
        self,
        broker: EvalBroker,
        blocked: BlockedEvals,
        *,
        drop_evals: bool = False,
        on_ack: Callable[[str], None] | None = None,
    ) -> None:
        self.broker = broker
        self.blocked = blocked
        #: told of every eval acked by a decision (as Eval.Ack tells it)
        self.on_ack = on_ack
        self.enabled = False
        #: test-only fault: lose every eval change (as a failed listener would)
        self.drop_evals = drop_evals
        #: ready nodes and their computed class: a node that becomes ready, or
        #: whose class changes while ready (dynamic metadata), unblocks its class
        self._ready_nodes: dict[str, str] = {}
        self._terminal_allocs: set[str] = set()

    def restore(self, snap: StateSnapshot) -> tuple[int, int]:
        """On becoming leader: every pending eval to the broker, every
        blocked eval to the tracker (exactly once: the caller enables
        routing in the same step, with no await in between)."""
        self._ready_nodes = {n.id: n.computed_class for n in snap.iter_nodes() if node_ready(n)}
        self._terminal_allocs = {
            a.id for a in snap.allocs.values() if a.client_status in ClientStatus.TERMINAL
        }
        self.broker.set_paused(snap.scheduler_config.pause_eval_broker)
        pending = blocked = 0
        for ev in sorted(snap.evals.values(), key=lambda e: e.create_index):
            if ev.status == EvalStatus.PENDING:
                # an eval the broker already has (being processed, after a
                # replica reset) must not be requeued behind itself
                if not self.broker.tracked(ev.id):
                    self.broker.enqueue(ev)
                pending += 1
            elif ev.status == EvalStatus.BLOCKED:
                if not self._reblocking(ev):
                    self.blocked.block(ev)
                blocked += 1
        self.enabled = True
        return pending, blocked

    def on_restore(self, snap: StateSnapshot) -> None:
        """The state was replaced by a snapshot restore: evals the broker
        holds may be gone, or other evals in the restored state: start
        over from it, as a new leader does (Nomad's leader reasserts its
        leadership after a restore, flushing and restoring its broker)."""
        if not self.enabled:
            return
        self.enabled = False
        for part in (self.broker, self.blocked):
            part.set_enabled(False)
            part.set_enabled(True)
        pending, blocked = self.restore(snap)
        log.warning(
            "state restored from a snapshot: broker restarted with %d pending and %d "
            "blocked evals at index %d",
            pending,
            blocked,
            snap.index,
        )

    def on_reset(self, snap: StateSnapshot) -> None:
        """The replica re-bootstrapped (it fell behind the retained change
        log), so the batches in the gap were never routed: enqueue pending
        evals again (tracked ones are no-ops), drop blocked evals that are
        no longer blocked in state, track new blocked ones, and let nodes
        that became ready (or changed class) in the gap unblock what they can."""
        if not self.enabled:
            return
        was_ready = self._ready_nodes
        self.blocked.retain(
            lambda ev: (
                (cur := snap.eval_by_id(ev.id)) is not None and cur.status == EvalStatus.BLOCKED
            )
        )
        self.enabled = False
        self.restore(snap)
        for node_id, computed_class in self._ready_nodes.items():
            if was_ready.get(node_id) == computed_class:
                continue
            node = snap.node_by_id(node_id)
            if node is not None:
                self.blocked.unblock(node.computed_class, snap.index)
                self.blocked.unblock_node(node.id, snap.index)

    def on_batch(self, batch: pb.ChangeBatch, snap: StateSnapshot) -> None:
        if not self.enabled:
            return
        for event in batch.events:
            topic = topics.of(event)
            if topic is topics.EVALUATION:
                # A plan's commit bumps its eval's modify index: the eval is
                # outstanding here already, and routing it again would run it
                # a second time after its ack.
                if (
                    not event.deleted
                    and event.type != EventType.PLAN_RESULT
                    and not self.drop_evals
                ):
                    self._route_eval(event.evaluation)
            elif topic is topics.NODE:
                self._route_node(event, batch.index)
            elif topic is topics.ALLOCATION:
                self._route_alloc(event, snap, batch.index)
            elif topic is topics.OPERATOR:
                self.broker.set_paused(event.scheduler_config.pause_eval_broker)
        if not self.drop_evals:
            for decision in batch.eval_decisions:
                self._decide(decision, snap)

    def _decide(self, decision: pb.EvalDecision, snap: StateSnapshot) -> None:
        """A worker's decision (after this batch's events were routed, so its
        created evals already wait behind the eval): ack the eval with what
        its outcome says, or restart its nack timer."""
        eval_id, token = decision.eval_id, decision.token
        if self.broker.outstanding_token(eval_id) != token:
            log.info(
                "eval %s: a decision with a token no longer outstanding; ignored",
                eval_id,
                extra={"eval_id": eval_id},
            )
            return
        if not decision.outcome:
            self.broker.outstanding_reset(eval_id, token)
            return
        written = snap.eval_by_id(eval_id)
        if written is not None:
            if written.status == EvalStatus.BLOCKED:
                self.blocked.block(written)  # the reblock: tracked again
            self.broker.note_outcome(eval_id, token, written)
        self.broker.ack(eval_id, token)
        if self.on_ack is not None:
            self.on_ack(eval_id)

    def _reblocking(self, ev: pb.Evaluation) -> bool:
        """Tracked already, or outstanding in the broker (its decision tracks it)."""
        return self.blocked.tracked(ev.id) or bool(self.broker.outstanding_token(ev.id))

    def _route_eval(self, ev: pb.Evaluation) -> None:
        if ev.status == EvalStatus.PENDING:
            self.broker.enqueue(ev)
        elif ev.status == EvalStatus.BLOCKED:
            if not self._reblocking(ev):
                self.blocked.block(ev)
        elif ev.status == EvalStatus.COMPLETE and not ev.failed_tg_allocs:
            self.blocked.untrack(ev.namespace, ev.job_id)

    def _route_node(self, event: pb.Event, index: int) -> None:
        node = event.node
        if event.deleted or not node_ready(node):
            self._ready_nodes.pop(node.id, None)
            return
        if self._ready_nodes.get(node.id) == node.computed_class:
            return
        self._ready_nodes[node.id] = node.computed_class
        self.blocked.unblock(node.computed_class, index)
        self.blocked.unblock_node(node.id, index)

    def _route_alloc(self, event: pb.Event, snap: StateSnapshot, index: int) -> None:
        alloc = event.allocation
        if event.deleted:
            self._terminal_allocs.discard(alloc.id)
            return
        if alloc.client_status not in ClientStatus.TERMINAL or alloc.id in self._terminal_allocs:
            return
        self._terminal_allocs.add(alloc.id)
        node = snap.node_by_id(alloc.node_id)
        if node is not None:
            self.blocked.unblock(node.computed_class, index)
            self.blocked.unblock_node(node.id, index)
