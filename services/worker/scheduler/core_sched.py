"""The `_core` scheduler: garbage collection (Nomad's `nomad/core_sched.go`).

Core evals come from the leader's periodic timers; the eval's `job_id`
names the collection: `eval-gc`, `job-gc`, `node-gc`, `deployment-gc`, or
`force-gc` (all of them, with no age threshold). Terminal evals and their
allocs, dead jobs (with their deployments), down nodes and ended
deployments older than their thresholds are deleted through the
`CorePlanner` deletions. Core evals are not stored, so no status is written.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from corral.domain import deployments, structs
from corral.domain.store import StateSnapshot
from corral.domain.structs import ClientStatus, DesiredStatus, JobStatus, JobType, NodeStatus
from corral.v1 import structs_pb2 as pb
from services.worker.scheduler.interfaces import CorePlanner, Planner, SchedulerError

CORE_JOB_EVAL_GC = "eval-gc"
CORE_JOB_JOB_GC = "job-gc"
CORE_JOB_NODE_GC = "node-gc"
CORE_JOB_DEPLOYMENT_GC = "deployment-gc"
CORE_JOB_FORCE_GC = "force-gc"
CORE_JOBS = (
    CORE_JOB_EVAL_GC,
    CORE_JOB_JOB_GC,
    CORE_JOB_NODE_GC,
    CORE_JOB_DEPLOYMENT_GC,
    CORE_JOB_FORCE_GC,
)


@dataclass(frozen=True)
class GCConfig:
    """Age thresholds (ns) past which terminal objects are collected;
    Nomad's server defaults. A worker takes them from its settings
    (services/worker/config.py `GCSettings`); how often a collection runs is
    the broker leader's `core_gc_interval`."""

    eval_gc_threshold: int = structs.HOUR
    batch_eval_gc_threshold: int = 24 * structs.HOUR
    job_gc_threshold: int = 4 * structs.HOUR
    node_gc_threshold: int = 24 * structs.HOUR
    deployment_gc_threshold: int = structs.HOUR


def core_eval(kind: str, *, now: int | None = None) -> pb.Evaluation:
    """A core GC eval as the leader's timers create it."""
    return pb.Evaluation(
        id=structs.new_id(),
        namespace="-",
        priority=structs.CORE_JOB_PRIORITY,
        type=JobType.CORE,
        triggered_by=structs.Trigger.SCHEDULED,
        job_id=kind,
        status=structs.EvalStatus.PENDING,
        create_time=now or 0,
    )


def _gc_able_job(job: pb.Job) -> bool:
    """Stopped or dead, and not a periodic/parameterized parent."""
    if job.periodic.enabled or (job.HasField("parameterized") and not job.dispatched):
        return False
    return job.stop or job.status == JobStatus.DEAD


def _collectable(a: pb.Allocation) -> bool:
    """Terminal and no longer running on its client: the least the state
    requires to delete an alloc (services/state/writes/gc.py), which refuses
    a whole GC request naming anything else."""
    return structs.alloc_terminal(a) and a.client_status != ClientStatus.RUNNING


def alloc_gc_eligible(a: pb.Allocation, job: pb.Job | None, now: int, cutoff: int) -> bool:
    """Terminal and old enough, and not a failed alloc its policy may still
    reschedule."""
    if not _collectable(a) or a.modify_time > cutoff:
        return False
    if job is None or job.stop or job.status == JobStatus.DEAD:
        return True
    if a.desired_status == DesiredStatus.STOP:
        return True
    if a.client_status != ClientStatus.FAILED:
        return True
    tg = structs.task_group(job, a.task_group)
    policy = tg.reschedule_policy if tg is not None and tg.HasField("reschedule_policy") else None
    if policy is None or (not policy.unlimited and policy.attempts == 0):
        return True
    if a.next_allocation:
        return True
    if policy.unlimited:
        return False
    events = a.reschedule_tracker.events
    if not len(events):
        return False
    return now - events[len(events) - 1].reschedule_time > policy.interval


