"""A client channel that follows the leader of a singleton role (broker,
planner).

A standby answers UNAVAILABLE with the leader's address in the trailing
metadata `corral-leader` (see `corral.domain.errors.NotLeader`). `LeaderChannel`
switches to that address and retries; when no leader is known (an election
under way, or the leader's process is gone) it rotates through the
configured addresses with a capped exponential backoff (50 ms doubling to
1 s: a standby takes over within a second or so, and a caller asking every
second at most finds it promptly) until the call's retry budget runs out.
Retrying is safe: a standby does nothing before refusing, and UNAVAILABLE
from a dead address means the call never ran.

Channels are created lazily, inside the running event loop (grpc.aio binds
a channel to the loop that created it).

    ch = LeaderChannel(["10.0.0.1:7001", "10.0.0.2:7001"])
    resp = await ch.call(lambda c: eval_pb2_grpc.EvalStub(c).Dequeue, request, timeout=5)
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import grpc

from corral.domain.errors import leader_from_error
from corral.runtime.settings import SecuritySettings
from corral.security import transport

log = logging.getLogger(__name__)

# given a channel, the bound stub method to call, e.g. lambda c: EvalStub(c).Ack
StubMethod = Callable[[grpc.aio.Channel], Callable[..., Awaitable[Any]]]


class LeaderChannel:
    def __init__(
        self,
        addresses: list[str],
        *,
        retry_budget: float = 30.0,
        initial_backoff: float = 0.05,
        max_backoff: float = 1.0,
        settings: SecuritySettings | None = None,
        region: str = "",
    ) -> None:
        addrs = [a.strip() for a in addresses if a and a.strip()]
        if not addrs:
            raise ValueError("at least one address is required")
        self._addresses = list(dict.fromkeys(addrs))
        self._current = self._addresses[0]
        self._channels: dict[str, grpc.aio.Channel] = {}
        self.retry_budget = retry_budget
        self.initial_backoff = initial_backoff
        self.max_backoff = max_backoff
        #: whose identity the channels carry (default: this process's); the
        #: HTTP gateway passes its user settings, without the server token
        self.settings = settings
        #: the region the servers belong to (default: this process's)
        self.region = region

    @property
    def address(self) -> str:
        """The address calls go to now (the last known leader)."""
        return self._current

    def channel(self, address: str | None = None) -> grpc.aio.Channel:
        """The channel to `address` (default: the current leader)."""
        address = address or self._current
        ch = self._channels.get(address)
        if ch is None:
            ch = self._channels[address] = transport.dial(
                address, settings=self.settings, region=self.region
            )
        return ch

    def _follow(self, leader: str) -> None:
        if leader not in self._addresses:
            self._addresses.append(leader)
        if leader != self._current:
            log.info("following leader %s (was %s)", leader, self._current)
        self._current = leader

    def _rotate(self) -> None:
        i = self._addresses.index(self._current) if self._current in self._addresses else -1
        self._current = self._addresses[(i + 1) % len(self._addresses)]

    async def call(
        self,
        stub_method: StubMethod,
        request: Any,
        timeout: float,
        *,
        retry_budget: float | None = None,
    ) -> Any:
        """Call the leader. UNAVAILABLE with a leader address: switch at once
        and retry; UNAVAILABLE without one: back off, try the next address.
        Any other error, or UNAVAILABLE past the retry budget, is raised."""
        budget = self.retry_budget if retry_budget is None else retry_budget
        deadline = time.monotonic() + budget
        backoff = self.initial_backoff
        while True:
            address = self._current
            try:
                return await stub_method(self.channel(address))(request, timeout=timeout)
            except grpc.aio.AioRpcError as exc:
                if exc.code() != grpc.StatusCode.UNAVAILABLE:
                    raise
                leader = leader_from_error(exc)
                if time.monotonic() >= deadline:
                    raise
                if leader and leader != address:
                    self._follow(leader)
                    continue
                # no leader known (or it names itself while stepping down)
                self._rotate()
                await asyncio.sleep(min(backoff, max(0.0, deadline - time.monotonic())))
                backoff = min(backoff * 2, self.max_backoff)

    async def close(self) -> None:
        channels, self._channels = self._channels, {}
        for ch in channels.values():
            await ch.close()
