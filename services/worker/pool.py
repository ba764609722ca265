"""The worker pool: N scheduler loops sharing one replica, one executor and
the broker/planner clients, reconfigurable at run time (Nomad 1.2's
scheduler worker API).

The pool also holds the process's lease with the broker: every dequeue
names `lease_id`, and a heartbeat task renews the lease every
`heartbeat_interval` on the event loop, whatever the loops are doing (a
scheduler runs in a thread), so a slow scheduling run keeps its lease and
a dead process loses it within the broker's lease ttl."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import uuid
from concurrent.futures import Executor, ThreadPoolExecutor

import grpc

from corral.domain.errors import InvalidArgument
from corral.runtime.replica import Replica
from corral.security import access
from corral.v1 import eval_pb2, state_pb2_grpc, worker_pb2
from services.worker import metrics
from services.worker.clients import RoleClient
from services.worker.config import MAX_SCHEDULERS, WorkerSettings, validate_config
from services.worker.scheduler.feasible.inflight import InFlightPlacements
from services.worker.worker import Worker

log = logging.getLogger(__name__)


class WorkerPool:
    def __init__(
        self,
        settings: WorkerSettings,
        replica: Replica,
        broker: RoleClient,
        planner: RoleClient,
        state: state_pb2_grpc.StateAsyncStub,
    ) -> None:
        validate_config(settings.num_schedulers, settings.enabled_schedulers)
        self.settings = settings
        self.replica = replica
        self.broker = broker
        self.planner = planner
        self.state = state
        self.enabled_schedulers = list(settings.enabled_schedulers)
        self.workers: list[Worker] = []
        # One thread per loop: a scheduler blocks its thread while its plan
        # is applied, and other loops keep scheduling meanwhile.
        self.executor: Executor = ThreadPoolExecutor(
            max_workers=MAX_SCHEDULERS, thread_name_prefix="scheduler"
        )
        self._lock = asyncio.Lock()
        #: what each loop's eval placed, for the other loops to count until
        #: their snapshot holds it: no two loops bid for the same capacity
        #: (services/worker/scheduler/feasible/inflight.py)
        self.inflight = InFlightPlacements()
        metrics.PLACEMENT_CLAIMS.source = self.inflight
        #: this process's lease with the broker (unique per process start)
        self.lease_id = f"{socket.gethostname()[:64]}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self._heartbeat: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._heartbeat = asyncio.create_task(self._heartbeats(), name="lease-heartbeat")
        await self._resize(self.settings.num_schedulers)

    async def stop(self, timeout: float = 10.0) -> None:
        """Stop every loop: each finishes or nacks its current eval."""
        workers = list(self.workers)
        for w in workers:
            w.stop()
        await asyncio.gather(*(w.wait_stopped(timeout) for w in workers))
        if self._heartbeat is not None:
            self._heartbeat.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._heartbeat
        self.executor.shutdown(wait=False, cancel_futures=True)

    async def _heartbeats(self) -> None:
        """Renew the lease until stopped; a failure (no leader yet, a
        standby) is retried at the next tick: the broker's ttl spans several."""
        interval = self.settings.heartbeat_interval
        request = eval_pb2.EvalHeartbeatRequest(worker_id=self.lease_id)
        failing = False
        while True:
            try:
                await self.broker.call("Heartbeat", request, timeout=max(1.0, 2 * interval))
                if failing:
                    log.info("worker lease %s: heartbeats reach the broker again", self.lease_id)
                failing = False
            except grpc.aio.AioRpcError as exc:
                if not failing:
                    log.warning(
                        "worker lease %s: heartbeat failed (%s): %s",
                        self.lease_id,
                        exc.code().name,
                        exc.details(),
                    )
                failing = True
            await asyncio.sleep(interval)

    # ------------------------------------------------------------ admin

    def info(self) -> list[worker_pb2.WorkerInfo]:
        """The workers, as the caller may see them: operator:read shows the
        pool, and the eval a worker runs only to a caller who may read-job
        in its namespace (an eval id of another namespace is not the
        operator's to see)."""
        return [
            worker_pb2.WorkerInfo(
                id=w.id,
                enabled_schedulers=self.enabled_schedulers,
                started=w.started,
                status=w.status,
                workload_status=w.workload,
                current_eval_id=w.current_eval_id
                if access.may_read_namespace(w.current_eval_namespace)
                else "",
                snapshot_index=w.snapshot_index,
                evals_processed=w.evals_processed,
            )
            for w in self.workers
        ]

    def select(self, ids: list[str]) -> list[Worker]:
        if not ids:
            return list(self.workers)
        by_id = {w.id: w for w in self.workers}
        missing = [i for i in ids if i not in by_id]
        if missing:
            raise InvalidArgument("worker_ids", f"unknown worker id(s): {', '.join(missing)}")
        return [by_id[i] for i in ids]

    def config(self) -> worker_pb2.WorkerPoolConfig:
        return worker_pb2.WorkerPoolConfig(
            num_schedulers=len([w for w in self.workers if not w.stopping]),
            enabled_schedulers=self.enabled_schedulers,
        )

    async def set_config(self, num: int, enabled: list[str]) -> worker_pb2.WorkerPoolConfig:
        """Change the number of loops and the scheduler types they dequeue,
        without a restart: extra loops stop (nacking nothing: they finish the
        eval they hold), new ones start; enabled types apply on the next
        dequeue of every loop."""
        validate_config(num, enabled)
        async with self._lock:
            self.enabled_schedulers = list(enabled)
            await self._resize(num)
        return self.config()

    async def _resize(self, num: int) -> None:
        live = [w for w in self.workers if not w.stopping]
        while len(live) < num:
            w = Worker(self, f"{uuid.uuid4().hex[:8]}")
            w.start()
            self.workers.append(w)
            live.append(w)
        extra = live[num:]
        for w in extra:
            w.stop()
        if extra:
            await asyncio.gather(*(w.wait_stopped(30) for w in extra))
            self.workers = [w for w in self.workers if w not in extra]
        log.info("worker pool: %d schedulers, enabled %s", num, ",".join(self.enabled_schedulers))
