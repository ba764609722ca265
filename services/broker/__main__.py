"""`python -m services.broker` — run an eval broker process.

    python -m services.broker --dsn DSN --state-addr HOST:PORT [--listen 127.0.0.1:0]
        [--nack-timeout 60] [--delivery-limit 3] [--initial-nack-delay 1]
        [--subsequent-nack-delay 20] [--failed-followup-delay 60] [--reaper-interval 5]
        [--core-gc-interval 300] [--worker-lease-ttl 5] [--reconcile-interval 30]

Every broker process keeps a replica warm; the one holding the advisory
lock is the leader: it restores pending and blocked evals from the state
and serves `Eval`, reconciling its queues with the state periodically and
nacking at once the evals of workers whose lease lapsed. On losing the
lock it flushes and becomes a standby.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys

from corral.runtime import runner
from corral.security import transport
from corral.v1 import eval_pb2, eval_pb2_grpc, state_pb2, state_pb2_grpc
from corral.v1 import structs_pb2 as pb
from services.broker.blocked_evals import BlockedEvals
from services.broker.config import BrokerProcessSettings
from services.broker.core_timers import ForcedGC, run_core_timers
from services.broker.deployments import watcher_over_state
from services.broker.eval_broker import EvalBroker
from services.broker.feed import FeedRouter
from services.broker.handlers import (
    EvalServicer,
    export_metrics,
    register_core_gc,
    register_periodic,
)
from services.broker.periodic import state_dispatcher
from services.broker.reaper import Reaper
from services.broker.reconciler import Reconciler, WriteTracker

log = logging.getLogger("services.broker")


class BrokerProcess(runner.LeaderRole):
    def __init__(self, settings: BrokerProcessSettings) -> None:
        super().__init__(settings)
        self.timings = settings.broker
        self.state_channel = transport.dial(settings.state_addr)
        self.state = state_pb2_grpc.StateStub(self.state_channel)
        self.broker = EvalBroker(self.timings, on_cancelable=lambda: self.reaper.wake.set())
        self.blocked = BlockedEvals(on_release=lambda evs, i: self.reaper.on_release(evs, i))
        self.router = FeedRouter(
            self.broker, self.blocked, drop_evals=settings.fault == "drop-feed-evals"
        )
        # every eval write of the leader goes through the tracker, so the
        # reconciler can wait for the ones in flight
        self.writes = WriteTracker(self._upsert_evals)
        self.reaper = Reaper(self.timings, self.broker, self.blocked, self.writes, self._job_exists)
        self.reconciler = Reconciler(
            self.timings.reconcile_interval,
            self.broker,
            self.blocked,
            self.replica,
            self.writes,
            self.reaper.queued_ids,
        )
        self.periodic = state_dispatcher(self.replica, self.state_channel)
        self.forced_gc = ForcedGC(self.broker, lambda: self.replica.index)
        self.router.on_ack = self.forced_gc.acked
        self.deployments = watcher_over_state(
            self.replica.snapshot, self.state_channel, lambda: self.address, self.writes
        )
        self._term: asyncio.Task[None] | None = None

    def _job_exists(self, ev: pb.Evaluation) -> bool:
        return self.replica.snapshot().job_by_id(ev.namespace, ev.job_id) is not None

    async def _upsert_evals(self, evals: list[pb.Evaluation]) -> int:
        resp = await self.state.UpsertEvals(
            state_pb2.UpsertEvalsRequest(evals=evals, leader_id=self.address), timeout=30
        )
        return int(resp.index)

    def add_services(self) -> None:
        self.replica.add_listener(
            self.router.on_batch, self.router.on_reset, self.router.on_restore
        )
        self.replica.add_listener(self.periodic.on_batch, self.periodic.on_reset)
        self.replica.add_listener(self.deployments.on_batch, self.deployments.on_reset)
        servicer = EvalServicer(
            self.timings,
            self.broker,
            self.blocked,
            self.replica,
            self.is_leader,
            self.leader_address,
            on_ack=self.forced_gc.acked,
            shutting_down=self.server.shutting_down,
        )
        self.server.add(
            eval_pb2_grpc.add_EvalServicer_to_server,
            servicer,
            eval_pb2.DESCRIPTOR.services_by_name["Eval"].full_name,
        )
        register_periodic(self.server, self.periodic, self.is_leader, self.leader_address)
        register_core_gc(
            self.server, self.forced_gc, self.broker, self.is_leader, self.leader_address
        )

    def background(self) -> list[asyncio.Task[None]]:
        return [asyncio.create_task(self.metrics_loop(), name="metrics")]

    async def on_elected(self) -> None:
        """Restore every pending and blocked eval exactly once: catch up with
        the state, then (with no await in between) enable and restore from
        that snapshot; later batches reach the router as they commit."""
        latest = await self.state.GetIndex(state_pb2.GetIndexRequest(), timeout=30)
        snap = await self.replica.wait_for_index(latest.index, timeout=60)
        snap = self.replica.snapshot()
        self.broker.set_enabled(True)
        self.blocked.set_enabled(True)
        pending, blocked = self.router.restore(snap)
        log.info(
            "broker leader: restored %d pending and %d blocked evals at index %d",
            pending,
            blocked,
            snap.index,
        )
        log.info("periodic dispatcher: launched %d missed", await self.periodic.restore())
        self._term = asyncio.create_task(self._leader_tasks(), name="leader-tasks")

    async def _leader_tasks(self) -> None:
        async with asyncio.TaskGroup() as tg:
            tg.create_task(self.reaper.run(), name="reaper")
            tg.create_task(self.periodic.run(), name="periodic")
            tg.create_task(
                run_core_timers(
                    self.broker, self.timings.core_gc_interval, lambda: self.replica.index
                ),
                name="core-gc",
            )
            tg.create_task(self.deployments.run(), name="deployment-watcher")
            tg.create_task(self.reconciler.run(), name="eval-reconciler")

    async def on_lost(self) -> None:
        self.router.enabled = False
        self.periodic.disable()
        self.broker.set_enabled(False)
        self.blocked.set_enabled(False)
        if self._term is not None:
            self._term.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._term
            self._term = None
        log.warning("broker lost leadership: flushed")

    async def metrics_loop(self) -> None:
        while True:
            export_metrics(self.broker, self.blocked)
            await asyncio.sleep(1.0)

    async def close(self) -> None:
        await self.state_channel.close()


def main(argv: list[str] | None = None) -> int:
    return runner.main(BrokerProcessSettings, BrokerProcess, doc=__doc__, argv=argv)


if __name__ == "__main__":
    sys.exit(main())
