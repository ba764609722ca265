"""Which asyncio event loop a role process runs on.

uvloop (libuv) runs the same asyncio programs with less CPU per callback,
and every role's hot loop is callbacks: gRPC's aio completion queue, psycopg
and timers. `CORRAL_EVENT_LOOP=asyncio` (or `--event-loop asyncio`) falls
back to the standard loop, e.g. to compare the two or to rule uvloop out
when chasing a bug.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any, Literal, TypeVar

import uvloop

T = TypeVar("T")

EventLoop = Literal["uvloop", "asyncio"]


def loop_factory(kind: EventLoop) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """A factory of `kind`'s loops (None: asyncio's own)."""
    if kind == "uvloop":
        return uvloop.new_event_loop
    return None


def run(main: Coroutine[Any, Any, T], kind: EventLoop) -> T:
    """`asyncio.run(main)` on a loop of `kind`."""
    with asyncio.Runner(loop_factory=loop_factory(kind)) as runner:
        return runner.run(main)
