"""The system and sysbatch schedulers (Nomad's `scheduler_system.go` and
`reconciler/reconcile_node.go`): one alloc per task group on every feasible
node of the job's datacenters.

Nodes that fail the job's constraints are skipped silently; a feasible node
without room produces a blocked eval for that node. Sysbatch allocs that ran
successfully are not run again for the same job version. Destructive updates
roll `max_parallel` at a time, the rest continuing after `stagger` in a
`rolling-update` eval.
"""

from __future__ import annotations

from corral.domain import structs
from corral.domain.structs import (
    ClientStatus,
    EvalStatus,
    Trigger,
)
from corral.v1 import structs_pb2 as pb
from services.worker.scheduler import annotate, limits, util
from services.worker.scheduler.eval_scheduler import EvalScheduler
from services.worker.scheduler.placement import Placer
from services.worker.scheduler.reconcile.allocs import disconnect_timeout
from services.worker.scheduler.reconcile.node import AllocTuple, diff_system_allocs

MAX_SYSTEM_ATTEMPTS = 5
MAX_SYSBATCH_ATTEMPTS = 2

_SYSTEM_TRIGGERS = frozenset(
    (
        Trigger.JOB_REGISTER,
        Trigger.NODE_UPDATE,
        Trigger.FAILED_FOLLOW_UP,
        Trigger.JOB_DEREGISTER,
        Trigger.ROLLING_UPDATE,
        Trigger.PREEMPTION,
        Trigger.DEPLOYMENT_WATCHER,
        Trigger.NODE_DRAIN,
        Trigger.ALLOC_STOP,
        Trigger.QUEUED_ALLOCS,
        Trigger.JOB_SCALING,
        Trigger.RECONNECT,
        Trigger.MAX_DISCONNECT_TIMEOUT,
    )
)


