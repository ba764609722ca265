"""An in-memory planner for scheduler tests (Nomad's `scheduler/tests`
Harness): it holds a `StateStore`, applies submitted plans to it as the plan
applier would (one index per write, a `ChangeBatch` of events) — through the
same `AppliedPlan` conversion and the same merge (`corral.domain.plan_results`) the
planner and the state service use, so scheduler tests see what production
writes — and records every plan, eval update, created eval and reblock so
tests can assert on them.

Partial commits are simulated by naming nodes to reject: their whole update
set (stops and placements) is dropped, the result carries a refresh index
and a fresh snapshot, so the schedulers' retry paths run for real.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from corral.domain import deployments, structs, topics
from corral.domain.plan_commit import applied_plan, committable, new_alloc_ids, stamp_result
from corral.domain.plan_results import merge_on_snapshot, plan_events
from corral.domain.store import StateSnapshot, StateStore
from corral.domain.topics import EventType
from corral.v1 import structs_pb2 as pb
from services.worker.scheduler.factory import new_scheduler

#: why the harness rejects a node's part of a plan (`reject_nodes`)
REJECTED = "rejected by the test"


class Harness:
    """A `Planner` and `CorePlanner` over an in-memory state store."""

    def __init__(self, store: StateStore | None = None, *, now: int | None = None) -> None:
        self.store = store or StateStore()
        self.plans: list[pb.Plan] = []
        self.results: list[pb.PlanResult] = []
        self.evals: list[pb.Evaluation] = []  # update_eval calls
        self.create_evals: list[pb.Evaluation] = []
        self.reblock_evals: list[pb.Evaluation] = []
        self.deleted_evals: list[str] = []
        self.deleted_allocs: list[str] = []
        self.deleted_jobs: list[tuple[str, str]] = []
        self.deleted_nodes: list[str] = []
        self.deleted_deployments: list[str] = []
        #: nodes whose part of any plan is rejected (partial commit)
        self.reject_nodes: set[str] = set()
        #: reject only the next N plans touching reject_nodes (None = always)
        self.reject_plans: int | None = None
        #: pin the clock of the writes (tests of time-based behaviour)
        self.now = now
        self._index = max(self.store.index, 1000)

    # ------------------------------------------------------------ state setup

    def next_index(self) -> int:
        self._index = max(self._index, self.store.index) + 1
        return self._index

    def snapshot(self) -> StateSnapshot:
        return self.store.snapshot()

    def _time(self) -> int:
        return self.now if self.now is not None else structs.now_ns()

    def _write(self, events: Iterable[pb.Event]) -> int:
        index = self.next_index()
        batch = pb.ChangeBatch(index=index, time=self._time())
        for e in events:
            e.index = index
            batch.events.append(e)
        self.store.apply(batch)
        return index

    def _upsert(
        self,
        topic: topics.Topic,
        type_: str,
        objs: Iterable[Any],
        prepare: Callable[[Any, int], None] | None = None,
    ) -> int:
        """Write copies of `objs` at one new index, created there unless
        they carry a create index, modified there."""
        index = self._index + 1
        out = []
        for obj in objs:
            o = structs.copy_msg(obj)
            if not o.create_index:
                o.create_index = index
            o.modify_index = index
            if prepare is not None:
                prepare(o, index)
            out.append(topic.event(o, type_))
        return self._write(out)

    def upsert_nodes(self, *nodes: pb.Node) -> int:
        def prepare(n: pb.Node, _index: int) -> None:
            if not n.computed_class:
                n.computed_class = structs.computed_class(n)

        return self._upsert(topics.NODE, EventType.NODE_REGISTRATION, nodes, prepare)

    def upsert_jobs(self, *jobs: pb.Job, keep_indexes: bool = False) -> int:
        """Register jobs; unless `keep_indexes`, a job's modify and
        job_modify indexes become the write's index, its create index is
        kept, and re-registering bumps the version, as a real registration
        does (older versions stay readable by version)."""
        index = self._index + 1
        out = []
        snap = self.store.snapshot()
        for j in jobs:
            j2 = structs.copy_msg(j)
            if not keep_indexes:
                cur = snap.job_by_id(j2.namespace, j2.id)
                if cur is not None:
                    # every registration is a new version, as in the state store
                    j2.version = max(j2.version, cur.version + 1)
                    j2.create_index = cur.create_index
                if not j2.create_index:
                    j2.create_index = index
                j2.modify_index = index
                j2.job_modify_index = index
            if not j2.submit_time:
                j2.submit_time = self._time()
            out.append(topics.JOB.event(j2, EventType.JOB_REGISTERED))
        return self._write(out)

    def upsert_allocs(self, *allocs: pb.Allocation) -> int:
        now = self._time()

        def prepare(a: pb.Allocation, index: int) -> None:
            a.alloc_modify_index = index
            if not a.create_time:
                a.create_time = now
            if not a.modify_time:
                a.modify_time = now

        return self._upsert(topics.ALLOCATION, EventType.ALLOCATION_UPDATED, allocs, prepare)

    def upsert_evals(self, *evals: pb.Evaluation) -> int:
        return self._upsert(topics.EVALUATION, EventType.EVALUATION_UPDATED, evals)

    def upsert_deployments(self, *deps: pb.Deployment) -> int:
        return self._upsert(topics.DEPLOYMENT, EventType.DEPLOYMENT_STATUS_UPDATE, deps)

    def set_alloc_health(self, alloc_id: str, healthy: bool) -> int:
        """What a client reports when an alloc of a deployment becomes
        healthy or unhealthy, with the deployment's counts following (as
        the state's Node.UpdateAlloc does)."""
        snap = self.store.snapshot()
        a = structs.copy_msg(self.alloc(alloc_id))
        before = deployments.health_of(a)
        a.deployment_status.healthy = healthy
        a.deployment_status.timestamp = self._time()
        index = self._index + 1
        a.modify_index = index
        out = [topics.ALLOCATION.event(a, EventType.ALLOCATION_UPDATED)]
        d = snap.deployment_by_id(a.deployment_id)
        if d is not None:
            d = structs.copy_msg(d)
            if deployments.count_health(d, a.task_group, before, healthy, self._time()):
                d.modify_index = index
                out.append(topics.DEPLOYMENT.event(d, EventType.DEPLOYMENT_STATUS_UPDATE))
        return self._write(out)

    def set_scheduler_config(self, config: pb.SchedulerConfiguration) -> int:
        """Operator scheduler configuration (algorithm, preemption)."""
        c = structs.copy_msg(config)
        return self._write([topics.OPERATOR.event(c, EventType.SCHEDULER_CONFIG)])

    # ------------------------------------------------------------ running schedulers

    def process(
        self, sched_type: str, ev: pb.Evaluation, *, log: logging.Logger | None = None
    ) -> None:
        """Run the scheduler for `sched_type` on `ev` against the current
        state (the eval is written first if it is not stored yet)."""
        if self.store.snapshot().eval_by_id(ev.id) is None:
            self.upsert_evals(ev)
        sched = new_scheduler(sched_type, self.store.snapshot(), self, log=log)
        sched.process(ev)

    # ------------------------------------------------------------ Planner

    def submit_plan(self, plan: pb.Plan) -> tuple[pb.PlanResult, StateSnapshot | None]:
        """Commit `plan` as the planner would: the commit rule decides which
        nodes' parts commit (every node, less `reject_nodes`), and the part
        that does is written as the planner writes it (the same
        `AppliedPlan`, the state's own merge and events), at one new index."""
        self.plans.append(structs.copy_msg(plan))
        snap = self.store.snapshot()
        rejecting = self.reject_plans is None or self.reject_plans > 0
        evaluation = committable(
            snap,
            plan,
            lambda node_id: REJECTED if rejecting and node_id in self.reject_nodes else "",
        )
        if evaluation.partial and self.reject_plans is not None:
            self.reject_plans -= 1
        result = evaluation.result
        if evaluation.is_noop() and not result.node_preemptions:
            result.alloc_index = snap.index
        else:
            result.alloc_index = self._write(self._plan_events(snap, plan, result))
            stamp_result(result, result.alloc_index, new_alloc_ids(snap, result))
        self.results.append(result)
        if result.rejected_nodes:
            result.refresh_index = max(self.store.snapshot().refresh_index(), result.alloc_index)
            return result, self.store.snapshot()
        return result, None

    def _plan_events(
        self, snap: StateSnapshot, plan: pb.Plan, result: pb.PlanResult
    ) -> list[pb.Event]:
        """What committing `result` writes, as the state writes it."""
        index = self._index + 1
        now = self._time()
        write = applied_plan(snap, plan, result, now)
        writes = merge_on_snapshot(
            write, snap, ev=snap.eval_by_id(plan.eval_id), index=index, now=now
        )
        events = plan_events(writes)
        for e in write.evals:  # preemption evals
            e.create_index = e.modify_index = index
            events.append(topics.EVALUATION.event(e, topics.EventType.EVALUATION_UPDATED))
        return events

    def update_eval(self, ev: pb.Evaluation) -> None:
        self.evals.append(structs.copy_msg(ev))
        self._store_eval(ev)

    def create_eval(self, ev: pb.Evaluation) -> None:
        self.create_evals.append(structs.copy_msg(ev))
        self._store_eval(ev)

    def reblock_eval(self, ev: pb.Evaluation) -> None:
        self.reblock_evals.append(structs.copy_msg(ev))
        self._store_eval(ev)

    def _store_eval(self, ev: pb.Evaluation) -> None:
        e = structs.copy_msg(ev)
        cur = self.store.snapshot().eval_by_id(e.id)
        index = self._index + 1
        e.create_index = cur.create_index if cur is not None else index
        e.modify_index = index
        if not e.create_time:
            e.create_time = self._time()
        e.modify_time = self._time()
        self._write([topics.EVALUATION.event(e, EventType.EVALUATION_UPDATED)])

    # ------------------------------------------------------------ CorePlanner

    def _delete(self, *changes: tuple[topics.Topic, str, Iterable[Any]]) -> None:
        """Delete the objects found (a None was not stored), of each
        (topic, event type, objects), at one index."""
        events = [
            topic.event(obj, type_, deleted=True)
            for topic, type_, found in changes
            for obj in found
            if obj is not None
        ]
        if events:
            self._write(events)

    def delete_evals(self, eval_ids: Sequence[str], alloc_ids: Sequence[str]) -> None:
        snap = self.store.snapshot()
        self.deleted_evals.extend(eval_ids)
        self.deleted_allocs.extend(alloc_ids)
        self._delete(
            (topics.EVALUATION, EventType.EVALUATION_DELETED, map(snap.eval_by_id, eval_ids)),
            (topics.ALLOCATION, EventType.ALLOCATION_DELETED, map(snap.alloc_by_id, alloc_ids)),
        )

    def delete_jobs(self, jobs: Sequence[tuple[str, str]]) -> None:
        snap = self.store.snapshot()
        self.deleted_jobs.extend(jobs)
        found = (snap.job_by_id(ns, jid) for ns, jid in jobs)
        self._delete((topics.JOB, EventType.JOB_DEREGISTERED, found))

    def delete_nodes(self, node_ids: Sequence[str]) -> None:
        snap = self.store.snapshot()
        self.deleted_nodes.extend(node_ids)
        found = map(snap.node_by_id, node_ids)
        self._delete((topics.NODE, EventType.NODE_DEREGISTRATION, found))

    def delete_deployments(self, deployment_ids: Sequence[str]) -> None:
        snap = self.store.snapshot()
        self.deleted_deployments.extend(deployment_ids)
        found = map(snap.deployment_by_id, deployment_ids)
        self._delete((topics.DEPLOYMENT, EventType.DEPLOYMENT_DELETED, found))

    # ------------------------------------------------------------ assertions helpers

    def alloc(self, alloc_id: str) -> pb.Allocation:
        a = self.store.snapshot().alloc_by_id(alloc_id)
        assert a is not None, f"alloc {alloc_id} not in state"
        return a

    def node(self, node_id: str) -> pb.Node:
        n = self.store.snapshot().node_by_id(node_id)
        assert n is not None, f"node {node_id} not in state"
        return n

    def job(self, namespace: str, job_id: str) -> pb.Job:
        j = self.store.snapshot().job_by_id(namespace, job_id)
        assert j is not None, f"job {job_id} not in state"
        return j

    def eval(self, eval_id: str) -> pb.Evaluation:
        e = self.store.snapshot().eval_by_id(eval_id)
        assert e is not None, f"eval {eval_id} not in state"
        return e

    def last_plan(self) -> pb.Plan:
        assert self.plans, "no plan was submitted"
        return self.plans[-1]

    def last_eval(self) -> pb.Evaluation:
        assert self.evals, "no eval update"
        return self.evals[-1]
