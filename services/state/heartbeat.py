"""What only the state leader runs: node heartbeat timers and the node
drainer (Nomad's heartbeat.go and drainer/).

Heartbeats never write unless a status changes: the leader keeps one
deadline per node in memory (a heap watched by one task, so thousands of
nodes cost one timer). A node that misses its TTL plus the grace period
becomes `disconnected` while one of its allocs is inside a group's
disconnect timeout (`max_client_disconnect` / `lost_after`, see
`writes.nodes.may_disconnect`, decided inside the write), else `down`, and
node-update evals follow. After a leader change every non-down node gets the
long failover TTL, as in Nomad.

The drainer marks a draining node's allocs to migrate, at most the group's
`migrate.max_parallel` at a time (all at once past the deadline), and ends
the drain when nothing is left running there.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import logging
import random
import time

from corral.domain import structs
from corral.domain.structs import JobType, NodeStatus, Trigger, copy_msg
from corral.domain.topics import EventType
from corral.v1 import structs_pb2 as pb
from services.state import metrics
from services.state.app_context import StateContext
from services.state.config import HeartbeatSettings as HeartbeatSettings  # re-exported
from services.state.writes.jobs import new_eval
from services.state.writes.nodes import miss_heartbeat, set_drain

log = logging.getLogger(__name__)


class Heartbeats:
    def __init__(self, ctx: StateContext, settings: HeartbeatSettings) -> None:
        self.ctx = ctx
        self.settings = settings
        self.enabled = False
        self._deadline: dict[str, float] = {}
        self._heap: list[tuple[float, str]] = []
        self._changed = asyncio.Event()

    def ttl(self) -> float:
        """Grows with the number of nodes so the heartbeat rate stays under
        max_per_second; jittered so nodes spread out."""
        n = len(self.ctx.feed.snapshot().nodes)
        base = max(self.settings.min_ttl, n / self.settings.max_per_second)
        return base + random.uniform(0, base)

    def reset(self, node_id: str, ttl: float) -> None:
        if not self.enabled:
            return
        deadline = time.monotonic() + ttl + self.settings.grace
        self._deadline[node_id] = deadline
        heapq.heappush(self._heap, (deadline, node_id))
        if self._heap[0][1] == node_id:
            self._changed.set()

    def running(self, node_id: str) -> bool:
        """Whether this process (the leader) runs a timer for the node that
        has not expired: an expiry stops it before its write starts."""
        return self.enabled and node_id in self._deadline

    @property
    def active(self) -> int:
        """Nodes with a running timer (nomad.nomad.heartbeat.active)."""
        return len(self._deadline)

    def forget(self, node_id: str) -> None:
        self._deadline.pop(node_id, None)

    def start_term(self) -> None:
        """Leader elected: every live node gets the failover TTL."""
        self.enabled = True
        self._deadline.clear()
        self._heap.clear()
        for node in self.ctx.feed.snapshot().iter_nodes():
            if node.status != NodeStatus.DOWN:
                self.reset(node.id, self.settings.failover_ttl)

    def reloaded(self) -> None:
        """The state was replaced (a snapshot restore): watch the nodes it
        holds now, each with an ordinary TTL, so a node restored from
        another cluster that never heartbeats here goes down soon; the
        nodes of this one heartbeat well within it (a node the restore
        dropped is told NOT_FOUND and registers again)."""
        if not self.enabled:
            return
        self._deadline.clear()
        self._heap.clear()
        for node in self.ctx.feed.snapshot().iter_nodes():
            if node.status != NodeStatus.DOWN:
                self.reset(node.id, self.ttl())
        self._changed.set()

    def end_term(self) -> None:
        self.enabled = False
        self._deadline.clear()
        self._heap.clear()

    async def run(self) -> None:
        pending: set[asyncio.Task[None]] = set()
        while True:
            now = time.monotonic()
            while self._heap and self._heap[0][0] <= now:
                deadline, node_id = heapq.heappop(self._heap)
                if self._deadline.get(node_id) != deadline:
                    continue  # superseded by a later heartbeat
                del self._deadline[node_id]
                # concurrently, so nodes that expire together share a batch
                task = asyncio.create_task(self._expire_logged(node_id))
                pending.add(task)
                task.add_done_callback(pending.discard)
            delay = (self._heap[0][0] - time.monotonic()) if self._heap else 3600.0
            self._changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), max(0.0, delay))

    async def _expire_logged(self, node_id: str) -> None:
        try:
            await self._expire(node_id)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception(
                "could not mark node %s unresponsive", node_id, extra={"node_id": node_id}
            )
            self.reset(node_id, 1.0)

    async def _expire(self, node_id: str) -> None:
        node = self.ctx.feed.snapshot().node_by_id(node_id)
        if node is None or node.status == NodeStatus.DOWN:
            return
        # down or disconnected is decided inside the write, on committed rows
        done = await self.ctx.batcher.submit(
            lambda tx: miss_heartbeat(tx, node_id), nodes=[node_id]
        )
        node, evals, written = done.value
        new = node.status
        if written:
            metrics.HEARTBEAT_MISSED.labels(new).inc()
        _, evals, _ = done.value
        log.warning(
            "node %s missed its heartbeat: %s (%d evals)",
            node_id,
            new,
            len(evals),
            extra={"node_id": node_id},
        )
        if new == NodeStatus.DISCONNECTED:
            # still watched: a disconnected node that never returns goes down
            self.reset(node_id, self.ttl())


class Drainer:
    def __init__(self, ctx: StateContext, interval: float = 1.0) -> None:
        self.ctx = ctx
        self.interval = interval

    async def run(self) -> None:
        while True:
            try:
                await self.step()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("drainer step failed")
            await asyncio.sleep(self.interval)

    async def step(self) -> None:
        snap = self.ctx.feed.snapshot()
        for node in snap.iter_nodes():
            if node.drain:
                await self._drain(node)

    async def _drain(self, node: pb.Node) -> None:
        snap = self.ctx.feed.snapshot()
        strategy = node.drain_strategy
        live = [a for a in snap.allocs_by_node(node.id) if not structs.alloc_terminal(a)]
        if strategy.ignore_system_jobs:
            live = [a for a in live if a.job_type not in (JobType.SYSTEM, JobType.SYSBATCH)]
        if not live:
            async with self.ctx.write() as tx:
                await set_drain(tx, node.id, None, mark_eligible=False)
            log.info("node %s drain complete", node.id, extra={"node_id": node.id})
            return
        force = strategy.deadline < 0 or (
            strategy.force_deadline and time.time_ns() >= strategy.force_deadline
        )
        # system jobs last (Nomad drains them after everything else)
        service = [a for a in live if a.job_type not in (JobType.SYSTEM, JobType.SYSBATCH)]
        batch = service or live
        to_mark: list[pb.Allocation] = []
        groups: dict[tuple[str, str, str], list[pb.Allocation]] = {}
        for a in batch:
            groups.setdefault((a.namespace, a.job_id, a.task_group), []).append(a)
        for (ns, job_id, tg_name), allocs in groups.items():
            waiting = [a for a in allocs if not a.desired_transition.migrate]
            if force:
                to_mark.extend(waiting)
                continue
            job = snap.job_by_id(ns, job_id)
            tg = structs.task_group(job, tg_name) if job is not None else None
            limit = tg.migrate.max_parallel if tg is not None and tg.migrate.max_parallel else 1
            in_flight = len(allocs) - len(waiting)
            to_mark.extend(waiting[: max(0, limit - in_flight)])
        if not to_mark:
            return
        async with self.ctx.write() as tx:
            jobs: dict[tuple[str, str], pb.Job] = {}
            for a in to_mark:
                cur = (await tx.get_allocs([a.id])).get(a.id)
                if cur is None or cur.desired_transition.migrate:
                    continue  # gone, or marked since the snapshot was taken
                alloc = copy_msg(cur)
                alloc.desired_transition.migrate = True
                tx.put_alloc(alloc, EventType.ALLOCATION_UPDATE_DESIRED_STATUS)
                job = await tx.get_job(a.namespace, a.job_id)
                if job is not None:
                    jobs[structs.job_key(a.namespace, a.job_id)] = job
            for job in jobs.values():
                ev = new_eval(job, Trigger.NODE_DRAIN)
                ev.node_id = node.id
                tx.put_eval(ev)
        log.info(
            "drain of node %s: %d allocs to migrate",
            node.id,
            len(to_mark),
            extra={"node_id": node.id},
        )
