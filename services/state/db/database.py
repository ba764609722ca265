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
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from operator import attrgetter
from typing import Any

import psycopg
from psycopg_pool import AsyncConnectionPool, PoolClosed, PoolTimeout
from sqlalchemy import Table

from corral.domain import topics
from corral.domain.errors import CorralError, InvalidArgument, Unavailable
from corral.domain.structs import (
    DEFAULT_NAMESPACE,
    DEFAULT_NODE_POOL,
    ClientStatus,
    DesiredStatus,
    NodeStatus,
)
from corral.domain.topics import EventType
from corral.v1 import structs_pb2 as pb
from services.state import metrics
from services.state.db import models as m
from services.state.node_identity import redact, seal

NOTIFY_CHANNEL = "corral_changes"
_SERVER_TERMINAL = [DesiredStatus.STOP, DesiredStatus.EVICT]
#: the submissions kept per job: those of its newest versions (Nomad keeps
#: as many as it tracks job versions, JobTrackedVersions)
SUBMISSIONS_KEPT = 6
_CLIENT_TERMINAL = list(ClientStatus.TERMINAL)


def _ns(namespace: str) -> str:
    return namespace or DEFAULT_NAMESPACE


Row = tuple[Any, ...]

#: how most columns are filled: the object's field of the same name, but
#: these two
_COMMON_COLUMNS: dict[str, Callable[[Any], Any]] = {
    "namespace": lambda o: _ns(o.namespace),
    "payload": lambda o: o.SerializeToString(),
}


_PG_TYPES = {"String": "text", "Integer": "int4", "BigInteger": "int8", "Boolean": "bool"}


def _upsert_sql(table: Table, keys: list[str]) -> tuple[str, str]:
    """(single-row upsert, multi-row upsert from one array per column)."""
    cols = [c.name for c in table.columns]
    updates = ", ".join(f"{c} = EXCLUDED.{c}" for c in cols if c not in keys)
    conflict = f"ON CONFLICT ({', '.join(keys)}) DO UPDATE SET {updates}"
    single = (
        f"INSERT INTO {table.name} ({', '.join(cols)}) "
        f"VALUES ({', '.join(['%s'] * len(cols))}) {conflict}"
    )
    types = [_PG_TYPES.get(type(c.type).__name__, "bytea") for c in table.columns]
    arrays = ", ".join(f"%b::{t}[]" for t in types)
    bulk = f"INSERT INTO {table.name} ({', '.join(cols)}) SELECT * FROM unnest({arrays}) {conflict}"
    return single, bulk


@dataclass(frozen=True, slots=True)
class _Table:
    """A table the transaction writes: its primary key columns, an object's
    key among this transaction's puts, and its row (one value per column,
    in the table's order)."""

    model: Table
    keys: list[str]
    key: Callable[[Any], Any]
    row: Callable[[Any], Row]
    #: a put stamps the object's create and modify times
    timed: bool
    #: rows go one upsert each (an array column: unnest would flatten it)
    row_by_row: bool
    #: the upsert of one row, and of many (one array per column)
    upsert: str
    bulk: str

    @property
    def name(self) -> str:
        return str(self.model.name)


def _table(
    model: Any,
    key: Callable[[Any], Any],
    *,
    timed: bool = False,
    row_by_row: bool = False,
    **columns: Callable[[Any], Any],
) -> _Table:
    """The `_Table` of an ORM model: a column is filled by `columns[name]`,
    else as in `_COMMON_COLUMNS`, else from the object's field of its name."""
    t: Table = model.__table__
    getters = tuple(
        columns.get(c.name) or _COMMON_COLUMNS.get(c.name) or attrgetter(c.name) for c in t.columns
    )

    def row(obj: Any) -> Row:
        return tuple([get(obj) for get in getters])  # a list first: faster than a generator

    keys = [c.name for c in t.primary_key.columns]
    return _Table(t, keys, key, row, timed, row_by_row, *_upsert_sql(t, keys))


def _job_key(o: Any) -> tuple[str, str]:
    return (_ns(o.namespace), o.id)


def _id(o: Any) -> str:
    return str(o.id)


_JOBS = _table(m.Job, _job_key, node_pool=lambda j: j.node_pool or DEFAULT_NODE_POOL)
_JOB_VERSIONS = _table(
    m.JobVersion,
    lambda j: (*_job_key(j), j.version),
    create_index=attrgetter("modify_index"),
)
_SUMMARIES = _table(m.JobSummary, lambda s: (_ns(s.namespace), s.job_id))
_NODES = _table(m.Node, _id, eligibility=attrgetter("scheduling_eligibility"))
_ALLOCS = _table(m.Alloc, _id, timed=True)
_EVALS = _table(m.Eval, _id, timed=True)
_DEPLOYMENTS = _table(m.Deployment, _id, timed=True)
_SCHED_CONFIG = _table(m.SchedulerConfig, lambda _c: 1, id=lambda _c: 1)
_LAUNCHES = _table(m.PeriodicLaunch, lambda p: (_ns(p.namespace), p.job_id))
_NAMESPACES = _table(m.Namespace, lambda ns: ns.name)
_NODE_POOLS = _table(m.NodePool, lambda pool: pool.name)
_POLICIES = _table(
    m.ScalingPolicy,
    _id,
    namespace=lambda p: _ns(p.target.get("Namespace", "")),
    job_id=lambda p: p.target.get("Job", ""),
)
_SCALING_EVENTS = _table(m.ScalingEvents, lambda se: (_ns(se.namespace), se.job_id))
# an array column (tags): one upsert per row (unnest would flatten it)
_SERVICES = _table(
    m.ServiceRegistration,
    lambda r: (_ns(r.namespace), r.id),
    row_by_row=True,
    tags=lambda r: list(r.tags),
)
_SUBMISSIONS = _table(
    m.JobSubmission, lambda s: (_ns(s.namespace), s.job_id, s.version), id=attrgetter("job_id")
)

