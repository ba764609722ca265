"""Job plan (dry run): run the scheduler for a job against the worker's
snapshot with the submitted job in place, recording the plan instead of
submitting it (Nomad's Job.Plan with an in-memory planner)."""

from __future__ import annotations

import asyncio
from concurrent.futures import Executor

from corral.domain import structs, topics
from corral.domain.errors import InvalidArgument
from corral.domain.plan_commit import committable
from corral.domain.store import StateSnapshot, StateStore
from corral.domain.structs import EvalStatus, JobStatus, Trigger
from corral.domain.topics import EventType
from corral.v1 import job_pb2
from corral.v1 import structs_pb2 as pb
from services.worker.scheduler.factory import new_scheduler


def _accept(_node_id: str) -> str:
    return ""


class DryRunPlanner:
    """Records what a scheduler would do; by the commit rule every node
    accepts its part, so every plan 'commits' in full."""

    def __init__(self, snapshot: StateSnapshot) -> None:
        self.snapshot = snapshot
        self.plans: list[pb.Plan] = []
        self.evals: list[pb.Evaluation] = []
        self.created: list[pb.Evaluation] = []

    def submit_plan(self, plan: pb.Plan) -> tuple[pb.PlanResult, StateSnapshot | None]:
        self.plans.append(structs.copy_msg(plan))
        result = committable(self.snapshot, plan, _accept).result
        result.alloc_index = self.snapshot.index
        return result, None

    def update_eval(self, ev: pb.Evaluation) -> None:
        self.evals.append(structs.copy_msg(ev))

    def create_eval(self, ev: pb.Evaluation) -> None:
        self.created.append(structs.copy_msg(ev))

    def reblock_eval(self, ev: pb.Evaluation) -> None:
        self.evals.append(structs.copy_msg(ev))


def snapshot_with_job(snapshot: StateSnapshot, job: pb.Job) -> tuple[StateSnapshot, pb.Job]:
    """The snapshot with `job` registered as its next version."""
    job = structs.copy_msg(job)
    job.namespace = job.namespace or structs.DEFAULT_NAMESPACE
    current = snapshot.job_by_id(job.namespace, job.id)
    index = snapshot.index + 1
    if current is not None and not current.stop and not structs.job_spec_changed(current, job):
        return snapshot, current  # nothing to register: plan against what runs
    job.version = current.version + 1 if current is not None else 0
    job.create_index = current.create_index if current is not None else index
    job.modify_index = index
    job.job_modify_index = index
    job.status = current.status if current is not None else JobStatus.PENDING
    store = StateStore(snapshot)
    batch = pb.ChangeBatch(index=index, events=[topics.JOB.event(job, EventType.JOB_REGISTERED)])
    return store.apply(batch), job


async def plan_job(
    snapshot: StateSnapshot, request: job_pb2.JobPlanRequest, executor: Executor
) -> job_pb2.JobPlanResponse:
    job = request.job
    if not job.id:
        raise InvalidArgument("job.id", "is required")
    if job.type not in structs.JobType.USER:
        raise InvalidArgument("job.type", f"unknown value {job.type!r}")
    current = snapshot.job_by_id(job.namespace, job.id)
    snap, job = snapshot_with_job(snapshot, job)
    ev = pb.Evaluation(
        id=structs.new_id(),
        namespace=job.namespace,
        priority=job.priority or structs.DEFAULT_PRIORITY,
        type=job.type,
        triggered_by=Trigger.JOB_REGISTER,
        job_id=job.id,
        job_modify_index=job.job_modify_index,
        status=EvalStatus.PENDING,
        annotate_plan=True,
    )
    planner = DryRunPlanner(snap)

    def run() -> None:
        new_scheduler(job.type, snap, planner).process(ev)

    await asyncio.get_running_loop().run_in_executor(executor, run)
    resp = job_pb2.JobPlanResponse(
        job_modify_index=current.job_modify_index if current is not None else 0,
        created_evals=planner.created,
        index=snapshot.index,
    )
    if planner.plans and planner.plans[-1].HasField("annotations"):
        resp.annotations.CopyFrom(planner.plans[-1].annotations)
    final = planner.evals[-1] if planner.evals else None
    if final is not None:
        for tg, metric in final.failed_tg_allocs.items():
            resp.failed_tg_allocs[tg].CopyFrom(metric)
    return resp
