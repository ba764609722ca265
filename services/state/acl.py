"""ACL reads from the database and the state's own token resolver.

ACL objects are not part of the in-memory state (no scheduler needs them):
policies and tokens are read from their tables, and `DatabaseResolver`
keeps resolved tokens for a few seconds. Its cache is dropped whenever any
state process writes an ACL table: this process's ACL handlers call
`invalidate()` after each write, and `follow()` watches the change feed
for the ACL events every process's writes record.

Tokens are looked up by the SHA-256 of their secret (`corral.security.acl.secret_hash`):
the secret itself is never stored, cached or logged.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

from corral.domain import topics
from corral.domain.errors import PermissionDenied
from corral.security import acl, identity
from corral.security.acl_resolve import (
    ANONYMOUS_ACCESSOR,
    NOT_FOUND,
    CachingResolver,
    Resolved,
    TokenCache,
    acl_from_response,
    check_expiry,
)
from corral.v1 import acl_pb2
from services.state.db.database import Database
from services.state.feed import ChangeFeed

log = logging.getLogger(__name__)

POLICIES_TABLE = "acl_policies"
TOKENS_TABLE = "acl_tokens"
ROLES_TABLE = "acl_roles"
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
TOKEN_COLUMNS = (
    "accessor_id, name, type, policies, global, create_time, expiration_time, "
    "create_index, modify_index, roles"
)
ROLE_COLUMNS = "id, name, description, policies, create_index, modify_index"


def to_ns(when: datetime | None) -> int:
    if when is None:
        return 0
    return (when - _EPOCH) // timedelta(microseconds=1) * 1000


def from_ns(ns: int) -> datetime | None:
    if not ns:
        return None
    return _EPOCH + timedelta(microseconds=ns // 1000)


def token_from_row(row: Sequence[Any]) -> acl_pb2.ACLToken:
    """An ACLToken (never with a secret) from the `TOKEN_COLUMNS` of a row;
    its role links hold ids only (`link_roles` names them)."""
    return acl_pb2.ACLToken(
        roles=[acl_pb2.ACLTokenRoleLink(id=r) for r in row[9] or ()],
        accessor_id=row[0],
        name=row[1],
        type=row[2],
        policies=list(row[3] or ()),
        is_global=bool(row[4]),
        create_time=to_ns(row[5]),
        expiration_time=to_ns(row[6]),
        create_index=int(row[7]),
        modify_index=int(row[8]),
    )


def anonymous_token(policies: Sequence[str]) -> acl_pb2.ACLToken:
    """Nomad's anonymous token: what a call without a token is."""
    return acl_pb2.ACLToken(
        accessor_id=ANONYMOUS_ACCESSOR,
        name="Anonymous Token",
        type=acl.TOKEN_CLIENT,
        policies=list(policies),
    )


