"""Scaling policies and a job's scale status as Nomad's api.ScalingPolicy,
api.ScalingPolicyListStub and api.JobScaleStatusResponse, and Nomad's
api.ScalingRequest body (`POST /v1/job/:id/scale`) as our JobScaleRequest:
the shapes nomad-autoscaler reads and sends."""

from __future__ import annotations

from typing import Any

from google.protobuf import json_format
from google.protobuf.struct_pb2 import Struct

from corral.domain.nomad_json import body_field, body_string
from corral.v1 import job_pb2, scaling_pb2
from corral.v1 import structs_pb2 as pb
from services.gateway.mapping.common import to_nomad

#: Nomad's bound on a task group's count (an int in Go)
MAX_COUNT = 2**31 - 1


def policy(msg: pb.ScalingPolicy) -> dict[str, Any]:
    """api.ScalingPolicy (Min, Max and Enabled always set on a stored one;
    its namespace is its target's)."""
    out = to_nomad(msg)
    out["Namespace"] = msg.target.get("Namespace", "")
    return out


def policy_stub(msg: scaling_pb2.ScalingPolicyListStub) -> dict[str, Any]:
    """api.ScalingPolicyListStub."""
    return to_nomad(msg)


def _event(e: pb.ScalingEvent) -> dict[str, Any]:
    return {
        "Count": e.count if e.HasField("count") else None,
        "PreviousCount": e.previous_count,
        "Error": e.error,
        "Message": e.message,
        "Meta": json_format.MessageToDict(e.meta) if e.HasField("meta") else None,
        "EvalID": e.eval_id or None,
        "Time": e.time,
        "CreateIndex": e.create_index,
    }


def scale_status(msg: job_pb2.JobScaleStatusResponse) -> dict[str, Any]:
    """api.JobScaleStatusResponse: per group, events newest first."""
    return {
        "JobID": msg.job_id,
        "Namespace": msg.namespace,
        "JobCreateIndex": msg.job_create_index,
        "JobModifyIndex": msg.job_modify_index,
        "JobStopped": msg.job_stopped,
        "TaskGroups": {
            name: {
                "Desired": tg.desired,
                "Placed": tg.placed,
                "Running": tg.running,
                "Healthy": tg.healthy,
                "Unhealthy": tg.unhealthy,
                "Events": [_event(e) for e in tg.events] or None,
            }
            for name, tg in msg.task_groups.items()
        },
    }


def scale_request(body: dict[str, Any], job_id: str, namespace: str) -> job_pb2.JobScaleRequest:
    """Nomad's api.ScalingRequest (Count, Target{Namespace, Job, Group},
    Message, Error, Meta, JobModifyIndex) for `job_id` in `namespace`;
    ValueError names what is wrong, in Nomad's words where it has them."""
    target = body_field(body, "Target") or {}
    if not isinstance(target, dict) or not all(isinstance(v, str) for v in target.values()):
        raise ValueError("Target must be an object of strings")
    if target.get("Job") not in (None, "", job_id):
        raise ValueError("job ID in payload did not match URL")
    if target.get("Namespace") not in (None, "", namespace):
        raise ValueError("namespace in payload did not match header")
    group = target.get("Group") or ""
    if not group:
        raise ValueError("missing task group name for scaling action")
    error = body_field(body, "Error", False)
    if not isinstance(error, bool):
        raise ValueError("Error must be true or false")
    out = job_pb2.JobScaleRequest(
        job_id=job_id,
        namespace=namespace,
        group=group,
        message=body_string(body_field(body, "Message"), "Message"),
        error=error,
    )
    count = body_field(body, "Count")
    if count is not None:
        if isinstance(count, bool) or not isinstance(count, int | float):
            raise ValueError("Count must be a whole number")
        if isinstance(count, float) and not count.is_integer():
            raise ValueError("Count must be a whole number")
        if count < 0:
            raise ValueError("scaling action count can't be negative")
        if error:
            raise ValueError("scaling action should not contain count if error is true")
        if count > MAX_COUNT:
            raise ValueError(f"new scaling count is too large for TaskGroup.Count (int): {count}")
        out.count = int(count)
    meta = body_field(body, "Meta")
    if meta is not None:
        if not isinstance(meta, dict):
            raise ValueError("Meta must be an object")
        try:
            out.meta.CopyFrom(_struct(meta))
        except (ValueError, TypeError, RecursionError) as exc:
            raise ValueError(f"Meta: {exc}") from None
    modify_index = body_field(body, "JobModifyIndex")
    if modify_index not in (None, 0):
        if isinstance(modify_index, bool) or not isinstance(modify_index, int) or modify_index < 0:
            raise ValueError("JobModifyIndex must be a whole number")
        out.enforce_index = True
        out.job_modify_index = modify_index
    return out


def _struct(data: dict[str, Any]) -> Struct:
    s = Struct()
    s.update(data)
    return s
