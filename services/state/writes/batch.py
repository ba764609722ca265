"""Coalescing of small, independent node writes into one transaction.

Every write serializes on the index counter, so a transaction per client
call caps the cluster at the commit rate: with 5,000 nodes registering (or
re-registering after a server restart) and every placement answered by a
`Node.UpdateAlloc`, the queue of single-row writes grows faster than it
drains and heartbeats wait behind it until their TTL runs out. Nomad
batches client alloc updates server-side for the same reason
(`batchUpdateInterval`); we batch registrations, status changes and alloc
updates alike.

One batch runs at a time: calls arriving while it commits form the next
one, so under load batches grow by themselves and when idle a call commits
at once (no timer). Every operation of a batch runs in the same `WriteTx`
and commits at the same index. An operation that fails *before* queuing any
change (the usual case: not found, secret mismatch, not ready) fails alone;
one that fails after queuing changes would leave half of itself in the
transaction, so the whole batch is rolled back and every caller gets the
error.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from opentelemetry import context as otel_context
from opentelemetry import trace

from corral.runtime import telemetry
from services.state import metrics
from services.state.db.database import Database, WriteTx

log = logging.getLogger(__name__)
tracer = telemetry.tracer("corral.state")

T = TypeVar("T")
Op = Callable[[WriteTx], Awaitable[Any]]


@dataclass
class Committed(Generic[T]):
    """An operation's result and the index its batch committed at."""

    value: T
    index: int


class _Failed:
    __slots__ = ("exc",)

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


@dataclass
class _Call:
    op: Op
    fut: asyncio.Future[Committed[Any]]
    allocs: tuple[str, ...]
    nodes: tuple[str, ...]
    evals: tuple[str, ...]
    jobs: tuple[tuple[str, str], ...]
    trace_context: otel_context.Context


Visible = Callable[[int], Awaitable[None]]


async def _no_wait(index: int) -> None:
    return None


class WriteBatcher:
    def __init__(self, db: Database, *, max_batch: int = 256, visible: Visible = _no_wait) -> None:
        self.db = db
        self.visible = visible  # waits until the local state holds an index
        self.max_batch = max_batch
        self._queue: list[_Call] = []
        self._runner: asyncio.Task[None] | None = None
        self.batches = 0
        self.ops = 0

    async def submit(
        self,
        op: Callable[[WriteTx], Awaitable[T]],
        *,
        allocs: Iterable[str] = (),
        nodes: Iterable[str] = (),
        evals: Iterable[str] = (),
        jobs: Iterable[tuple[str, str]] = (),
    ) -> Committed[T]:
        """Run `op` in the next batch; returns once that batch committed.
        `allocs`, `nodes`, `evals` and `jobs` name rows `op` will read: the batch reads
        them for all its operations at once (`WriteTx.prefetch`). The returned
        index is already `visible` on this process (read-your-writes); a batch
        that changed nothing returns the current index without consuming one."""
        fut: asyncio.Future[Committed[Any]] = asyncio.get_running_loop().create_future()
        self._queue.append(
            _Call(
                op,
                fut,
                tuple(allocs),
                tuple(nodes),
                tuple(evals),
                tuple(jobs),
                otel_context.get_current(),
            )
        )
        if self._runner is None or self._runner.done():
            self._runner = asyncio.create_task(self._run(), name="write-batcher")
        result: Committed[T] = await fut
        await self.visible(result.index)
        return result

    async def _run(self) -> None:
        while self._queue:
            batch = self._queue[: self.max_batch]
            del self._queue[: self.max_batch]
            batch = [c for c in batch if not c.fut.cancelled()]
            if batch:
                await self._commit(batch)

    async def _commit(self, batch: list[_Call]) -> None:
        """One transaction for the batch. Each caller's trace gets a
        `state.commit` span for it (the batch is one commit in several
        traces); each operation runs inside its caller's, so what it writes
        (an eval's traceparent) and its statements join that trace."""
        spans = (
            [tracer.start_span("state.commit", context=c.trace_context) for c in batch]
            if telemetry.tracing_enabled()
            else []
        )
        try:
            # the transaction's own statements (index, prefetch) go to the first caller's trace
            with trace.use_span(spans[0]) if spans else contextlib.nullcontext():
                await self._commit_traced(batch, spans)
        finally:
            for span in spans:
                span.set_attribute("batch.size", len(batch))
                span.end()

    async def _commit_traced(self, batch: list[_Call], spans: list[trace.Span]) -> None:
        results: list[Any] = []
        try:
            async with self.db.write() as tx:
                await tx.prefetch(
                    allocs=[i for c in batch for i in c.allocs],
                    nodes=[i for c in batch for i in c.nodes],
                    evals=[i for c in batch for i in c.evals],
                    jobs=[k for c in batch for k in c.jobs],
                )
                for i, call in enumerate(batch):
                    op = call.op
                    before = tx.change_count
                    try:
                        if spans:
                            with trace.use_span(spans[i]):
                                results.append(await op(tx))
                        else:
                            results.append(await op(tx))
                    except Exception as exc:
                        if tx.change_count != before:
                            raise
                        results.append(_Failed(exc))
        except BaseException as exc:
            if len(batch) > 1:
                log.warning("write batch of %d rolled back: %r", len(batch), exc)
            for call in batch:
                if not call.fut.done():
                    call.fut.set_exception(exc)
            if not isinstance(exc, Exception):
                raise  # cancelled (shutdown): the callers were told above
            return
        for span in spans:
            span.set_attribute("index", tx.index)
        self.batches += 1
        self.ops += len(batch)
        metrics.BATCH_SIZE.observe(len(batch))
        for call, res in zip(batch, results, strict=True):
            fut = call.fut
            if fut.done():
                continue
            if isinstance(res, _Failed):
                fut.set_exception(res.exc)
            else:
                fut.set_result(Committed(res, tx.index))
