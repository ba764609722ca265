"""Indexed write transactions and consistent reads over PostgreSQL.

Every write goes through `Database.write()`:

1. `UPDATE index_counter SET value = value + n RETURNING value` — the row
   lock serializes writers, so commit order equals index order across any
   number of state processes (ARCHITECTURE.md §2);
2. the caller reads what it must validate (inside the lock, so it sees the
   newest committed state) and queues puts/deletes, each stamped with its
   index;
3. on exit the queued rows are upserted per table, one `change_log` row per
   index holds that index's `ChangeBatch`, `table_indexes` is bumped and a
   `NOTIFY` wakes every change feed; then the transaction commits. Any
   exception rolls everything back, counter included, so indexes stay
   gap-free.

Group commit (the planner's `ApplyPlans`) takes n consecutive indexes in one
transaction; each put names the index it belongs to.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import psycopg
from sqlalchemy import Table, delete, select, text
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine

from corral.structs import DEFAULT_NAMESPACE, Topic
from corral.v1 import structs_pb2 as pb
from services.state.db import models as m

NOTIFY_CHANNEL = "corral_changes"
UPSERT_CHUNK = 1000

_T_JOBS: Table = m.Job.__table__  # type: ignore[assignment]
_T_JOB_VERSIONS: Table = m.JobVersion.__table__  # type: ignore[assignment]
_T_SUMMARIES: Table = m.JobSummary.__table__  # type: ignore[assignment]
_T_NODES: Table = m.Node.__table__  # type: ignore[assignment]
_T_ALLOCS: Table = m.Alloc.__table__  # type: ignore[assignment]
_T_EVALS: Table = m.Eval.__table__  # type: ignore[assignment]
_T_DEPLOYMENTS: Table = m.Deployment.__table__  # type: ignore[assignment]
_T_SCHED_CONFIG: Table = m.SchedulerConfig.__table__  # type: ignore[assignment]
_T_CHANGE_LOG: Table = m.ChangeLog.__table__  # type: ignore[assignment]

#: table name (as in table_indexes and StateSnapshot.table_index) per topic
TOPIC_TABLE = {
    Topic.JOB: "jobs",
    Topic.EVALUATION: "evals",
    Topic.ALLOCATION: "allocs",
    Topic.NODE: "nodes",
    Topic.DEPLOYMENT: "deployments",
    Topic.OPERATOR: "scheduler_config",
    Topic.JOB_SUMMARY: "job_summary",
}


def _ns(namespace: str) -> str:
    return namespace or DEFAULT_NAMESPACE


def _job_row(j: pb.Job) -> dict[str, Any]:
    return {
        "namespace": _ns(j.namespace),
        "id": j.id,
        "type": j.type,
        "status": j.status,
        "priority": j.priority,
        "stop": j.stop,
        "version": j.version,
        "payload": j.SerializeToString(),
        "create_index": j.create_index,
        "modify_index": j.modify_index,
        "job_modify_index": j.job_modify_index,
    }


def _job_version_row(j: pb.Job) -> dict[str, Any]:
    return {
        "namespace": _ns(j.namespace),
        "id": j.id,
        "version": j.version,
        "payload": j.SerializeToString(),
        "create_index": j.modify_index,
    }


def _summary_row(s: pb.JobSummary) -> dict[str, Any]:
    return {
        "namespace": _ns(s.namespace),
        "job_id": s.job_id,
        "payload": s.SerializeToString(),
        "create_index": s.create_index,
        "modify_index": s.modify_index,
    }


def _node_row(n: pb.Node) -> dict[str, Any]:
    return {
        "id": n.id,
        "name": n.name,
        "datacenter": n.datacenter,
        "node_pool": n.node_pool,
        "node_class": n.node_class,
        "status": n.status,
        "eligibility": n.scheduling_eligibility,
        "drain": n.drain,
        "payload": n.SerializeToString(),
        "create_index": n.create_index,
        "modify_index": n.modify_index,
    }


def _alloc_row(a: pb.Allocation) -> dict[str, Any]:
    return {
        "id": a.id,
        "namespace": _ns(a.namespace),
        "job_id": a.job_id,
        "node_id": a.node_id,
        "eval_id": a.eval_id,
        "name": a.name,
        "task_group": a.task_group,
        "desired_status": a.desired_status,
        "client_status": a.client_status,
        "payload": a.SerializeToString(),
        "create_index": a.create_index,
        "modify_index": a.modify_index,
    }


def _eval_row(e: pb.Evaluation) -> dict[str, Any]:
    return {
        "id": e.id,
        "namespace": _ns(e.namespace),
        "job_id": e.job_id,
        "type": e.type,
        "status": e.status,
        "triggered_by": e.triggered_by,
        "priority": e.priority,
        "payload": e.SerializeToString(),
        "create_index": e.create_index,
        "modify_index": e.modify_index,
    }


def _deployment_row(d: pb.Deployment) -> dict[str, Any]:
    return {
        "id": d.id,
        "namespace": _ns(d.namespace),
        "job_id": d.job_id,
        "status": d.status,
        "payload": d.SerializeToString(),
        "create_index": d.create_index,
        "modify_index": d.modify_index,
    }


def _stamp(obj: Any, index: int) -> None:
    if not obj.create_index:
        obj.create_index = index
    obj.modify_index = index


@dataclass
class _Pending:
    """Rows queued by a transaction, keyed so the last put of an object wins."""

    rows: dict[str, dict[Any, dict[str, Any]]] = field(default_factory=dict)
    deletes: dict[str, dict[Any, Any]] = field(default_factory=dict)
    objects: dict[str, dict[Any, Any]] = field(default_factory=dict)

    def put(self, table: str, key: Any, row: dict[str, Any], obj: Any) -> None:
        self.rows.setdefault(table, {})[key] = row
        self.objects.setdefault(table, {})[key] = obj
        self.deletes.get(table, {}).pop(key, None)

    def delete(self, table: str, key: Any, where: Any) -> None:
        self.rows.get(table, {}).pop(key, None)
        self.objects.setdefault(table, {})[key] = None
        self.deletes.setdefault(table, {})[key] = where

    def get(self, table: str, key: Any) -> tuple[bool, Any]:
        objs = self.objects.get(table)
        if objs is not None and key in objs:
            return True, objs[key]
        return False, None


class WriteTx:
    """One indexed write transaction. Obtain it from `Database.write()`.

    `index` is the (last) index this transaction commits at; with group commit
    `indexes` lists all of them in order. Reads (`get_*`) see the newest
    committed state plus this transaction's own queued puts.
    """

    def __init__(self, conn: AsyncConnection, indexes: list[int]) -> None:
        self.conn = conn
        self.indexes = indexes
        self.index = indexes[-1]
        self.now = time.time_ns()
        self._pending = _Pending()
        self._events: dict[int, list[pb.Event]] = {i: [] for i in indexes}

    # ------------------------------------------------------------ events

    def event(
        self,
        topic: str,
        type_: str,
        key: str,
        *,
        namespace: str = "",
        index: int | None = None,
        deleted: bool = False,
        **payload: Any,
    ) -> pb.Event:
        """Record one change for the change log (and the event stream)."""
        at = index or self.index
        ev = pb.Event(
            index=at,
            topic=topic,
            type=type_,
            key=key,
            namespace=namespace,
            deleted=deleted,
            **payload,
        )
        self._events[at].append(ev)
        return ev

    # ------------------------------------------------------------ puts

    def put_job(
        self, job: pb.Job, event_type: str = "JobRegistered", *, index: int | None = None
    ) -> None:
        """Upsert the job and record this version. Stamps create/modify index."""
        at = index or self.index
        _stamp(job, at)
        key = (_ns(job.namespace), job.id)
        self._pending.put("jobs", key, _job_row(job), job)
        self._pending.put("job_versions", (*key, job.version), _job_version_row(job), job)
        self.event(Topic.JOB, event_type, job.id, namespace=job.namespace, index=at, job=job)

    def put_job_summary(self, summary: pb.JobSummary, *, index: int | None = None) -> None:
        at = index or self.index
        _stamp(summary, at)
        key = (_ns(summary.namespace), summary.job_id)
        self._pending.put("job_summaries", key, _summary_row(summary), summary)
        self.event(
            Topic.JOB_SUMMARY,
            "JobSummary",
            summary.job_id,
            namespace=summary.namespace,
            index=at,
            job_summary=summary,
        )

    def put_node(
        self, node: pb.Node, event_type: str = "NodeRegistration", *, index: int | None = None
    ) -> None:
        at = index or self.index
        _stamp(node, at)
        self._pending.put("nodes", node.id, _node_row(node), node)
        self.event(Topic.NODE, event_type, node.id, index=at, node=node)

    def put_alloc(
        self,
        alloc: pb.Allocation,
        event_type: str = "AllocationUpdated",
        *,
        index: int | None = None,
    ) -> None:
        at = index or self.index
        _stamp(alloc, at)
        if not alloc.create_time:
            alloc.create_time = self.now
        alloc.modify_time = self.now
        self._pending.put("allocs", alloc.id, _alloc_row(alloc), alloc)
        self.event(
            Topic.ALLOCATION,
            event_type,
            alloc.id,
            namespace=alloc.namespace,
            index=at,
            allocation=alloc,
        )

    def put_eval(
        self, ev: pb.Evaluation, event_type: str = "EvaluationUpdated", *, index: int | None = None
    ) -> None:
        at = index or self.index
        _stamp(ev, at)
        if not ev.create_time:
            ev.create_time = self.now
        ev.modify_time = self.now
        self._pending.put("evals", ev.id, _eval_row(ev), ev)
        self.event(
            Topic.EVALUATION, event_type, ev.id, namespace=ev.namespace, index=at, evaluation=ev
        )

    def put_deployment(
        self,
        d: pb.Deployment,
        event_type: str = "DeploymentStatusUpdate",
        *,
        index: int | None = None,
    ) -> None:
        at = index or self.index
        _stamp(d, at)
        if not d.create_time:
            d.create_time = self.now
        d.modify_time = self.now
        self._pending.put("deployments", d.id, _deployment_row(d), d)
        self.event(
            Topic.DEPLOYMENT, event_type, d.id, namespace=d.namespace, index=at, deployment=d
        )

    def put_scheduler_config(
        self, cfg: pb.SchedulerConfiguration, *, index: int | None = None
    ) -> None:
        at = index or self.index
        _stamp(cfg, at)
        row = {"id": 1, "payload": cfg.SerializeToString(), "modify_index": at}
        self._pending.put("scheduler_config", 1, row, cfg)
        self.event(
            Topic.OPERATOR, "SchedulerConfigUpdated", "scheduler", index=at, scheduler_config=cfg
        )

    # ------------------------------------------------------------ deletes

    def delete_job(self, job: pb.Job, *, index: int | None = None) -> None:
        """Purge a job and all its versions and its summary."""
        key = (_ns(job.namespace), job.id)
        self._pending.delete("jobs", key, key)
        self._pending.delete("job_versions_all", key, key)
        self._pending.delete("job_summaries", key, key)
        self.event(
            Topic.JOB,
            "JobDeregistered",
            job.id,
            namespace=job.namespace,
            index=index,
            deleted=True,
            job=job,
        )

    def delete_alloc(self, alloc: pb.Allocation, *, index: int | None = None) -> None:
        self._pending.delete("allocs", alloc.id, alloc.id)
        self.event(
            Topic.ALLOCATION,
            "AllocationDeleted",
            alloc.id,
            namespace=alloc.namespace,
            index=index,
            deleted=True,
            allocation=alloc,
        )

    def delete_eval(self, ev: pb.Evaluation, *, index: int | None = None) -> None:
        self._pending.delete("evals", ev.id, ev.id)
        self.event(
            Topic.EVALUATION,
            "EvaluationDeleted",
            ev.id,
            namespace=ev.namespace,
            index=index,
            deleted=True,
            evaluation=ev,
        )

    def delete_node(self, node: pb.Node, *, index: int | None = None) -> None:
        self._pending.delete("nodes", node.id, node.id)
        self.event(Topic.NODE, "NodeDeregistration", node.id, index=index, deleted=True, node=node)

    def delete_deployment(self, d: pb.Deployment, *, index: int | None = None) -> None:
        self._pending.delete("deployments", d.id, d.id)
        self.event(
            Topic.DEPLOYMENT,
            "DeploymentDeleted",
            d.id,
            namespace=d.namespace,
            index=index,
            deleted=True,
            deployment=d,
        )

    # ------------------------------------------------------------ reads

    async def _one(self, table: str, key: Any, stmt: Any, cls: type[Any]) -> Any:
        found, obj = self._pending.get(table, key)
        if found:
            return obj
        row = (await self.conn.execute(stmt)).first()
        return cls.FromString(row[0]) if row else None

    async def get_job(self, namespace: str, job_id: str) -> pb.Job | None:
        key = (_ns(namespace), job_id)
        stmt = select(_T_JOBS.c.payload).where(
            _T_JOBS.c.namespace == key[0], _T_JOBS.c.id == job_id
        )
        job: pb.Job | None = await self._one("jobs", key, stmt, pb.Job)
        return job

    async def get_job_version(self, namespace: str, job_id: str, version: int) -> pb.Job | None:
        key = (_ns(namespace), job_id, version)
        t = _T_JOB_VERSIONS
        stmt = select(t.c.payload).where(
            t.c.namespace == key[0], t.c.id == job_id, t.c.version == version
        )
        job: pb.Job | None = await self._one("job_versions", key, stmt, pb.Job)
        return job

    async def get_job_summary(self, namespace: str, job_id: str) -> pb.JobSummary | None:
        key = (_ns(namespace), job_id)
        t = _T_SUMMARIES
        stmt = select(t.c.payload).where(t.c.namespace == key[0], t.c.job_id == job_id)
        s: pb.JobSummary | None = await self._one("job_summaries", key, stmt, pb.JobSummary)
        return s

    async def get_node(self, node_id: str) -> pb.Node | None:
        stmt = select(_T_NODES.c.payload).where(_T_NODES.c.id == node_id)
        node: pb.Node | None = await self._one("nodes", node_id, stmt, pb.Node)
        return node

    async def get_eval(self, eval_id: str) -> pb.Evaluation | None:
        stmt = select(_T_EVALS.c.payload).where(_T_EVALS.c.id == eval_id)
        ev: pb.Evaluation | None = await self._one("evals", eval_id, stmt, pb.Evaluation)
        return ev

    async def get_deployment(self, deployment_id: str) -> pb.Deployment | None:
        stmt = select(_T_DEPLOYMENTS.c.payload).where(_T_DEPLOYMENTS.c.id == deployment_id)
        d: pb.Deployment | None = await self._one("deployments", deployment_id, stmt, pb.Deployment)
        return d

    async def get_scheduler_config(self) -> pb.SchedulerConfiguration:
        stmt = select(_T_SCHED_CONFIG.c.payload).where(_T_SCHED_CONFIG.c.id == 1)
        cfg = await self._one("scheduler_config", 1, stmt, pb.SchedulerConfiguration)
        return cfg if cfg is not None else pb.SchedulerConfiguration()

    async def _many(
        self, table: str, ids: Sequence[str], t: Table, cls: type[Any]
    ) -> dict[str, Any]:
        out: dict[str, Any] = {}
        missing: list[str] = []
        for i in ids:
            found, obj = self._pending.get(table, i)
            if found:
                if obj is not None:
                    out[i] = obj
            else:
                missing.append(i)
        if missing:
            rows = await self.conn.execute(select(t.c.id, t.c.payload).where(t.c.id.in_(missing)))
            for row in rows:
                out[row[0]] = cls.FromString(row[1])
        return out

    async def get_allocs(self, alloc_ids: Sequence[str]) -> dict[str, pb.Allocation]:
        return await self._many("allocs", alloc_ids, _T_ALLOCS, pb.Allocation)

    async def get_evals(self, eval_ids: Sequence[str]) -> dict[str, pb.Evaluation]:
        return await self._many("evals", eval_ids, _T_EVALS, pb.Evaluation)

    async def get_nodes(self, node_ids: Sequence[str]) -> dict[str, pb.Node]:
        return await self._many("nodes", node_ids, _T_NODES, pb.Node)

    async def _by(
        self, table: str, t: Table, where: Any, cls: type[Any], key_col: str = "id"
    ) -> list[Any]:
        """Rows matching `where`, merged with this transaction's own puts."""
        rows = await self.conn.execute(select(t.c[key_col], t.c.payload).where(where))
        out: dict[Any, Any] = {r[0]: cls.FromString(r[1]) for r in rows}
        for key, obj in self._pending.objects.get(table, {}).items():
            if obj is None:
                out.pop(key, None)
            elif key in out:
                out[key] = obj
        return list(out.values())

    async def allocs_by_job(self, namespace: str, job_id: str) -> list[pb.Allocation]:
        t = _T_ALLOCS
        found = await self._by(
            "allocs", t, (t.c.namespace == _ns(namespace)) & (t.c.job_id == job_id), pb.Allocation
        )
        return found + self._new_matching("allocs", found, lambda a: a.job_id == job_id)

    async def allocs_by_node(self, node_id: str) -> list[pb.Allocation]:
        t = _T_ALLOCS
        found = await self._by("allocs", t, t.c.node_id == node_id, pb.Allocation)
        return found + self._new_matching("allocs", found, lambda a: a.node_id == node_id)

    async def evals_by_job(self, namespace: str, job_id: str) -> list[pb.Evaluation]:
        t = _T_EVALS
        found = await self._by(
            "evals", t, (t.c.namespace == _ns(namespace)) & (t.c.job_id == job_id), pb.Evaluation
        )
        return found + self._new_matching("evals", found, lambda e: e.job_id == job_id)

    async def evals_by_status(self, statuses: Iterable[str]) -> list[pb.Evaluation]:
        t = _T_EVALS
        wanted = list(statuses)
        found = await self._by("evals", t, t.c.status.in_(wanted), pb.Evaluation)
        return found + self._new_matching("evals", found, lambda e: e.status in wanted)

    async def jobs_all(self) -> list[pb.Job]:
        rows = await self.conn.execute(select(_T_JOBS.c.namespace, _T_JOBS.c.id, _T_JOBS.c.payload))
        out = {(r[0], r[1]): pb.Job.FromString(r[2]) for r in rows}
        for key, obj in self._pending.objects.get("jobs", {}).items():
            if obj is None:
                out.pop(key, None)
            else:
                out[key] = obj
        return list(out.values())

    async def count_nodes(self) -> int:
        row = (await self.conn.execute(text("SELECT count(*) FROM nodes"))).first()
        return int(row[0]) if row else 0

    def _new_matching(self, table: str, found: list[Any], pred: Any) -> list[Any]:
        """Objects put by this transaction that the SQL query could not see yet."""
        seen = {o.id for o in found}
        return [
            o
            for o in self._pending.objects.get(table, {}).values()
            if o is not None and o.id not in seen and pred(o)
        ]

    # ------------------------------------------------------------ commit

    async def _flush(self) -> None:
        conn = self.conn
        p = self._pending
        specs: list[tuple[str, Table, list[str]]] = [
            ("jobs", _T_JOBS, ["namespace", "id"]),
            ("job_versions", _T_JOB_VERSIONS, ["namespace", "id", "version"]),
            ("job_summaries", _T_SUMMARIES, ["namespace", "job_id"]),
            ("nodes", _T_NODES, ["id"]),
            ("allocs", _T_ALLOCS, ["id"]),
            ("evals", _T_EVALS, ["id"]),
            ("deployments", _T_DEPLOYMENTS, ["id"]),
            ("scheduler_config", _T_SCHED_CONFIG, ["id"]),
        ]
        for name, table, keys in specs:
            dels = p.deletes.get(name)
            if dels:
                if len(keys) == 1:
                    await conn.execute(
                        delete(table).where(table.c[keys[0]].in_(list(dels.values())))
                    )
                else:
                    for where in dels.values():
                        await conn.execute(
                            delete(table).where(
                                *[table.c[k] == v for k, v in zip(keys, where, strict=True)]
                            )
                        )
            all_versions = p.deletes.get("job_versions_all") if name == "job_versions" else None
            for ns, job_id in (all_versions or {}).values():
                await conn.execute(
                    delete(table).where(table.c.namespace == ns, table.c.id == job_id)
                )
            rows = list(p.rows.get(name, {}).values())
            if not rows:
                continue
            stmt = pg_insert(table)
            cols = [c.name for c in table.columns if c.name not in keys and c.name in rows[0]]
            stmt = stmt.on_conflict_do_update(
                index_elements=keys, set_={c: stmt.excluded[c] for c in cols}
            )
            for start in range(0, len(rows), UPSERT_CHUNK):
                await conn.execute(stmt, rows[start : start + UPSERT_CHUNK])

        touched: dict[str, int] = {}
        log_rows = []
        for at in self.indexes:
            events = self._events[at]
            for ev in events:
                table_name = TOPIC_TABLE.get(ev.topic)
                if table_name is not None:
                    touched[table_name] = at
            batch = pb.ChangeBatch(index=at, time=self.now, events=events)
            log_rows.append({"index": at, "payload": batch.SerializeToString()})
        await conn.execute(pg_insert(_T_CHANGE_LOG), log_rows)
        if touched:
            await conn.execute(
                text(
                    "INSERT INTO table_indexes (name, index) "
                    "SELECT * FROM unnest(CAST(:names AS text[]), CAST(:idx AS bigint[])) "
                    "ON CONFLICT (name) DO UPDATE SET index = excluded.index"
                ),
                {"names": list(touched), "idx": list(touched.values())},
            )
        await conn.execute(
            text("SELECT pg_notify(:ch, :payload)"),
            {"ch": NOTIFY_CHANNEL, "payload": str(self.index)},
        )


