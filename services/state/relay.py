"""Relaying a user's call to the broker leader.

The periodic dispatcher and the core-eval queue live on the broker leader,
so `Periodic.Force` and `System.GarbageCollect` must run there (Nomad
forwards both to its leader). Users only know the state service's address:
the state finds the brokers in the member registry and relays the call to
the leader, following a standby's `corral-leader` answer; the broker's
answer goes back with its own status code."""

from __future__ import annotations

from typing import Any

import grpc

from corral.domain.errors import CorralError, Unavailable
from corral.runtime.rpc import LeaderChannel, StubMethod
from corral.v1 import state_pb2
from services.state.app_context import StateContext

#: how long a relayed call may chase a leader through an election
RELAY_BUDGET_S = 15.0


class Relayed(CorralError):
    """The broker's answer, passed on with its own status code."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code


async def broker_addresses(ctx: StateContext) -> list[str]:
    """The brokers in the member registry, the last known leader first: where
    a call relayed to the broker leader starts looking."""
    members = [
        state_pb2.Member.FromString(payload)
        for payload, _age in await ctx.db.members(role="broker", max_age_s=30)
    ]
    members.sort(key=lambda m: not m.leader)
    return [m.address for m in members if m.address]


async def to_broker_leader(
    ctx: StateContext,
    method: StubMethod,
    request: Any,
    *,
    timeout: float,
    no_broker: str,
    failed: str,
) -> Any:
    """`method(request)` on the broker leader. Without a broker the caller
    is told UNAVAILABLE: "no broker is running: <no_broker>"; a broker's
    error without details comes back as `failed`."""
    addresses = await broker_addresses(ctx)
    if not addresses:
        raise Unavailable(f"no broker is running: {no_broker}")
    channel = LeaderChannel(addresses, retry_budget=RELAY_BUDGET_S)
    try:
        return await channel.call(method, request, timeout=timeout)
    except grpc.aio.AioRpcError as exc:
        raise Relayed(exc.code(), exc.details() or failed) from None
    finally:
        await channel.close()
