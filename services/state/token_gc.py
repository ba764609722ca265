"""Deleting expired ACL tokens (Nomad's expired token GC), on the state
leader.

An expired token is refused already (`corral.security.acl.check_expiry`), so this is
housekeeping: without it every short-lived token a CI job creates stays in
`acl_tokens` for ever. Tokens are not in the replicas, so the core scheduler
on the workers cannot see them; the state, which holds the table, collects
them. Every `token_gc_interval` the leader deletes the tokens that expired
more than `token_gc_threshold` ago; `corral system gc` deletes every expired
one at once. The index moves only when a token is deleted: a read looks
first, the write decides again on the rows it deletes.

Expired one-time tokens (services/state/writes/one_time_tokens.py) go in
the same pass, as soon as they expire (Nomad's ExpireOneTimeTokens; an
expired one already exchanges for nothing). They are each region's own.
"""

from __future__ import annotations

import asyncio
import logging
import time

from services.state.acl import from_ns
from services.state.app_context import StateContext
from services.state.config import ACLSettings
from services.state.writes import one_time_tokens
from services.state.writes.acl import delete_expired_tokens

log = logging.getLogger(__name__)

NS_PER_S = 1_000_000_000


async def collect_expired(ctx: StateContext, threshold_ns: int) -> list[str]:
    """Delete the tokens that expired more than `threshold_ns` ago, and
    every expired one-time token; the deleted tokens' accessor ids.
    Outside the authoritative region of a federation only local tokens:
    global tokens are the authority's to collect (Nomad's leader does the
    same), and their deletion is replicated here."""
    before = time.time_ns() - threshold_ns
    local_only = ctx.federation is not None and not ctx.federation.authoritative
    now = time.time_ns()
    async with ctx.db.read() as conn:
        cur = await conn.execute(
            "SELECT EXISTS (SELECT 1 FROM acl_tokens WHERE expiration_time IS NOT NULL "
            "AND expiration_time < %s AND NOT (global AND %s)), "
            "EXISTS (SELECT 1 FROM acl_one_time_tokens WHERE expires_at <= %s)",
            (from_ns(before), local_only, from_ns(now)),
        )
        row = await cur.fetchone()
        if row is None or not (row[0] or row[1]):
            return []
    async with ctx.write() as tx:
        deleted = await delete_expired_tokens(tx, before, local_only=local_only)
        one_time = await one_time_tokens.delete_expired(tx, now)
    if deleted:
        log.info("deleted %d expired ACL token(s)", len(deleted))
    if one_time:
        log.info("deleted %d expired one-time token(s)", len(one_time))
    return deleted


class TokenGC:
    """The leader's timer around `collect_expired`."""

    def __init__(self, ctx: StateContext, settings: ACLSettings) -> None:
        self.ctx = ctx
        self.threshold_ns = int(settings.token_gc_threshold * NS_PER_S)
        self.interval = settings.token_gc_interval

    async def run(self) -> None:
        while True:
            try:
                await collect_expired(self.ctx, self.threshold_ns)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("expired ACL token GC failed")
            await asyncio.sleep(self.interval)