class Database:
    """The state service's handle on PostgreSQL."""

    def __init__(self, dsn: str, *, pool_size: int = 8) -> None:
        self.dsn = dsn
        self.engine: AsyncEngine = create_async_engine(
            "postgresql+psycopg://",
            async_creator=lambda: psycopg.AsyncConnection.connect(dsn),
            pool_size=pool_size,
            max_overflow=pool_size,
            pool_pre_ping=True,
        )

    async def close(self) -> None:
        await self.engine.dispose()

    @contextlib.asynccontextmanager
    async def write(self, count: int = 1) -> AsyncIterator[WriteTx]:
        """An indexed write transaction taking `count` consecutive indexes."""
        if count < 1:
            raise ValueError("count must be >= 1")
        async with self.engine.begin() as conn:
            result = await conn.execute(
                text("UPDATE index_counter SET value = value + :n WHERE id = 1 RETURNING value"),
                {"n": count},
            )
            last = int(result.scalar_one())
            tx = WriteTx(conn, list(range(last - count + 1, last + 1)))
            yield tx
            await tx._flush()

    @contextlib.asynccontextmanager
    async def read(self, *, repeatable: bool = False) -> AsyncIterator[AsyncConnection]:
        """A read-only transaction; `repeatable` gives one consistent snapshot
        of every table (REPEATABLE READ)."""
        async with self.engine.connect() as conn:
            if repeatable:
                await conn.execute(
                    text("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
                )
            yield conn
            await conn.rollback()

    async def latest_index(self) -> int:
        async with self.engine.connect() as conn:
            row = (await conn.execute(text("SELECT value FROM index_counter WHERE id = 1"))).first()
            return int(row[0]) if row else 0

    async def oldest_retained_index(self) -> int:
        """The change log holds every index after this one."""
        async with self.engine.connect() as conn:
            row = (await conn.execute(text("SELECT min(index) FROM change_log"))).first()
            if row is None or row[0] is None:
                latest = (
                    await conn.execute(text("SELECT value FROM index_counter WHERE id = 1"))
                ).first()
                return int(latest[0]) if latest else 0
            return int(row[0]) - 1

    async def read_log(self, after: int, limit: int = 1000) -> list[pb.ChangeBatch]:
        async with self.engine.connect() as conn:
            rows = await conn.execute(
                select(_T_CHANGE_LOG.c.payload)
                .where(_T_CHANGE_LOG.c.index > after)
                .order_by(_T_CHANGE_LOG.c.index)
                .limit(limit)
            )
            return [pb.ChangeBatch.FromString(r[0]) for r in rows]

    async def truncate_log(self, keep: int) -> int:
        """Drop change-log rows older than the newest `keep` indexes."""
        async with self.engine.begin() as conn:
            result = await conn.execute(
                text(
                    "DELETE FROM change_log WHERE index <= "
                    "(SELECT value FROM index_counter WHERE id = 1) - :keep"
                ),
                {"keep": keep},
            )
            return int(result.rowcount or 0)

    async def touch_member(self, member_id: str, role: str, address: str, payload: bytes) -> None:
        t: Table = m.Member.__table__  # type: ignore[assignment]
        stmt = pg_insert(t).values(id=member_id, role=role, address=address, payload=payload)
        stmt = stmt.on_conflict_do_update(
            index_elements=["id"],
            set_={"role": role, "address": address, "payload": payload, "last_seen": text("now()")},
        )
        async with self.engine.begin() as conn:
            await conn.execute(stmt)

    async def members(self, role: str = "", max_age_s: float = 60.0) -> list[tuple[bytes, float]]:
        """Members seen in the last max_age_s seconds: (payload, age seconds)."""
        async with self.engine.connect() as conn:
            q = text(
                "SELECT payload, extract(epoch FROM now() - last_seen) FROM members "
                "WHERE last_seen > now() - make_interval(secs => :age) "
                "AND (:role = '' OR role = :role) ORDER BY role, id"
            )
            rows = await conn.execute(q, {"age": max_age_s, "role": role})
            return [(bytes(r[0]), float(r[1])) for r in rows]
