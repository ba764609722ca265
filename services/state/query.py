"""Blocking queries and pagination for the public reads (Nomad's
QueryOptions/QueryMeta), served from the feed's in-memory snapshot."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Protocol, TypeVar

from corral.domain import paging
from corral.domain.errors import InvalidArgument, NotFound
from corral.domain.store import StateSnapshot
from corral.runtime import telemetry
from corral.security import access
from corral.v1 import query_pb2
from services.state.app_context import StateContext

T = TypeVar("T")

DEFAULT_WAIT_S = 300.0
MAX_WAIT_S = 600.0


async def snapshot_for(
    ctx: StateContext, query: query_pb2.QueryOptions, tables: Sequence[str]
) -> StateSnapshot:
    """The newest snapshot; with `min_index`, wait until one of `tables` was
    written after it (or the wait runs out, then answer anyway)."""
    snap = ctx.feed.snapshot()
    if not query.min_index or table_index(snap, tables) > query.min_index:
        return snap
    wait = query.wait_ms / 1000 if query.wait_ms > 0 else DEFAULT_WAIT_S
    loop = asyncio.get_running_loop()
    deadline = loop.time() + min(wait, MAX_WAIT_S)
    # one of this connection's waiting calls (call_limits.py) while it waits
    with ctx.limits.waiting("a blocking query"):
        while table_index(snap, tables) <= query.min_index:
            remaining = deadline - loop.time()
            if remaining <= 0 or ctx.shutting_down.is_set():
                break
            await ctx.feed.wait_advance(remaining)
            snap = ctx.feed.snapshot()
    if table_index(snap, tables) <= query.min_index:
        telemetry.mark_idle()  # timed out with nothing new: no trace of its own
    return snap


R = TypeVar("R")


async def answer_when_newer(
    ctx: StateContext,
    query: query_pb2.QueryOptions,
    compute: Callable[[StateSnapshot], tuple[R, int]],
) -> R:
    """A blocking query whose index is the answer's own rather than a
    table's (Nomad's Job.Statuses: the newest change among what one page
    shows, so a change off the page wakes nobody): `compute` answers from
    a snapshot with that index; with `min_index`, it runs again on each new
    snapshot until its index is > min_index or the wait runs out."""
    answer, index = compute(ctx.feed.snapshot())
    if not query.min_index or index > query.min_index:
        return answer
    wait = query.wait_ms / 1000 if query.wait_ms > 0 else DEFAULT_WAIT_S
    loop = asyncio.get_running_loop()
    deadline = loop.time() + min(wait, MAX_WAIT_S)
    with ctx.limits.waiting("a blocking query"):
        while index <= query.min_index:
            remaining = deadline - loop.time()
            if remaining <= 0 or ctx.shutting_down.is_set():
                break
            seen = ctx.feed.snapshot().index
            await ctx.feed.wait_advance(remaining)
            snap = ctx.feed.snapshot()
            if snap.index != seen:
                answer, index = compute(snap)
    if index <= query.min_index:
        telemetry.mark_idle()
    return answer


def table_index(snap: StateSnapshot, tables: Sequence[str]) -> int:
    return max(1, *(snap.table_index(t) for t in tables))


def meta(snap: StateSnapshot, tables: Sequence[str], next_token: str = "") -> query_pb2.QueryMeta:
    return query_pb2.QueryMeta(
        index=table_index(snap, tables), next_token=next_token, known_leader=True
    )


def paginate(
    items: list[T], key: Callable[[T], str], query: query_pb2.QueryOptions
) -> tuple[list[T], str]:
    """Items sorted by key, starting at next_token, at most per_page."""
    if query.per_page < 0:
        raise InvalidArgument("query.per_page", "must not be negative")
    items = sorted(items, key=key)
    if query.next_token:
        items = [i for i in items if key(i) >= query.next_token]
    if query.per_page and len(items) > query.per_page:
        return items[: query.per_page], key(items[query.per_page])
    return items, ""


class Created(Protocol):
    """An object listed in creation order."""

    @property
    def id(self) -> str: ...

    @property
    def create_index(self) -> int: ...


C = TypeVar("C", bound=Created)


def paginate_by_creation(items: list[C], query: query_pb2.QueryOptions) -> tuple[list[C], str]:
    """One page in Nomad's order of evaluations, allocations and
    deployments: by creation, (create index, id), or by id when the query
    has a prefix; `reverse` turns it round (corral/domain/paging.py)."""
    if query.per_page < 0:
        raise InvalidArgument("query.per_page", "must not be negative")
    return paging.creation_page(
        items,
        create_index=lambda o: o.create_index,
        ident=lambda o: o.id,
        by_id=bool(query.prefix),
        next_token=query.next_token,
        per_page=query.per_page,
        reverse=query.reverse,
    )


def namespace_matches(
    query: query_pb2.QueryOptions, namespace: str, capability: str = access.READ_JOB
) -> bool:
    """Whether a listing shows an object of `namespace`: the one asked for
    (checked by the access rule), or with `*` every one the caller's ACL
    grants `capability` in."""
    wanted = query.namespace or "default"
    if wanted == "*":
        return access.current_acl().allows_namespace(namespace or "default", capability)
    return (namespace or "default") == wanted


def resolve_prefix(ids: Sequence[str], prefix: str, kind: str) -> str:
    """The one id starting with `prefix` (Nomad accepts unique prefixes)."""
    if not prefix:
        raise InvalidArgument(f"{kind}_id", "is required")
    if prefix in ids:
        return prefix
    matches = [i for i in ids if i.startswith(prefix)]
    if not matches:
        raise NotFound(f"{kind} {prefix!r} not found")
    if len(matches) > 1:
        shown = ", ".join(sorted(matches)[:5])
        raise InvalidArgument(f"{kind}_id", f"prefix {prefix!r} matches several {kind}s: {shown}")
    return matches[0]


class Listed(Protocol):
    """What a listing filters on: an object of a job, in a namespace."""

    @property
    def id(self) -> str: ...

    @property
    def namespace(self) -> str: ...

    @property
    def job_id(self) -> str: ...


L = TypeVar("L", bound=Listed)


def listing(
    query: query_pb2.QueryOptions,
    job_id: str,
    of_job: Callable[[str, str], list[L]],
    others: Callable[[], list[L]],
    **equal: str,
) -> list[L]:
    """The objects a List shows: of `job_id` when the request names one
    (its index `of_job(namespace, job_id)` when the namespace is one, else
    `others()`), in the query's namespace, their id starting with its
    prefix, and equal to the request's other filters that are given
    (`equal`: field name -> value, '' for not given)."""
    if job_id and query.namespace != "*":
        candidates = of_job(query.namespace or "default", job_id)
    else:
        candidates = others()
    wanted = [(name, value) for name, value in equal.items() if value]
    return [
        o
        for o in candidates
        if namespace_matches(query, o.namespace)
        and (not job_id or o.job_id == job_id)
        and o.id.startswith(query.prefix)
        and all(getattr(o, name) == value for name, value in wanted)
    ]
