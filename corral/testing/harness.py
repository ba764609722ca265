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
from collections.abc import Iterable, Sequence

from corral.domain import deployments, structs
from corral.domain.plan_commit import applied_plan, new_alloc_ids, stamp_result
from corral.domain.plan_results import PLAN_RESULT_EVENT, merge_plan
from corral.domain.store import StateSnapshot, StateStore
from corral.domain.structs import Topic
from corral.v1 import structs_pb2 as pb
from services.worker.scheduler.factory import new_scheduler


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

    def upsert_nodes(self, *nodes: pb.Node) -> int:
        index = self._index + 1
        out = []
        for n in nodes:
            n2 = structs.copy_msg(n)
            if not n2.create_index:
                n2.create_index = index
            n2.modify_index = index
            if not n2.computed_class:
                n2.computed_class = structs.computed_class(n2)
            out.append(pb.Event(topic=Topic.NODE, type="NodeRegistration", key=n2.id, node=n2))
        return self._write(out)

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
            out.append(pb.Event(topic=Topic.JOB, type="JobRegistered", key=j2.id, job=j2))
        return self._write(out)

    def upsert_allocs(self, *allocs: pb.Allocation) -> int:
        index = self._index + 1
        out = []
        now = self._time()
        for a in allocs:
            a2 = structs.copy_msg(a)
            if not a2.create_index:
                a2.create_index = index
            a2.modify_index = index
            a2.alloc_modify_index = index
            if not a2.create_time:
                a2.create_time = now
            if not a2.modify_time:
                a2.modify_time = now
            out.append(
                pb.Event(topic=Topic.ALLOCATION, type="AllocationUpdated", key=a2.id, allocation=a2)
            )
        return self._write(out)

    def upsert_evals(self, *evals: pb.Evaluation) -> int:
        index = self._index + 1
        out = []
        for e in evals:
            e2 = structs.copy_msg(e)
            if not e2.create_index:
                e2.create_index = index
            e2.modify_index = index
            out.append(
                pb.Event(topic=Topic.EVALUATION, type="EvaluationUpdated", key=e2.id, evaluation=e2)
            )
        return self._write(out)

    def upsert_deployments(self, *deps: pb.Deployment) -> int:
        index = self._index + 1
        out = []
        for d in deps:
            d2 = structs.copy_msg(d)
            if not d2.create_index:
                d2.create_index = index
            d2.modify_index = index
            out.append(self._deployment_event(d2))
        return self._write(out)

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
        out = [pb.Event(topic=Topic.ALLOCATION, type="AllocationUpdated", key=a.id, allocation=a)]
        d = snap.deployment_by_id(a.deployment_id)
        if d is not None:
            d = structs.copy_msg(d)
            if deployments.count_health(d, a.task_group, before, healthy, self._time()):
                d.modify_index = index
                out.append(self._deployment_event(d))
        return self._write(out)

    @staticmethod
    def _deployment_event(d: pb.Deployment) -> pb.Event:
        return pb.Event(
            topic=Topic.DEPLOYMENT, type="DeploymentStatusUpdate", key=d.id, deployment=d
        )

    def set_scheduler_config(self, config: pb.SchedulerConfiguration) -> int:
        """Operator scheduler configuration (algorithm, preemption)."""
        c = structs.copy_msg(config)
        return self._write(
            [pb.Event(topic=Topic.OPERATOR, type="SchedulerConfig", scheduler_config=c)]
        )

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
        """Commit `plan` as the planner would: decide which nodes' parts
        commit (every node, less `reject_nodes`), build the same
        `AppliedPlan` the planner builds and merge it with the state's own
        merge (`corral.domain.plan_results`), at one new index."""
        self.plans.append(structs.copy_msg(plan))
        snap = self.store.snapshot()
        result = self._committable(snap, plan)
        if not _writes_anything(result):
            result.alloc_index = snap.index
        else:
            result.alloc_index = self._write(self._plan_events(snap, plan, result))
            stamp_result(result, result.alloc_index, new_alloc_ids(snap, result))
        self.results.append(result)
        if result.rejected_nodes:
            result.refresh_index = max(self.store.snapshot().refresh_index(), result.alloc_index)
            return result, self.store.snapshot()
        return result, None

    def _committable(self, snap: StateSnapshot, plan: pb.Plan) -> pb.PlanResult:
        """The part of `plan` the planner would commit: a rejected node
        loses its whole update set, an all-at-once plan everything;
        preemptions of allocs already terminal are left out."""
        nodes = set(plan.node_update) | set(plan.node_allocation)
        rejecting = self.reject_plans is None or self.reject_plans > 0
        rejected = sorted(n for n in nodes if n in self.reject_nodes) if rejecting else []
        if rejected and self.reject_plans is not None:
            self.reject_plans -= 1
        result = pb.PlanResult()
        result.rejected_nodes.extend(rejected)
        if rejected and plan.all_at_once:
            return result
        for node_id in sorted(nodes - set(rejected)):
            if node_id in plan.node_update and plan.node_update[node_id].stops:
                result.node_update[node_id].CopyFrom(plan.node_update[node_id])
            if node_id in plan.node_allocation and plan.node_allocation[node_id].allocs:
                result.node_allocation[node_id].CopyFrom(plan.node_allocation[node_id])
            if node_id in plan.node_preemptions:
                for stop in plan.node_preemptions[node_id].stops:
                    cur = snap.alloc_by_id(stop.alloc_id)
                    if cur is not None and not structs.alloc_terminal(cur):
                        result.node_preemptions[node_id].stops.append(stop)
        if plan.HasField("deployment"):
            result.deployment.CopyFrom(plan.deployment)
            if rejected:  # canaries count only once placed
                placed = {a.id for lst in result.node_allocation.values() for a in lst.allocs}
                for state in result.deployment.task_groups.values():
                    keep = [c for c in state.placed_canaries if c in placed]
                    del state.placed_canaries[:]
                    state.placed_canaries.extend(keep)
        result.deployment_updates.extend(plan.deployment_updates)
        return result

    def _plan_events(
        self, snap: StateSnapshot, plan: pb.Plan, result: pb.PlanResult
    ) -> list[pb.Event]:
        """What committing `result` writes, as the state writes it."""
        index = self._index + 1
        now = self._time()
        write = applied_plan(snap, plan, result, now)
        writes = merge_plan(
            write,
            job=snap.job_by_id(write.namespace, write.job_id) if write.job_id else None,
            alloc=snap.alloc_by_id,
            deployment=snap.deployment_by_id,
            ev=snap.eval_by_id(plan.eval_id),
            index=index,
            now=now,
        )
        events = [
            pb.Event(topic=Topic.ALLOCATION, type=PLAN_RESULT_EVENT, key=a.id, allocation=a)
            for a in writes.allocs.values()
        ]
        events += [
            pb.Event(topic=Topic.DEPLOYMENT, type=PLAN_RESULT_EVENT, key=d.id, deployment=d)
            for d in writes.deployments.values()
        ]
        if writes.eval is not None:
            e = writes.eval
            events.append(
                pb.Event(topic=Topic.EVALUATION, type=PLAN_RESULT_EVENT, key=e.id, evaluation=e)
            )
        for e in write.evals:  # preemption evals
            e.create_index = e.modify_index = index
            events.append(
                pb.Event(topic=Topic.EVALUATION, type="EvaluationUpdated", key=e.id, evaluation=e)
            )
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
        self._write(
            [pb.Event(topic=Topic.EVALUATION, type="EvaluationUpdated", key=e.id, evaluation=e)]
        )

    # ------------------------------------------------------------ CorePlanner

    def delete_evals(self, eval_ids: Sequence[str], alloc_ids: Sequence[str]) -> None:
        snap = self.store.snapshot()
        events = []
        for eid in eval_ids:
            e = snap.eval_by_id(eid)
            if e is not None:
                events.append(
                    pb.Event(
                        topic=Topic.EVALUATION,
                        type="EvaluationDeleted",
                        key=eid,
                        deleted=True,
                        evaluation=e,
                    )
                )
        for aid in alloc_ids:
            a = snap.alloc_by_id(aid)
            if a is not None:
                events.append(
                    pb.Event(
                        topic=Topic.ALLOCATION,
                        type="AllocationDeleted",
                        key=aid,
                        deleted=True,
                        allocation=a,
                    )
                )
        self.deleted_evals.extend(eval_ids)
        self.deleted_allocs.extend(alloc_ids)
        if events:
            self._write(events)

    def delete_jobs(self, jobs: Sequence[tuple[str, str]]) -> None:
        snap = self.store.snapshot()
        events = []
        for ns, jid in jobs:
            j = snap.job_by_id(ns, jid)
            if j is not None:
                events.append(
                    pb.Event(topic=Topic.JOB, type="JobDeregistered", key=jid, deleted=True, job=j)
                )
        self.deleted_jobs.extend(jobs)
        if events:
            self._write(events)

    def delete_nodes(self, node_ids: Sequence[str]) -> None:
        snap = self.store.snapshot()
        events = []
        for nid in node_ids:
            n = snap.node_by_id(nid)
            if n is not None:
                events.append(
                    pb.Event(
                        topic=Topic.NODE, type="NodeDeregistration", key=nid, deleted=True, node=n
                    )
                )
        self.deleted_nodes.extend(node_ids)
        if events:
            self._write(events)

    def delete_deployments(self, deployment_ids: Sequence[str]) -> None:
        snap = self.store.snapshot()
        events = []
        for did in deployment_ids:
            d = snap.deployment_by_id(did)
            if d is not None:
                events.append(pb.Event(topic=Topic.DEPLOYMENT, key=did, deleted=True, deployment=d))
        self.deleted_deployments.extend(deployment_ids)
        if events:
            self._write(events)

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


def _writes_anything(result: pb.PlanResult) -> bool:
    """A result with nothing to commit is answered without a write."""
    return bool(
        result.node_update
        or result.node_allocation
        or result.node_preemptions
        or result.HasField("deployment")
        or result.deployment_updates
    )