#: every table a transaction writes, in the order the commit writes them
_TABLES: dict[str, _Table] = {
    t.name: t
    for t in (
        _JOBS,
        _JOB_VERSIONS,
        _SUMMARIES,
        _NODES,
        _ALLOCS,
        _EVALS,
        _DEPLOYMENTS,
        _SCHED_CONFIG,
        _LAUNCHES,
        _SERVICES,
        _NAMESPACES,
        _NODE_POOLS,
        _POLICIES,
        _SCALING_EVENTS,
        _SUBMISSIONS,
    )
}
#: deletes of many rows of a table by one condition, run before its upserts:
#: (pending delete kind, statement taking that delete's parameters)
_RANGE_DELETES: dict[str, tuple[tuple[str, str], ...]] = {
    "job_versions": (
        ("job_versions_all", "DELETE FROM job_versions WHERE namespace = %s AND id = %s"),
    ),
    "job_submissions": (
        ("job_submissions_all", "DELETE FROM job_submissions WHERE namespace = %s AND id = %s"),
        (
            "job_submissions_before",
            "DELETE FROM job_submissions WHERE namespace = %s AND id = %s AND version < %s",
        ),
    ),
}
#: the table of the objects of each topic `WriteTx.put` writes
_TOPIC_TABLES: dict[topics.Topic, _Table] = {
    topics.ALLOCATION: _ALLOCS,
    topics.EVALUATION: _EVALS,
    topics.DEPLOYMENT: _DEPLOYMENTS,
    topics.JOB_SUMMARY: _SUMMARIES,
    topics.NAMESPACE: _NAMESPACES,
    topics.NODE_POOL: _NODE_POOLS,
    topics.SCALING_POLICY: _POLICIES,
    topics.SERVICE: _SERVICES,
}


def _stamp(obj: Any, index: int) -> None:
    if not obj.create_index:
        obj.create_index = index
    obj.modify_index = index


