"""The leader's eval reconciler: nothing pending in the state stays unknown
to the broker.

The broker learns of evals from its replica's change feed and restores all
of them when it takes office (Nomad's `restoreEvals`). Anything that makes
it miss one while in office — a listener that failed on a batch, an ack
without the outcome written (refused now, see handlers.Ack), a bug — would
leave that eval `pending` (or `blocked` and never released) until the next
leader change. So on taking office and every `reconcile_interval` the
leader compares its replica with what it holds:

* a `pending` eval the broker does not hold in any form (ready, pending
  behind its job's eval, unacked, held by a wait or a nack delay, in the
  `_failed` queue, or about to be canceled) is enqueued again;
* a `blocked` eval neither tracked, nor outstanding (being reblocked), nor
  queued in the reaper's write-backs (released, or a duplicate to cancel),
  nor untracked on purpose (a later eval of its job completed with
  everything placed) is tracked again (Nomad's `reapDupBlockedEvaluations` finds the
  duplicates among what is tracked; we also find what is missing).

A write of the broker's own may be in flight while a pass looks (a released
eval on its way to `pending`, a cancelation): the pass takes its candidates,
waits until every write started before then has finished and reached the
replica, and repairs only the candidates still unknown with the same modify
index. Every repair is logged with the eval id and counted in
`corral_broker_reconcile_repairs_total{kind}`. Core evals are never stored
by the broker, so they are left out.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

from corral.domain.store import StateSnapshot
from corral.domain.structs import EvalStatus, JobType
from corral.v1 import structs_pb2 as pb
from services.broker import metrics
from services.broker.blocked_evals import BlockedEvals
from services.broker.eval_broker import EvalBroker

log = logging.getLogger(__name__)

WriteEvals = Callable[[list[pb.Evaluation]], Awaitable[int]]
#: bound on waiting for in-flight writes and the replica during one pass
SETTLE_TIMEOUT = 60.0


class ReplicaView(Protocol):
    def snapshot(self) -> StateSnapshot: ...

    async def wait_for_index(self, min_index: int, timeout: float) -> StateSnapshot: ...


class WriteTracker:
    """Wraps the broker's state write: counts the writes in flight and the
    highest index written, so a reconciler pass can wait for writes it may
    have looked across."""

    def __init__(self, write: WriteEvals) -> None:
        self._write = write
        self._seq = itertools.count()
        self._in_flight: set[int] = set()
        self._done = asyncio.Condition()
        self.last_index = 0

    async def __call__(self, evals: list[pb.Evaluation]) -> int:
        seq = next(self._seq)
        self._in_flight.add(seq)
        try:
            index = await self._write(evals)
            self.last_index = max(self.last_index, index)
            return index
        finally:
            self._in_flight.discard(seq)
            async with self._done:
                self._done.notify_all()

    def mark(self) -> int:
        """A point in the write sequence: writes started before it are < it."""
        return next(self._seq)

    async def settled(self, mark: int) -> int:
        """Wait until every write started before `mark` has finished; the
        highest index written so far."""
        async with self._done:
            await self._done.wait_for(lambda: all(s > mark for s in self._in_flight))
        return self.last_index


@dataclass
class Repairs:
    pending: list[str]
    blocked: list[str]


class Reconciler:
    def __init__(
        self,
        interval: float,
        broker: EvalBroker,
        blocked: BlockedEvals,
        replica: ReplicaView,
        writes: WriteTracker,
        queued_writes: Callable[[], set[str]],
    ) -> None:
        self.interval = interval
        self.broker = broker
        self.blocked = blocked
        self.replica = replica
        self.writes = writes
        #: ids of evals the reaper holds for a write not yet started
        self.queued_writes = queued_writes

    async def run(self) -> None:
        """One pass on taking office, then one every `interval` (0: only the first)."""
        while True:
            try:
                await self.reconcile()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("eval reconciler pass failed (next pass retries): %s", exc)
            if self.interval <= 0:
                return
            await asyncio.sleep(self.interval)

    def _unknown(self, snap: StateSnapshot) -> list[pb.Evaluation]:
        held = self.broker.known_ids()
        queued = self.queued_writes()
        out = []
        for ev in snap.evals.values():
            if ev.type == JobType.CORE or ev.id in held:
                continue
            if ev.status == EvalStatus.PENDING or (
                ev.status == EvalStatus.BLOCKED and not self._blocked_known(snap, ev, queued)
            ):
                out.append(ev)
        return out

    def _blocked_known(self, snap: StateSnapshot, ev: pb.Evaluation, queued: set[str]) -> bool:
        return (
            self.blocked.tracked(ev.id)
            or ev.id in queued
            or bool(self.broker.outstanding_token(ev.id))  # its decision tracks it
            or _untracked_on_purpose(snap, ev)
        )

    async def reconcile(self) -> Repairs:
        """One pass; returns the ids it repaired."""
        repairs = Repairs([], [])
        if not self.broker.enabled:
            return repairs
        mark = self.writes.mark()
        candidates = self._unknown(self.replica.snapshot())
        if not candidates:
            return repairs
        index = await asyncio.wait_for(self.writes.settled(mark), SETTLE_TIMEOUT)
        snap = await self.replica.wait_for_index(index, SETTLE_TIMEOUT)
        if not self.broker.enabled:
            return repairs
        # no await from here on: the check and the repair see one state
        still = {ev.id for ev in self._unknown(snap)}
        for ev in sorted(candidates, key=lambda e: e.create_index):
            cur = snap.eval_by_id(ev.id)
            if cur is None or ev.id not in still or cur.modify_index != ev.modify_index:
                continue
            if cur.status == EvalStatus.PENDING:
                self.broker.enqueue(cur)
                repairs.pending.append(cur.id)
                kind = "pending"
            else:
                self.blocked.block(cur)
                repairs.blocked.append(cur.id)
                kind = "blocked"
            metrics.RECONCILE_REPAIRS.labels(kind).inc()
            log.warning(
                "eval reconciler: %s eval %s of job %s was unknown to the broker; %s",
                kind,
                cur.id,
                cur.job_id,
                "re-enqueued" if kind == "pending" else "tracked again",
                extra={"eval_id": cur.id, "job_id": cur.job_id, "index": snap.index},
            )
        return repairs


def _untracked_on_purpose(snap: StateSnapshot, ev: pb.Evaluation) -> bool:
    """A later eval of the job completed with everything placed, so the feed
    untracked this blocked eval (feed.FeedRouter._route_eval): leave it."""
    return any(
        other.status == EvalStatus.COMPLETE
        and not other.failed_tg_allocs
        and other.modify_index > ev.modify_index
        for other in snap.evals_by_job(ev.namespace, ev.job_id)
    )
