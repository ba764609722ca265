"""Clients for the leader-elected roles the worker calls: the broker's
`Eval` service and the planner's `Plan` service.

A call goes to the last known leader; a standby's UNAVAILABLE carrying the
leader's address (`corral-leader` metadata) redirects it there at once,
other UNAVAILABLE answers move on to the next configured address.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import grpc

from corral.domain.errors import leader_from_error
from corral.security import transport


class RoleClient(Protocol):
    """Calls a method of a leader-elected role's service by name, following
    the leader (broker: `Eval`, planner: `Plan`)."""

    async def call(self, method: str, request: Any, *, timeout: float) -> Any: ...


class LeaderClient:
    def __init__(
        self, addresses: str | list[str], stub_factory: Callable[[grpc.aio.Channel], Any]
    ) -> None:
        if isinstance(addresses, str):
            addresses = [a.strip() for a in addresses.split(",") if a.strip()]
        if not addresses:
            raise ValueError("at least one address is required")
        self.addresses = list(addresses)
        self._factory = stub_factory
        self._stubs: dict[str, Any] = {}
        self._channels: dict[str, grpc.aio.Channel] = {}
        self.current = self.addresses[0]

    def _stub(self, address: str) -> Any:
        stub = self._stubs.get(address)
        if stub is None:
            channel = transport.dial(
                address,
                options=[
                    ("grpc.max_send_message_length", transport.MAX_MESSAGE_BYTES),
                    ("grpc.max_receive_message_length", transport.MAX_MESSAGE_BYTES),
                ],
            )
            self._channels[address] = channel
            stub = self._stubs[address] = self._factory(channel)
        return stub

    async def call(self, method: str, request: Any, *, timeout: float) -> Any:
        """Call `method` on the leader; raises the last AioRpcError when no
        address answers (the caller decides whether to back off and retry)."""
        order = [self.current] + [a for a in self.addresses if a != self.current]
        tried: set[str] = set()
        last: grpc.aio.AioRpcError | None = None
        while order:
            address = order.pop(0)
            if address in tried:
                continue
            tried.add(address)
            try:
                result = await getattr(self._stub(address), method)(request, timeout=timeout)
            except grpc.aio.AioRpcError as exc:
                if exc.code() != grpc.StatusCode.UNAVAILABLE:
                    raise
                last = exc
                leader = leader_from_error(exc)
                if leader and leader not in tried:
                    order.insert(0, leader)
                continue
            self.current = address
            return result
        assert last is not None
        raise last

    async def close(self) -> None:
        for channel in self._channels.values():
            await channel.close()
        self._channels.clear()
        self._stubs.clear()
