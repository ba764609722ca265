"""Evaluations as Nomad's api.Evaluation (and its list stub)."""

from __future__ import annotations

from typing import Any

from corral.v1 import structs_pb2 as pb
from services.gateway.mapping.common import rfc3339, to_nomad


def evaluation(msg: pb.Evaluation) -> dict[str, Any]:
    """api.Evaluation (WaitUntil is a Go time.Time there)."""
    out = to_nomad(msg, {"wait_until": rfc3339})
    out["Type"] = msg.type
    return out


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
        "WaitUntil": rfc3339(msg.wait_until) if msg.wait_until else None,
        "NextEval": msg.next_eval,
        "PreviousEval": msg.previous_eval,
        "BlockedEval": msg.blocked_eval,
        "CreateIndex": msg.create_index,
        "ModifyIndex": msg.modify_index,
        "CreateTime": msg.create_time,
        "ModifyTime": msg.modify_time,
    }
