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
"""

from __future__ import annotations

import asyncio
import logging
import time

from services.state.acl import from_ns
from services.state.app_context import StateContext
from services.state.config import ACLSettings
from services.state.writes.acl import delete_expired_tokens

log = logging.getLogger(__name__)

NS_PER_S = 1_000_000_000


async def collect_expired(ctx: StateContext, threshold_ns: int) -> list[str]:
    """Delete the tokens that expired more than `threshold_ns` ago; their
    accessor ids. Outside the authoritative region of a federation only
    local ones: global tokens are the authority's to collect (Nomad's
    leader does the same), and their deletion is replicated here."""
    before = time.time_ns() - threshold_ns
    local_only = ctx.federation is not None and not ctx.federation.authoritative
    async with ctx.db.read() as conn:
        cur = await conn.execute(
            "SELECT 1 FROM acl_tokens WHERE expiration_time IS NOT NULL "
            "AND expiration_time < %s AND NOT (global AND %s) LIMIT 1",
            (from_ns(before), local_only),
        )
        if await cur.fetchone() is None:
            return []
    async with ctx.write() as tx:
        deleted = await delete_expired_tokens(tx, before, local_only=local_only)
    if deleted:
        log.info("deleted %d expired ACL token(s)", len(deleted))
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