class CoreScheduler:
    def __init__(
        self,
        snapshot: StateSnapshot,
        planner: Planner,
        log: logging.Logger,
        config: GCConfig | None = None,
        *,
        now: int | None = None,
    ) -> None:
        self.snap = snapshot
        self.planner = planner
        self.log = log
        self.config = config or GCConfig()
        self.now = now

    def _now(self) -> int:
        return self.now if self.now is not None else structs.now_ns()

    def _core_planner(self) -> CorePlanner:
        if not isinstance(self.planner, CorePlanner):
            raise SchedulerError("core scheduler needs a planner that can delete (CorePlanner)")
        return self.planner

    def process(self, ev: pb.Evaluation) -> None:
        kind = ev.job_id.split(":", 1)[0]
        if kind == CORE_JOB_EVAL_GC:
            self.eval_gc()
        elif kind == CORE_JOB_JOB_GC:
            self.job_gc()
        elif kind == CORE_JOB_NODE_GC:
            self.node_gc()
        elif kind == CORE_JOB_DEPLOYMENT_GC:
            self.deployment_gc()
        elif kind == CORE_JOB_FORCE_GC:
            self.job_gc(threshold=0)
            self.eval_gc(threshold=0)
            self.deployment_gc(threshold=0)
            self.node_gc(threshold=0)
        else:
            raise SchedulerError(f"core scheduler cannot handle job '{ev.job_id}'")

    # ------------------------------------------------------------ evals

    def gc_eval(
        self, ev: pb.Evaluation, cutoff: int, *, allow_batch: bool
    ) -> tuple[bool, list[str]]:
        """(can the eval go, which of its allocs can go)."""
        if not structs.eval_terminal(ev) or ev.modify_time > cutoff:
            return False, []
        job = self.snap.job_by_id(ev.namespace, ev.job_id)
        allocs = self.snap.allocs_by_eval(ev.id)
        if ev.type == JobType.BATCH:
            collect = job is None or (job.status == JobStatus.DEAD and (job.stop or allow_batch))
            if not collect:
                assert job is not None
                # a live batch job keeps its allocs (or they would be re-run),
                # except terminal ones of versions older than the current
                old = [
                    a.id
                    for a in allocs
                    if a.create_index < job.job_modify_index
                    and a.modify_time < cutoff
                    and _collectable(a)
                ]
                return len(old) == len(allocs), old
        now = self._now()
        gc = True
        ids: list[str] = []
        for a in allocs:
            if alloc_gc_eligible(a, job, now, cutoff):
                ids.append(a.id)
            else:
                gc = False
        return gc, ids

    def eval_gc(self, threshold: int | None = None) -> tuple[list[str], list[str]]:
        """Terminal evals older than their threshold, with their allocs.

        A purged job's evals and allocs go as soon as they are terminal,
        whatever the threshold: purging said the job's history is not wanted
        (Nomad keeps them until the eval threshold; the issue asks for
        more). So do allocs that neither a job nor an eval refers to any
        more, which nothing else would ever collect."""
        now = self._now()
        cutoff = now - (self.config.eval_gc_threshold if threshold is None else threshold)
        batch_cutoff = now - (
            self.config.batch_eval_gc_threshold if threshold is None else threshold
        )
        evals: list[str] = []
        allocs: list[str] = []
        for ev in self.snap.evals.values():
            if self.snap.job_by_id(ev.namespace, ev.job_id) is None:
                c = now  # purged
            else:
                c = batch_cutoff if ev.type == JobType.BATCH else cutoff
            gc, alloc_ids = self.gc_eval(ev, c, allow_batch=False)
            if gc:
                evals.append(ev.id)
            allocs.extend(alloc_ids)
        allocs.extend(self._orphan_allocs())
        if evals or allocs:
            self.log.debug("eval GC", extra={"evals": len(evals), "allocs": len(allocs)})
            self._core_planner().delete_evals(evals, allocs)
        return evals, allocs

    def _orphan_allocs(self) -> list[str]:
        """Collectable allocs whose job and eval are both gone."""
        return [
            a.id
            for a in self.snap.allocs.values()
            if a.eval_id not in self.snap.evals
            and self.snap.job_by_id(a.namespace, a.job_id) is None
            and _collectable(a)
        ]

    # ------------------------------------------------------------ jobs

    def job_gc(self, threshold: int | None = None) -> list[tuple[str, str]]:
        now = self._now()
        cutoff = now - (self.config.job_gc_threshold if threshold is None else threshold)
        gc_jobs: list[tuple[str, str]] = []
        gc_evals: list[str] = []
        gc_allocs: list[str] = []
        for job in self.snap.iter_jobs():
            if not _gc_able_job(job) or job.submit_time > cutoff:
                continue
            job_evals: list[str] = []
            job_allocs: list[str] = []
            all_gc = True
            for ev in self.snap.evals_by_job(job.namespace, job.id):
                gc, alloc_ids = self.gc_eval(ev, cutoff, allow_batch=True)
                if not gc:
                    all_gc = False
                    break
                job_evals.append(ev.id)
                job_allocs.extend(alloc_ids)
            if not all_gc:
                continue
            # allocs not reachable from a stored eval must be collectable too
            if not all(_collectable(a) for a in self.snap.allocs_by_job(job.namespace, job.id)):
                continue
            gc_jobs.append((job.namespace, job.id))
            gc_evals.extend(job_evals)
            seen = set(job_allocs)
            gc_allocs.extend(job_allocs)
            gc_allocs.extend(
                a.id for a in self.snap.allocs_by_job(job.namespace, job.id) if a.id not in seen
            )
        if gc_evals or gc_allocs:
            self._core_planner().delete_evals(gc_evals, gc_allocs)
        if gc_jobs:
            self.log.debug("job GC", extra={"jobs": len(gc_jobs)})
            self._core_planner().delete_jobs(gc_jobs)
            deps = [d.id for ns, jid in gc_jobs for d in self.snap.deployments_by_job(ns, jid)]
            if deps:
                self._core_planner().delete_deployments(deps)
        return gc_jobs

    # ------------------------------------------------------------ deployments

    def deployment_gc(self, threshold: int | None = None) -> list[str]:
        """Ended deployments older than the threshold that no live alloc
        refers to (Nomad's deploymentGC); a purged job's deployments as soon
        as no live alloc refers to them, active or not."""
        now = self._now()
        cutoff = now - (self.config.deployment_gc_threshold if threshold is None else threshold)
        gc: list[str] = []
        for d in self.snap.deployments.values():
            purged = self.snap.job_by_id(d.namespace, d.job_id) is None
            if not purged and (deployments.is_active(d) or d.modify_time > cutoff):
                continue
            if any(
                a.deployment_id == d.id and not structs.alloc_terminal(a)
                for a in self.snap.allocs_by_job(d.namespace, d.job_id)
            ):
                continue
            gc.append(d.id)
        if gc:
            self.log.debug("deployment GC", extra={"deployments": len(gc)})
            self._core_planner().delete_deployments(gc)
        return gc

    # ------------------------------------------------------------ nodes

    def node_gc(self, threshold: int | None = None) -> list[str]:
        now = self._now()
        cutoff = now - (self.config.node_gc_threshold if threshold is None else threshold)
        gc_nodes: list[str] = []
        for node in self.snap.iter_nodes():
            if node.status != NodeStatus.DOWN or node.status_updated_at > cutoff:
                continue
            if any(not structs.alloc_terminal(a) for a in self.snap.allocs_by_node(node.id)):
                continue
            gc_nodes.append(node.id)
        if gc_nodes:
            self.log.debug("node GC", extra={"nodes": len(gc_nodes)})
            self._core_planner().delete_nodes(gc_nodes)
        return gc_nodes
