"""Fencing writes of leader-elected roles.

Leases on advisory locks overlap briefly: when a leader's connection dies
the lock is free at once, but the old leader notices only at its next
keepalive. A write that names its leader (the address it advertises) is
checked inside the index lock against the current holder of that role's
lock, so a deposed leader's in-flight plan or eval write is refused rather
than committed against the new leader's decisions.
"""

from __future__ import annotations

from corral.errors import FailedPrecondition
from corral.leader import APP_PREFIX, role_lock_id
from services.state.db.database import WriteTx


async def require_leader(tx: WriteTx, role: str, address: str) -> None:
    # One look per transaction, made inside the index lock as before: every
    # write of a batch is fenced against the same reading.
    key = ("leader", role)
    holder = tx.memo.get(key)
    if holder is None:
        cur = await tx.conn.execute(
            "SELECT a.application_name FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid "
            "WHERE l.locktype = 'advisory' AND l.granted "
            "AND ((l.classid::bigint << 32) | l.objid::bigint) = %s",
            (role_lock_id(role),),
        )
        row = await cur.fetchone()
        holder = str(row[0]) if row and row[0] else ""
        tx.memo[key] = holder
    if holder != f"{APP_PREFIX}{role}:{address}"[:63]:
        current = holder.split(":", 2)[2] if holder.count(":") >= 2 else "none"
        raise FailedPrecondition(
            f"{address} is not the {role} leader (current leader: {current}); write refused"
        )