class SystemScheduler(EvalScheduler):
    """Schedules one system or sysbatch evaluation."""

    max_attempts = MAX_SYSTEM_ATTEMPTS
    batch_attempts = MAX_SYSBATCH_ATTEMPTS

    def _start(self) -> None:
        self.nodes: list[pb.Node] = []
        self.nodes_by_dc: dict[str, int] = {}
        self.not_ready: set[str] = set()
        self.limit_reached = False
        self.rolling_eval: pb.Evaluation | None = None
        self.blocked: list[pb.Evaluation] = []

    @property
    def sysbatch(self) -> bool:
        """The sysbatch variant (the base's batch variant)."""
        return self.batch

    def _can_handle(self, trigger: str) -> bool:
        if trigger in _SYSTEM_TRIGGERS:
            return True
        return self.sysbatch and trigger == Trigger.PERIODIC_JOB

    def _set_status(self, status: str, desc: str) -> None:
        util.set_status(
            self.log,
            self.planner,
            self.eval,
            status=status,
            desc=desc,
            next_eval=self.next_eval,
            failed_tg_allocs=self.failed_tg_allocs,
            queued=self.queued,
        )

    def process(self, ev: pb.Evaluation) -> None:
        if self._run(ev):
            self._set_status(EvalStatus.COMPLETE, "")

    def _over_limit(self) -> str:
        """Why this eval would materialise too many placements (the job's
        allocs per node times the ready nodes it may run on), or ''."""
        job = self.snap.job_by_id(self.eval.namespace, self.eval.job_id)
        if job is None or util.job_stopped(job):
            return ""
        per_node = limits.desired_count(job.task_groups)
        if per_node <= self.max_placements:
            nodes, _, _ = util.ready_nodes_in_dcs(self.snap, job.datacenters, job.node_pool)
            asked = per_node * len(nodes)
        else:
            asked = per_node  # over the limit on one node already
        what = f"the job asks for {per_node} allocs on each of its ready nodes:"
        return limits.over_limit(asked, self.max_placements, what)

    def _attempt(self) -> bool:
        ev = self.eval
        self.job = self.snap.job_by_id(ev.namespace, ev.job_id)
        stopped = util.job_stopped(self.job)
        self.queued = {}
        self.nodes, self.not_ready, self.nodes_by_dc = [], set(), {}
        if not stopped:
            assert self.job is not None
            self.queued = {tg.name: 0 for tg in self.job.task_groups}
            self.nodes, self.not_ready, self.nodes_by_dc = util.ready_nodes_in_dcs(
                self.snap, self.job.datacenters, self.job.node_pool
            )
        self.plan = util.make_plan(ev, self.job)
        self.failed_tg_allocs = {}
        self.followups = []
        self.placer = Placer(
            self.snap,
            self.plan,
            self.log,
            True,
            self.job,
            system=True,
            sysbatch=self.sysbatch,
            inflight=self.inflight,
        )
        self.placer.nodes, self.placer.nodes_by_dc = self.nodes, self.nodes_by_dc

        self._compute_job_allocs()

        if util.plan_is_noop(self.plan) and not ev.annotate_plan:
            return True

        if self.followups and ev.wait_until == 0:
            for f in self.followups:
                f.previous_eval = ev.id
                f.traceparent = ev.traceparent
                self.planner.create_eval(f)
                self.next_eval = f

        if self.limit_reached and self.rolling_eval is None and self.job is not None:
            self.rolling_eval = util.next_rolling_eval(ev, util.stagger_of(self.job))
            self.planner.create_eval(self.rolling_eval)
            self.next_eval = self.rolling_eval

        if ev.annotate_plan and self.annotations is not None:
            self.plan.annotations.CopyFrom(self.annotations)

        result, new_snap = self.planner.submit_plan(self.plan)
        self.plan_result = result
        util.adjust_queued_allocations(result, self.queued)
        if new_snap is not None:
            self.snap = new_snap
            return False
        full, _, _ = util.full_commit(self.plan, result)
        return full

    def _compute_job_allocs(self) -> None:
        ev = self.eval
        job = self.job
        plan = self.plan
        allocs = self.snap.allocs_by_job(ev.namespace, ev.job_id)
        tainted = util.tainted_nodes(self.snap, allocs)
        util.update_non_terminal_allocs_to_lost(plan, tainted, allocs)

        live: list[pb.Allocation] = []
        terminal: dict[tuple[str, str], pb.Allocation] = {}
        for a in allocs:
            if structs.alloc_terminal(a):
                key = (a.node_id, a.name)
                cur = terminal.get(key)
                if cur is None or a.create_index > cur.create_index:
                    terminal[key] = a
            else:
                live.append(a)

        now = structs.now_ns()
        diff = diff_system_allocs(
            None if util.job_stopped(job) else job,
            self.nodes,
            self.not_ready,
            tainted,
            live,
            terminal,
            now,
            util.initializing_nodes(self.snap, live),
        )
        for t in diff.stop:
            assert t.alloc is not None
            util.append_stopped_alloc(plan, t.alloc, util.ALLOC_NOT_NEEDED)
        for t in diff.migrate:
            assert t.alloc is not None
            util.append_stopped_alloc(plan, t.alloc, util.ALLOC_NODE_TAINTED)
        for t in diff.lost:
            assert t.alloc is not None
            util.append_stopped_alloc(plan, t.alloc, util.ALLOC_LOST, ClientStatus.LOST)
        self._schedule_disconnect_timeouts(diff.disconnecting, now)
        for t in diff.disconnecting + diff.reconnecting:
            assert t.alloc is not None
            util.append_alloc(plan, t.alloc)

        inplace, destructive = self._inplace_updates(diff.update)
        self.annotations = annotate.desired_updates_from_node_diff(diff, inplace, destructive)

        # roll destructive updates max_parallel at a time per group
        self.limit_reached = False
        place = list(diff.place)
        taken: dict[str, int] = {}
        for t in destructive:
            assert t.alloc is not None and t.task_group is not None and job is not None
            mp = util.max_parallel_of(job, t.task_group)
            n = taken.get(t.task_group.name, 0)
            if mp > 0 and n >= mp:
                self.limit_reached = True
                continue
            taken[t.task_group.name] = n + 1
            if not structs.alloc_terminal(t.alloc):
                util.append_stopped_alloc(plan, t.alloc, util.ALLOC_UPDATING)
            place.append(t)

        if not place:
            if job is not None and not job.stop:
                for tg in job.task_groups:
                    self.queued[tg.name] = 0
            return
        for t in place:
            assert t.task_group is not None
            self.queued[t.task_group.name] = self.queued.get(t.task_group.name, 0) + 1
        self._compute_placements(place, live)

    def _schedule_disconnect_timeouts(self, disconnecting: list[AllocTuple], now: int) -> None:
        """Allocs going unknown get a `max-disconnect-timeout` follow-up at
        now + lost_after (batched 5 s apart, as for service jobs): without
        it nothing would re-evaluate the job when the window ends and the
        allocs would stay unknown for as long as the node stays away."""
        job = self.job
        if not disconnecting or job is None:
            return
        due = [
            (t.alloc.id, disconnect_timeout(t.task_group, now))
            for t in disconnecting
            if t.alloc is not None
        ]
        ids, evals = util.batch_followup_evals(
            job,
            self.eval.priority,
            due,
            Trigger.MAX_DISCONNECT_TIMEOUT,
            util.DISCONNECT_TIMEOUT_FOLLOWUP,
            Trigger.MAX_DISCONNECT_TIMEOUT,
        )
        for t in disconnecting:
            if t.alloc is not None:
                t.alloc.followup_eval_id = ids.get(t.alloc.id, "")
        self.followups = evals

    def _inplace_updates(
        self, updates: list[AllocTuple]
    ) -> tuple[list[AllocTuple], list[AllocTuple]]:
        """Update in place where the job change allows it and the alloc still
        fits its node; the rest are destructive."""
        job = self.job
        assert self.placer is not None
        inplace: list[AllocTuple] = []
        destructive: list[AllocTuple] = []
        for t in updates:
            a, tg = t.alloc, t.task_group
            assert a is not None and tg is not None and job is not None
            old_job = util.placed_job_version(self.snap, job, a)
            if old_job is None or util.tasks_updated(job, old_job, tg.name):
                destructive.append(t)
                continue
            if structs.alloc_terminal(a):
                # a finished sysbatch alloc of a compatible version: keep it
                inplace.append(t)
                continue
            node = self.snap.node_by_id(a.node_id)
            if node is None or not util.node_in_job(node, job):
                destructive.append(t)
                continue
            if not self.placer.fits_in_place(a, node, tg):
                destructive.append(t)
                continue
            updated = structs.copy_msg(a)
            updated.eval_id = self.eval.id
            updated.job_version = job.version
            updated.job_modify_index = job.job_modify_index
            util.append_alloc(self.plan, updated)
            inplace.append(t)
        return inplace, destructive

    def _compute_placements(self, place: list[AllocTuple], live: list[pb.Allocation]) -> None:
        job = self.job
        assert job is not None and self.placer is not None
        placer = self.placer
        node_by_id = {n.id: n for n in self.nodes}
        has_allocs = {a.task_group for a in live}
        filtered_metrics: dict[str, pb.AllocMetric] = {}
        for missing in place:
            tg = missing.task_group
            assert tg is not None
            node = node_by_id.get(missing.node_id)
            if node is None:
                continue
            placer.set_nodes([node])
            option = placer.select(tg, alloc_name=missing.name)
            if option is None:
                if placer.nodes_filtered() > 0:
                    # not a failure: the node is not for this job
                    self.queued[tg.name] -= 1
                    if (
                        self.annotations is not None
                        and tg.name in self.annotations.desired_tg_updates
                    ):
                        du = self.annotations.desired_tg_updates[tg.name]
                        du.place = max(0, du.place - 1)
                    filtered_metrics[tg.name] = util.merge_node_filtered(
                        filtered_metrics.get(tg.name), placer.failure_metrics(tg)
                    )
                    if self.queued[tg.name] <= 0 and tg.name not in has_allocs:
                        self.failed_tg_allocs[tg.name] = filtered_metrics[tg.name]
                    continue
                failed = self.failed_tg_allocs.get(tg.name)
                if failed is not None:
                    failed.coalesced_failures += 1
                    continue
                self.failed_tg_allocs[tg.name] = placer.failure_metrics(tg, self.nodes_by_dc)
                self._add_blocked(node)
                continue
            alloc = placer.new_alloc(self.eval, job, tg, missing.name, option)
            if missing.alloc is not None and missing.alloc.id:
                alloc.previous_allocation = missing.alloc.id
            if self.annotations is not None and len(alloc.preempted_allocations):
                annotate.add_preemptions(self.annotations, tg.name, option.preempted_allocs)

    def _add_blocked(self, node: pb.Node) -> None:
        """A blocked eval for this job on this node, released when the node
        gains capacity (UnblockNode)."""
        assert self.placer is not None
        classes, escaped, quota = self.placer.eligibility()
        b = util.create_blocked_eval(
            self.eval,
            class_eligibility=None if escaped else classes,
            escaped=escaped,
            quota_reached=quota,
            failed_tg_allocs=self.failed_tg_allocs,
        )
        b.status_description = util.BLOCKED_EVAL_FAILED_PLACEMENTS
        b.node_id = node.id
        self.blocked.append(b)
        self.planner.create_eval(b)
