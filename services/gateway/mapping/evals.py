"""Evaluations as Nomad's api.Evaluation (and its list stub)."""

from __future__ import annotations

from typing import Any

from corral.v1 import structs_pb2 as pb
from services.gateway.mapping.absent import fill, fill_all
from services.gateway.mapping.common import rfc3339, to_nomad

#: Corral's journey times (issue 20's UI timeline): Nomad's api.Evaluation
#: has no equivalent, so the Nomad-shaped API leaves them out; the UI's
#: /ui/api/evaluation/<id>/journey serves them
JOURNEY_FIELDS = ("EnqueueTime", "DequeueTime", "PlanSubmitTime")
#: Corral's own bookkeeping on an eval: the trace context (the UI's journey
#: endpoint shows the trace) and a reserved field
INTERNAL_FIELDS = ("Traceparent", "LeaderAck")


def metrics(out: dict[str, Any] | None) -> dict[str, Any] | None:
    """An AllocMetric's JSON as Nomad's api.AllocationMetric (in place)."""
    return fill("AllocationMetric", out)


def evaluation(msg: pb.Evaluation) -> dict[str, Any]:
    """api.Evaluation (WaitUntil is a Go time.Time there). QuotaLimitReached
    is the name of the quota whose limit blocked the eval in Nomad's
    (Enterprise) quotas: Corral has none, so it is always ""."""
    out = to_nomad(
        msg,
        {
            "wait_until": rfc3339,
            "quota_limit_reached": lambda _: "",
        },
    )
    out["Type"] = msg.type
    for key in (*JOURNEY_FIELDS, *INTERNAL_FIELDS):
        del out[key]
    fill_all("AllocationMetric", out["FailedTGAllocs"])
    return fill("Evaluation", out) or out


def stub(msg: pb.Evaluation) -> dict[str, Any]:
    """api.EvaluationStub, what /v1/evaluations lists."""
    return {
        "ID": msg.id,
        "Priority": msg.priority,
        "Type": msg.type,
        "TriggeredBy": msg.triggered_by,
        "Namespace": msg.namespace,
        "JobID": msg.job_id,
        "NodeID": msg.node_id,
        "DeploymentID": msg.deployment_id,
        "Status": msg.status,
        "StatusDescription": msg.status_description,
        "WaitUntil": rfc3339(msg.wait_until),
        "NextEval": msg.next_eval,
        "PreviousEval": msg.previous_eval,
        "BlockedEval": msg.blocked_eval,
        "CreateIndex": msg.create_index,
        "ModifyIndex": msg.modify_index,
        "CreateTime": msg.create_time,
        "ModifyTime": msg.modify_time,
    }
