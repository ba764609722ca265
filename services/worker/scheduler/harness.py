"""An in-memory planner for scheduler tests (Nomad's `scheduler/tests`
Harness): it holds a `StateStore`, applies submitted plans to it as the plan
applier would (one index per write, a `ChangeBatch` of events), and records
every plan, eval update, created eval and reblock so tests can assert on
them.

Partial commits are simulated by naming nodes to reject: their whole update
set (stops and placements) is dropped, the result carries a refresh index
and a fresh snapshot, so the schedulers' retry paths run for real.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence

from corral import deployments, structs
from corral.store import StateSnapshot, StateStore
from corral.structs import DesiredStatus, Topic
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
        out = [self._alloc_event(a, "AllocationUpdated")]
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
        self.plans.append(structs.copy_msg(plan))
        snap = self.store.snapshot()
        nodes = set(plan.node_update) | set(plan.node_allocation)
        rejecting = self.reject_plans is None or self.reject_plans > 0
        rejected = sorted(n for n in nodes if n in self.reject_nodes) if rejecting else []
        if rejected and self.reject_plans is not None:
            self.reject_plans -= 1

        result = pb.PlanResult()
        result.rejected_nodes.extend(rejected)
        if rejected and plan.all_at_once:
            accepted: set[str] = set()
        else:
            accepted = nodes - set(rejected)

        events: list[pb.Event] = []
        index = self._index + 1
        now = self._time()
        placed: list[pb.Allocation] = []
        for node_id in sorted(accepted):
            for stop in plan.node_update[node_id].stops if node_id in plan.node_update else []:
                cur = snap.alloc_by_id(stop.alloc_id)
                if cur is None:
                    continue
                a = self._apply_stop(cur, stop, index, now)
                result.node_update[node_id].stops.append(stop)
                events.append(self._alloc_event(a, "PlanResult"))
            for new in (
                plan.node_allocation[node_id].allocs if node_id in plan.node_allocation else []
            ):
                a = structs.copy_msg(new)
                cur = snap.alloc_by_id(a.id)
                if cur is None:
                    a.create_index = index
                    a.create_time = now
                    placed.append(a)
                else:
                    a.create_index = cur.create_index
                    a.create_time = cur.create_time
                    # fields the client owns survive a scheduler update
                    if not len(a.task_states):
                        a.task_states.MergeFrom(cur.task_states)
                a.modify_index = index
                a.alloc_modify_index = index
                a.modify_time = now
                if plan.HasField("job"):
                    a.job_version = a.job_version or plan.job.version
                    a.job_modify_index = a.job_modify_index or plan.job.job_modify_index
                result.node_allocation[node_id].allocs.append(a)
                events.append(self._alloc_event(a, "PlanResult"))
        for node_id, lst in plan.node_preemptions.items():
            if node_id not in accepted:
                continue
            for stop in lst.stops:
                cur = snap.alloc_by_id(stop.alloc_id)
                if cur is None or structs.alloc_terminal(cur):
                    continue
                a = self._apply_stop(cur, stop, index, now)
                result.node_preemptions[node_id].stops.append(stop)
                events.append(self._alloc_event(a, "PlanResult"))
        events.extend(self._plan_deployments(plan, snap, index, now, result))
        # chain replacements: the previous alloc learns its successor
        by_id = {e.allocation.id: e.allocation for e in events}
        for a in placed:
            if not a.previous_allocation:
                continue
            prev = by_id.get(a.previous_allocation)
            if prev is None:
                stored = snap.alloc_by_id(a.previous_allocation)
                if stored is None:
                    continue
                prev = structs.copy_msg(stored)
                prev.modify_index = index
                prev.modify_time = now
                events.append(self._alloc_event(prev, "PlanResult"))
                by_id[prev.id] = prev
            prev.next_allocation = a.id
        if events:
            result.alloc_index = self._write(events)
        else:
            result.alloc_index = snap.index
        if rejected:
            result.refresh_index = max(self.store.snapshot().refresh_index(), result.alloc_index)
            self.results.append(result)
            return result, self.store.snapshot()
        self.results.append(result)
        return result, None

    def _plan_deployments(
        self,
        plan: pb.Plan,
        snap: StateSnapshot,
        index: int,
        now: int,
        result: pb.PlanResult,
    ) -> list[pb.Event]:
        """The plan's new deployment and status updates, with placements
        counted on the deployment they join (as the state's plan merge)."""
        changed: dict[str, pb.Deployment] = {}
        if plan.HasField("deployment"):
            d = structs.copy_msg(plan.deployment)
            d.create_index = d.create_index or index
            if snap.deployment_by_id(d.id) is None:
                deployments.start_progress_clock(d, now)
            changed[d.id] = d
            result.deployment.CopyFrom(d)
        for upd in plan.deployment_updates:
            cur = changed.get(upd.deployment_id) or snap.deployment_by_id(upd.deployment_id)
            if cur is None:
                continue
            cur = structs.copy_msg(cur)
            cur.status = upd.status
            cur.status_description = upd.status_description
            changed[cur.id] = cur
            result.deployment_updates.append(upd)
        for lst in result.node_allocation.values():
            for a in lst.allocs:
                old = snap.alloc_by_id(a.id)
                if not a.deployment_id or (
                    old is not None and old.deployment_id == a.deployment_id
                ):
                    continue
                d2 = changed.get(a.deployment_id) or snap.deployment_by_id(a.deployment_id)
                if d2 is None:
                    continue
                d2 = structs.copy_msg(d2)
                deployments.count_placement(d2, a, now)
                changed[d2.id] = d2
        for d in changed.values():
            d.modify_index = index
        return [self._deployment_event(d) for d in changed.values()]

    @staticmethod
    def _alloc_event(a: pb.Allocation, etype: str) -> pb.Event:
        return pb.Event(topic=Topic.ALLOCATION, type=etype, key=a.id, allocation=a)

    @staticmethod
    def _apply_stop(cur: pb.Allocation, stop: pb.AllocStop, index: int, now: int) -> pb.Allocation:
        a = structs.copy_msg(cur)
        a.desired_status = stop.desired_status or DesiredStatus.STOP
        a.desired_description = stop.desired_description
        if stop.client_status and stop.client_status != a.client_status:
            a.client_status = stop.client_status
            a.alloc_states.add(field="client_status", value=stop.client_status, time=now)
        if stop.followup_eval_id:
            a.followup_eval_id = stop.followup_eval_id
        if stop.preempted_by_allocation:
            a.preempted_by_allocation = stop.preempted_by_allocation
        a.modify_index = index
        a.alloc_modify_index = index
        a.modify_time = now
        return a

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
