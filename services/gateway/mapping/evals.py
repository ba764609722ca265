"""Evaluations as Nomad's api.Evaluation (and its list stub)."""

from __future__ import annotations

from typing import Any

from corral.v1 import structs_pb2 as pb
from services.gateway.mapping.common import Field, entry, rfc3339, to_nomad

#: Corral's journey times (issue 20's UI timeline): Nomad's api.Evaluation
#: has no equivalent, so the Nomad-shaped API leaves them out; the UI's
#: /ui/api/evaluation/<id>/journey serves them
JOURNEY_FIELDS = ("EnqueueTime", "DequeueTime", "PlanSubmitTime")


def evaluation(msg: pb.Evaluation) -> dict[str, Any]:
    """api.Evaluation (WaitUntil is a Go time.Time there)."""
    out = to_nomad(msg, {"wait_until": rfc3339})
    out["Type"] = msg.type
    for key in JOURNEY_FIELDS:
        del out[key]
    return out


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
    ("WaitUntil", lambda m: rfc3339(m.wait_until) if m.wait_until else None),
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
