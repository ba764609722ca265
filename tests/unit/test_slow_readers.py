"""corral/runtime/slow_readers.py on a stand-in gRPC context: a stalled
reader is dropped naming where to resume, a finished stream leaves nothing
behind for asyncio to complain about, and idle sources get heartbeats."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import AsyncIterator
from typing import Any

import pytest

from corral.runtime.slow_readers import SlowReader, send_stream, with_heartbeats


class Context:
    """A server context whose writes block once `room` messages were taken;
    with `gone`, a blocked write cancelled fails a moment later instead, as
    gRPC's does when its client went away."""

    def __init__(self, room: int, *, gone: bool = False) -> None:
        self.room = room
        self.gone = gone
        self.sent: list[Any] = []

    async def write(self, message: Any) -> None:
        if len(self.sent) >= self.room:
            try:
                await asyncio.Event().wait()  # the reader reads nothing more
            except asyncio.CancelledError:
                if not self.gone:
                    raise
                await asyncio.sleep(0.05)
                raise ConnectionError("the client went away") from None
        self.sent.append(message)


async def numbered(n: int) -> AsyncIterator[tuple[int, str]]:
    for i in range(1, n + 1):
        yield i, f"batch {i}"


async def test_a_stalled_reader_is_dropped_naming_the_index_to_resume_from() -> None:
    context = Context(room=3)
    with pytest.raises(SlowReader, match="Resubscribe from index 3 "):
        await send_stream(context, numbered(10), stall_timeout=0.2, what="Event.Stream")
    assert context.sent == ["batch 1", "batch 2", "batch 3"]


async def test_a_stream_whose_client_left_leaves_no_unretrieved_error() -> None:
    loop = asyncio.get_running_loop()
    complaints: list[dict[str, Any]] = []
    loop.set_exception_handler(lambda _, ctx: complaints.append(ctx))
    context = Context(room=0, gone=True)
    call = asyncio.ensure_future(
        send_stream(context, numbered(10), stall_timeout=30, what="Event.Stream")
    )
    await asyncio.sleep(0.05)
    # gRPC cancels the call of a client that went away, here twice: the
    # second lands while the call waits for its writer to stop
    call.cancel()
    await asyncio.sleep(0.01)
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    await asyncio.sleep(0.1)  # the writer's write fails meanwhile
    gc.collect()
    await asyncio.sleep(0)
    assert not complaints, complaints


async def test_a_quiet_source_gets_heartbeats_and_keeps_its_place() -> None:
    async def slow() -> AsyncIterator[int]:
        await asyncio.sleep(0.25)
        yield 1

    got = [item async for item in with_heartbeats(slow(), 0.1)]
    assert got[-1] == 1 and None in got[:-1]
