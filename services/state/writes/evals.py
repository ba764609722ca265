"""Writing evaluations, with the side effects Nomad's FSM applies."""

from __future__ import annotations

from collections.abc import Sequence

from corral.domain.errors import AlreadyExists, FailedPrecondition, InvalidArgument, NotFound
from corral.domain.structs import EvalStatus, copy_msg, is_blocked_eval
from corral.v1 import state_pb2
from corral.v1 import structs_pb2 as pb
from services.state import validate
from services.state.db.database import WriteTx


def validate_evals(evals: Sequence[pb.Evaluation], field: str = "evals") -> None:
    validate.batch_size(len(evals), field)
    for i, ev in enumerate(evals):
        validate.evaluation(ev, f"{field}[{i}]")


async def upsert_evals(
    tx: WriteTx, evals: Sequence[pb.Evaluation], *, index: int | None = None
) -> None:
    """Insert or update evals at `index` (default: the transaction's).

    * An existing eval keeps its create_index/create_time, and its journey
      times (enqueue/dequeue/plan submit) when the write carries none: only
      the worker that ran it records them, and another writer's later
      rewrite (the broker cancelling it, the reaper failing it) must not
      wipe them.
    * Completing an eval with no failed task groups cancels every other
      blocked eval of its job ("evaluation <id> successful"), as Nomad does
      when the blocked tracker untracks the job.
    * queued_allocations are recorded in the job summary's `queued`.
    """
    existing = await tx.get_evals([e.id for e in evals])
    for ev in evals:
        ev = copy_msg(ev)
        old = existing.get(ev.id)
        if old is not None:
            ev.create_index = old.create_index
            ev.create_time = old.create_time
            if not (ev.enqueue_time or ev.dequeue_time or ev.plan_submit_time):
                ev.enqueue_time = old.enqueue_time
                ev.dequeue_time = old.dequeue_time
                ev.plan_submit_time = old.plan_submit_time
        else:
            ev.create_index = 0
        tx.put_eval(ev, index=index)
        if ev.status == EvalStatus.COMPLETE and not ev.failed_tg_allocs and ev.job_id:
            await _cancel_blocked(tx, ev, index)
        if ev.queued_allocations and ev.job_id:
            await _record_queued(tx, ev, index)


#: the statuses a worker's decision may leave its eval in: never `pending`,
#: which would ack an eval nobody holds any more (its outcome not written)
DECIDED = (EvalStatus.COMPLETE, EvalStatus.FAILED, EvalStatus.CANCELED, EvalStatus.BLOCKED)


def validate_decision(request: state_pb2.DecideEvalRequest) -> None:
    """What `State.DecideEval` can check without reading: the held eval and
    its token named, an outcome of that eval that is decided, created evals
    that follow it and are new to the request."""
    validate.require_id(request.eval_id, "eval_id")
    validate.require_id(request.token, "token")
    if not request.HasField("outcome") and not request.created:
        raise InvalidArgument("outcome", "is required when no eval is created")
    if request.HasField("outcome"):
        validate.evaluation(request.outcome, "outcome")
        if request.outcome.id != request.eval_id:
            raise InvalidArgument("outcome.id", f"must be the held eval {request.eval_id!r}")
        if request.outcome.status not in DECIDED:
            raise InvalidArgument(
                "outcome.status",
                f"must be one of {', '.join(DECIDED)}, not {request.outcome.status!r}",
            )
    if request.created:
        validate_evals(request.created, "created")
    seen = {request.eval_id}
    for i, ev in enumerate(request.created):
        if ev.previous_eval != request.eval_id:
            raise InvalidArgument(
                f"created[{i}].previous_eval", f"must be the held eval {request.eval_id!r}"
            )
        if ev.id in seen:
            raise InvalidArgument(f"created[{i}].id", f"evaluation {ev.id} appears twice")
        seen.add(ev.id)


async def decide_eval(tx: WriteTx, request: state_pb2.DecideEvalRequest) -> None:
    """Write a worker's decision (`validate_decision` first): the created
    evals and the outcome, and the decision itself on the change batch for
    the broker. Refused before anything is queued when a created eval
    exists already, the held eval is gone, or a `blocked` outcome is given
    for an eval that is not a blocked one (Nomad's Eval.Reblock rule)."""
    ids = [ev.id for ev in request.created] + [request.eval_id]
    stored = await tx.get_evals(ids)
    for ev in request.created:
        if ev.id in stored:
            raise AlreadyExists(f"evaluation {ev.id} already exists")
    writes = list(request.created)
    if request.HasField("outcome"):
        held = stored.get(request.eval_id)
        if held is None:
            raise NotFound(f"evaluation {request.eval_id} not found")
        if request.outcome.status == EvalStatus.BLOCKED and not is_blocked_eval(held):
            raise FailedPrecondition(
                f"evaluation {request.eval_id} is not blocked (status {held.status})"
            )
        writes.append(request.outcome)
    await upsert_evals(tx, writes)
    tx.record_decision(
        pb.EvalDecision(
            eval_id=request.eval_id, token=request.token, outcome=request.HasField("outcome")
        )
    )


async def _cancel_blocked(tx: WriteTx, done: pb.Evaluation, index: int | None) -> None:
    for other in await tx.evals_by_job(done.namespace, done.job_id):
        if other.id == done.id or other.status != EvalStatus.BLOCKED:
            continue
        canceled = copy_msg(other)
        canceled.status = EvalStatus.CANCELED
        canceled.status_description = f'evaluation "{done.id}" successful'
        tx.put_eval(canceled, index=index)


async def _record_queued(tx: WriteTx, ev: pb.Evaluation, index: int | None) -> None:
    summary = await tx.get_job_summary(ev.namespace, ev.job_id)
    if summary is None:
        summary = pb.JobSummary(job_id=ev.job_id, namespace=ev.namespace)
    else:
        summary = copy_msg(summary)
    changed = False
    for tg, queued in ev.queued_allocations.items():
        if summary.summary[tg].queued != queued or tg not in summary.summary:
            summary.summary[tg].queued = queued
            changed = True
    if changed:
        tx.put_job_summary(summary, index=index)
