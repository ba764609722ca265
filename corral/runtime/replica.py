"""The replica: an in-memory copy of the state fed by `State.Subscribe`.

What a Nomad follower's FSM is to Nomad, this is to the broker, the planner
and the workers. It bootstraps from `State.Snapshot`, then applies every
change batch in index order; when the stream breaks it reconnects and resumes
from its last applied index, and when the state says it is too far behind
the retained change log (OUT_OF_RANGE) it re-bootstraps.

`wait_for_index` is event-driven — it wakes when the feed applies the index
(the "potential optimization" the seed's waitForIndex mentions), it never
sleeps in a loop — and returns an immutable snapshot that is O(1) to take.

A replica asks for a view of the feed (`corral/runtime/feed_view.py`): by default
every topic with allocs less their placement metrics, which no replica
reads; the broker's asks for fewer topics and a status view of allocs. Its
snapshot and its subscription ask for the same view, so it holds the same
whether it bootstrapped or resumed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

import grpc
from prometheus_client import Gauge

from corral.domain.errors import RESTORED_METADATA_KEY
from corral.domain.store import StateSnapshot, StateStore
from corral.runtime import feed_view
from corral.runtime.feed_view import FeedView
from corral.security import transport
from corral.v1 import state_pb2, state_pb2_grpc
from corral.v1 import structs_pb2 as pb

log = logging.getLogger(__name__)

OnBatch = Callable[[pb.ChangeBatch, StateSnapshot], None]
OnReset = Callable[[StateSnapshot], None]
_Listener = tuple[OnBatch, OnReset | None, OnReset | None]

REPLICA_INDEX = Gauge("corral_replica_index", "Newest index applied by the replica", ["replica"])
REPLICA_LAG = Gauge(
    "corral_replica_lag_seconds", "Seconds between a batch's commit and its apply", ["replica"]
)


class Replica:
    """In-memory state following the state service's change feed."""

    def __init__(
        self,
        state_addr: str,
        *,
        name: str = "replica",
        reconnect_backoff: float = 0.1,
        max_backoff: float = 1.0,
        view: FeedView | None = None,
    ) -> None:
        self.state_addr = state_addr
        self.name = name
        self.view = view or FeedView.of(alloc_view=feed_view.SCHEDULING)
        # a replica's readers never look at placement metrics: keep allocs lean
        self._store = StateStore(lean=True)
        self._advanced = asyncio.Event()
        self._listeners: list[_Listener] = []
        self._running = asyncio.Event()
        self._running.set()
        self._stopping = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._channel: grpc.aio.Channel | None = None
        self._backoff = reconnect_backoff
        self._max_backoff = max_backoff
        self._bootstraps = 0

    # ------------------------------------------------------------ reading

    @property
    def index(self) -> int:
        return self._store.index

    @property
    def bootstraps(self) -> int:
        """How many times the replica loaded a full snapshot."""
        return self._bootstraps

    def snapshot(self) -> StateSnapshot:
        return self._store.snapshot()

    async def wait_for_index(self, min_index: int, timeout: float) -> StateSnapshot:
        """A snapshot at index >= min_index, or TimeoutError after `timeout` s."""
        if self._store.index >= min_index:
            return self._store.snapshot()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while self._store.index < min_index:
            remaining = deadline - loop.time()
            if remaining <= 0:
                at = self._store.index
                raise TimeoutError(
                    f"replica {self.name} at index {at}, timed out waiting for {min_index}"
                )
            ev = self._advanced
            try:
                await asyncio.wait_for(ev.wait(), remaining)
            except TimeoutError:
                continue
        return self._store.snapshot()

    def add_listener(
        self,
        on_batch: OnBatch,
        on_reset: OnReset | None = None,
        on_restore: OnReset | None = None,
    ) -> None:
        """Call on_batch after each applied batch (in index order) and
        on_reset after a full re-bootstrap; after one that follows a
        snapshot restore (the state was replaced, not merely too far
        ahead), on_restore instead when given. Listeners run on the feed
        task: keep them quick and do not block."""
        self._listeners.append((on_batch, on_reset, on_restore))

    # ------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        """Bootstrap from a snapshot, then follow the feed in the background."""
        self._channel = transport.dial(
            self.state_addr,
            options=[
                ("grpc.max_receive_message_length", transport.MAX_MESSAGE_BYTES),
                ("grpc.max_send_message_length", transport.MAX_MESSAGE_BYTES),
            ],
        )
        stub = state_pb2_grpc.StateStub(self._channel)
        backoff = self._backoff
        while True:
            try:
                await self._bootstrap(stub)
                break
            except grpc.aio.AioRpcError as exc:
                if self._stopping.is_set():
                    return
                log.warning(
                    "replica %s: bootstrap failed (%s); retrying", self.name, exc.code().name
                )
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, self._max_backoff)
        self._task = asyncio.create_task(self._follow(stub), name=f"replica-{self.name}")

    async def stop(self) -> None:
        self._stopping.set()
        self._running.set()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
            self._task = None
        if self._channel is not None:
            await self._channel.close()
            self._channel = None

    def pause(self) -> None:
        """Stop applying batches (they queue in the stream) — lets tests and
        operators hold a replica behind on purpose."""
        self._running.clear()

    def resume(self) -> None:
        self._running.set()

    # ------------------------------------------------------------ feed

    async def _bootstrap(
        self, stub: state_pb2_grpc.StateAsyncStub, *, restored: bool = False
    ) -> None:
        index = 0
        tables: dict[str, int] = {}
        parts: dict[str, list[object]] = {
            "jobs": [],
            "job_versions": [],
            "nodes": [],
            "allocs": [],
            "evals": [],
            "deployments": [],
            "job_summaries": [],
            "service_registrations": [],
            "namespaces": [],
            "node_pools": [],
            "scaling_policies": [],
            "scaling_events": [],
        }
        config = pb.SchedulerConfiguration()
        first = True
        request = state_pb2.SnapshotRequest(
            chunk_size=2000,
            topics=sorted(self.view.topics),
            alloc_view=self.view.alloc_view,  # type: ignore[arg-type]
        )
        chunks = stub.Snapshot(request, wait_for_ready=True)
        async for chunk in chunks:
            if first:
                index = chunk.index
                tables = {t.table: t.index for t in chunk.table_indexes}
                config = chunk.scheduler_config
                first = False
            for name, items in parts.items():
                items.extend(getattr(chunk, name))
        snap = StateStore.build(
            index,
            scheduler_config=config,
            table_indexes=tables,
            lean=True,
            **parts,  # type: ignore[arg-type]
        )
        self._store.reset(snap)
        self._bootstraps += 1
        REPLICA_INDEX.labels(self.name).set(index)
        log.info("replica %s bootstrapped at index %d", self.name, index, extra={"index": index})
        for _, on_reset, on_restore in self._listeners:
            handler = on_restore if restored and on_restore is not None else on_reset
            if handler is not None:
                handler(snap)
        self._signal()

    async def _follow(self, stub: state_pb2_grpc.StateAsyncStub) -> None:
        backoff = 0.0  # the first resume after a break is immediate
        broken_at: float | None = None
        while not self._stopping.is_set():
            try:
                request = state_pb2.SubscribeRequest(
                    from_index=self._store.index,
                    topics=sorted(self.view.topics),
                    alloc_view=self.view.alloc_view,  # type: ignore[arg-type]
                )
                stream = stub.Subscribe(request, wait_for_ready=True)
                async for batch in stream:
                    if broken_at is not None:
                        self._resumed(broken_at)
                        broken_at = None
                    if not self._running.is_set():
                        await self._running.wait()
                    self._apply(batch)
                    backoff = 0.0
                # the server ended the stream (shutdown): reconnect
                broken_at = broken_at or time.monotonic()
            except asyncio.CancelledError:
                raise
            except grpc.aio.AioRpcError as exc:
                if self._stopping.is_set():
                    return
                broken_at = broken_at or time.monotonic()
                if exc.code() == grpc.StatusCode.OUT_OF_RANGE:
                    log.warning("replica %s: %s; re-bootstrapping", self.name, exc.details())
                    trailers = exc.trailing_metadata() or ()
                    restored = any(k == RESTORED_METADATA_KEY for k, _ in trailers)
                    with contextlib.suppress(grpc.aio.AioRpcError):
                        await self._bootstrap(stub, restored=restored)
                        broken_at = None
                    continue
                log.info("replica %s: feed interrupted (%s); resuming", self.name, exc.code().name)
            if backoff:
                await asyncio.sleep(backoff)
            backoff = min(max(backoff * 2, self._backoff), self._max_backoff)

    def _resumed(self, broken_at: float) -> None:
        """Log how long the feed was broken (recovery time, docs/operations.md)."""
        log.info(
            "replica %s: feed resumed at index %d after %.2fs",
            self.name,
            self._store.index,
            time.monotonic() - broken_at,
            extra={"index": self._store.index},
        )

    def _apply(self, batch: pb.ChangeBatch) -> None:
        before = self._store.index
        snap = self._store.apply(batch)
        if snap.index == before:
            return  # a redelivered batch
        REPLICA_INDEX.labels(self.name).set(snap.index)
        if batch.time:
            REPLICA_LAG.labels(self.name).set(max(0.0, time.time() - batch.time / 1e9))
        for on_batch, _, _ in self._listeners:
            try:
                on_batch(batch, snap)
            except Exception:
                log.exception("replica %s: listener failed on index %d", self.name, batch.index)
        self._signal()

    def _signal(self) -> None:
        ev = self._advanced
        self._advanced = asyncio.Event()
        ev.set()
