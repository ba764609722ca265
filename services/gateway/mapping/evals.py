"""Evaluations as Nomad's api.Evaluation (and its list stub)."""

from __future__ import annotations

from typing import Any

from corral.v1 import structs_pb2 as pb
from services.gateway.mapping.absent import fill, fill_all
from services.gateway.mapping.common import Field, entry, rfc3339, to_nomad

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


#: api.EvaluationStub's fields
_STUB: tuple[Field, ...] = (
    "id",
    "priority",
    "type",
    "triggered_by",
    "namespace",
    "job_id",
    "node_id",
    "deployment_id",
    "status",
    "status_description",
    # a Go time.Time, never null: Go's zero time when unset
    ("WaitUntil", lambda m: rfc3339(m.wait_until)),
    "next_eval",
    "previous_eval",
    "blocked_eval",
    "create_index",
    "modify_index",
    "create_time",
    "modify_time",
)


def stub(msg: pb.Evaluation) -> dict[str, Any]:
    """api.EvaluationStub, what /v1/evaluations lists."""
    return entry(msg, _STUB)
