"""What only the broker leader writes back to the state, in batches:

* cancelable evals (covered or superseded by an acked eval of the same
  job), woken by acks plus a periodic sweep (seed 000), one batch at a
  time; a backlog larger than a batch drains batch after batch, back to back
  (`cancel_backlog_pause`, 0 by default), at the state's write rate rather
  than one batch per sweep (minutes for an eval storm's 100,000);
* evals that reached the delivery limit: marked failed, with a follow-up
  eval after the failed follow-up delay (Nomad's reapFailedEvaluations);
* duplicate blocked evals, canceled;
* blocked evals released by a capacity change, written back as pending at a
  new index so the worker's snapshot includes what unblocked them;
* every minute, the release of evals blocked on plan conflicts.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Awaitable, Callable

from corral.domain import structs
from corral.domain.structs import EvalStatus, JobType, Trigger, copy_msg, new_id
from corral.v1 import structs_pb2 as pb
from services.broker.blocked_evals import BlockedEvals
from services.broker.config import BrokerSettings
from services.broker.eval_broker import FAILED_QUEUE, EvalBroker

log = logging.getLogger(__name__)

WriteEvals = Callable[[list[pb.Evaluation]], Awaitable[int]]


class Reaper:
    def __init__(
        self,
        settings: BrokerSettings,
        broker: EvalBroker,
        blocked: BlockedEvals,
        write: WriteEvals,
        job_exists: Callable[[pb.Evaluation], bool],
    ) -> None:
        self.settings = settings
        self.broker = broker
        self.blocked = blocked
        self.write = write
        self.job_exists = job_exists
        self.wake = asyncio.Event()
        self._released: list[pb.Evaluation] = []

    def on_release(self, released: list[pb.Evaluation], index: int) -> None:
        for ev in released:
            out = copy_msg(ev)
            out.status = EvalStatus.PENDING
            out.status_description = f"unblocked by a capacity change at index {index}"
            self._released.append(out)
        self.wake.set()

    def queued_ids(self) -> set[str]:
        """Evals waiting here for a write not yet started: released blocked
        evals (still `blocked` in the state) and duplicates to cancel."""
        return {ev.id for ev in self._released} | {ev.id for ev in self.blocked.duplicates}

    async def run(self) -> None:
        async with asyncio.TaskGroup() as tg:
            tg.create_task(self._writes())
            tg.create_task(self._failed())
            tg.create_task(self._unblock_failed())

    async def _writes(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.wake.wait(), self.settings.reaper_interval)
            self.wake.clear()
            try:
                await self._flush()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("broker write-back failed (will retry): %s", exc)
                await asyncio.sleep(1.0)
                self.wake.set()
                continue
            if self.broker.has_cancelable():
                if self.settings.cancel_backlog_pause > 0:
                    await asyncio.sleep(self.settings.cancel_backlog_pause)
                self.wake.set()

    async def _flush(self) -> None:
        if self._released:
            batch, self._released = self._released, []
            try:
                await self.write(batch)
            except Exception:
                self._released[:0] = batch
                raise
        dups = self.blocked.take_duplicates()
        if dups:
            canceled = []
            for dup in dups:
                out = copy_msg(dup)
                out.status = EvalStatus.CANCELED
                out.status_description = (
                    f'existing blocked evaluation exists for job "{dup.job_id}"'
                )
                canceled.append(out)
            try:
                await self.write(canceled)
            except Exception:
                self.blocked.duplicates[:0] = dups
                raise
        # one batch per pass, so the released and duplicate evals above and
        # other writers' calls are not kept waiting behind a whole storm
        if self.broker.has_cancelable():
            batch = self.broker.take_cancelable(self.settings.cancel_batch_size)
            canceled = []
            for ev in batch:
                out = copy_msg(ev)
                out.status = EvalStatus.CANCELED
                out.status_description = "canceled after more recent eval was processed"
                canceled.append(out)
            try:
                await self.write(canceled)
            except Exception:
                self.broker.return_cancelable(batch)
                raise
            log.info("canceled %d superseded evals", len(canceled))

    async def _failed(self) -> None:
        while True:
            got = await self.broker.dequeue([FAILED_QUEUE], timeout=1.0)
            if got is None:
                continue
            ev, token = got
            failed = copy_msg(ev)
            failed.status = EvalStatus.FAILED
            failed.status_description = (
                f"evaluation reached delivery limit ({self.settings.delivery_limit})"
            )
            writes = [failed]
            if ev.type != JobType.CORE and self.job_exists(ev):
                delay = self.settings.failed_followup_delay + random.uniform(
                    0, self.settings.failed_followup_jitter
                )
                follow = pb.Evaluation(
                    id=new_id(),
                    namespace=ev.namespace,
                    priority=ev.priority,
                    type=ev.type,
                    triggered_by=Trigger.FAILED_FOLLOW_UP,
                    job_id=ev.job_id,
                    status=EvalStatus.PENDING,
                    previous_eval=ev.id,
                    wait_until=structs.now_ns() + int(delay * 1e9),
                    traceparent=ev.traceparent,
                )
                failed.next_eval = follow.id
                writes.append(follow)
            try:
                await self.write(writes)
            except Exception as exc:
                log.warning(
                    "could not mark eval %s failed: %s", ev.id, exc, extra={"eval_id": ev.id}
                )
                self.broker.nack_quietly(ev.id, token)
                await asyncio.sleep(1.0)
                continue
            log.warning("eval %s failed after %d deliveries", ev.id, self.settings.delivery_limit)
            with contextlib.suppress(Exception):
                self.broker.ack(ev.id, token)

    async def _unblock_failed(self) -> None:
        while True:
            await asyncio.sleep(self.settings.unblock_failed_interval)
            self.blocked.unblock_failed()