async def _rows(db: Database, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
    async with db.read() as conn:
        cur = await conn.execute(sql, params)
        return await cur.fetchall()


async def table_index(db: Database, tables: Sequence[str], floor: int = 1) -> int:
    """The last index that wrote any of `tables` (at least `floor`: reads
    answer 1 for tables never written, as every blocking index is >= 1)."""
    rows = await _rows(
        db,
        "SELECT coalesce(max(index), 0) FROM table_indexes WHERE name = ANY(%s)",
        (list(tables),),
    )
    return max(floor, int(rows[0][0]) if rows else 0)


async def list_policies(db: Database, *, with_rules: bool = False) -> list[acl_pb2.ACLPolicy]:
    rules = "rules" if with_rules else "''"
    rows = await _rows(
        db,
        f"SELECT name, description, {rules}, create_index, modify_index "
        "FROM acl_policies ORDER BY name",
    )
    return [_policy(r) for r in rows]


async def get_policies(db: Database, names: Sequence[str]) -> list[acl_pb2.ACLPolicy]:
    rows = await _rows(
        db,
        "SELECT name, description, rules, create_index, modify_index "
        "FROM acl_policies WHERE name = ANY(%s) ORDER BY name",
        (list(names),),
    )
    return [_policy(r) for r in rows]


def _policy(row: Sequence[Any]) -> acl_pb2.ACLPolicy:
    return acl_pb2.ACLPolicy(
        name=row[0],
        description=row[1],
        rules=row[2],
        create_index=int(row[3]),
        modify_index=int(row[4]),
    )


def role_from_row(row: Sequence[Any]) -> acl_pb2.ACLRole:
    """An ACLRole from the `ROLE_COLUMNS` of a row."""
    return acl_pb2.ACLRole(
        id=row[0],
        name=row[1],
        description=row[2],
        policies=list(row[3] or ()),
        create_index=int(row[4]),
        modify_index=int(row[5]),
    )


async def list_roles(db: Database) -> list[acl_pb2.ACLRole]:
    rows = await _rows(db, f"SELECT {ROLE_COLUMNS} FROM acl_roles ORDER BY id")
    return [role_from_row(r) for r in rows]


async def get_roles(db: Database, ids: Sequence[str]) -> list[acl_pb2.ACLRole]:
    """The roles of `ids` that exist, by id."""
    if not ids:
        return []
    rows = await _rows(
        db, f"SELECT {ROLE_COLUMNS} FROM acl_roles WHERE id = ANY(%s) ORDER BY id", (list(ids),)
    )
    return [role_from_row(r) for r in rows]


async def get_role_by_name(db: Database, name: str) -> acl_pb2.ACLRole | None:
    rows = await _rows(db, f"SELECT {ROLE_COLUMNS} FROM acl_roles WHERE name = %s", (name,))
    return role_from_row(rows[0]) if rows else None


def name_links(tokens: Sequence[acl_pb2.ACLToken], roles: Sequence[acl_pb2.ACLRole]) -> None:
    """Give each token's role links the roles' current names, dropping
    links to roles that no longer exist (Nomad's fixTokenRoleLinks: a
    role's name may change, a deleted role drops out)."""
    names = {r.id: r.name for r in roles}
    for t in tokens:
        links = [
            acl_pb2.ACLTokenRoleLink(id=link.id, name=names[link.id])
            for link in t.roles
            if link.id in names
        ]
        del t.roles[:]
        t.roles.extend(links)


async def link_roles(db: Database, tokens: Sequence[acl_pb2.ACLToken]) -> None:
    """`name_links` with the roles read from the database."""
    ids = sorted({link.id for t in tokens for link in t.roles})
    if ids:
        name_links(tokens, await get_roles(db, ids))


async def list_tokens(db: Database) -> list[acl_pb2.ACLToken]:
    rows = await _rows(db, f"SELECT {TOKEN_COLUMNS} FROM acl_tokens ORDER BY accessor_id")
    tokens = [token_from_row(r) for r in rows]
    await link_roles(db, tokens)
    return tokens


async def get_token(db: Database, accessor_id: str) -> acl_pb2.ACLToken | None:
    rows = await _rows(
        db, f"SELECT {TOKEN_COLUMNS} FROM acl_tokens WHERE accessor_id = %s", (accessor_id,)
    )
    if not rows:
        return None
    token = token_from_row(rows[0])
    await link_roles(db, [token])
    return token


async def any_global(db: Database, accessor_ids: Sequence[str]) -> bool:
    """Whether any of these tokens is global (its writes belong to the
    authoritative region of a federation)."""
    rows = await _rows(
        db,
        "SELECT 1 FROM acl_tokens WHERE global AND accessor_id = ANY(%s) LIMIT 1",
        (list(accessor_ids),),
    )
    return bool(rows)


async def token_by_secret(
    db: Database, secret_id: str, *, name_roles: bool = True
) -> acl_pb2.ACLToken | None:
    """The token whose secret is `secret_id`, looked up by its hash; its
    role links named (`link_roles`) unless `name_roles` is false (ids only,
    deleted roles included: for a caller that reads the roles anyway)."""
    rows = await _rows(
        db,
        f"SELECT {TOKEN_COLUMNS} FROM acl_tokens WHERE secret_hash = %s",
        (acl.secret_hash(secret_id),),
    )
    if not rows:
        return None
    token = token_from_row(rows[0])
    if name_roles:
        await link_roles(db, [token])
    return token


async def token_policy_names(db: Database, token: acl_pb2.ACLToken) -> list[str]:
    """Every policy name a client token holds: its own, then those of the
    roles it links (read now: a role changed or deleted since the token
    was made counts as it is), without repeats."""
    names = list(token.policies)
    for role in await get_roles(db, [link.id for link in token.roles]):
        names.extend(role.policies)
    return list(dict.fromkeys(names))


async def lookup(
    db: Database, secret_id: str, now_ns: int | None = None
) -> acl_pb2.ACLResolveTokenResponse:
    """What `ACL.ResolveToken` answers for `secret_id`, from the database."""
    if not secret_id:
        policies = await get_policies(db, [acl.ANONYMOUS_POLICY])
        return acl_pb2.ACLResolveTokenResponse(
            accessor_id=ANONYMOUS_ACCESSOR,
            type=acl.TOKEN_CLIENT,
            policies=[acl_pb2.ACLPolicy(name=p.name, rules=p.rules) for p in policies],
        )
    token = await token_by_secret(db, secret_id, name_roles=False)
    if token is None:
        raise PermissionDenied(NOT_FOUND)
    check_expiry(token.expiration_time, time.time_ns() if now_ns is None else now_ns)
    resp = acl_pb2.ACLResolveTokenResponse(
        accessor_id=token.accessor_id, type=token.type, expiration_time=token.expiration_time
    )
    if token.type == acl.TOKEN_CLIENT:
        names = await token_policy_names(db, token)
        if names:
            for p in await get_policies(db, names):
                resp.policies.add(name=p.name, rules=p.rules)
    return resp


class WorkloadResolver(Protocol):
    """Workload identities (services/state/identities.py)."""

    async def resolve(self, token: str) -> acl_pb2.ACLResolveTokenResponse: ...

    def check(self, claim: acl_pb2.WorkloadClaim) -> str: ...


class DatabaseResolver(CachingResolver):
    """The state role's `Resolver`: tokens from the database, each answer
    (and each miss) kept for `ttl` seconds at most. A JWT is a workload
    identity: resolved by `workloads` (its signature checked once per
    cache period, its alloc on every use)."""

    def __init__(
        self,
        db: Database,
        *,
        ttl: float = 5.0,
        max_entries: int = 4096,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], int] = time.time_ns,
    ) -> None:
        super().__init__(TokenCache(ttl, ttl, max_entries=max_entries, clock=clock), wall_clock)
        self.db = db
        #: database lookups made (tests read it)
        self.lookups = 0
        #: set by the state app once the keyring exists
        self.workloads: WorkloadResolver | None = None

    async def _fetch(self, key: str, secret_id: str) -> Resolved:
        self.lookups += 1
        generation = self.cache.generation
        if self.workloads is not None and identity.looks_like_jwt(secret_id):
            # not cached when refused: its alloc may reach this process's
            # state a moment after the JWT was signed by another one
            resp = await self.workloads.resolve(secret_id)
        else:
            try:
                resp = await lookup(self.db, secret_id, self._wall())
            except PermissionDenied as exc:
                self.cache.put(key, exc.message, generation)
                raise
        resolved = Resolved(resp, acl_from_response(resp))
        self.cache.put(key, resolved, generation)
        return resolved

    def _check(self, resolved: Resolved) -> None:
        """A workload identity's alloc is checked on every use."""
        if self.workloads is not None and resolved.response.HasField("workload"):
            self.workloads.check(resolved.response.workload)

    async def follow(self, feed: ChangeFeed, stop: asyncio.Event) -> None:
        """Invalidate on every ACL write any state process commits, until
        `stop`; started by the state app beside its other loops."""
        while not stop.is_set():
            try:
                async for batch in feed.subscribe(feed.index, stop):
                    if any(ev.topic in topics.ACL_NAMES for ev in batch.events):
                        self.invalidate()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # e.g. fell behind the retained log: start over
                log.warning("ACL cache feed follow restarted: %s", exc)
                self.invalidate()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), 1.0)
