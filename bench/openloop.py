"""Open-loop pacing for W1L (latency at an offered load).

A closed loop (the next call once the previous returns, or N in flight)
slows down with the system it measures, so its latencies only measure the
queue it builds itself (saturated W1's p99). An open loop sends call `i`
at `start + i / rate` whatever happened to the calls before it, as real
users do; the figure that keeps it honest is how many calls left later than
their scheduled time (the driver itself could not keep up), which is
counted, not hidden.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

#: A call dispatched later than this after its scheduled time counts as late.
LATE_AFTER_S = 0.05


def schedule(rate: float, seconds: float) -> list[float]:
    """Offsets (s from the start) of the calls of `rate` per second over
    `seconds`: 0, 1/rate, 2/rate, ... while below `seconds`."""
    if rate <= 0 or seconds <= 0:
        return []
    count = max(1, int(rate * seconds + 1e-9))
    return [i / rate for i in range(count)]


@dataclass
class OpenLoopResult:
    """What the driver did: calls sent, how late their dispatch was, and
    how they ended."""

    offered_rate: float
    sent: int = 0
    late: int = 0  # dispatched more than LATE_AFTER_S after schedule
    max_late_ms: float = 0.0
    errors: list[str] = field(default_factory=list)
    max_in_flight: int = 0
    send_s: float = 0.0  # first dispatch to last dispatch
    wall_s: float = 0.0  # first dispatch to the last call's return

    def as_dict(self) -> dict[str, object]:
        return {
            "offered_jobs_per_s": round(self.offered_rate, 2),
            "sent": self.sent,
            "late": self.late,
            "max_late_ms": round(self.max_late_ms, 1),
            "errors": len(self.errors),
            "max_in_flight": self.max_in_flight,
            "send_s": round(self.send_s, 3),
            "wall_s": round(self.wall_s, 3),
        }


def lateness(scheduled: list[float], dispatched: list[float]) -> tuple[int, float]:
    """(calls dispatched more than LATE_AFTER_S after their offset, the
    largest delay in ms); both lists are offsets from the same start."""
    delays = [max(0.0, d - s) for s, d in zip(scheduled, dispatched, strict=True)]
    return sum(1 for d in delays if d > LATE_AFTER_S), max(delays, default=0.0) * 1000


async def run(
    call: Callable[[int], Awaitable[None]],
    rate: float,
    seconds: float,
    clock: Callable[[], float] = time.monotonic,
) -> OpenLoopResult:
    """Start `call(i)` at offset i / rate for `seconds`, each as its own
    task (never waiting for earlier calls), then wait for all of them. An
    exception of a call is recorded in `errors`, not raised."""
    offsets = schedule(rate, seconds)
    result = OpenLoopResult(offered_rate=rate)
    in_flight = 0
    dispatched: list[float] = []
    tasks: list[asyncio.Task[None]] = []

    async def one(i: int) -> None:
        nonlocal in_flight
        in_flight += 1
        result.max_in_flight = max(result.max_in_flight, in_flight)
        try:
            await call(i)
        except Exception as exc:
            result.errors.append(f"{i}: {type(exc).__name__}: {exc}")
        finally:
            in_flight -= 1

    start = clock()
    for i, offset in enumerate(offsets):
        delay = start + offset - clock()
        if delay > 0:
            await asyncio.sleep(delay)
        dispatched.append(clock() - start)
        tasks.append(asyncio.create_task(one(i)))
    result.send_s = dispatched[-1] if dispatched else 0.0
    await asyncio.gather(*tasks)
    result.wall_s = clock() - start
    result.sent = len(tasks)
    result.late, result.max_late_ms = lateness(offsets, dispatched)
    return result
