"""/v1/event/stream: Corral's Event.Stream as Nomad's NDJSON event stream.

Query parameters as Nomad's: `topic` (repeatable; `Job`, `Job:example`,
`Job:*`, `*`; none = every topic), `index` (stream events from this index
on; 0 = from now), `namespace` (default "default", `*` = all). Each line
is one index's events, `{"Index": N, "Events": [...]}`; a `{}` line is
written whenever 10 s pass without one, as Nomad's heartbeat, so clients
and proxies see the connection alive.

Errors Nomad answers with a status (a bad topic, a token without the
permission) arrive as one before the stream starts: the first answer of
the gRPC stream is awaited briefly. When the HTTP client goes away, the
response's own cleanup cancels the gRPC call, whichever way the stream
ends; `ACTIVE` counts the streams open (tests wait for it to drop)."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

import grpc
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import BaseRoute
from starlette.types import Receive, Scope, Send

from corral.v1 import event_pb2
from services.gateway.authz import ApiRoute, Need
from services.gateway.http import (
    backend_of,
    bad_request,
    int_param,
    metadata_of,
)
from services.gateway.mapping import events as event_map

#: Nomad's heartbeat period
HEARTBEAT_S = 10.0
#: how long the first answer is awaited for an error to become a status
FIRST_ANSWER_S = 1.0
#: event streams open now (for tests and debugging)
ACTIVE = 0

Read = asyncio.Future[Any]


def _from_index(index: int) -> int:
    """Nomad's `index=N` streams events from N on; ours takes events after
    `from_index`, with 0 meaning "from now" (so index=1 starts after 1)."""
    if index <= 0:
        return 0
    return max(index - 1, 1)


def _request(request: Request) -> event_pb2.EventStreamRequest:
    try:
        topics = [event_map.topic(t) for t in request.query_params.getlist("topic")]
    except event_map.TopicError as exc:
        raise bad_request(f"Invalid topic query: {exc}") from None
    return event_pb2.EventStreamRequest(
        topics=topics,
        from_index=_from_index(int_param(request, "index")),
        namespace=request.query_params.get("namespace", "") or "default",
    )


class _Stream:
    """One gRPC event stream and its outstanding read."""

    def __init__(self, call: Any) -> None:
        self.call = call
        self.read: Read = asyncio.ensure_future(call.read())
        self.closed = False

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self.read.cancel()
        self.call.cancel()
        global ACTIVE
        ACTIVE -= 1

    async def lines(self, first: Any) -> AsyncIterator[bytes]:
        """The NDJSON body: `first` (an answer already read, or None), then
        every answer with events, and `{}` whenever HEARTBEAT_S passed since
        the last line (the state's own heartbeats and the events this
        stream filters out do not count: they write nothing)."""
        loop = asyncio.get_running_loop()
        try:
            message = first
            last_write = loop.time()
            while True:
                if message is grpc.aio.EOF:
                    return
                if message is not None and message.events:
                    yield (json.dumps(event_map.events(message)) + "\n").encode()
                    last_write = loop.time()
                quiet = last_write + HEARTBEAT_S - loop.time()
                if quiet <= 0:
                    yield b"{}\n"
                    last_write = loop.time()
                    quiet = HEARTBEAT_S
                done, _ = await asyncio.wait({self.read}, timeout=quiet)
                if not done:
                    message = None
                    continue
                try:
                    message = self.read.result()
                except grpc.aio.AioRpcError:
                    return  # the stream broke (the state went away): end the body
                self.read = asyncio.ensure_future(self.call.read())
        finally:
            self.close()


class _EventResponse(StreamingResponse):
    """A streaming response that closes its gRPC stream however it ends
    (finished, client gone, cancelled)."""

    def __init__(self, stream: _Stream, first: Any) -> None:
        super().__init__(stream.lines(first), media_type="application/json")
        self.stream = stream

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.stream.close()


async def stream(request: Request) -> Response:
    message = _request(request)
    call = backend_of(request).events.Stream(message, metadata=metadata_of(request))
    global ACTIVE
    ACTIVE += 1
    events = _Stream(call)
    try:
        done, _ = await asyncio.wait({events.read}, timeout=FIRST_ANSWER_S)
        first = None
        if done:
            first = events.read.result()  # a refusal raises here: its HTTP status
            if first is not grpc.aio.EOF:
                events.read = asyncio.ensure_future(call.read())
    except BaseException:
        with contextlib.suppress(Exception):
            events.close()
        raise
    return _EventResponse(events, first)


#: Event.Stream decides per event, as Nomad's stream does
STREAM = Need(
    summary="shows job, eval, alloc and deployment events of namespaces with `read-job`, "
    "node events with `node:read`, operator events with `operator:read`",
    namespace=(("read-job",),),
    filters=True,
)

ROUTES: list[BaseRoute] = [
    ApiRoute("/v1/event/stream", stream, {"GET": STREAM}),
]
