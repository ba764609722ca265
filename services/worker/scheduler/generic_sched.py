"""The generic scheduler for service and batch jobs (Nomad's
`scheduler/generic_sched.go`): reconcile the job's allocs with its spec,
place what is missing through the feasibility/ranking stack, submit the plan
and retry on fresher state when the planner rejects part of it.
"""

from __future__ import annotations

from corral.domain import deployments, structs
from corral.domain.structs import ClientStatus, EvalStatus, Trigger
from corral.v1 import structs_pb2 as pb
from services.worker.scheduler import annotate, limits, util
from services.worker.scheduler.eval_scheduler import EvalScheduler
from services.worker.scheduler.interfaces import SchedulerError
from services.worker.scheduler.placement import Placer
from services.worker.scheduler.reconcile.allocs import AllocNameIndex, next_delay, reschedule_policy
from services.worker.scheduler.reconcile.reconciler import (
    AllocReconciler,
    PlaceResult,
    ReconcileResults,
)

MAX_SERVICE_ATTEMPTS = 5
MAX_BATCH_ATTEMPTS = 2


class GenericScheduler(EvalScheduler):
    """Schedules one service or batch evaluation."""

    max_attempts = MAX_SERVICE_ATTEMPTS
    batch_attempts = MAX_BATCH_ATTEMPTS

    def _start(self) -> None:
        self.blocked: pb.Evaluation | None = None
        self.rolling_limited = False
        #: the deployment new and updated allocs of the current version join
        self.deployment_id = ""
        self._deployment_groups: set[str] = set()
        #: the deployment the eval names when it ends (Nomad's s.deployment)
        self.eval_deployment_id = ""

    # ------------------------------------------------------------ driver

    def process(self, ev: pb.Evaluation) -> None:
        if not self._run(ev):
            return
        if structs.is_blocked_eval(self.eval) and self.failed_tg_allocs:
            self._reblock()
            return
        self._set_status(EvalStatus.COMPLETE, "")

    def _can_handle(self, trigger: str) -> bool:
        return trigger in Trigger.ALL and trigger != Trigger.SCHEDULED

    def _attempts_ran_out(self) -> None:
        self._create_blocked_eval(plan_failure=True)

    def _over_limit(self) -> str:
        """Why this eval would materialise too many placements, or ''. Checked
        before reconciling, which builds one entry per desired alloc; a
        stopped job only stops what exists, which earlier evals bounded."""
        job = self.snap.job_by_id(self.eval.namespace, self.eval.job_id)
        if job is None or util.job_stopped(job):
            return ""
        asked = limits.desired_count(job.task_groups)
        return limits.over_limit(asked, self.max_placements, "the job asks for")

    def _reblock(self) -> None:
        """A blocked eval (waiting in the tracker, or released from it by a
        capacity change) that still cannot place everything goes back to the
        tracker under the same id with what this run learned, instead of
        being completed with a new blocked eval (Nomad's generic_sched.go)."""
        reblock = structs.copy_msg(self.eval)
        reblock.status = EvalStatus.BLOCKED
        reblock.status_description = (
            util.BLOCKED_EVAL_MAX_PLAN
            if reblock.triggered_by == Trigger.MAX_PLAN_ATTEMPTS
            else util.BLOCKED_EVAL_FAILED_PLACEMENTS
        )
        classes, escaped, quota = self._eligibility()
        reblock.escaped_computed_class = escaped
        reblock.ClearField("class_eligibility")
        for k, v in classes.items():
            reblock.class_eligibility[k] = v
        reblock.quota_limit_reached = quota
        reblock.ClearField("failed_tg_allocs")
        for tg, m in self.failed_tg_allocs.items():
            reblock.failed_tg_allocs[tg].CopyFrom(m)
        reblock.ClearField("queued_allocations")
        for tg, n in self.queued.items():
            reblock.queued_allocations[tg] = n
        self.planner.reblock_eval(reblock)

    def _set_status(self, status: str, desc: str) -> None:
        util.set_status(
            self.log,
            self.planner,
            self.eval,
            status=status,
            desc=desc,
            blocked=self.blocked,
            next_eval=self.next_eval,
            failed_tg_allocs=self.failed_tg_allocs,
            queued=self.queued,
            deployment_id=self.eval_deployment_id,
        )

    def _eligibility(self) -> tuple[dict[str, bool], bool, bool]:
        if self.placer is None:
            return {}, False, False
        return self.placer.eligibility()

    def _create_blocked_eval(self, *, plan_failure: bool) -> None:
        classes, escaped, quota = self._eligibility()
        blocked = util.create_blocked_eval(
            self.eval,
            class_eligibility=None if escaped else classes,
            escaped=escaped,
            quota_reached=quota,
            failed_tg_allocs=self.failed_tg_allocs,
        )
        if plan_failure:
            blocked.triggered_by = Trigger.MAX_PLAN_ATTEMPTS
            blocked.status_description = util.BLOCKED_EVAL_MAX_PLAN
        else:
            blocked.status_description = util.BLOCKED_EVAL_FAILED_PLACEMENTS
        self.blocked = blocked
        self.planner.create_eval(blocked)

    def _attempt(self) -> bool:
        """One pass: reconcile, place, submit. True when done."""
        ev = self.eval
        self.job = self.snap.job_by_id(ev.namespace, ev.job_id)
        stopped = util.job_stopped(self.job)
        self.queued = {}
        if not stopped:
            assert self.job is not None
            self.queued = {tg.name: 0 for tg in self.job.task_groups}
        self.followups = []
        self.plan = util.make_plan(ev, self.job)
        self.failed_tg_allocs = {}
        self.rolling_limited = False
        self.deployment_id = ""
        self._deployment_groups = set()
        self.eval_deployment_id = ""
        self.placer = Placer(
            self.snap, self.plan, self.log, self.batch, self.job, inflight=self.inflight
        )

        self._compute_job_allocs()

        if (
            not structs.is_blocked_eval(ev)
            and self.failed_tg_allocs
            and self.blocked is None
            and (not self.followups or structs.now_ns() > ev.wait_until)
        ):
            self._create_blocked_eval(plan_failure=False)

        if util.plan_is_noop(self.plan) and not ev.annotate_plan:
            return True

        if self.followups and ev.wait_until == 0:
            for f in self.followups:
                f.previous_eval = ev.id
                f.traceparent = ev.traceparent
                self.planner.create_eval(f)
                self.next_eval = f

        if self.rolling_limited and self.job is not None and self.next_eval is None:
            # era rolling update: continue after the stagger
            self.next_eval = util.next_rolling_eval(ev, util.stagger_of(self.job))
            self.planner.create_eval(self.next_eval)

        if ev.annotate_plan and self.annotations is not None:
            self.plan.annotations.CopyFrom(self.annotations)

        result, new_snap = self.planner.submit_plan(self.plan)
        self.plan_result = result
        util.adjust_queued_allocations(result, self.queued)
        if new_snap is not None:
            self.log.debug("refresh forced", extra={"eval_id": ev.id})
            self.snap = new_snap
            # nothing was written: a deployment this plan would have created
            # does not exist (the next attempt reads or creates one again)
            self.eval_deployment_id = ""
            return False
        full, expected, actual = util.full_commit(self.plan, result)
        if not full:
            raise SchedulerError(
                f"missing state refresh after partial commit ({actual} of {expected} placed)"
            )
        return True

    # ------------------------------------------------------------ reconcile

    def _alloc_update(
        self, existing: pb.Allocation, job: pb.Job, tg: pb.TaskGroup
    ) -> tuple[bool, bool, pb.Allocation | None]:
        """Ignore, destructive, or the in-place updated alloc."""
        if existing.job_modify_index == job.job_modify_index:
            return True, False, None
        old_job = util.placed_job_version(self.snap, job, existing)
        if old_job is None or util.tasks_updated(job, old_job, tg.name):
            return False, True, None
        if structs.alloc_terminal(existing):
            return True, False, None
        node = self.snap.node_by_id(existing.node_id)
        if node is None or not util.node_in_job(node, job):
            return False, True, None
        assert self.placer is not None
        if not self.placer.fits_in_place(existing, node, tg):
            return False, True, None
        updated = structs.copy_msg(existing)
        updated.eval_id = self.eval.id
        updated.job_version = job.version
        updated.job_modify_index = job.job_modify_index
        return False, False, updated

    def _compute_job_allocs(self) -> None:
        ev = self.eval
        allocs = self.snap.allocs_by_job(ev.namespace, ev.job_id)
        tainted = util.tainted_nodes(self.snap, allocs)
        util.update_non_terminal_allocs_to_lost(self.plan, tainted, allocs)

        job = self.job
        rec = AllocReconciler(
            job=None if util.job_stopped(job) else job,
            job_id=ev.job_id,
            is_batch=self.batch,
            eval_id=ev.id,
            eval_priority=ev.priority,
            existing=allocs,
            tainted=tainted,
            now=structs.now_ns(),
            alloc_update_fn=self._alloc_update,
            job_of=lambda a: util.alloc_job(self.snap, job, a),
            initializing=util.initializing_nodes(self.snap, allocs),
            deployment=self.snap.latest_deployment_by_job(ev.namespace, ev.job_id),
        )
        result = rec.compute()
        self.log.debug(
            "reconciled current state with desired state",
            extra={
                "eval_id": ev.id,
                "job_id": ev.job_id,
                "place": len(result.place),
                "destructive": len(result.destructive_update),
                "inplace": len(result.inplace_update),
                "stop": len(result.stop),
                "disconnect": len(result.disconnect_updates),
                "reconnect": len(result.reconnect_updates),
                "followups": len(result.followup_evals()),
            },
        )
        self.annotations = annotate.from_reconcile(result)
        self.followups = result.followup_evals()
        self.rolling_limited = bool(result.rolling_limited)
        self._plan_deployment(result)

        plan = self.plan
        for s in result.stop:
            util.append_stopped_alloc(
                plan, s.alloc, s.description, s.client_status, s.followup_eval_id
            )
        for a in result.inplace_update:
            self._join_deployment(a)
        for group in (
            result.disconnect_updates.values(),
            result.reconnect_updates.values(),
            result.inplace_update,
            result.attribute_updates.values(),
        ):
            for a in group:
                util.append_alloc(plan, a)

        if not result.place and not result.destructive_update:
            if job is not None and not job.stop:
                for tg in job.task_groups:
                    self.queued[tg.name] = 0
            return
        for p in result.place:
            self.queued[p.task_group.name] = self.queued.get(p.task_group.name, 0) + 1
        for p in result.destructive_update:
            self.queued[p.task_group.name] = self.queued.get(p.task_group.name, 0) + 1
        self._compute_placements(result)

    def _plan_deployment(self, result: ReconcileResults) -> None:
        """The plan carries the deployment the reconciler created and the
        status changes it decided; allocs join the current version's
        deployment only while it is active."""
        if result.deployment is not None:
            self.plan.deployment.CopyFrom(result.deployment)
        self.plan.deployment_updates.extend(result.deployment_updates)
        d = result.deployment or self.snap.deployment_by_id(result.deployment_id)
        self.deployment_id = d.id if d is not None and deployments.is_active(d) else ""
        self._deployment_groups = set(d.task_groups) if d is not None else set()
        # Nomad's setStatus names the deployment the scheduler held: the one
        # this plan creates, else the job's latest (service jobs only)
        if result.deployment is not None:
            self.eval_deployment_id = result.deployment.id
        elif not self.batch:
            latest = self.snap.latest_deployment_by_job(self.eval.namespace, self.eval.job_id)
            self.eval_deployment_id = latest.id if latest is not None else ""

    def _join_deployment(self, alloc: pb.Allocation) -> None:
        """Mark a placed or in-place updated alloc as part of the deployment;
        its health is then tracked (again) by its client."""
        if not self.deployment_id or alloc.task_group not in self._deployment_groups:
            return
        if alloc.deployment_id != self.deployment_id:
            alloc.deployment_id = self.deployment_id
            alloc.ClearField("deployment_status")

    # ------------------------------------------------------------ placement

    def _compute_placements(self, result: ReconcileResults) -> None:
        job = self.job
        assert job is not None and self.placer is not None
        placer = self.placer
        placer.set_nodes_for_job(job)
        placer.begin_placements(len(result.destructive_update) + len(result.place))
        now = structs.now_ns()
        plan = self.plan
        for batch in (result.destructive_update, result.place):
            for missing in batch:
                tg = missing.task_group
                failed = self.failed_tg_allocs.get(tg.name)
                if failed is not None:
                    failed.coalesced_failures += 1
                    continue
                prev = missing.previous_alloc
                if missing.stop_previous and prev is not None:
                    util.append_stopped_alloc(plan, prev, missing.stop_description)
                    placer.plan_edited(prev.node_id)
                penalty: set[str] = set()
                if prev is not None:
                    if prev.client_status == ClientStatus.FAILED:
                        penalty.add(prev.node_id)
                    for rev in prev.reschedule_tracker.events:
                        penalty.add(rev.prev_node_id)
                preferred = self._preferred_node(missing)
                option = placer.select(
                    tg,
                    alloc_name=missing.name,
                    penalty_node_ids=penalty,
                    preferred_node=preferred,
                )
                if option is None:
                    self.failed_tg_allocs[tg.name] = placer.failure_metrics(tg)
                    if missing.stop_previous and prev is not None:
                        util.pop_update(plan, prev)
                        placer.plan_edited(prev.node_id)
                    if prev is not None and missing.reschedule:
                        self._mark_failed_to_reschedule(prev)
                    continue
                name = self._dedupe_name(missing, result.name_indexes.get(tg.name))
                alloc = placer.new_alloc(self.eval, job, tg, name, option)
                if len(alloc.preempted_allocations) and self.annotations is not None:
                    annotate.add_preemptions(
                        self.annotations,
                        tg.name,
                        (v for v in option.preempted_allocs),
                    )
                self._join_deployment(alloc)
                if missing.canary and self.deployment_id:
                    alloc.deployment_status.canary = True
                if prev is not None:
                    alloc.previous_allocation = prev.id
                    if missing.reschedule:
                        self._update_reschedule_tracker(alloc, prev, now)

    def _dedupe_name(self, missing: PlaceResult, index: AllocNameIndex | None) -> str:
        """A placement whose name index is already doubly used gets the next
        free name instead (can happen after a destructive scale-up)."""
        if index is None or missing.stop_previous or missing.canary:
            return missing.name
        i = structs.alloc_name_index(missing.name)
        if index.is_duplicate(i):
            index.unset_index(i)
            return index.next(1)[0]
        return missing.name

    def _preferred_node(self, missing: PlaceResult) -> pb.Node | None:
        """The previous node, for groups with sticky or migrating disks."""
        prev = missing.previous_alloc
        tg = missing.task_group
        if prev is None or not (tg.ephemeral_disk.sticky or tg.ephemeral_disk.migrate):
            return None
        node = self.snap.node_by_id(prev.node_id)
        if node is None or not structs.node_ready(node):
            return None
        return node

    def _update_reschedule_tracker(
        self, alloc: pb.Allocation, prev: pb.Allocation, now: int
    ) -> None:
        """Carry the reschedule history forward onto the replacement."""
        tg = structs.task_group(
            util.alloc_job(self.snap, self.job, prev) or pb.Job(), prev.task_group
        )
        policy = reschedule_policy(tg, self.job.type if self.job else "")
        kept: list[pb.RescheduleEvent] = []
        events = list(prev.reschedule_tracker.events)
        if policy is not None and policy.attempts > 0:
            kept = [
                e
                for e in events
                if policy.interval > 0 and now - e.reschedule_time <= policy.interval
            ]
        else:
            kept = events[-util.MAX_PAST_RESCHEDULE_EVENTS :]
        tracker = alloc.reschedule_tracker
        tracker.events.extend(kept)
        tracker.events.add(
            reschedule_time=now,
            prev_alloc_id=prev.id,
            prev_node_id=prev.node_id,
            delay=next_delay(prev, policy),
        )
        tracker.last_reschedule = util.LAST_RESCHEDULE_OK

    def _mark_failed_to_reschedule(self, prev: pb.Allocation) -> None:
        """Keep the failed alloc (do not stop it) and note on its tracker
        that its replacement could not be placed, so a later eval retries."""
        util.pop_update(self.plan, prev)
        updated = structs.copy_msg(prev)
        for lst in self.plan.node_allocation.values():
            for a in lst.allocs:
                if a.id == prev.id:
                    updated = structs.copy_msg(a)
        updated.reschedule_tracker.last_reschedule = util.LAST_RESCHEDULE_FAILED
        util.replace_alloc_in_plan(self.plan, updated)
        if self.placer is not None:
            self.placer.ctx.invalidate(prev.node_id)
