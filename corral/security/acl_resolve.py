"""From a token's secret id to its ACL, for the access interceptor.

The state role resolves against its database (`services.state.acl`); every
other role (worker, agent, broker, planner) holds a `RemoteResolver` that
asks the state's `ACL.ResolveToken` and caches the answer, as a Nomad
client caches tokens for `acl.token_ttl` (30 s). Both answer the same way:

* '' (no token) is the anonymous token: the policy named "anonymous" if it
  exists, else `DENY_ALL`;
* an unknown secret raises PermissionDenied("ACL token not found"), an
  expired one PermissionDenied("ACL token expired");
* a management token is `MANAGEMENT`; a client token is its policies
  compiled (`corral.security.acl.compile_acl`).

Caches are keyed by the SHA-256 of the secret, never the secret, and no
secret is ever logged.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import grpc

from corral.domain.errors import PermissionDenied, Unavailable
from corral.security import acl
from corral.v1 import acl_pb2, acl_pb2_grpc

log = logging.getLogger(__name__)

NOT_FOUND = "ACL token not found"
EXPIRED = "ACL token expired"
ANONYMOUS_ACCESSOR = "anonymous"


class Resolver(Protocol):
    """What the access interceptor (corral/security/access.py) asks."""

    async def resolve(self, secret_id: str) -> acl.ACL:
        """The ACL of `secret_id` ('' = anonymous); PermissionDenied for an
        unknown or expired token."""
        ...


def workload_claim(resp: acl_pb2.ACLResolveTokenResponse) -> acl.WorkloadClaim | None:
    """The workload a `ResolveToken` answer speaks for, if it was a
    workload identity."""
    if not resp.HasField("workload"):
        return None
    w = resp.workload
    return acl.WorkloadClaim(
        namespace=w.namespace,
        job_id=w.job_id,
        group=w.group,
        task=w.task,
        alloc_id=w.alloc_id,
        identity=w.identity or "default",
    )


def acl_from_response(resp: acl_pb2.ACLResolveTokenResponse) -> acl.ACL:
    """The ACL a `ResolveToken` answer describes. A stored policy that no
    longer parses (it was valid when written) grants nothing. A workload
    identity gets its implicit policy (`acl.WorkloadClaim`)."""
    if resp.type == acl.TOKEN_MANAGEMENT:
        return acl.MANAGEMENT
    workload = workload_claim(resp)
    rules: list[acl.PolicyRules] = []
    for p in resp.policies:
        try:
            parsed = acl.parse_policy(p.rules)
        except Exception:
            log.warning("ACL policy %r does not parse; it grants nothing", p.name)
            continue
        rules.append(dataclasses.replace(parsed, name=p.name))
    if not rules and workload is None:
        return acl.DENY_ALL
    return acl.compile_acl(rules, workload=workload)


class ACLDisabled(Unavailable):
    """The state answered that ACLs are off there: it enforces nothing, so
    a token cannot be resolved (a caller that only mirrors the state's
    decisions, as the HTTP gateway does, may treat every token as allowed)."""


def check_expiry(expiration_time: int, now_ns: int) -> None:
    if expiration_time and expiration_time <= now_ns:
        raise PermissionDenied(EXPIRED)


@dataclass(frozen=True)
class Resolved:
    """One resolved token: what ResolveToken said, and its compiled ACL."""

    response: acl_pb2.ACLResolveTokenResponse
    acl: acl.ACL

    @property
    def expiration_time(self) -> int:
        return self.response.expiration_time


class TokenCache:
    """Resolved tokens and misses by secret hash, each for a TTL, at most
    `max_entries` (least recently used dropped first), so a flood of made-up
    tokens costs bounded memory. An expired entry stays readable through
    `stale()` for use while the state cannot be reached."""

    def __init__(
        self,
        ttl: float,
        miss_ttl: float,
        *,
        max_entries: int = 4096,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.ttl = ttl
        self.miss_ttl = miss_ttl
        self.max_entries = max_entries
        self._clock = clock
        self._entries: OrderedDict[str, tuple[float, Resolved | str]] = OrderedDict()
        #: moves on every clear(): an answer fetched before a clear is not kept
        self.generation = 0

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: str) -> Resolved | str | None:
        """A fresh entry: the resolved token, or the message of a miss."""
        entry = self._entries.get(key)
        if entry is None:
            return None
        deadline, value = entry
        if self._clock() >= deadline:
            return None
        self._entries.move_to_end(key)
        return value

    def stale(self, key: str) -> Resolved | None:
        entry = self._entries.get(key)
        return entry[1] if entry is not None and isinstance(entry[1], Resolved) else None

    def put(self, key: str, value: Resolved | str, generation: int | None = None) -> None:
        """Keep `value`; with `generation` (read before the lookup began),
        only if nothing was cleared meanwhile: a lookup racing an ACL
        write must not cache what the write just changed."""
        if generation is not None and generation != self.generation:
            return
        ttl = self.miss_ttl if isinstance(value, str) else self.ttl
        self._entries[key] = (self._clock() + ttl, value)
        self._entries.move_to_end(key)
        while len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)

    def clear(self) -> None:
        self._entries.clear()
        self.generation += 1


class CachingResolver:
    """What every resolver does around its lookup: answers cached by the
    secret's hash (`TokenCache`), a cached miss refused at once, the expiry
    checked on every answer, cached or not. A subclass fetches what the
    cache does not hold (`_fetch`) and caches it."""

    def __init__(self, cache: TokenCache, wall_clock: Callable[[], int]) -> None:
        self.cache = cache
        self._wall = wall_clock

    async def resolve(self, secret_id: str) -> acl.ACL:
        return (await self.resolve_token(secret_id)).acl

    async def resolve_token(self, secret_id: str) -> Resolved:
        key = acl.secret_hash(secret_id)
        hit = self.cache.get(key)
        if isinstance(hit, str):
            raise PermissionDenied(hit)
        if hit is None:
            hit = await self._fetch(key, secret_id)
        check_expiry(hit.expiration_time, self._wall())
        self._check(hit)
        return hit

    def invalidate(self) -> None:
        """Forget every cached answer (an ACL table was written)."""
        self.cache.clear()

    async def _fetch(self, key: str, secret_id: str) -> Resolved:
        """The token of `secret_id` (`key` its hash), looked up and cached;
        PermissionDenied for an unknown or expired one."""
        raise NotImplementedError

    def _check(self, resolved: Resolved) -> None:
        """What else must hold each time a token is used, cached or not
        (PermissionDenied when it does not)."""


class RemoteResolver(CachingResolver):
    """Resolves tokens through the state's `ACL.ResolveToken` on `channel`
    (a grpc.aio channel the role owns), caching answers for `ttl` seconds
    and misses for `miss_ttl`, so repeated bad tokens do not reach the
    state. Concurrent lookups of one secret share one call, and at most
    `max_inflight` calls run at once. While the state is unreachable a
    token resolved before keeps working (Nomad does the same), unless it
    has expired; a token never seen gets UNAVAILABLE."""

    def __init__(
        self,
        channel: grpc.aio.Channel,
        *,
        ttl: float = 30.0,
        miss_ttl: float = 5.0,
        timeout: float = 5.0,
        max_entries: int = 4096,
        max_inflight: int = 32,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], int] = time.time_ns,
    ) -> None:
        super().__init__(
            TokenCache(ttl, miss_ttl, max_entries=max_entries, clock=clock), wall_clock
        )
        self._stub = acl_pb2_grpc.ACLStub(channel)
        self.timeout = timeout
        self._inflight: dict[str, asyncio.Future[Resolved]] = {}
        self._slots = asyncio.Semaphore(max_inflight)
        #: ResolveToken calls made (tests and metrics read it)
        self.calls = 0

    async def _fetch(self, key: str, secret_id: str) -> Resolved:
        """Concurrent lookups of one secret share one call."""
        fut = self._inflight.get(key)
        if fut is None:
            fut = asyncio.ensure_future(self._call(key, secret_id))
            self._inflight[key] = fut
            fut.add_done_callback(lambda f: self._done(key, f))
        return await asyncio.shield(fut)

    def _done(self, key: str, fut: asyncio.Future[Resolved]) -> None:
        self._inflight.pop(key, None)
        if not fut.cancelled():
            fut.exception()  # retrieved: waiters that went away leave no warning

    async def _call(self, key: str, secret_id: str) -> Resolved:
        generation = self.cache.generation
        try:
            async with self._slots:
                self.calls += 1
                resp = await self._stub.ResolveToken(
                    acl_pb2.ACLResolveTokenRequest(secret_id=secret_id), timeout=self.timeout
                )
        except grpc.aio.AioRpcError as exc:
            code = exc.code()
            if code in (grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.NOT_FOUND):
                message = EXPIRED if exc.details() == EXPIRED else NOT_FOUND
                self.cache.put(key, message, generation)
                raise PermissionDenied(message) from None
            if code == grpc.StatusCode.FAILED_PRECONDITION:
                raise ACLDisabled(
                    "cannot resolve the ACL token: ACLs are disabled at the state"
                ) from None
            stale = self.cache.stale(key)
            if stale is not None and code in (
                grpc.StatusCode.UNAVAILABLE,
                grpc.StatusCode.DEADLINE_EXCEEDED,
            ):
                log.warning("state unreachable (%s); using a cached ACL token", code.name)
                return stale
            raise Unavailable(f"cannot resolve the ACL token: state answered {code.name}") from None
        resolved = Resolved(resp, acl_from_response(resp))
        self.cache.put(key, resolved, generation)
        return resolved
