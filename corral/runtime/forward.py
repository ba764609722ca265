"""Passing one gRPC call on to another server, unchanged: the mechanics of
region forwarding (Nomad's `forwardRegion`), kept apart from who decides
where a call goes (the state's federation links,
services/state/federation/links.py).

The request goes out as the bytes it came in as (re-serialized), the answer
comes back as the bytes the other server sent: the receiving server's
handler returns them and its serializer passes bytes through
(`corral.runtime.server`). The call carries the caller's ACL token, the
region it is for and the region forwarding it, nothing else of the
caller's metadata; its deadline is what remains of the caller's. A status
the other server answered is the caller's answer, with its message and
trailing metadata; a call that never reached the other server (no
connection could be made) raises `Unreachable`, so the caller may try
another server of that region.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import grpc

from corral.domain.errors import bounded_message
from corral.security.acl import TOKEN_METADATA_KEY
from corral.security.transport import FORWARDED_METADATA_KEY, REGION_METADATA_KEY

Context = Any  # grpc.aio.ServicerContext

#: the caller's metadata a forwarded call keeps: its ACL token, in either form
KEPT_METADATA = (TOKEN_METADATA_KEY, "authorization")
#: how long a forwarded call without a deadline of its own may take; a
#: blocking query's wait (at most 10 minutes) is included
DEFAULT_TIMEOUT = 11 * 60.0


class Unreachable(Exception):  # noqa: N818 - an outcome the caller acts on
    """The call did not reach the other server: `reason` says why."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def metadata(context: Context, region: str, origin: str) -> list[tuple[str, str]]:
    """What a forwarded call carries: the caller's token, the region it is
    for, and the region that forwards it (so it is not forwarded again)."""
    pairs: list[tuple[str, str]] = []
    for key, value in context.invocation_metadata() or ():
        if key in KEPT_METADATA:
            pairs.append((key, value if isinstance(value, str) else value.decode()))
    pairs += [(REGION_METADATA_KEY, region), (FORWARDED_METADATA_KEY, origin)]
    return pairs


def timeout(context: Context, default: float | None = DEFAULT_TIMEOUT) -> float | None:
    """What remains of the caller's deadline (`default` when it set none)."""
    remaining = context.time_remaining()
    return default if remaining is None else max(remaining, 0.0)


def _reached(channel: grpc.aio.Channel) -> bool:
    """Whether the channel holds a connection: an UNAVAILABLE on a ready
    channel is the other server's own answer (its database is away, it is
    shutting down), one on a channel that is not is ours to handle."""
    return bool(channel.get_state() == grpc.ChannelConnectivity.READY)


async def relay_status(context: Context, exc: grpc.aio.AioRpcError) -> None:
    """End the caller's call with the status the other server answered."""
    trailing = [
        (k, v)
        for k, v in (exc.trailing_metadata() or ())
        if not k.startswith("grpc-") or k == "grpc-retry-pushback-ms"
    ]
    await context.abort(
        exc.code(), bounded_message(exc.details() or ""), trailing_metadata=tuple(trailing)
    )


async def unary(
    channel: grpc.aio.Channel,
    method: str,
    request: Any,
    context: Context,
    call_metadata: list[tuple[str, str]],
) -> bytes:
    """The other server's answer to `request`, as bytes. Raises Unreachable
    when no connection could be made; any status the other server answered
    ends the caller's call with that status."""
    call: Any = channel.unary_unary(method)  # no serializers: bytes in, bytes out
    try:
        answer: bytes = await call(
            request.SerializeToString(), metadata=call_metadata, timeout=timeout(context)
        )
    except grpc.aio.AioRpcError as exc:
        if exc.code() == grpc.StatusCode.UNAVAILABLE and not _reached(channel):
            raise Unreachable(exc.details() or "unavailable") from None
        await relay_status(context, exc)
        raise  # abort raised already; for type checkers
    return answer


async def stream(
    channel: grpc.aio.Channel,
    method: str,
    request: Any,
    context: Context,
    call_metadata: list[tuple[str, str]],
) -> AsyncIterator[bytes]:
    """The other server's stream of answers, as bytes, until it ends; the
    call to it is cancelled when the caller goes away. Raises Unreachable
    when no connection could be made before the first answer."""
    call: Any = channel.unary_stream(method)
    # a stream (the event stream, logs -f) lasts as long as its caller wants
    remote = call(
        request.SerializeToString(), metadata=call_metadata, timeout=timeout(context, None)
    )
    started = False
    try:
        async for item in remote:
            started = True
            yield item
    except grpc.aio.AioRpcError as exc:
        if not started and exc.code() == grpc.StatusCode.UNAVAILABLE and not _reached(channel):
            raise Unreachable(exc.details() or "unavailable") from None
        await relay_status(context, exc)
        raise
    finally:
        remote.cancel()
