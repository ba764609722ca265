"""Worker leases: how the broker learns fast that a worker process died.

Nomad has no such thing: an eval held by a dead worker waits for its nack
timer (60 s). Here every worker process renews a lease with `Eval.Heartbeat`
about once a second (and every `Eval.Dequeue` naming its worker id renews it
too); when a lease lives `ttl` seconds without a renewal, `on_expire` is
called with the worker id and the broker nacks the evals that worker holds.
The nack timer stays as the backstop for dequeues without a worker id.

One timer per lease on the broker's event loop, replaced on each renewal:
at one heartbeat per worker process per second that is nothing.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable


class WorkerLeases:
    def __init__(self, ttl: float, on_expire: Callable[[str], None]) -> None:
        self.ttl = ttl
        self.on_expire = on_expire
        self._timers: dict[str, asyncio.TimerHandle] = {}

    def renew(self, worker_id: str) -> None:
        """Start or extend the lease of `worker_id` by a full ttl."""
        timer = self._timers.get(worker_id)
        if timer is not None:
            timer.cancel()
        self._timers[worker_id] = asyncio.get_running_loop().call_later(
            self.ttl, self._expire, worker_id
        )

    def alive(self, worker_id: str) -> bool:
        return worker_id in self._timers

    def _expire(self, worker_id: str) -> None:
        self._timers.pop(worker_id, None)
        self.on_expire(worker_id)

    def clear(self) -> None:
        """Forget every lease (leadership lost: the next leader starts afresh)."""
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()

    def __len__(self) -> int:
        return len(self._timers)
