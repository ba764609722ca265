"""Server streams to readers that may stop reading (issue 26): an event
stream or a change-feed subscription whose client takes nothing must cost
a bounded amount of memory, and not for ever.

`send_stream` writes a stream's messages with `context.write` as the reader
takes them, pulling the next one from its source only when the previous one
was handed to gRPC. So a reader that falls behind holds only what gRPC's
flow control already took for it (the client's window and the transport's
buffers: about 4 MiB per stream here) and its source's current page (the
feed reads the change log in pages bounded by bytes). Nothing queues up
beyond that, however long the stream lives.

A reader that lets a message wait for `stall_timeout` — it read nothing
for that long with all of that queued for it — is dropped:
RESOURCE_EXHAUSTED naming the last index it was sent, so it resubscribes
from there (Nomad closes a subscription that falls out of its event buffer
the same way: "subscription closed by server, client should resubscribe").
Each stream has its own writer: one stuck reader never slows another.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, TypeVar

from corral.domain.errors import ResourceExhausted

M = TypeVar("M")

#: default time a reader may take nothing while a message waits for it
STALL_TIMEOUT_S = 30.0


class SlowReader(ResourceExhausted):
    """The reader stopped reading: its stream was ended to free what it held."""


@dataclass
class _Progress:
    sent: int = -1  # the index of the last message handed to gRPC
    since: float = 0.0  # when the write in flight started (0: none in flight)


async def send_stream(
    context: Any,
    source: AsyncIterator[tuple[int, Any]],
    *,
    stall_timeout: float = STALL_TIMEOUT_S,
    what: str,
) -> None:
    """Write every `(index, message)` of `source` to the stream, in order.
    Raises `SlowReader` (the stuck write cancelled) when the reader stalls;
    returns when `source` ends, raising what it raised."""
    loop = asyncio.get_running_loop()
    progress = _Progress()

    async def write_all() -> None:
        async for index, message in source:
            progress.since = loop.time()
            await context.write(message)
            progress.since = 0.0
            progress.sent = index

    writer = asyncio.create_task(write_all(), name=f"{what}-writer")
    # however the call ends (gRPC may cancel it more than once when its
    # client goes away), what the writer met is collected, never left for
    # asyncio to log as "Task exception was never retrieved"
    writer.add_done_callback(_collect)
    # the watch wakes a few times per timeout, not per message: the write
    # path costs what it did without it
    check = stall_timeout / 4
    try:
        while True:
            done, _ = await asyncio.wait({writer}, timeout=check)
            if done:
                writer.result()
                return
            since = progress.since
            if since and loop.time() - since >= stall_timeout:
                writer.cancel()
                with contextlib.suppress(BaseException):
                    await writer
                raise SlowReader(
                    f"{what}: the reader took nothing for {stall_timeout:g} s; dropped. "
                    f"Resubscribe from index {max(progress.sent, 0)} (the last one sent)"
                )
    finally:
        if not writer.done():
            writer.cancel()
            with contextlib.suppress(BaseException):
                await writer


async def with_heartbeats(source: AsyncIterator[M], interval: float) -> AsyncIterator[M | None]:
    """`source`'s items, and None whenever it has been quiet for `interval`
    seconds (the pending read is kept, never cancelled: cancelling an async
    generator's step would end it)."""
    pending: asyncio.Future[M] | None = None
    try:
        while True:
            if pending is None:
                pending = asyncio.ensure_future(anext(source))
                pending.add_done_callback(_collect)
            done, _ = await asyncio.wait({pending}, timeout=interval)
            if not done:
                yield None
                continue
            try:
                item = pending.result()
            except StopAsyncIteration:
                return
            pending = None
            yield item
    finally:
        if pending is not None and not pending.done():
            pending.cancel()
            with contextlib.suppress(BaseException):
                await pending


def _collect(done: asyncio.Future[Any]) -> None:
    """Mark what a finished task met as seen (its owner has moved on)."""
    if not done.cancelled():
        done.exception()
