"""Figures read from the database after a workload, all from server-side
commit times: every index has one `change_log` row whose `created_at` is
`clock_timestamp()` taken in the writing transaction, so "register
committed" and "plan committed" are the times of the indexes the job's
eval and its allocs were created at. Nothing here runs during a workload.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg

from corral.domain import topics
from corral.domain.structs import ClientStatus
from corral.domain.topics import EventType
from corral.v1 import structs_pb2 as pb


@dataclass
class Placements:
    """The allocs a workload's plans created, in commit order."""

    first_register: datetime | None
    commit_times: list[datetime]
    node_plans: int  # (commit index, node) pairs: node-plans that committed
    plan_indexes: int  # distinct indexes that created allocs

    @property
    def count(self) -> int:
        return len(self.commit_times)

    def duration_s(self) -> float:
        if self.first_register is None or not self.commit_times:
            return 0.0
        return (self.commit_times[-1] - self.first_register).total_seconds()

    def timeline(self, points: int = 200) -> list[list[float]]:
        """[seconds since the first register, cumulative placements], at most
        `points` samples plus the last one."""
        if self.first_register is None or not self.commit_times:
            return []
        n = len(self.commit_times)
        step = max(1, n // points)
        out = [
            [round((self.commit_times[i] - self.first_register).total_seconds(), 4), i + 1]
            for i in range(0, n, step)
        ]
        last = [round((self.commit_times[-1] - self.first_register).total_seconds(), 4), n]
        if out[-1] != last:
            out.append(last)
        return [[0.0, 0], *out]


def placements(conn: psycopg.Connection[Any], job_like: str, after_index: int = 0) -> Placements:
    """Allocs of the jobs whose id matches `job_like` (SQL LIKE), created
    after `after_index`, with the commit time of their creating index."""
    first = conn.execute(
        "SELECT min(c.created_at) FROM jobs j JOIN change_log c ON c.index = j.create_index "
        "WHERE j.id LIKE %s AND j.create_index > %s",
        (job_like, after_index),
    ).fetchone()
    rows = conn.execute(
        "SELECT c.created_at FROM allocs a JOIN change_log c ON c.index = a.create_index "
        "WHERE a.job_id LIKE %s AND a.create_index > %s ORDER BY a.create_index",
        (job_like, after_index),
    ).fetchall()
    pairs = conn.execute(
        "SELECT count(DISTINCT (create_index, node_id)), count(DISTINCT create_index) "
        "FROM allocs WHERE job_id LIKE %s AND create_index > %s",
        (job_like, after_index),
    ).fetchone()
    assert pairs is not None
    return Placements(
        first_register=first[0] if first else None,
        commit_times=[r[0] for r in rows],
        node_plans=int(pairs[0]),
        plan_indexes=int(pairs[1]),
    )


def eval_latencies_ms(
    conn: psycopg.Connection[Any], job_like: str, after_index: int = 0
) -> list[float]:
    """Per eval that placed anything: its first plan commit minus its own
    creation commit (for a job registration, the register commit)."""
    rows = conn.execute(
        "SELECT extract(epoch FROM min(cp.created_at) - ce.created_at) * 1000 "
        "FROM evals e "
        "JOIN change_log ce ON ce.index = e.create_index "
        "JOIN allocs a ON a.eval_id = e.id "
        "JOIN change_log cp ON cp.index = a.create_index "
        "WHERE e.job_id LIKE %s AND e.create_index > %s "
        "GROUP BY e.id, ce.created_at",
        (job_like, after_index),
    ).fetchall()
    return [float(r[0]) for r in rows]


def nodes_used(conn: psycopg.Connection[Any], job_like: str, after_index: int = 0) -> int:
    """Distinct nodes the matching jobs' allocs created after `after_index`
    went to (packing: fewer is tighter)."""
    row = conn.execute(
        "SELECT count(DISTINCT node_id) FROM allocs WHERE job_id LIKE %s AND create_index > %s",
        (job_like, after_index),
    ).fetchone()
    return int(row[0]) if row else 0


def eval_counts(
    conn: psycopg.Connection[Any], job_like: str, after_index: int = 0
) -> dict[str, int]:
    """Evals of the matching jobs by status."""
    rows = conn.execute(
        "SELECT status, count(*) FROM evals WHERE job_id LIKE %s AND create_index > %s "
        "GROUP BY status",
        (job_like, after_index),
    ).fetchall()
    return {str(r[0]): int(r[1]) for r in rows}


def last_commit_seconds_after(
    conn: psycopg.Connection[Any], job_like: str, after: float, after_index: int = 0
) -> dict[str, float]:
    """How long after `after` (Unix seconds, this machine's clock, which the
    database shares) the matching jobs' last plan committed (`placed_s`: the
    newest alloc's creating commit) and their last eval was canceled
    (`canceled_s`: the newest canceled eval's last write); 0.0 for none.
    Tells a storm's scheduling from its cancelation write-back."""
    row = conn.execute(
        "SELECT (SELECT extract(epoch FROM max(c.created_at)) FROM allocs a "
        "        JOIN change_log c ON c.index = a.create_index "
        "        WHERE a.job_id LIKE %s AND a.create_index > %s), "
        "       (SELECT extract(epoch FROM max(c.created_at)) FROM evals e "
        "        JOIN change_log c ON c.index = e.modify_index "
        "        WHERE e.job_id LIKE %s AND e.create_index > %s AND e.status = 'canceled')",
        (job_like, after_index, job_like, after_index),
    ).fetchone()
    assert row is not None
    return {
        name: round(max(0.0, float(t) - after), 2) if t is not None else 0.0
        for name, t in (("placed_s", row[0]), ("canceled_s", row[1]))
    }


def unfinished_evals(conn: psycopg.Connection[Any], job_like: str = "%") -> int:
    row = conn.execute(
        "SELECT count(*) FROM evals WHERE job_id LIKE %s AND status = 'pending'",
        (job_like,),
    ).fetchone()
    return int(row[0]) if row else 0


def latest_index(conn: psycopg.Connection[Any]) -> int:
    row = conn.execute("SELECT value FROM index_counter WHERE id = 1").fetchone()
    return int(row[0]) if row else 0


def live_allocs(conn: psycopg.Connection[Any], job_like: str) -> int:
    row = conn.execute(
        "SELECT count(*) FROM allocs WHERE job_id LIKE %s AND desired_status = 'run' "
        "AND client_status NOT IN ('complete', 'failed', 'lost')",
        (job_like,),
    ).fetchone()
    return int(row[0]) if row else 0


def node_statuses(conn: psycopg.Connection[Any]) -> dict[str, int]:
    rows = conn.execute("SELECT status, count(*) FROM nodes GROUP BY status").fetchall()
    return {str(r[0]): int(r[1]) for r in rows}


@dataclass
class Replacement:
    lost_alloc: str
    seconds_after_down: float


def replacements(
    conn: psycopg.Connection[Any], down_node_ids: list[str], after_index: int
) -> tuple[int, list[Replacement]]:
    """Allocs lost on `down_node_ids` (service and batch; a system job's
    alloc has nowhere else to go) and, for each that was replaced, the time
    from its node's down commit to the replacement's commit."""
    down_at = {
        str(r[0]): r[1]
        for r in conn.execute(
            "SELECT n.id, c.created_at FROM nodes n JOIN change_log c ON c.index = n.modify_index "
            "WHERE n.id = ANY(%s) AND n.status IN ('down', 'disconnected')",
            (down_node_ids,),
        ).fetchall()
    }
    lost = {
        str(r[0]): str(r[1])
        for r in conn.execute(
            "SELECT a.id, a.node_id FROM allocs a JOIN jobs j "
            "ON j.namespace = a.namespace AND j.id = a.job_id "
            "WHERE a.node_id = ANY(%s) AND a.client_status IN ('lost', 'unknown') "
            "AND j.type IN ('service', 'batch')",
            (down_node_ids,),
        ).fetchall()
    }
    out: list[Replacement] = []
    for payload, created in conn.execute(
        "SELECT a.payload, c.created_at FROM allocs a "
        "JOIN change_log c ON c.index = a.create_index WHERE a.create_index > %s",
        (after_index,),
    ).fetchall():
        alloc = pb.Allocation.FromString(payload)
        node = lost.get(alloc.previous_allocation)
        if node is None or node not in down_at:
            continue
        out.append(
            Replacement(alloc.previous_allocation, (created - down_at[node]).total_seconds())
        )
    return len(lost), out


def nodes_down(conn: psycopg.Connection[Any]) -> list[str]:
    return [
        str(r[0])
        for r in conn.execute(
            "SELECT id FROM nodes WHERE status IN ('down', 'disconnected')"
        ).fetchall()
    ]


def register_commit_times(
    conn: psycopg.Connection[Any], job_like: str, after_index: int = 0
) -> list[datetime]:
    """Commit times of the matching jobs' registrations (their create
    index), in order: what an open-loop driver actually achieved."""
    rows = conn.execute(
        "SELECT c.created_at FROM jobs j JOIN change_log c ON c.index = j.create_index "
        "WHERE j.id LIKE %s AND j.create_index > %s ORDER BY j.create_index",
        (job_like, after_index),
    ).fetchall()
    return [r[0] for r in rows]


#: A change batch that reports an alloc running holds these bytes (its
#: client_status); the others need not be parsed.
_RUNNING = ClientStatus.RUNNING.encode()


def running_commits(
    conn: psycopg.Connection[Any], job_prefix: str, after_index: int = 0
) -> dict[str, datetime]:
    """Per alloc of the jobs whose id starts with `job_prefix`: the commit
    time of the first change that recorded it `running` (the client's
    `UpdateAlloc`; the alloc row only keeps its last change, the change log
    keeps every one)."""
    out: dict[str, datetime] = {}
    rows = conn.execute(
        "SELECT created_at, payload FROM change_log WHERE index > %s "
        "AND position(%s::bytea IN payload) > 0 ORDER BY index",
        (after_index, _RUNNING),
    )
    for created, payload in rows:
        batch = pb.ChangeBatch.FromString(payload)
        for ev in batch.events:
            if ev.topic != topics.ALLOCATION.name or not ev.HasField("allocation"):
                continue
            a = ev.allocation
            if (
                a.client_status == ClientStatus.RUNNING
                and a.job_id.startswith(job_prefix)
                and a.id not in out
            ):
                out[a.id] = created
    return out


def placement_to_running_ms(
    conn: psycopg.Connection[Any], job_prefix: str, after_index: int = 0
) -> tuple[list[float], int]:
    """(plan commit → first `running` commit in ms for every alloc of the
    jobs starting with `job_prefix` created after `after_index` that was
    reported running, allocs never reported running)."""
    running = running_commits(conn, job_prefix, after_index)
    rows = conn.execute(
        "SELECT a.id, c.created_at FROM allocs a JOIN change_log c ON c.index = a.create_index "
        "WHERE a.job_id LIKE %s AND a.create_index > %s",
        (job_prefix + "%", after_index),
    ).fetchall()
    out: list[float] = []
    missing = 0
    for alloc_id, placed in rows:
        at = running.get(str(alloc_id))
        if at is None:
            missing += 1
        else:
            out.append((at - placed).total_seconds() * 1000)
    return out, missing


#: the kind of a commit, by the event types of its change batch, in the
#: order a batch holding several is counted under (the write batcher may
#: put a registration, eval writes and client updates in one commit)
COMMIT_KINDS: tuple[tuple[str, frozenset[str]], ...] = (
    ("plan", frozenset({EventType.PLAN_RESULT})),
    (
        "job",
        frozenset(
            {EventType.JOB_REGISTERED, EventType.JOB_DEREGISTERED, EventType.JOB_STATUS_UPDATED}
        ),
    ),
    ("client update", frozenset({EventType.NODE_ALLOC_UPDATE, EventType.ALLOCATION_UPDATED})),
    ("eval", frozenset({EventType.EVALUATION_UPDATED})),
)


def commit_kind(event_types: set[str]) -> str:
    """`plan`, `job`, `client update`, `eval`, `node` or `other`: the first
    of `COMMIT_KINDS` the batch holds an event of, else `node` when it holds
    a node event, else `other`."""
    for kind, types in COMMIT_KINDS:
        if event_types & types:
            return kind
    if any(t.startswith("Node") for t in event_types):
        return "node"
    return "other"


def commit_kinds(
    conn: psycopg.Connection[Any], after_index: int, until_index: int
) -> dict[str, int]:
    """Indexes written in (`after_index`, `until_index`] by `commit_kind`,
    and `shared`: those whose batch held more than one kind."""
    out: dict[str, int] = {}
    rows = conn.execute(
        "SELECT payload FROM change_log WHERE index > %s AND index <= %s",
        (after_index, until_index),
    )
    for (payload,) in rows:
        types = {ev.type for ev in pb.ChangeBatch.FromString(payload).events}
        kind = commit_kind(types)
        out[kind] = out.get(kind, 0) + 1
        held = sum(1 for _, t in COMMIT_KINDS if types & t)
        if held > 1:
            out["shared"] = out.get("shared", 0) + 1
    return out
