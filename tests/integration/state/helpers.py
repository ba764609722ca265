"""Small builders for state tests."""

from __future__ import annotations

from corral.structs import EvalStatus, JobType, Trigger, new_id
from corral.v1 import structs_pb2 as pb


def pending_eval(job_id: str = "web", **kw: object) -> pb.Evaluation:
    ev = pb.Evaluation(
        id=new_id(),
        namespace="default",
        priority=50,
        type=JobType.SERVICE,
        triggered_by=Trigger.JOB_REGISTER,
        job_id=job_id,
        status=EvalStatus.PENDING,
    )
    for k, v in kw.items():
        setattr(ev, k, v)
    return ev
