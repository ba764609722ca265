"""Dispatching a parameterized job (Nomad's Job.Dispatch): a child job
with the caller's meta and payload, and its evaluation, written in one
transaction that first reads the committed parent, so a parent stopped or
re-registered concurrently is judged as it is at that index."""

from __future__ import annotations

from corral.domain import dispatch
from corral.domain.errors import FailedPrecondition, InvalidArgument, NotFound
from corral.domain.structs import copy_msg
from corral.v1 import structs_pb2 as pb
from services.state.db.database import WriteTx
from services.state.writes.jobs import register_job, validate_job


def dispatch_problem_field(problem: str) -> str:
    """The request field a dispatch problem is about, for INVALID_ARGUMENT."""
    return "payload" if problem.startswith("payload") else "meta"


async def dispatch_job(
    tx: WriteTx,
    namespace: str,
    parent_id: str,
    *,
    payload: bytes,
    meta: dict[str, str],
    id_prefix_template: str = "",
) -> tuple[pb.Job, pb.Evaluation | None]:
    """Write the child `<parent>/dispatch-<unix time>-<8 hex>` of the
    parameterized job and its register eval."""
    parent = await tx.get_job(namespace, parent_id)
    if parent is None:
        raise NotFound(f"job {parent_id!r} not found")
    if not parent.HasField("parameterized") or parent.dispatched:
        raise InvalidArgument("job_id", f"job {parent_id!r} is not a parameterized job")
    if parent.stop:
        raise FailedPrecondition(f"job {parent_id!r} is stopped; run it again to dispatch it")
    problem = dispatch.dispatch_problem(parent, payload, meta)
    if problem is not None:
        raise InvalidArgument(dispatch_problem_field(problem), problem)
    child = copy_msg(parent)
    child.id = dispatch.dispatched_id(parent.id, id_prefix_template, tx.now // 10**9)
    child.name = child.id
    child.parent_id = parent.id
    child.dispatched = True
    child.ClearField("parameterized")
    child.ClearField("status_description")
    child.meta.update(meta)
    child.payload = payload
    try:
        validate_job(child)
    except InvalidArgument as exc:
        if exc.field == "job.id":
            raise InvalidArgument("id_prefix_template", exc.message) from None
        raise
    return await register_job(tx, child, dispatch=True)
