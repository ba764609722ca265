"""The change feed inside a state process: follows the change log with
LISTEN/NOTIFY, keeps a local `StateStore` at the newest index, and fans the
batches out to every `State.Subscribe` and `Event.Stream` stream.

One reader per process reads each new change-log row once, however many
subscribers there are; subscribers that start behind the in-memory ring are
served from the table and then join the live ring. The ring is bounded by
bytes (`--feed-ring-bytes`), not only by count: a parsed batch takes about
four times its serialized size, and under steady churn a ring of 8,192
batches alone grew the state process by some 250 MB (issue 19). Nothing polls: the
reader sleeps until a NOTIFY (or a reconnect of the LISTEN connection, after
which it catches up from its last index).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import OrderedDict, deque
from collections.abc import AsyncIterator, Callable

import psycopg

from corral.domain import topics
from corral.domain.errors import OutOfRange, StateRestored, Unavailable
from corral.domain.store import StateSnapshot, StateStore
from corral.runtime.feed_view import FeedView
from corral.v1 import structs_pb2 as pb
from services.state.db.database import NOTIFY_CHANNEL, Database
from services.state.db.snapshot import load_dump

log = logging.getLogger(__name__)

READ_BATCH = 1000
#: a subscriber behind the ring reads the change log in pages of at most
#: this many serialized bytes (a page is held while its reader is slow)
SUBSCRIBER_PAGE_BYTES = 4 * 2**20
VISIBLE_TIMEOUT_S = 30.0
#: default bound of the ring: serialized bytes of the batches it holds
RING_BYTES = 4 * 2**20
#: and of its length, whatever the batches' size
RING_SIZE = 8192
#: bound of the encoded batches kept for subscribers of the same view
ENCODED_BYTES = 8 * 2**20


class ChangeFeed:
    def __init__(
        self, db: Database, *, ring_bytes: int = RING_BYTES, ring_size: int = RING_SIZE
    ) -> None:
        self.db = db
        self.store = StateStore()
        # the newest batches, for subscribers a little behind; with their
        # serialized sizes, so the ring is bounded by bytes as well as count
        self._ring: deque[pb.ChangeBatch] = deque()
        self._ring_sizes: deque[int] = deque()
        self._ring_bytes = 0
        self.ring_limit_bytes = ring_bytes
        self.ring_limit_size = max(1, ring_size)
        self._advanced = asyncio.Event()
        self._wake = asyncio.Event()
        self._stopping = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._ready = asyncio.Event()
        # blocking client queries wait per node: a write wakes only the nodes
        # whose allocs it touched, not every waiting client
        self._node_waiters: dict[str, asyncio.Event] = {}
        # each batch serialized once per view, for all its subscribers
        self._encoded: OrderedDict[tuple[FeedView, int], bytes] = OrderedDict()
        self._encoded_bytes = 0
        #: called after the state was reloaded while running (a snapshot
        #: restore, or a log truncated past this process): caches of state
        #: outside the store start over
        self.on_reload: list[Callable[[], None]] = []
        db.on_commit = self.committed

    @property
    def index(self) -> int:
        return self.store.index

    def snapshot(self) -> StateSnapshot:
        return self.store.snapshot()

    async def start(self) -> None:
        """Load the state, then follow the log. Returns once caught up."""
        self._tasks.append(asyncio.create_task(self._listen(), name="feed-listen"))
        await self._bootstrap()
        self._tasks.append(asyncio.create_task(self._read_loop(), name="feed-read"))
        await self._ready.wait()

    async def stop(self) -> None:
        self._stopping.set()
        self._wake.set()
        self._signal_advance()
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._tasks.clear()

    async def _bootstrap(self) -> None:
        dump = await load_dump(self.db)
        self.store.reset(dump.to_snapshot())
        self._ring.clear()
        self._ring_sizes.clear()
        self._ring_bytes = 0
        log.info("state loaded at index %d", dump.index, extra={"index": dump.index})

    async def _listen(self) -> None:
        """Hold a LISTEN connection; every NOTIFY (and every reconnect) wakes the reader."""
        backoff = 0.1
        while not self._stopping.is_set():
            try:
                conn = await psycopg.AsyncConnection.connect(self.db.dsn, autocommit=True)
                async with conn:
                    await conn.execute(f"LISTEN {NOTIFY_CHANNEL}")
                    backoff = 0.1
                    self._wake.set()  # catch up on whatever was missed while not listening
                    async for _ in conn.notifies():
                        self._wake.set()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # connection lost: retry, then catch up
                if self._stopping.is_set():
                    return
                log.warning("change feed LISTEN connection lost: %s", exc)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 5.0)

    async def _read_loop(self) -> None:
        while not self._stopping.is_set():
            try:
                await self._catch_up()
                self._ready.set()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("change feed read failed; retrying")
                await asyncio.sleep(0.5)
                continue
            await self._wake.wait()
            self._wake.clear()

    async def _catch_up(self) -> None:
        while True:
            batches = await self.db.read_log(self.store.index, READ_BATCH)
            # this process's own commits may have been applied meanwhile (committed())
            fresh = [b for b in batches if b.index > self.store.index]
            if not fresh:
                if len(batches) < READ_BATCH:
                    return
                continue
            if fresh[0].index != self.store.index + 1 or any(b.reset for b in fresh):
                # The log was truncated past us (we were down a long time), or
                # the state was replaced by a snapshot restore: reload.
                log.warning("change log truncated or reset past index %d; reloading", self.index)
                await self._bootstrap()
                self._signal_advance()
                # every node's blocking alloc query answers from the new state
                for waiter in self._node_waiters.values():
                    waiter.set()
                self._node_waiters.clear()
                for reloaded in self.on_reload:
                    try:
                        reloaded()
                    except Exception:
                        log.exception("a state reload listener failed")
                continue
            self._apply(fresh)
            if len(batches) < READ_BATCH:
                return

    def _apply(self, batches: list[pb.ChangeBatch]) -> None:
        for batch in batches:
            self.store.apply(batch)
            self._remember(batch)
            self._wake_nodes(batch)
        self._signal_advance()

    def _remember(self, batch: pb.ChangeBatch) -> None:
        """Keep `batch` in the ring, dropping the oldest beyond either bound.

        The newest batch always stays, however large (a 10,000-alloc plan),
        so live subscribers are served from memory; a dropped one is read
        from the change-log table by any subscriber that still needs it.
        """
        size = batch.ByteSize()
        self._ring.append(batch)
        self._ring_sizes.append(size)
        self._ring_bytes += size
        while len(self._ring) > 1 and (
            self._ring_bytes > self.ring_limit_bytes or len(self._ring) > self.ring_limit_size
        ):
            self._drop_oldest()

    def _drop_oldest(self) -> None:
        self._ring.popleft()
        self._ring_bytes -= self._ring_sizes.popleft()

    @property
    def ring_stats(self) -> tuple[int, int]:
        """(batches, serialized bytes) the ring holds now."""
        return len(self._ring), self._ring_bytes

    def committed(self, batches: list[pb.ChangeBatch]) -> None:
        """This process just committed `batches` (Database.on_commit).

        When they follow the local state directly they are applied at once,
        so the write's caller reads them without waiting for the NOTIFY
        round trip; otherwise another process committed in between and the
        reader is woken to fetch the gap (and these) from the log.
        """
        if any(b.reset for b in batches):
            self._wake.set()  # a snapshot restore: the reader reloads the state
        elif batches and batches[0].index == self.store.index + 1 and self._ready.is_set():
            self._apply(batches)
        elif batches and batches[-1].index > self.store.index:
            self._wake.set()

    async def wait_visible(self, index: int, timeout: float = VISIBLE_TIMEOUT_S) -> None:
        """Read-your-writes: return once the local state holds `index`.

        A write RPC calls this before it answers with `index`, so every read
        on this process afterwards reflects the write. It wakes on the feed,
        never polls; if the feed cannot catch up in `timeout` (the database
        is unreachable) the caller is told UNAVAILABLE rather than answered
        with a state that does not yet show its own write.
        """
        if self.store.index >= index:
            return
        try:
            await self.wait_for_index(index, timeout)
        except TimeoutError:
            raise Unavailable(
                f"write committed at index {index}, but this state process is still at "
                f"index {self.store.index}; read with query.min_index = {index - 1}"
            ) from None

    def _wake_nodes(self, batch: pb.ChangeBatch) -> None:
        if not self._node_waiters:
            return
        for ev in batch.events:
            topic = topics.of(ev)
            node_id = (
                ev.allocation.node_id
                if topic is topics.ALLOCATION
                else ev.key
                if topic is topics.NODE
                else ""
            )
            waiter = self._node_waiters.pop(node_id, None) if node_id else None
            if waiter is not None:
                waiter.set()

    async def wait_node(self, node_id: str, timeout: float) -> None:
        """Wait until a write touches the node or its allocs (or timeout)."""
        waiter = self._node_waiters.get(node_id)
        if waiter is None:
            waiter = self._node_waiters[node_id] = asyncio.Event()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(waiter.wait(), timeout)

    def forget_before(self, index: int) -> None:
        """Drop ring entries at or below `index` (the change log was truncated
        there): subscribers older than that must re-bootstrap."""
        while self._ring and self._ring[0].index <= index:
            self._drop_oldest()

    def encoded(self, batch: pb.ChangeBatch, view: FeedView) -> bytes:
        """`batch` as `view`'s subscribers receive it, serialized.

        Subscribers of one view (every worker, the planners; the brokers)
        follow the head together, so the bytes are kept for the ones after
        the first: a batch is projected and serialized once per view rather
        than once per stream. Bounded by bytes, oldest dropped first; a
        change-log index always holds the same batch, so a cached encoding
        never goes stale."""
        key = (view, batch.index)
        data = self._encoded.get(key)
        if data is not None:
            return data
        data = view.batch(batch).SerializeToString()
        self._encoded[key] = data
        self._encoded_bytes += len(data)
        while len(self._encoded) > 1 and self._encoded_bytes > ENCODED_BYTES:
            _, old = self._encoded.popitem(last=False)
            self._encoded_bytes -= len(old)
        return data

    def _signal_advance(self) -> None:
        ev = self._advanced
        self._advanced = asyncio.Event()
        ev.set()

    async def wait_advance(self, timeout: float | None = None) -> None:
        """Wait until the index moves (or timeout); never raises on timeout."""
        ev = self._advanced
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(ev.wait(), timeout)

    async def wait_for_index(self, min_index: int, timeout: float) -> StateSnapshot:
        """A snapshot at index >= min_index; TimeoutError if it does not come."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while self.store.index < min_index:
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise TimeoutError(
                    f"timed out waiting for index {min_index} (at {self.store.index})"
                )
            await self.wait_advance(remaining)
        return self.store.snapshot()

    async def subscribe(
        self, from_index: int, stop: asyncio.Event | None = None
    ) -> AsyncIterator[pb.ChangeBatch]:
        """Every batch with index > from_index, in order, without gaps, until stop.

        Raises OutOfRange when from_index is older than the retained log, or
        newer than anything this state has (the subscriber followed another
        database), or when the state was replaced by a snapshot restore
        after from_index (a `reset` batch): the subscriber must re-bootstrap
        from a snapshot.
        """
        last = from_index
        if last > self.store.index and last > await self.db.latest_index():
            raise OutOfRange(f"from_index {last} is ahead of the state (index {self.store.index})")
        while True:
            if stop is not None and stop.is_set():
                return
            if self._stopping.is_set():
                return
            ring = self._ring
            if last >= self.store.index:
                ev = self._advanced
                waiters = [asyncio.ensure_future(ev.wait())]
                if stop is not None:
                    waiters.append(asyncio.ensure_future(stop.wait()))
                try:
                    await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    for w in waiters:
                        w.cancel()
                continue
            if ring and ring[0].index <= last + 1:
                start = last + 1 - ring[0].index
                pending = [ring[i] for i in range(start, len(ring))]
                for batch in pending:
                    yield batch
                    last = batch.index
                continue
            batches = await self.db.read_log(last, READ_BATCH, max_bytes=SUBSCRIBER_PAGE_BYTES)
            if batches and batches[0].reset:
                raise StateRestored(batches[0].index)
            if not batches or batches[0].index != last + 1:
                oldest = await self.db.oldest_retained_index()
                raise OutOfRange(
                    f"from_index {last} is older than the retained change log "
                    f"(oldest retained {oldest}); re-bootstrap from State.Snapshot"
                )
            for batch in batches:
                if batch.reset:
                    raise StateRestored(batch.index)
                yield batch
                last = batch.index