@dataclass
class _Pending:
    """Rows queued by a transaction, keyed so the last put of an object wins."""

    rows: dict[str, dict[Any, Row]] = field(default_factory=dict)
    deletes: dict[str, dict[Any, Any]] = field(default_factory=dict)
    objects: dict[str, dict[Any, Any]] = field(default_factory=dict)

    def put(self, table: _Table, obj: Any) -> None:
        name, key = table.name, table.key(obj)
        self.rows.setdefault(name, {})[key] = table.row(obj)
        self.objects.setdefault(name, {})[key] = obj
        self.deletes.get(name, {}).pop(key, None)

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

    def __init__(self, conn: psycopg.AsyncConnection[Any], indexes: list[int]) -> None:
        self.conn = conn
        self.indexes = indexes
        self.index = indexes[-1]
        self.now = time.time_ns()
        self._pending = _Pending()
        self._events: dict[int, list[pb.Event]] = {i: [] for i in indexes}
        # workers' eval decisions (State.DecideEval) by index: they ride on
        # the change batch to the broker, which acks by them
        self._decisions: dict[int, list[pb.EvalDecision]] = {}
        self._system_jobs: dict[tuple[str, str], pb.Job] | None = None
        # reads a transaction may reuse (the index lock keeps them current)
        self.memo: dict[Any, Any] = {}
        self._read_cache: dict[str, dict[Any, Any]] = {}
        self.committed = True  # false once rolled back for recording no change
        self.batches: list[pb.ChangeBatch] = []  # what the commit appended to the change log
        # allocs that became client-terminal and nodes that went down in
        # this transaction (by id, the index that did it): their service
        # registrations are removed at commit (`_drop_gone_services`)
        self._services_gone_allocs: dict[str, int] = {}
        self._services_gone_nodes: dict[str, int] = {}

    @property
    def change_count(self) -> int:
        """Changes recorded so far; every put and delete records one."""
        return sum(len(evs) for evs in self._events.values())

    # ------------------------------------------------------------ events

    def record(self, ev: pb.Event, *, index: int | None = None) -> pb.Event:
        """Record one change for the change log (and the event stream), at
        `index` (default: the transaction's)."""
        at = index or self.index
        ev.index = at
        self._events[at].append(ev)
        return ev

    def record_decision(self, decision: pb.EvalDecision, *, index: int | None = None) -> None:
        """Put a worker's eval decision on the change batch at `index`
        (default: the transaction's), next to the eval writes it made."""
        self._decisions.setdefault(index or self.index, []).append(decision)

    def _change(
        self,
        topic: topics.Topic,
        obj: Any,
        event_type: str,
        index: int | None,
        *,
        deleted: bool = False,
    ) -> pb.Event:
        return self.record(topic.event(obj, event_type, deleted=deleted), index=index)

    # ------------------------------------------------------------ puts

    def _put(self, table: _Table, obj: Any, index: int | None) -> None:
        """Queue `obj`'s row, stamped with `index` (create index if it has
        none, modify index; and its times where the table keeps them)."""
        _stamp(obj, index or self.index)
        if table.timed:
            if not obj.create_time:
                obj.create_time = self.now
            obj.modify_time = self.now
        self._pending.put(table, obj)

    def put(
        self, topic: topics.Topic, obj: Any, event_type: str, *, index: int | None = None
    ) -> None:
        """Upsert an alloc, eval, deployment or job summary (`topic` says
        which) and record the change."""
        self._put(_TOPIC_TABLES[topic], obj, index)
        self._change(topic, obj, event_type, index)
        if topic is topics.ALLOCATION:
            self._alloc_written(obj, index)

    def put_change(self, ev: pb.Event, *, index: int | None = None) -> None:
        """Upsert the alloc, eval or deployment a change record carries and
        record that very event (a committed plan's `plan_events`, not copied
        again)."""
        topic = topics.of(ev)
        assert topic is not None
        self._put(_TOPIC_TABLES[topic], topics.payload(ev), index)
        self.record(ev, index=index)
        if topic is topics.ALLOCATION:
            self._alloc_written(ev.allocation, index)

    def _alloc_written(self, alloc: pb.Allocation, index: int | None) -> None:
        """An alloc the client finished loses its service registrations at
        commit (`_drop_gone_services`)."""
        if alloc.client_status in _CLIENT_TERMINAL:
            self._services_gone_allocs[alloc.id] = index or self.index

    def put_job(
        self,
        job: pb.Job,
        event_type: str = EventType.JOB_REGISTERED,
        *,
        index: int | None = None,
    ) -> None:
        """Upsert the job and record this version. Stamps create/modify index."""
        self._put(_JOBS, job, index)
        self._pending.put(_JOB_VERSIONS, job)
        self._change(topics.JOB, job, event_type, index)

    def put_job_version(self, job: pb.Job, *, index: int | None = None) -> None:
        """Rewrite one stored version of a job (its stability) without
        touching the current job row."""
        self._pending.put(_JOB_VERSIONS, job)
        self._change(topics.JOB, job, EventType.JOB_VERSION, index)

    def put_job_summary(self, summary: pb.JobSummary, *, index: int | None = None) -> None:
        self.put(topics.JOB_SUMMARY, summary, EventType.JOB_SUMMARY, index=index)

    def put_node(
        self,
        node: pb.Node,
        event_type: str = EventType.NODE_REGISTRATION,
        *,
        index: int | None = None,
    ) -> None:
        """Upsert the node. Its secret is replaced by its hash (the table
        never holds a secret), and the change-log event carries neither, so
        no stream, snapshot or replica does (services/state/node_identity.py)."""
        seal(node)
        self._put(_NODES, node, index)
        redact(self._change(topics.NODE, node, event_type, index).node)
        if node.status == NodeStatus.DOWN:
            self._services_gone_nodes[node.id] = index or self.index

    def put_alloc(
        self,
        alloc: pb.Allocation,
        event_type: str = EventType.ALLOCATION_UPDATED,
        *,
        index: int | None = None,
    ) -> None:
        self.put(topics.ALLOCATION, alloc, event_type, index=index)

    def put_eval(
        self,
        ev: pb.Evaluation,
        event_type: str = EventType.EVALUATION_UPDATED,
        *,
        index: int | None = None,
    ) -> None:
        self.put(topics.EVALUATION, ev, event_type, index=index)

    def put_deployment(
        self,
        d: pb.Deployment,
        event_type: str = EventType.DEPLOYMENT_STATUS_UPDATE,
        *,
        index: int | None = None,
    ) -> None:
        self.put(topics.DEPLOYMENT, d, event_type, index=index)

    def put_scheduler_config(
        self, cfg: pb.SchedulerConfiguration, *, index: int | None = None
    ) -> None:
        self._put(_SCHED_CONFIG, cfg, index)
        self._change(topics.OPERATOR, cfg, EventType.SCHEDULER_CONFIG_UPDATED, index)

    def put_service_registration(
        self,
        reg: pb.ServiceRegistration,
        event_type: str = EventType.SERVICE_REGISTRATION,
        *,
        index: int | None = None,
    ) -> None:
        """Upsert one instance of a service (Nomad's ServiceRegistration
        event). Stamps create/modify index; keep the stored create_index on
        an update."""
        self.put(topics.SERVICE, reg, event_type, index=index)

    def put_periodic_launch(self, launch: pb.PeriodicLaunch, *, index: int | None = None) -> None:
        """Record a periodic job's last launch. It is bookkeeping, not an
        event: it is always written beside the job put that caused it."""
        self._put(_LAUNCHES, launch, index)

    def put_namespace(self, ns: pb.Namespace) -> None:
        self.put(topics.NAMESPACE, ns, EventType.NAMESPACE_UPSERTED)

    def put_node_pool(self, pool: pb.NodePool) -> None:
        self.put(topics.NODE_POOL, pool, EventType.NODE_POOL_UPSERTED)

    def put_scaling_policy(self, p: pb.ScalingPolicy) -> None:
        self.put(topics.SCALING_POLICY, p, EventType.SCALING_POLICY_UPSERTED)

    def put_scaling_events(self, se: pb.JobScalingEvents) -> None:
        """A job's scaling events (no create index: a row that only moves)."""
        se.modify_index = self.index
        self._pending.put(_SCALING_EVENTS, se)
        self._change(topics.SCALING_EVENT, se, EventType.SCALING_EVENT_RECORDED, None)

    # ------------------------------------------------------------ deletes

    def delete_namespace(self, ns: pb.Namespace) -> None:
        self._pending.delete(_NAMESPACES.name, ns.name, ns.name)
        self._change(topics.NAMESPACE, ns, EventType.NAMESPACE_DELETED, None, deleted=True)

    def delete_node_pool(self, pool: pb.NodePool) -> None:
        self._pending.delete(_NODE_POOLS.name, pool.name, pool.name)
        self._change(topics.NODE_POOL, pool, EventType.NODE_POOL_DELETED, None, deleted=True)

    def delete_scaling_policy(self, p: pb.ScalingPolicy, *, index: int | None = None) -> None:
        self._delete_object(
            _POLICIES, topics.SCALING_POLICY, p, EventType.SCALING_POLICY_DELETED, index
        )

    def delete_scaling_events(self, se: pb.JobScalingEvents, *, index: int | None = None) -> None:
        key = _SCALING_EVENTS.key(se)
        self._pending.delete(_SCALING_EVENTS.name, key, key)
        self._change(
            topics.SCALING_EVENT, se, EventType.SCALING_EVENTS_DELETED, index, deleted=True
        )

    def delete_job(self, job: pb.Job, *, index: int | None = None) -> None:
        """Purge a job and all its versions and its summary."""
        key = _job_key(job)
        self._pending.delete("jobs", key, key)
        self._pending.delete("job_versions_all", key, key)
        self._pending.delete("job_submissions_all", key, key)
        self._pending.delete("job_summaries", key, key)
        self._change(topics.JOB, job, EventType.JOB_DEREGISTERED, index, deleted=True)

    def put_job_submission(self, sub: pb.JobSubmission) -> None:
        """Keep the file a job version was submitted with (bookkeeping
        beside the version: no event), and forget those of versions more
        than SUBMISSIONS_KEPT behind it."""
        key = (_ns(sub.namespace), sub.job_id)
        self._pending.put(_SUBMISSIONS, sub)
        oldest_kept = sub.version - SUBMISSIONS_KEPT + 1
        if oldest_kept > 0:
            self._pending.delete("job_submissions_before", key, (*key, oldest_kept))

    def delete_periodic_launch(self, namespace: str, job_id: str) -> None:
        key = (_ns(namespace), job_id)
        self._pending.delete("periodic_launches", key, key)

    def _delete_object(
        self, table: _Table, topic: topics.Topic, obj: Any, event_type: str, index: int | None
    ) -> pb.Event:
        """Delete an object kept by its key and record the change."""
        key = table.key(obj)
        self._pending.delete(table.name, key, key)
        return self._change(topic, obj, event_type, index, deleted=True)

    def delete_service_registration(
        self, reg: pb.ServiceRegistration, *, index: int | None = None
    ) -> None:
        self._delete_object(_SERVICES, topics.SERVICE, reg, EventType.SERVICE_DEREGISTRATION, index)

    def delete_alloc(self, alloc: pb.Allocation, *, index: int | None = None) -> None:
        self._delete_object(_ALLOCS, topics.ALLOCATION, alloc, EventType.ALLOCATION_DELETED, index)
        self._services_gone_allocs[alloc.id] = index or self.index

    def delete_eval(self, ev: pb.Evaluation, *, index: int | None = None) -> None:
        self._delete_object(_EVALS, topics.EVALUATION, ev, EventType.EVALUATION_DELETED, index)

    def delete_node(self, node: pb.Node, *, index: int | None = None) -> None:
        self._services_gone_nodes[node.id] = index or self.index
        deleted = self._delete_object(
            _NODES, topics.NODE, node, EventType.NODE_DEREGISTRATION, index
        )
        redact(deleted.node)

    def delete_deployment(self, d: pb.Deployment, *, index: int | None = None) -> None:
        self._delete_object(_DEPLOYMENTS, topics.DEPLOYMENT, d, EventType.DEPLOYMENT_DELETED, index)

    # ------------------------------------------------------------ reads

    async def _fetch(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        cur = await self.conn.execute(sql, params)
        return await cur.fetchall()

    async def _one(
        self, table: str, key: Any, sql: str, params: Sequence[Any], cls: type[Any]
    ) -> Any:
        found, obj = self._pending.get(table, key)
        if found:
            return obj
        cached = self._read_cache.get(table)
        if cached is not None and key in cached:
            return cached[key]
        rows = await self._fetch(sql, params)
        return cls.FromString(rows[0][0]) if rows else None

    async def get_job(self, namespace: str, job_id: str) -> pb.Job | None:
        key = (_ns(namespace), job_id)
        sql = "SELECT payload FROM jobs WHERE namespace = %s AND id = %s"
        job: pb.Job | None = await self._one("jobs", key, sql, key, pb.Job)
        return job

    async def get_job_version(self, namespace: str, job_id: str, version: int) -> pb.Job | None:
        key = (_ns(namespace), job_id, version)
        sql = "SELECT payload FROM job_versions WHERE namespace = %s AND id = %s AND version = %s"
        job: pb.Job | None = await self._one("job_versions", key, sql, key, pb.Job)
        return job

    async def job_versions(self, namespace: str, job_id: str) -> list[pb.Job]:
        """Every stored version of a job, newest first, with this
        transaction's own puts (a purge queued in it drops the stored ones)."""
        ns = _ns(namespace)
        out: dict[int, pb.Job] = {}
        purged, _ = self._pending.get("job_versions_all", (ns, job_id))
        if not purged:
            rows = await self._fetch(
                "SELECT version, payload FROM job_versions WHERE namespace = %s AND id = %s",
                (ns, job_id),
            )
            out = {int(r[0]): pb.Job.FromString(r[1]) for r in rows}
        for key, obj in self._pending.objects.get("job_versions", {}).items():
            if key[:2] == (ns, job_id) and obj is not None:
                out[int(key[2])] = obj
        return [out[v] for v in sorted(out, reverse=True)]

    async def get_job_summary(self, namespace: str, job_id: str) -> pb.JobSummary | None:
        key = (_ns(namespace), job_id)
        sql = "SELECT payload FROM job_summaries WHERE namespace = %s AND job_id = %s"
        s: pb.JobSummary | None = await self._one("job_summaries", key, sql, key, pb.JobSummary)
        return s

    async def get_job_submission(
        self, namespace: str, job_id: str, version: int
    ) -> pb.JobSubmission | None:
        key = (_ns(namespace), job_id, version)
        sql = (
            "SELECT payload FROM job_submissions WHERE namespace = %s AND id = %s AND version = %s"
        )
        sub: pb.JobSubmission | None = await self._one(
            "job_submissions", key, sql, key, pb.JobSubmission
        )
        return sub

    async def get_periodic_launch(self, namespace: str, job_id: str) -> pb.PeriodicLaunch | None:
        key = (_ns(namespace), job_id)
        sql = "SELECT payload FROM periodic_launches WHERE namespace = %s AND job_id = %s"
        launch: pb.PeriodicLaunch | None = await self._one(
            "periodic_launches", key, sql, key, pb.PeriodicLaunch
        )
        return launch

    async def get_node(self, node_id: str) -> pb.Node | None:
        sql = "SELECT payload FROM nodes WHERE id = %s"
        node: pb.Node | None = await self._one("nodes", node_id, sql, (node_id,), pb.Node)
        return node

    async def get_eval(self, eval_id: str) -> pb.Evaluation | None:
        sql = "SELECT payload FROM evals WHERE id = %s"
        ev: pb.Evaluation | None = await self._one("evals", eval_id, sql, (eval_id,), pb.Evaluation)
        return ev

    async def get_deployment(self, deployment_id: str) -> pb.Deployment | None:
        sql = "SELECT payload FROM deployments WHERE id = %s"
        d: pb.Deployment | None = await self._one(
            "deployments", deployment_id, sql, (deployment_id,), pb.Deployment
        )
        return d

    async def get_scheduler_config(self) -> pb.SchedulerConfiguration:
        sql = "SELECT payload FROM scheduler_config WHERE id = 1"
        cfg = await self._one("scheduler_config", 1, sql, (), pb.SchedulerConfiguration)
        return cfg if cfg is not None else pb.SchedulerConfiguration()

    async def _whole(self, table: str, cls: type[Any]) -> dict[str, Any]:
        """Every row of a small table keyed by name, read once per
        transaction (namespaces and node pools are few, and a batch of
        registrations asks for them again and again), with this
        transaction's own puts and deletes over it."""
        memo_key = ("whole", table)
        committed: dict[str, Any] | None = self.memo.get(memo_key)
        if committed is None:
            rows = await self._fetch(f"SELECT name, payload FROM {table}")
            committed = {str(r[0]): cls.FromString(r[1]) for r in rows}
            self.memo[memo_key] = committed
        out = dict(committed)
        for name, obj in self._pending.objects.get(table, {}).items():
            if obj is None:
                out.pop(name, None)
            else:
                out[name] = obj
        return out

    async def get_namespace(self, name: str) -> pb.Namespace | None:
        ns: pb.Namespace | None = (await self._whole("namespaces", pb.Namespace)).get(
            name or DEFAULT_NAMESPACE
        )
        return ns

    async def get_node_pool(self, name: str) -> pb.NodePool | None:
        pool: pb.NodePool | None = (await self._whole("node_pools", pb.NodePool)).get(name)
        return pool

    async def namespaces_with_default_pool(self, pool: str) -> list[str]:
        """Namespaces whose node_pool_config names `pool` as the default."""
        found = await self._whole("namespaces", pb.Namespace)
        return sorted(n for n, ns in found.items() if ns.node_pool_config.default == pool)

    async def scaling_policies_by_job(self, namespace: str, job_id: str) -> list[pb.ScalingPolicy]:
        ns = _ns(namespace)
        return await self._by(
            "scaling_policies",
            "namespace = %s AND job_id = %s",
            (ns, job_id),
            pb.ScalingPolicy,
            lambda p: _ns(p.target.get("Namespace", "")) == ns and p.target.get("Job") == job_id,
        )

    async def get_scaling_events(self, namespace: str, job_id: str) -> pb.JobScalingEvents | None:
        key = (_ns(namespace), job_id)
        sql = "SELECT payload FROM scaling_events WHERE namespace = %s AND job_id = %s"
        se: pb.JobScalingEvents | None = await self._one(
            "scaling_events", key, sql, key, pb.JobScalingEvents
        )
        return se

    async def first_live_job(
        self, *, namespace: str | None = None, node_pool: str | None = None
    ) -> tuple[str, str] | None:
        """(namespace, id) of a job that is not dead, in `namespace` or in
        `node_pool`, or None: what keeps either from being deleted."""
        where, params = (
            ("namespace = %s", (namespace,))
            if namespace is not None
            else (
                "node_pool = %s",
                (node_pool,),
            )
        )
        pending = self._pending.objects.get("jobs", {})
        for key, job in pending.items():
            if job is None or job.status == "dead":
                continue
            if (namespace is not None and key[0] == namespace) or (
                node_pool is not None and (job.node_pool or DEFAULT_NODE_POOL) == node_pool
            ):
                return key  # type: ignore[no-any-return]
        rows = await self._fetch(
            f"SELECT namespace, id FROM jobs WHERE {where} AND status != 'dead' "
            "AND NOT ((namespace, id) IN (SELECT * FROM unnest(%s::text[], %s::text[]))) LIMIT 1",
            (*params, [k[0] for k in pending], [k[1] for k in pending]),
        )
        return (str(rows[0][0]), str(rows[0][1])) if rows else None

    async def count_live_allocs_in_namespace(self, namespace: str) -> int:
        """Allocs of `namespace` the client has not finished (Nomad refuses
        to delete a namespace that has any)."""
        rows = await self._fetch(
            "SELECT count(*) FROM allocs WHERE namespace = %s AND NOT (client_status = ANY(%s))",
            (namespace, _CLIENT_TERMINAL),
        )
        return int(rows[0][0]) if rows else 0

    async def first_node_in_pool(self, pool: str) -> str | None:
        """The id of a node in `pool`, or None."""
        for node_id, node in self._pending.objects.get("nodes", {}).items():
            if node is not None and (node.node_pool or DEFAULT_NODE_POOL) == pool:
                return str(node_id)
        rows = await self._fetch("SELECT id FROM nodes WHERE node_pool = %s LIMIT 1", (pool,))
        return str(rows[0][0]) if rows else None

    async def _many(self, table: str, ids: Sequence[str], cls: type[Any]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        missing: list[str] = []
        cached = self._read_cache.get(table, {})
        for i in ids:
            found, obj = self._pending.get(table, i)
            if not found and i in cached:
                found, obj = True, cached[i]
            if found:
                if obj is not None:
                    out[i] = obj
            else:
                missing.append(i)
        if missing:
            rows = await self._fetch(
                f"SELECT id, payload FROM {table} WHERE id = ANY(%s)", (missing,)
            )
            for row in rows:
                out[row[0]] = cls.FromString(row[1])
        return out

    async def prefetch(
        self,
        *,
        allocs: Iterable[str] = (),
        nodes: Iterable[str] = (),
        evals: Iterable[str] = (),
        jobs: Iterable[tuple[str, str]] = (),
    ) -> None:
        """Read many rows in one query per table ahead of a batch of small
        writes, so each write's own lookups cost no round trip. Rows that do
        not exist are remembered as missing; this transaction's puts still
        win over what was read."""
        by_id: tuple[tuple[str, Iterable[str], type[Any]], ...] = (
            ("allocs", allocs, pb.Allocation),
            ("nodes", nodes, pb.Node),
            ("evals", evals, pb.Evaluation),
        )
        for table, ids, cls in by_id:
            wanted = sorted(set(ids) - self._read_cache.get(table, {}).keys())
            if not wanted:
                continue
            cache = self._read_cache.setdefault(table, {})
            rows = await self._fetch(
                f"SELECT id, payload FROM {table} WHERE id = ANY(%s)", (wanted,)
            )
            found = {r[0]: cls.FromString(r[1]) for r in rows}
            for i in wanted:
                cache[i] = found.get(i)
        keys = sorted({(_ns(ns), job_id) for ns, job_id in jobs})
        if keys:
            cache = self._read_cache.setdefault("jobs", {})
            rows = await self._fetch(
                "SELECT namespace, id, payload FROM jobs "
                "WHERE (namespace, id) IN (SELECT * FROM unnest(%s::text[], %s::text[]))",
                ([k[0] for k in keys], [k[1] for k in keys]),
            )
            found_jobs = {(r[0], r[1]): pb.Job.FromString(r[2]) for r in rows}
            for k in keys:
                cache[k] = found_jobs.get(k)

    async def get_service_registration(
        self, namespace: str, reg_id: str
    ) -> pb.ServiceRegistration | None:
        key = (_ns(namespace), reg_id)
        sql = "SELECT payload FROM service_registrations WHERE namespace = %s AND id = %s"
        reg: pb.ServiceRegistration | None = await self._one(
            "service_registrations", key, sql, key, pb.ServiceRegistration
        )
        return reg

    async def service_registrations_where(
        self, *, alloc_ids: Sequence[str] = (), node_ids: Sequence[str] = ()
    ) -> dict[tuple[str, str], pb.ServiceRegistration]:
        """Registrations of these allocs or nodes, by (namespace, id), with
        this transaction's own puts and deletes merged in."""
        allocs, nodes = set(alloc_ids), set(node_ids)
        out: dict[tuple[str, str], pb.ServiceRegistration] = {}
        if allocs or nodes:
            rows = await self._fetch(
                "SELECT namespace, id, payload FROM service_registrations "
                "WHERE alloc_id = ANY(%s) OR node_id = ANY(%s)",
                (sorted(allocs), sorted(nodes)),
            )
            out = {(r[0], r[1]): pb.ServiceRegistration.FromString(r[2]) for r in rows}
        for key, obj in self._pending.objects.get("service_registrations", {}).items():
            if obj is None:
                out.pop(key, None)
            elif obj.alloc_id in allocs or obj.node_id in nodes:
                out[key] = obj
        return out

    async def _drop_gone_services(self) -> None:
        """Nomad's deregisterServicesForTerminalAllocs and its node-down
        cleanup: the registrations of allocs this transaction made
        client-terminal (or deleted), and of nodes it marked down (or
        deleted), go with them, at the same index. Costs a query only when
        such an alloc or node is in the transaction."""
        allocs, nodes = self._services_gone_allocs, self._services_gone_nodes
        if not allocs and not nodes:
            return
        gone = await self.service_registrations_where(alloc_ids=list(allocs), node_ids=list(nodes))
        for reg in gone.values():
            at = allocs.get(reg.alloc_id) or nodes.get(reg.node_id)
            self.delete_service_registration(reg, index=at)

    async def get_allocs(self, alloc_ids: Sequence[str]) -> dict[str, pb.Allocation]:
        return await self._many("allocs", alloc_ids, pb.Allocation)

    async def get_evals(self, eval_ids: Sequence[str]) -> dict[str, pb.Evaluation]:
        return await self._many("evals", eval_ids, pb.Evaluation)

    async def get_nodes(self, node_ids: Sequence[str]) -> dict[str, pb.Node]:
        return await self._many("nodes", node_ids, pb.Node)

    async def _by(
        self, table: str, where: str, params: Sequence[Any], cls: type[Any], pred: Any
    ) -> list[Any]:
        """Rows matching `where`, merged with this transaction's own puts
        (including objects it created that match `pred`)."""
        rows = await self._fetch(f"SELECT id, payload FROM {table} WHERE {where}", params)
        out: dict[Any, Any] = {r[0]: cls.FromString(r[1]) for r in rows}
        for key, obj in self._pending.objects.get(table, {}).items():
            if obj is None:
                out.pop(key, None)
            elif key in out or pred(obj):
                out[key] = obj
        return list(out.values())

    async def allocs_by_job(self, namespace: str, job_id: str) -> list[pb.Allocation]:
        ns = _ns(namespace)
        return await self._by(
            "allocs",
            "namespace = %s AND job_id = %s",
            (ns, job_id),
            pb.Allocation,
            lambda a: _ns(a.namespace) == ns and a.job_id == job_id,
        )

    async def job_alloc_counts(self, namespace: str, job_id: str) -> tuple[int, int]:
        """(allocs, live allocs) of a job, counted in SQL without reading a
        single payload: a job's status needs only these, and a big job's
        allocs would otherwise be parsed on every client update."""
        ns = _ns(namespace)
        pending = self._pending.objects.get("allocs", {})
        row = (
            await self._fetch(
                "SELECT count(*), count(*) FILTER (WHERE NOT (desired_status = ANY(%s)) "
                "AND NOT (client_status = ANY(%s))) FROM allocs "
                "WHERE namespace = %s AND job_id = %s AND NOT (id = ANY(%s))",
                (_SERVER_TERMINAL, _CLIENT_TERMINAL, ns, job_id, list(pending)),
            )
        )[0]
        total, live = int(row[0]), int(row[1])
        for a in pending.values():
            if a is None or _ns(a.namespace) != ns or a.job_id != job_id:
                continue
            total += 1
            live += not (
                a.desired_status in _SERVER_TERMINAL or a.client_status in _CLIENT_TERMINAL
            )
        return total, live

    async def job_has_evals_in(self, namespace: str, job_id: str, statuses: Sequence[str]) -> bool:
        """Whether any eval of the job has one of `statuses` (no payloads read)."""
        ns = _ns(namespace)
        wanted = list(statuses)
        pending = self._pending.objects.get("evals", {})
        for e in pending.values():
            if (
                e is not None
                and _ns(e.namespace) == ns
                and e.job_id == job_id
                and e.status in wanted
            ):
                return True
        rows = await self._fetch(
            "SELECT 1 FROM evals WHERE namespace = %s AND job_id = %s AND status = ANY(%s) "
            "AND NOT (id = ANY(%s)) LIMIT 1",
            (ns, job_id, wanted, list(pending)),
        )
        return bool(rows)

    async def allocs_by_node(self, node_id: str) -> list[pb.Allocation]:
        return await self._by(
            "allocs", "node_id = %s", (node_id,), pb.Allocation, lambda a: a.node_id == node_id
        )

    async def deployments_by_job(self, namespace: str, job_id: str) -> list[pb.Deployment]:
        ns = _ns(namespace)
        return await self._by(
            "deployments",
            "namespace = %s AND job_id = %s",
            (ns, job_id),
            pb.Deployment,
            lambda d: _ns(d.namespace) == ns and d.job_id == job_id,
        )

    async def evals_by_job(self, namespace: str, job_id: str) -> list[pb.Evaluation]:
        ns = _ns(namespace)
        return await self._by(
            "evals",
            "namespace = %s AND job_id = %s",
            (ns, job_id),
            pb.Evaluation,
            lambda e: _ns(e.namespace) == ns and e.job_id == job_id,
        )

    async def evals_by_status(self, statuses: Iterable[str]) -> list[pb.Evaluation]:
        wanted = list(statuses)
        return await self._by(
            "evals", "status = ANY(%s)", (wanted,), pb.Evaluation, lambda e: e.status in wanted
        )

    async def system_jobs(self) -> list[pb.Job]:
        """Running system jobs: every node that changes status needs them,
        so the committed ones are read once per transaction (the counter
        lock keeps them current) and this transaction's puts are merged in."""
        if self._system_jobs is None:
            rows = await self._fetch(
                "SELECT namespace, id, payload FROM jobs WHERE type = 'system' AND NOT stop"
            )
            self._system_jobs = {(r[0], r[1]): pb.Job.FromString(r[2]) for r in rows}
        out = dict(self._system_jobs)
        for key, obj in self._pending.objects.get("jobs", {}).items():
            if obj is None or obj.type != "system" or obj.stop:
                out.pop(key, None)
            else:
                out[key] = obj
        return list(out.values())

    async def job_keys(self) -> list[tuple[str, str]]:
        """(namespace, id) of every job, with this transaction's own puts
        and purges (no payload read)."""
        rows = await self._fetch("SELECT namespace, id FROM jobs")
        keys = {(str(r[0]), str(r[1])) for r in rows}
        for key, obj in self._pending.objects.get("jobs", {}).items():
            if obj is None:
                keys.discard(key)
            else:
                keys.add(key)
        return sorted(keys)

    async def count_nodes(self) -> int:
        rows = await self._fetch("SELECT count(*) FROM nodes")
        return int(rows[0][0]) if rows else 0

    # ------------------------------------------------------------ commit

    async def _flush(self) -> None:
        """Queue every write of the transaction; with the connection in
        pipeline mode they go to the server together with the COMMIT."""
        await self._drop_gone_services()
        p = self._pending
        for name, table in _TABLES.items():
            dels = p.deletes.get(name)
            if dels:
                await self._delete(name, table.keys, list(dels.values()))
            for kind, sql in _RANGE_DELETES.get(name, ()):
                for where in (p.deletes.get(kind) or {}).values():
                    await self.conn.execute(sql, where)
            rows = p.rows.get(name)
            if not rows:
                continue
            if len(rows) == 1 or table.row_by_row:
                for row in rows.values():
                    await self.conn.execute(table.upsert, row)
            else:
                # one statement for any number of rows: a column array each
                await self.conn.execute(
                    table.bulk, [list(c) for c in zip(*rows.values(), strict=True)]
                )

        touched: dict[str, int] = {}
        log_rows = []
        for at in self.indexes:
            events = self._events[at]
            for ev in events:
                table_index = topics.index_of(ev.topic)
                if table_index:
                    touched[table_index] = at
            batch = pb.ChangeBatch(
                index=at, time=self.now, events=events, eval_decisions=self._decisions.get(at, ())
            )
            self.batches.append(batch)
            log_rows.append((at, batch.SerializeToString()))
        await self.conn.execute(
            "INSERT INTO change_log (index, payload) SELECT * FROM unnest(%b::int8[], %b::bytea[])",
            ([r[0] for r in log_rows], [r[1] for r in log_rows]),
        )
        if touched:
            await self.conn.execute(
                "INSERT INTO table_indexes (name, index) "
                "SELECT * FROM unnest(%s::text[], %s::bigint[]) "
                "ON CONFLICT (name) DO UPDATE SET index = excluded.index",
                (list(touched), list(touched.values())),
            )
        await self.conn.execute("SELECT pg_notify(%s, %s)", (NOTIFY_CHANNEL, str(self.index)))

    async def _delete(self, table: str, keys: list[str], wheres: list[Any]) -> None:
        if len(keys) == 1:
            await self.conn.execute(f"DELETE FROM {table} WHERE {keys[0]} = ANY(%s)", (wheres,))
            return
        cond = " AND ".join(f"{k} = %s" for k in keys)
        for where in wheres:
            await self.conn.execute(f"DELETE FROM {table} WHERE {cond}", tuple(where))


def translate_error(exc: BaseException) -> CorralError | None:
    """What a database exception means to a caller (the state server's
    error interceptor asks): the database unreachable, restarting or out of
    connections is UNAVAILABLE, so clients retry; a value PostgreSQL cannot
    store is the caller's INVALID_ARGUMENT. Anything else stays INTERNAL.
    The database's own text goes to the log only."""
    if isinstance(exc, psycopg.OperationalError | PoolTimeout | PoolClosed):
        return Unavailable("the state database is unavailable; retry")
    if isinstance(exc, psycopg.DataError):
        return InvalidArgument("request", "holds a value the database cannot store")
    return None


class Database:
    """The state service's handle on PostgreSQL: a psycopg connection pool.

    The schema is SQLAlchemy's (models + Alembic); the hot path talks to
    psycopg directly in pipeline mode, because every write serializes on
    the index counter and round trips are the ceiling (perf-anchors §4.3).
    """

    def __init__(self, dsn: str, *, pool_size: int = 8) -> None:
        self.dsn = dsn
        self.pool = AsyncConnectionPool(
            dsn, min_size=1, max_size=pool_size, open=False, kwargs={"autocommit": True}
        )
        self._opened = False
        self.on_commit: Callable[[list[pb.ChangeBatch]], None] | None = None

    async def _ensure_open(self) -> None:
        if not self._opened:
            self._opened = True
            await self.pool.open(wait=True, timeout=30)

    async def close(self) -> None:
        if self._opened:
            await self.pool.close()
            self._opened = False

    @contextlib.asynccontextmanager
    async def write(self, count: int = 1) -> AsyncIterator[WriteTx]:
        """An indexed write transaction taking `count` consecutive indexes.

        A single-index transaction that records no change is rolled back,
        counter included: a write that decides there is nothing to do (or
        whose every batched call failed) consumes no index and adds no
        change-log row, and reports the current index as `tx.index` with
        `tx.committed` false. The committed `ChangeBatch`es go to
        `on_commit` (the process's own change feed) straight after COMMIT.
        """
        if count < 1:
            raise ValueError("count must be >= 1")
        await self._ensure_open()
        asked = time.perf_counter()
        async with self.pool.connection() as conn:
            async with conn.pipeline(), conn.transaction():
                cur = await conn.execute(
                    "UPDATE index_counter SET value = value + %s WHERE id = 1 RETURNING value",
                    (count,),
                )
                row = await cur.fetchone()
                assert row is not None, "index_counter row missing: run the migrations"
                locked = time.perf_counter()
                metrics.WRITE_LOCK_WAIT.observe(locked - asked)
                last = int(row[0])
                tx = WriteTx(conn, list(range(last - count + 1, last + 1)))
                yield tx
                if count == 1 and tx.change_count == 0:
                    tx.committed = False
                    tx.index = last - 1  # the newest committed index (we hold its lock)
                    raise psycopg.Rollback()
                await tx._flush()
            metrics.WRITE_HOLD.observe(time.perf_counter() - locked)
        if tx.committed and self.on_commit is not None:
            self.on_commit(tx.batches)

    @contextlib.asynccontextmanager
    async def read(
        self, *, repeatable: bool = False
    ) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
        """A read-only transaction; `repeatable` gives one consistent snapshot
        of every table (REPEATABLE READ)."""
        await self._ensure_open()
        async with self.pool.connection() as conn, conn.transaction(force_rollback=True):
            if repeatable:
                await conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
            yield conn

    @contextlib.asynccontextmanager
    async def transaction(self) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
        """A plain read-write transaction, outside the indexed writes: for
        the snapshot restore only (services/state/backup.py), which takes
        the index counter's lock itself and replaces every table. Its
        change batches go to `on_commit` as `write()`'s do."""
        await self._ensure_open()
        async with self.pool.connection() as conn, conn.transaction():
            yield conn

    async def schema_revision(self) -> str:
        """The Alembic revision the database was migrated to."""
        rows = await self._query("SELECT version_num FROM alembic_version")
        return str(rows[0][0]) if rows else ""

    async def _query(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        await self._ensure_open()
        async with self.pool.connection() as conn:
            cur = await conn.execute(sql, params)
            return await cur.fetchall() if cur.description else []

    async def bookkeeping(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        """One statement outside the indexed writes, committed at once: for
        bookkeeping no reader waits on (a variable lock's lease), never for
        state a write must decide on. No index, no change-log row."""
        return await self._query(sql, params)

    async def get_node(self, node_id: str) -> pb.Node | None:
        """One node straight from the table (no index taken), with its
        secret's hash: for the state's own checks, never for a reader."""
        rows = await self._query("SELECT payload FROM nodes WHERE id = %s", (node_id,))
        return pb.Node.FromString(rows[0][0]) if rows else None

    async def periodic_launches(
        self, namespace: str = "", job_id: str = ""
    ) -> tuple[list[pb.PeriodicLaunch], int]:
        """Recorded launches (one job's with namespace and job_id) and the
        committed index they were read at, in one transaction."""
        async with self.read(repeatable=True) as conn:
            cur = await conn.execute(
                "SELECT payload FROM periodic_launches "
                "WHERE (%s = '' OR (namespace = %s AND job_id = %s)) ORDER BY namespace, job_id",
                (job_id, _ns(namespace), job_id),
            )
            rows = await cur.fetchall()
            cur = await conn.execute("SELECT value FROM index_counter WHERE id = 1")
            at = await cur.fetchone()
        return [pb.PeriodicLaunch.FromString(r[0]) for r in rows], int(at[0]) if at else 0

    async def latest_index(self) -> int:
        rows = await self._query("SELECT value FROM index_counter WHERE id = 1")
        return int(rows[0][0]) if rows else 0

    async def oldest_retained_index(self) -> int:
        """The change log holds every index after this one."""
        rows = await self._query(
            "SELECT coalesce(min(index) - 1, (SELECT value FROM index_counter WHERE id = 1)) "
            "FROM change_log"
        )
        return int(rows[0][0]) if rows and rows[0][0] is not None else 0

    async def read_log(
        self, after: int, limit: int = 1000, *, max_bytes: int = 0
    ) -> list[pb.ChangeBatch]:
        """Up to `limit` change batches after index `after`, in order; with
        `max_bytes`, only as many as fit in that many serialized bytes (at
        least one): a subscriber's page, whatever the batches' size."""
        if not max_bytes:
            rows = await self._query(
                "SELECT payload FROM change_log WHERE index > %s ORDER BY index LIMIT %s",
                (after, limit),
            )
        else:
            rows = await self._query(
                "SELECT payload FROM (SELECT index, payload, octet_length(payload) AS size, "
                "sum(octet_length(payload)) OVER (ORDER BY index) AS upto FROM change_log "
                "WHERE index > %s ORDER BY index LIMIT %s) page "
                "WHERE upto - size < %s ORDER BY index",
                (after, limit, max_bytes),
            )
        return [pb.ChangeBatch.FromString(r[0]) for r in rows]

    async def truncate_log(self, keep: int) -> int:
        """Drop change-log rows older than the newest `keep` indexes."""
        await self._ensure_open()
        async with self.pool.connection() as conn:
            cur = await conn.execute(
                "DELETE FROM change_log WHERE index <= "
                "(SELECT value FROM index_counter WHERE id = 1) - %s",
                (keep,),
            )
            return int(cur.rowcount or 0)

    async def touch_member(self, member_id: str, role: str, address: str, payload: bytes) -> None:
        await self._query(
            "INSERT INTO members (id, role, address, payload, last_seen) "
            "VALUES (%s, %s, %s, %s, now()) ON CONFLICT (id) DO UPDATE SET "
            "role = EXCLUDED.role, address = EXCLUDED.address, payload = EXCLUDED.payload, "
            "last_seen = now()",
            (member_id, role, address, payload),
        )

    async def job_submission(
        self, namespace: str, job_id: str, version: int
    ) -> pb.JobSubmission | None:
        """The stored submission of one job version (read from the
        database: submissions are not part of the replicated state)."""
        rows = await self._query(
            "SELECT payload FROM job_submissions WHERE namespace = %s AND id = %s AND version = %s",
            (_ns(namespace), job_id, version),
        )
        return pb.JobSubmission.FromString(bytes(rows[0][0])) if rows else None

    async def members(self, role: str = "", max_age_s: float = 60.0) -> list[tuple[bytes, float]]:
        """Members seen in the last max_age_s seconds: (payload, age seconds)."""
        rows = await self._query(
            "SELECT payload, extract(epoch FROM now() - last_seen)::float8 FROM members "
            "WHERE last_seen > now() - make_interval(secs => %s) "
            "AND (%s = '' OR role = %s) ORDER BY role, id",
            (max_age_s, role, role),
        )
        return [(bytes(r[0]), float(r[1])) for r in rows]
