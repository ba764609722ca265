"""Fencing the writes of leader-elected roles: mandatory, not opt-in.

The internal writes only a leader makes (`State.ApplyPlans` by the planner
leader; `UpsertEvals`, `SetDeploymentStatus`, `UpsertDeployments` and
`UpdateAllocDesiredTransitions` by the broker leader) name the leader they
come from (`leader_id`, the address it advertises). The name is checked
inside the index lock against the current holder of that role's advisory
lock, so a deposed leader's in-flight write is refused rather than
committed against the new leader's decisions, and a request with no leader
id, or anyone else's, is refused outright: before this was mandatory, an
`ApplyPlans` without a leader id committed an alloc on a node that does not
exist and an over-capacity alloc, since only the planner leader checks fit.

Refusals are FAILED_PRECONDITION (the cluster's leadership is not what the
write requires; a deposed leader's callers already treat it so: the planner
turns it into "plan queue flushed" and the worker retries the new leader).
The message always says "is not the <role> leader".
"""

from __future__ import annotations

from corral.domain.errors import FailedPrecondition
from corral.runtime.leader import APP_PREFIX, role_lock_id
from services.state.db.database import WriteTx


def require_leader_id(role: str, address: str) -> None:
    """Refuse a write that names no leader, before it takes the index lock."""
    if not address:
        raise FailedPrecondition(
            f"leader_id is required: a caller that names no leader is not the {role} "
            "leader; write refused"
        )


async def require_leader(tx: WriteTx, role: str, address: str) -> None:
    """`address` holds the role's leader lock now (read under the index lock)."""
    require_leader_id(role, address)
    # One look per transaction, made inside the index lock as before: every
    # write of a batch is fenced against the same reading.
    key = ("leader", role)
    holder = tx.memo.get(key)
    if holder is None:
        # advisory locks are per database: another database on the same
        # server may have a leader of its own
        cur = await tx.conn.execute(
            "SELECT a.application_name FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid "
            "WHERE l.locktype = 'advisory' AND l.granted "
            "AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database()) "
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
