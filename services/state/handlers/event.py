"""`Event.Stream`: the change log as the user-facing event stream, filtered
by topic (and key), from an index or from now, with heartbeats."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

from corral.domain import topics
from corral.domain.errors import InvalidArgument
from corral.domain.structs import DEFAULT_NAMESPACE
from corral.runtime.server import GrpcServer
from corral.runtime.slow_readers import send_stream, with_heartbeats
from corral.security import access, acl
from corral.security.acl import ACL, VARIABLE_LIST
from corral.v1 import event_pb2, event_pb2_grpc
from corral.v1 import structs_pb2 as pb
from services.state.app_context import StateContext
from services.state.metrics import dropped_counted

Context = Any
HEARTBEAT_S = 10.0


def _object_keys(topic: topics.Topic, ev: pb.Event) -> tuple[str, ...]:
    """Keys an event matches: its own id, plus its topic's match keys (the
    job id of evals and allocs, the node id of allocs, the job id and the
    service name of service registrations)."""
    obj = topics.payload(ev)
    return (ev.key, *topic.match_keys(obj)) if obj is not None else (ev.key,)


def _visible_to(acl: ACL) -> Callable[[topics.Topic, pb.Event], bool]:
    """What the caller may see of the stream (Nomad's rules, the topic's
    `read_rule`): node events with node:read, operator events with
    operator:read, node pool events with a management token only (Nomad
    cannot filter them by pool rule either), variable events with `list` on
    the variable's path, the rest with read-job in the event's namespace.
    Decided on the caller's ACL as of the last ACL write
    (`recheck` in `Stream`)."""
    if acl.is_management:
        return lambda topic, ev: True

    def visible(topic: topics.Topic, ev: pb.Event) -> bool:
        namespace = ev.namespace or DEFAULT_NAMESPACE
        if topic.read_rule == "namespace":
            return acl.allows_namespace(namespace, access.READ_JOB)
        if topic.read_rule == "variable":
            return acl.allows_variable(namespace, ev.key, VARIABLE_LIST)
        if topic.read_rule == "management":
            return False  # a management token saw everything above
        return acl.allows(topic.read_rule, "read")

    return visible


class EventServicer(event_pb2_grpc.EventServicer):
    def __init__(self, ctx: StateContext) -> None:
        self.ctx = ctx

    async def Stream(  # type: ignore[override]  # writes with context.write
        self, request: event_pb2.EventStreamRequest, context: Context
    ) -> None:
        filters: dict[str, set[str]] = {}
        for i, t in enumerate(request.topics):
            if t.topic != topics.ANY and t.topic not in topics.STREAMED_NAMES:
                raise InvalidArgument(f"topics[{i}].topic", f"unknown topic {t.topic!r}")
            filters.setdefault(t.topic, set()).add(t.key or topics.ANY)
        namespace = request.namespace
        may_see = _visible_to(access.current_acl())
        secret = acl.CURRENT_TOKEN.get()

        async def recheck(acl_changed: bool) -> None:
            """Resolve the caller's token again (after an ACL write, and at
            each heartbeat for its expiry): a deleted or expired token ends
            the stream with PERMISSION_DENIED, new policies apply from here
            on (Nomad closes such subscriptions too)."""
            nonlocal may_see
            if secret is None:
                return
            if acl_changed:
                self.ctx.acl.invalidate()  # do not wait for the cache's own follower
            may_see = _visible_to(await self.ctx.acl.resolve(secret))

        def wanted(ev: pb.Event) -> bool:
            topic = topics.of(ev)
            if topic is None or not topic.streamed:  # ACL changes are not for the stream
                return False
            if namespace and namespace != "*" and ev.namespace and ev.namespace != namespace:
                return False
            if not may_see(topic, ev):
                return False
            if not filters:
                return True
            for name in (ev.topic, topics.ANY):
                keys = filters.get(name)
                if keys is None:
                    continue
                if topics.ANY in keys or any(k in keys for k in _object_keys(topic, ev)):
                    return True
            return False

        from_index = request.from_index or self.ctx.feed.index
        feed = self.ctx.feed

        async def responses() -> AsyncIterator[tuple[int, event_pb2.EventStreamResponse]]:
            """(the index a resubscription would start from, the message)"""
            last = from_index
            batches = feed.subscribe(from_index, self.ctx.shutting_down)
            async for batch in with_heartbeats(batches, HEARTBEAT_S):
                if batch is None:
                    await recheck(acl_changed=False)
                    yield last, event_pb2.EventStreamResponse(index=feed.index, heartbeat=True)
                    continue
                last = batch.index
                if any(e.topic in topics.ACL_NAMES for e in batch.events):
                    await recheck(acl_changed=True)
                events = [e for e in batch.events if wanted(e)]
                if events:
                    yield last, event_pb2.EventStreamResponse(index=last, events=events)

        # each stream writes at its reader's pace, bounded (slow_readers.py):
        # a reader that stops is dropped, the others never wait for it
        with self.ctx.limits.waiting("an event stream"), dropped_counted("Event.Stream"):
            await send_stream(
                context,
                responses(),
                stall_timeout=self.ctx.stream_stall_timeout,
                what="Event.Stream",
            )


def register(server: GrpcServer, ctx: StateContext) -> None:
    server.add(
        event_pb2_grpc.add_EventServicer_to_server,
        EventServicer(ctx),
        event_pb2.DESCRIPTOR.services_by_name["Event"].full_name,
    )
