"""The one way tests wait for a state: poll a check until it holds, within
a bounded time, then fail naming what was awaited and the last value seen.

Wait for the state you mean (the replacement alloc running, the eval
complete), not for a condition an old object can still satisfy, and never
sleep a fixed time to let things settle.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

DEFAULT_TIMEOUT_S = 45.0


async def until(
    check: Callable[[], Any | Awaitable[Any]],
    timeout: float = DEFAULT_TIMEOUT_S,
    *,
    what: str = "condition",
    interval: float = 0.05,
) -> Any:
    """Poll `check` (plain or async) until it returns something truthy, and
    return that; AssertionError after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        last = check()
        if asyncio.iscoroutine(last) or isinstance(last, asyncio.Future):
            last = await last
        if last:
            return last
        if time.monotonic() >= deadline:
            raise AssertionError(f"{what} not reached in {timeout:g} s; last value: {last!r}")
        await asyncio.sleep(interval)


def wait_for(
    what: str,
    check: Callable[[], Any],
    timeout: float = DEFAULT_TIMEOUT_S,
    *,
    interval: float = 0.5,
) -> Any:
    """`until` for synchronous tests (e.g. ones driving the CLI)."""
    deadline = time.monotonic() + timeout
    while True:
        last = check()
        if last:
            return last
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out waiting for {what}; last value: {last!r}")
        time.sleep(interval)
