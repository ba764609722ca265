"""The planner's token check against the eval broker: `Eval.PauseNackTimeout`
before a plan is queued (refused with FAILED_PRECONDITION unless the eval is
outstanding with that token) and `Eval.ResumeNackTimeout` once it is
answered, as Nomad's Plan.Submit does.

Calls go to the broker leader: the client tries the configured addresses
and follows the `corral-leader` address a standby answers with.
"""

from __future__ import annotations

import logging
from typing import Protocol

import grpc

from corral.domain.errors import FailedPrecondition, Unavailable, leader_from_error
from corral.security import transport
from corral.v1 import eval_pb2, eval_pb2_grpc

log = logging.getLogger(__name__)


class EvalTokenChecker(Protocol):
    async def pause_nack_timeout(self, eval_id: str, token: str) -> None: ...

    async def resume_nack_timeout(self, eval_id: str, token: str) -> None: ...


class BrokerClient:
    """EvalTokenChecker over gRPC to the broker leader."""

    def __init__(self, addresses: str, *, timeout: float = 10.0) -> None:
        self._addresses = [a.strip() for a in addresses.split(",") if a.strip()]
        if not self._addresses:
            raise ValueError("no broker address")
        self._timeout = timeout
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._current = self._addresses[0]

    def _stub(self, address: str) -> eval_pb2_grpc.EvalStub:
        ch = self._channels.get(address)
        if ch is None:
            ch = self._channels[address] = transport.dial(address)
        return eval_pb2_grpc.EvalStub(ch)

    async def _call(self, method: str, eval_id: str, token: str) -> None:
        request = eval_pb2.EvalAckRequest(eval_id=eval_id, token=token)
        candidates = [self._current] + [a for a in self._addresses if a != self._current]
        last: grpc.aio.AioRpcError | None = None
        tried: set[str] = set()
        while candidates:
            address = candidates.pop(0)
            if address in tried:
                continue
            tried.add(address)
            try:
                await getattr(self._stub(address), method)(request, timeout=self._timeout)
                self._current = address
                return
            except grpc.aio.AioRpcError as exc:
                if exc.code() == grpc.StatusCode.FAILED_PRECONDITION:
                    raise FailedPrecondition(exc.details() or "eval token mismatch") from None
                if exc.code() not in (
                    grpc.StatusCode.UNAVAILABLE,
                    grpc.StatusCode.DEADLINE_EXCEEDED,
                ):
                    raise Unavailable(
                        f"broker {method} failed: {exc.code().name}: {exc.details()}"
                    ) from None
                last = exc
                leader = leader_from_error(exc)
                if leader and leader not in tried:
                    candidates.insert(0, leader)
        detail = f"{last.code().name}: {last.details()}" if last is not None else "no address"
        raise Unavailable(f"no eval broker leader reachable ({detail})")

    async def pause_nack_timeout(self, eval_id: str, token: str) -> None:
        await self._call("PauseNackTimeout", eval_id, token)

    async def resume_nack_timeout(self, eval_id: str, token: str) -> None:
        await self._call("ResumeNackTimeout", eval_id, token)

    async def close(self) -> None:
        for ch in self._channels.values():
            await ch.close()
        self._channels.clear()
