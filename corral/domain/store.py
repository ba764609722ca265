"""The in-memory state: an immutable `StateSnapshot` and the `StateStore` that
applies change batches to produce the next one.

This plays the part of Nomad's go-memdb state store on a follower. Every map
is a persistent HAMT (`immutables.Map`), so taking a snapshot is O(1) and a
scheduler can read one for as long as it likes while the store moves on.
The same classes back the replica (fed by `State.Subscribe`), the state
service's public reads and the scheduler's in-memory test harness.

Stored messages are shared between snapshots: callers must treat every
message they get from a snapshot as read-only and copy before changing it.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any

from immutables import Map

from corral.domain import regexp, topics
from corral.domain.structs import DEFAULT_NAMESPACE, DEFAULT_NODE_POOL, node_ready
from corral.domain.topics import EventType
from corral.v1 import structs_pb2 as pb

JobKey = tuple[str, str]
#: (namespace, registration id), as Nomad keys service registrations
ServiceKey = tuple[str, str]
#: (datacenter, node pool) of the ready-node index; a None datacenter stands
#: for every one, so a node is under two keys
ReadyKey = tuple[str | None, str]

_EMPTY: Map[Any, Any] = Map()


def _jk(namespace: str, job_id: str) -> JobKey:
    return (namespace or DEFAULT_NAMESPACE, job_id)


@dataclass(frozen=True, slots=True)
class StateSnapshot:
    """All objects at one index. Immutable; O(1) to take."""

    index: int = 0
    jobs: Map[JobKey, pb.Job] = _EMPTY  # current version
    job_versions: Map[JobKey, Map[int, pb.Job]] = _EMPTY
    job_summaries: Map[JobKey, pb.JobSummary] = _EMPTY
    nodes: Map[str, pb.Node] = _EMPTY
    allocs: Map[str, pb.Allocation] = _EMPTY
    evals: Map[str, pb.Evaluation] = _EMPTY
    deployments: Map[str, pb.Deployment] = _EMPTY
    scheduler_config: pb.SchedulerConfiguration = field(default_factory=pb.SchedulerConfiguration)
    namespaces: Map[str, pb.Namespace] = _EMPTY
    node_pools: Map[str, pb.NodePool] = _EMPTY
    scaling_policies: Map[str, pb.ScalingPolicy] = _EMPTY
    scaling_events: Map[JobKey, pb.JobScalingEvents] = _EMPTY
    table_indexes: Map[str, int] = _EMPTY  # table -> last index that wrote it
    # secondary indexes
    allocs_by_job_map: Map[JobKey, Map[str, pb.Allocation]] = _EMPTY
    allocs_by_node_map: Map[str, Map[str, pb.Allocation]] = _EMPTY
    allocs_by_eval_map: Map[str, Map[str, pb.Allocation]] = _EMPTY
    nodes_by_dc_map: Map[str, Map[str, pb.Node]] = _EMPTY
    #: the scheduling-ready nodes (`structs.node_ready`) and the others, by
    #: (datacenter or None for every one, pool) (`ready_keys`): what each
    #: eval asks, kept up to date by each node write instead of found by a
    #: walk of every node per eval (issue 30)
    ready_nodes_map: Map[ReadyKey, Map[str, pb.Node]] = _EMPTY
    not_ready_nodes_map: Map[ReadyKey, Map[str, pb.Node]] = _EMPTY
    evals_by_job_map: Map[JobKey, Map[str, pb.Evaluation]] = _EMPTY
    deployments_by_job_map: Map[JobKey, Map[str, pb.Deployment]] = _EMPTY
    # service registrations (Nomad's native service discovery) and their
    # indexes: by (namespace, service name), by alloc, by job, by node
    services: Map[ServiceKey, pb.ServiceRegistration] = _EMPTY
    services_by_name_map: Map[tuple[str, str], Map[ServiceKey, pb.ServiceRegistration]] = _EMPTY
    services_by_alloc_map: Map[str, Map[ServiceKey, pb.ServiceRegistration]] = _EMPTY
    services_by_job_map: Map[JobKey, Map[ServiceKey, pb.ServiceRegistration]] = _EMPTY
    services_by_node_map: Map[str, Map[ServiceKey, pb.ServiceRegistration]] = _EMPTY
    scaling_policies_by_job_map: Map[JobKey, Map[str, pb.ScalingPolicy]] = _EMPTY

    # ------------------------------------------------------------ jobs

    def job_by_id(self, namespace: str, job_id: str) -> pb.Job | None:
        job: pb.Job | None = self.jobs.get(_jk(namespace, job_id))
        return job

    def job_by_version(self, namespace: str, job_id: str, version: int) -> pb.Job | None:
        versions = self.job_versions.get(_jk(namespace, job_id))
        if versions is None:
            return None
        job: pb.Job | None = versions.get(version)
        return job

    def job_versions_of(self, namespace: str, job_id: str) -> list[pb.Job]:
        """Every stored version, newest first."""
        versions = self.job_versions.get(_jk(namespace, job_id))
        if versions is None:
            return []
        return [versions[v] for v in sorted(versions.keys(), reverse=True)]

    def iter_jobs(self) -> Iterator[pb.Job]:
        return iter(self.jobs.values())

    def job_summary(self, namespace: str, job_id: str) -> pb.JobSummary | None:
        s: pb.JobSummary | None = self.job_summaries.get(_jk(namespace, job_id))
        return s

    # ------------------------------------------------------------ nodes

    def node_by_id(self, node_id: str) -> pb.Node | None:
        node: pb.Node | None = self.nodes.get(node_id)
        return node

    def iter_nodes(self) -> Iterator[pb.Node]:
        return iter(self.nodes.values())

    def nodes_in_datacenters(self, datacenters: Iterable[str]) -> list[pb.Node]:
        """Nodes of the given datacenters; a name may be a `*` glob as in
        Nomad 1.5+ (`"*"` or no names at all = every datacenter). Plain names
        use the datacenter index; only globs scan the nodes."""
        dcs = list(datacenters)
        if not dcs or "*" in dcs:
            return list(self.nodes.values())
        plain = [d for d in dcs if "*" not in d]
        # RE2: a job's `*a*a*a...` over a long name is linear, not exponential
        globs = [regexp.glob(d) for d in dcs if "*" in d]
        out: list[pb.Node] = []
        for dc in dict.fromkeys(plain):
            m = self.nodes_by_dc_map.get(dc)
            if m is not None:
                out.extend(m.values())
        if globs:
            named = set(plain)
            out.extend(
                n
                for n in self.nodes.values()
                if n.datacenter not in named and any(g.match(n.datacenter) for g in globs)
            )
        return out

    def ready_nodes(self, datacenter: str | None, pool: str) -> Map[str, pb.Node]:
        """The scheduling-ready nodes of one datacenter (None: every one)
        and node pool, by id. A map iterates in the order of its keys'
        hashes, so these come in the order a walk of `nodes` filtered to
        them would give."""
        m: Map[str, pb.Node] = self.ready_nodes_map.get((datacenter, pool), _EMPTY)
        return m

    def not_ready_nodes(self, datacenter: str | None, pool: str) -> Map[str, pb.Node]:
        """The nodes of one datacenter (None: every one) and pool that are not
        scheduling-ready: down, disconnected, initializing, draining or
        ineligible."""
        m: Map[str, pb.Node] = self.not_ready_nodes_map.get((datacenter, pool), _EMPTY)
        return m

    def ready_counts_by_dc(self, pool: str) -> dict[str, int]:
        """Ready nodes per datacenter that has any, in one pool."""
        return {
            dc: len(m)
            for (dc, p), m in self.ready_nodes_map.items()
            if dc is not None and p == pool and len(m)
        }

    # ------------------------------------------------------------ allocs

    def alloc_by_id(self, alloc_id: str) -> pb.Allocation | None:
        a: pb.Allocation | None = self.allocs.get(alloc_id)
        return a

    def allocs_by_job(self, namespace: str, job_id: str) -> list[pb.Allocation]:
        m = self.allocs_by_job_map.get(_jk(namespace, job_id))
        return list(m.values()) if m is not None else []

    def allocs_by_node(self, node_id: str) -> list[pb.Allocation]:
        m = self.allocs_by_node_map.get(node_id)
        return list(m.values()) if m is not None else []

    def allocs_by_eval(self, eval_id: str) -> list[pb.Allocation]:
        m = self.allocs_by_eval_map.get(eval_id)
        return list(m.values()) if m is not None else []

    # ------------------------------------------------------------ evals

    def eval_by_id(self, eval_id: str) -> pb.Evaluation | None:
        e: pb.Evaluation | None = self.evals.get(eval_id)
        return e

    def evals_by_job(self, namespace: str, job_id: str) -> list[pb.Evaluation]:
        m = self.evals_by_job_map.get(_jk(namespace, job_id))
        return list(m.values()) if m is not None else []

    # ------------------------------------------------------------ deployments

    def deployment_by_id(self, deployment_id: str) -> pb.Deployment | None:
        d: pb.Deployment | None = self.deployments.get(deployment_id)
        return d

    def deployments_by_job(self, namespace: str, job_id: str) -> list[pb.Deployment]:
        m = self.deployments_by_job_map.get(_jk(namespace, job_id))
        return list(m.values()) if m is not None else []

    def latest_deployment_by_job(self, namespace: str, job_id: str) -> pb.Deployment | None:
        best: pb.Deployment | None = None
        for d in self.deployments_by_job(namespace, job_id):
            if best is None or d.create_index > best.create_index:
                best = d
        return best

    # ------------------------------------------------------------ services

    def service_registration(self, namespace: str, reg_id: str) -> pb.ServiceRegistration | None:
        reg: pb.ServiceRegistration | None = self.services.get(_jk(namespace, reg_id))
        return reg

    def service_registrations(self, namespace: str | None = None) -> list[pb.ServiceRegistration]:
        """Every registration, or those of one namespace."""
        if namespace is None:
            return list(self.services.values())
        ns = namespace or DEFAULT_NAMESPACE
        return [r for (rns, _), r in self.services.items() if rns == ns]

    def services_by_name(self, namespace: str, name: str) -> list[pb.ServiceRegistration]:
        m = self.services_by_name_map.get(_jk(namespace, name))
        return list(m.values()) if m is not None else []

    def services_by_alloc(self, alloc_id: str) -> list[pb.ServiceRegistration]:
        m = self.services_by_alloc_map.get(alloc_id)
        return list(m.values()) if m is not None else []

    def services_by_job(self, namespace: str, job_id: str) -> list[pb.ServiceRegistration]:
        m = self.services_by_job_map.get(_jk(namespace, job_id))
        return list(m.values()) if m is not None else []

    def services_by_node(self, node_id: str) -> list[pb.ServiceRegistration]:
        m = self.services_by_node_map.get(node_id)
        return list(m.values()) if m is not None else []

    # ------------------------------------------------------------ namespaces, node pools

    def namespace_by_name(self, name: str) -> pb.Namespace | None:
        ns: pb.Namespace | None = self.namespaces.get(name or DEFAULT_NAMESPACE)
        return ns

    def node_pool_by_name(self, name: str) -> pb.NodePool | None:
        pool: pb.NodePool | None = self.node_pools.get(name)
        return pool

    # ------------------------------------------------------------ scaling

    def scaling_policy_by_id(self, policy_id: str) -> pb.ScalingPolicy | None:
        p: pb.ScalingPolicy | None = self.scaling_policies.get(policy_id)
        return p

    def scaling_policies_by_job(self, namespace: str, job_id: str) -> list[pb.ScalingPolicy]:
        m = self.scaling_policies_by_job_map.get(_jk(namespace, job_id))
        return list(m.values()) if m is not None else []

    def scaling_events_by_job(self, namespace: str, job_id: str) -> pb.JobScalingEvents | None:
        e: pb.JobScalingEvents | None = self.scaling_events.get(_jk(namespace, job_id))
        return e

    # ------------------------------------------------------------ indexes

    def table_index(self, table: str) -> int:
        i: int = self.table_indexes.get(table, 0)
        return i

    def refresh_index(self) -> int:
        """What a worker must wait for after a partial plan: the newest
        change to nodes or allocs (Nomad's RefreshIndex)."""
        return max(self.table_index("nodes"), self.table_index("allocs"))


def _set_nested(outer: Map[Any, Any], key: Any, inner_key: Any, value: Any) -> Map[Any, Any]:
    inner = outer.get(key, _EMPTY)
    return outer.set(key, inner.set(inner_key, value))


class _NestedChanges:
    """Changes to one two-level index (outer key -> inner key -> object)
    gathered over a change batch and applied with one mutation per touched
    inner map: a 10,000-alloc plan would otherwise copy the path to the job's
    and the eval's inner maps 10,000 times, once per alloc."""

    __slots__ = ("changes",)

    def __init__(self) -> None:
        self.changes: dict[Any, dict[Any, Any]] = {}

    def set(self, key: Any, inner_key: Any, value: Any) -> None:
        self.changes.setdefault(key, {})[inner_key] = value

    def delete(self, key: Any, inner_key: Any) -> None:
        self.changes.setdefault(key, {})[inner_key] = None

    def apply(self, outer: Map[Any, Any]) -> Map[Any, Any]:
        if not self.changes:
            return outer
        om = outer.mutate()
        for key, items in self.changes.items():
            im = om.get(key, _EMPTY).mutate()
            for inner_key, value in items.items():
                if value is None:
                    if inner_key in im:
                        del im[inner_key]
                else:
                    im[inner_key] = value
            inner = im.finish()
            if len(inner):
                om[key] = inner
            elif key in om:
                del om[key]
        return om.finish()


def lean_batch(batch: pb.ChangeBatch) -> pb.ChangeBatch:
    """The batch with its allocs' placement metrics left out.

    Metrics (nodes evaluated, filtered, scores of the top nodes) are three
    quarters of a scheduled alloc's bytes, and only a user reading one alloc
    (`alloc status -verbose`, served by the state service) ever looks at
    them; a replica's schedulers, planner and broker never do. Clearing a
    field does not give back its memory (a parsed batch is one upb arena,
    alive as long as any message taken out of it), so the lean batch is
    parsed again, into one new arena: one arena per batch, not per message,
    because a message with an arena of its own costs about a kilobyte more.
    Clears the field on `batch` itself (it is the caller's; its listeners
    see the lean allocs too)."""
    cleared = False
    for ev in batch.events:
        if ev.HasField("allocation") and ev.allocation.HasField("metrics"):
            ev.allocation.ClearField("metrics")
            cleared = True
    return pb.ChangeBatch.FromString(batch.SerializeToString()) if cleared else batch


class StateStore:
    """Mutable holder of the current snapshot; applies change batches.

    Not thread-safe: one writer (the feed) at a time; readers take
    `snapshot()` and keep it as long as they like. A `lean` store (a
    replica's) keeps allocs without their placement metrics (`lean_batch`).
    """

    def __init__(self, snapshot: StateSnapshot | None = None, *, lean: bool = False) -> None:
        self._snap = snapshot or StateSnapshot()
        self.lean = lean

    @property
    def index(self) -> int:
        return self._snap.index

    def snapshot(self) -> StateSnapshot:
        return self._snap

    def reset(self, snapshot: StateSnapshot) -> None:
        self._snap = snapshot

    # ------------------------------------------------------------ bootstrap

    @staticmethod
    def build(
        index: int,
        *,
        jobs: Iterable[pb.Job] = (),
        job_versions: Iterable[pb.Job] = (),
        nodes: Iterable[pb.Node] = (),
        allocs: Iterable[pb.Allocation] = (),
        evals: Iterable[pb.Evaluation] = (),
        deployments: Iterable[pb.Deployment] = (),
        job_summaries: Iterable[pb.JobSummary] = (),
        scheduler_config: pb.SchedulerConfiguration | None = None,
        namespaces: Iterable[pb.Namespace] = (),
        node_pools: Iterable[pb.NodePool] = (),
        scaling_policies: Iterable[pb.ScalingPolicy] = (),
        scaling_events: Iterable[pb.JobScalingEvents] = (),
        table_indexes: dict[str, int] | None = None,
        lean: bool = False,
        service_registrations: Iterable[pb.ServiceRegistration] = (),
    ) -> StateSnapshot:
        """A snapshot from whole tables (a State.Snapshot stream, or a test)."""
        store = StateStore(lean=lean)
        batch = pb.ChangeBatch(index=index)
        contents: list[tuple[topics.Topic, str, Iterable[Any]]] = [
            (topics.JOB, EventType.JOB_VERSION, job_versions),
            (topics.JOB, EventType.JOB_REGISTERED, jobs),
            (topics.NODE, EventType.NODE_REGISTRATION, nodes),
            (topics.ALLOCATION, EventType.ALLOCATION_UPDATED, allocs),
            (topics.EVALUATION, EventType.EVALUATION_UPDATED, evals),
            (topics.DEPLOYMENT, EventType.DEPLOYMENT_STATUS_UPDATE, deployments),
            (topics.JOB_SUMMARY, EventType.JOB_SUMMARY, job_summaries),
            (
                topics.OPERATOR,
                EventType.SCHEDULER_CONFIG,
                [scheduler_config] if scheduler_config is not None else [],
            ),
            (topics.NAMESPACE, EventType.NAMESPACE_UPSERTED, namespaces),
            (topics.NODE_POOL, EventType.NODE_POOL_UPSERTED, node_pools),
            (topics.SCALING_POLICY, EventType.SCALING_POLICY_UPSERTED, scaling_policies),
            (topics.SCALING_EVENT, EventType.SCALING_EVENT_RECORDED, scaling_events),
            (topics.SERVICE, EventType.SERVICE_REGISTRATION, service_registrations),
        ]
        for topic, type_, objs in contents:
            for obj in objs:
                batch.events.add(topic=topic.name, type=type_, **{topic.payload: obj})
        store.apply(batch, stamp_tables=False)
        snap = store.snapshot()
        tables = Map(table_indexes or {})
        return replace(snap, index=index, table_indexes=tables)

    # ------------------------------------------------------------ apply

    def apply(self, batch: pb.ChangeBatch, *, stamp_tables: bool = True) -> StateSnapshot:
        """Apply one transaction's events and return the new snapshot.

        Events are applied in order; a batch whose index is not newer than
        the store's is ignored (the feed may redeliver after a reconnect).
        """
        s = self._snap
        if stamp_tables and batch.index and batch.index <= s.index:
            return s
        if self.lean:
            batch = lean_batch(batch)
        jobs = s.jobs.mutate()
        job_versions = s.job_versions
        summaries = s.job_summaries.mutate()
        nodes = s.nodes.mutate()
        allocs = s.allocs.mutate()
        evals = s.evals.mutate()
        deployments = s.deployments.mutate()
        sched_config = s.scheduler_config
        namespaces = s.namespaces
        node_pools = s.node_pools
        policies = s.scaling_policies
        scaling_events = s.scaling_events
        policies_by_job = _NestedChanges()
        by_job = _NestedChanges()
        by_node = _NestedChanges()
        by_eval = _NestedChanges()
        by_dc = _NestedChanges()
        ready = _NestedChanges()
        not_ready = _NestedChanges()
        evals_by_job = _NestedChanges()
        deps_by_job = _NestedChanges()
        services = s.services.mutate()
        svc_by_name = _NestedChanges()
        svc_by_alloc = _NestedChanges()
        svc_by_job = _NestedChanges()
        svc_by_node = _NestedChanges()
        touched: set[str] = set()

        for ev in batch.events:
            kind = topics.of(ev)
            touched.add(ev.topic)
            if kind is topics.JOB:
                job = ev.job
                key = _jk(job.namespace, job.id)
                if ev.deleted:
                    if key in jobs:
                        del jobs[key]
                    if key in job_versions:
                        job_versions = job_versions.delete(key)
                    continue
                job_versions = _set_nested(job_versions, key, job.version, job)
                cur = jobs.get(key)
                same_job = cur is not None and cur.create_index == job.create_index
                if ev.type == EventType.JOB_VERSION:
                    # a stored version rewritten (its stability, its tag):
                    # the job too when it is the current version
                    current = same_job and cur is not None and cur.version == job.version
                else:
                    current = cur is None or cur.version <= job.version or not same_job
                if current:
                    jobs[key] = job
            elif kind is topics.ALLOCATION:
                a = ev.allocation
                jkey = _jk(a.namespace, a.job_id)
                old = allocs.get(a.id)
                if old is not None:
                    # an update can move the alloc to a newer eval
                    if ev.deleted or old.eval_id != a.eval_id:
                        by_eval.delete(old.eval_id, old.id)
                    if ev.deleted or old.node_id != a.node_id:
                        by_node.delete(old.node_id, old.id)
                    ojkey = _jk(old.namespace, old.job_id)
                    if ev.deleted or ojkey != jkey:
                        by_job.delete(ojkey, old.id)
                if ev.deleted:
                    if old is not None:
                        del allocs[a.id]
                    continue
                allocs[a.id] = a
                by_job.set(jkey, a.id, a)
                by_node.set(a.node_id, a.id, a)
                by_eval.set(a.eval_id, a.id, a)
            elif kind is topics.EVALUATION or kind is topics.DEPLOYMENT:
                # kept by id, indexed by job
                if kind is topics.EVALUATION:
                    o: Any = ev.evaluation
                    by_id: Any = evals
                    by_job_of = evals_by_job
                else:
                    o = ev.deployment
                    by_id = deployments
                    by_job_of = deps_by_job
                jkey = _jk(o.namespace, o.job_id)
                if ev.deleted:
                    if o.id in by_id:
                        del by_id[o.id]
                        by_job_of.delete(jkey, o.id)
                    continue
                by_id[o.id] = o
                by_job_of.set(jkey, o.id, o)
            elif kind is topics.NODE:
                n = ev.node
                old_node = nodes.get(n.id)
                into = ready if not ev.deleted and node_ready(n) else not_ready
                keys = ready_keys(n) if not ev.deleted else ()
                if old_node is not None:
                    if ev.deleted or old_node.datacenter != n.datacenter:
                        by_dc.delete(old_node.datacenter, n.id)
                    was = ready if node_ready(old_node) else not_ready
                    old_keys = ready_keys(old_node)
                    # the common write (a client's alloc update) keeps the
                    # node where it was: the sets below replace it there
                    if was is not into or old_keys != keys:
                        for rk in old_keys:
                            was.delete(rk, n.id)
                if ev.deleted:
                    if n.id in nodes:
                        del nodes[n.id]
                    continue
                nodes[n.id] = n
                by_dc.set(n.datacenter, n.id, n)
                for rk in keys:
                    into.set(rk, n.id, n)
            elif kind is topics.JOB_SUMMARY:
                js = ev.job_summary
                key = _jk(js.namespace, js.job_id)
                if ev.deleted:
                    if key in summaries:
                        del summaries[key]
                    continue
                summaries[key] = js
            elif kind is topics.OPERATOR:
                sched_config = ev.scheduler_config
            elif kind is topics.SERVICE:
                r = ev.service_registration
                skey = _jk(r.namespace, r.id)
                prev = services.get(skey)
                if prev is not None:
                    svc_by_name.delete(_jk(prev.namespace, prev.service_name), skey)
                    svc_by_alloc.delete(prev.alloc_id, skey)
                    svc_by_job.delete(_jk(prev.namespace, prev.job_id), skey)
                    svc_by_node.delete(prev.node_id, skey)
                if ev.deleted:
                    if prev is not None:
                        del services[skey]
                    continue
                services[skey] = r
                svc_by_name.set(_jk(r.namespace, r.service_name), skey, r)
                svc_by_alloc.set(r.alloc_id, skey, r)
                svc_by_job.set(_jk(r.namespace, r.job_id), skey, r)
                svc_by_node.set(r.node_id, skey, r)
            elif kind is not None:
                namespaces, node_pools, policies, scaling_events = _apply_object(
                    ev, kind, namespaces, node_pools, policies, scaling_events, policies_by_job
                )

        table_indexes = s.table_indexes
        if stamp_tables and batch.index:
            tm = table_indexes.mutate()
            for topic in touched:
                table = topics.index_of(topic)
                if table:
                    tm[table] = batch.index
            table_indexes = tm.finish()

        self._snap = StateSnapshot(
            index=max(s.index, batch.index),
            jobs=jobs.finish(),
            job_versions=job_versions,
            job_summaries=summaries.finish(),
            nodes=nodes.finish(),
            allocs=allocs.finish(),
            evals=evals.finish(),
            deployments=deployments.finish(),
            scheduler_config=sched_config,
            namespaces=namespaces,
            node_pools=node_pools,
            scaling_policies=policies,
            scaling_events=scaling_events,
            table_indexes=table_indexes,
            allocs_by_job_map=by_job.apply(s.allocs_by_job_map),
            allocs_by_node_map=by_node.apply(s.allocs_by_node_map),
            allocs_by_eval_map=by_eval.apply(s.allocs_by_eval_map),
            nodes_by_dc_map=by_dc.apply(s.nodes_by_dc_map),
            ready_nodes_map=ready.apply(s.ready_nodes_map),
            not_ready_nodes_map=not_ready.apply(s.not_ready_nodes_map),
            evals_by_job_map=evals_by_job.apply(s.evals_by_job_map),
            deployments_by_job_map=deps_by_job.apply(s.deployments_by_job_map),
            services=services.finish(),
            services_by_name_map=svc_by_name.apply(s.services_by_name_map),
            services_by_alloc_map=svc_by_alloc.apply(s.services_by_alloc_map),
            services_by_job_map=svc_by_job.apply(s.services_by_job_map),
            services_by_node_map=svc_by_node.apply(s.services_by_node_map),
            scaling_policies_by_job_map=policies_by_job.apply(s.scaling_policies_by_job_map),
        )
        return self._snap


def ready_keys(node: pb.Node) -> tuple[ReadyKey, ...]:
    """The ready-node index's keys a node is under: its datacenter and pool
    (a node without one is in the default pool), and every datacenter with
    its pool. Not "every pool" (`all`, rare): each key costs every node
    write a map update in every replica, so that question walks the nodes."""
    pool = node.node_pool or DEFAULT_NODE_POOL
    return ((node.datacenter, pool), (None, pool))


def _put(m: Map[Any, Any], key: Any, value: Any, deleted: bool) -> Map[Any, Any]:
    if deleted:
        return m.delete(key) if key in m else m
    return m.set(key, value)


def _apply_object(
    ev: pb.Event,
    kind: topics.Topic,
    namespaces: Map[str, pb.Namespace],
    node_pools: Map[str, pb.NodePool],
    policies: Map[str, pb.ScalingPolicy],
    scaling_events: Map[JobKey, pb.JobScalingEvents],
    policies_by_job: _NestedChanges,
) -> tuple[
    Map[str, pb.Namespace],
    Map[str, pb.NodePool],
    Map[str, pb.ScalingPolicy],
    Map[JobKey, pb.JobScalingEvents],
]:
    """The rarely written objects (namespaces, node pools, scaling policies
    and events): one immutable-map update each, no batch-wide mutation."""
    if kind is topics.NAMESPACE:
        namespaces = _put(namespaces, ev.namespace_object.name, ev.namespace_object, ev.deleted)
    elif kind is topics.NODE_POOL:
        node_pools = _put(node_pools, ev.node_pool.name, ev.node_pool, ev.deleted)
    elif kind is topics.SCALING_POLICY:
        p = ev.scaling_policy
        policies = _put(policies, p.id, p, ev.deleted)
        jkey = _jk(p.target.get("Namespace", ""), p.target.get("Job", ""))
        if ev.deleted:
            policies_by_job.delete(jkey, p.id)
        else:
            policies_by_job.set(jkey, p.id, p)
    elif kind is topics.SCALING_EVENT:
        se = ev.job_scaling_events
        scaling_events = _put(scaling_events, _jk(se.namespace, se.job_id), se, ev.deleted)
    return namespaces, node_pools, policies, scaling_events
