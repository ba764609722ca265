"""Deployments: proto → Nomad's JSON (api/deployments.go's `Deployment`,
`DeploymentState` and `DeploymentUpdateResponse`), and the bodies of the
deployment actions (promote, pause, allocation health) → our requests."""

from __future__ import annotations

from typing import Any

from corral.domain.nomad_json import body_field as field
from corral.v1 import deployment_pb2
from corral.v1 import structs_pb2 as pb
from services.gateway.mapping.common import rfc3339


def deployment_state(state: pb.DeploymentState) -> dict[str, Any]:
    """One task group's progress (Nomad's `DeploymentState`)."""
    return {
        "PlacedCanaries": list(state.placed_canaries) or None,
        "AutoRevert": state.auto_revert,
        "AutoPromote": state.auto_promote,
        "ProgressDeadline": state.progress_deadline,
        "RequireProgressBy": rfc3339(state.require_progress_by),
        "Promoted": state.promoted,
        "DesiredCanaries": state.desired_canaries,
        "DesiredTotal": state.desired_total,
        "PlacedAllocs": state.placed_allocs,
        "HealthyAllocs": state.healthy_allocs,
        "UnhealthyAllocs": state.unhealthy_allocs,
    }


def deployment(d: pb.Deployment) -> dict[str, Any]:
    """Nomad's `Deployment` (the list and the read share one shape).

    `JobSpecModifyIndex` is the job's modify index (Corral keeps one);
    `IsMultiregion` is always false (one region)."""
    return {
        "ID": d.id,
        "Namespace": d.namespace or "default",
        "JobID": d.job_id,
        "JobVersion": d.job_version,
        "JobModifyIndex": d.job_modify_index,
        "JobSpecModifyIndex": d.job_modify_index,
        "JobCreateIndex": d.job_create_index,
        "IsMultiregion": False,
        "TaskGroups": {name: deployment_state(s) for name, s in sorted(d.task_groups.items())},
        "Status": d.status,
        "StatusDescription": d.status_description,
        "CreateIndex": d.create_index,
        "ModifyIndex": d.modify_index,
        "CreateTime": d.create_time,
        "ModifyTime": d.modify_time,
    }


def update_response(r: deployment_pb2.DeploymentUpdateResponse) -> dict[str, Any]:
    """Nomad's `DeploymentUpdateResponse`: the eval the action created and,
    after an auto-revert, the job version it registered."""
    return {
        "EvalID": r.eval_id,
        "EvalCreateIndex": r.eval_create_index,
        "DeploymentModifyIndex": r.deployment_modify_index,
        "RevertedJobVersion": r.reverted_job_version if r.reverted else None,
        "Index": r.index,
        "LastIndex": r.index,
        "RequestTime": 0,
    }


def promote_request(
    deployment_id: str, body: dict[str, Any]
) -> deployment_pb2.DeploymentPromoteRequest:
    """`{"All": true}` or `{"Groups": [...]}` (Nomad's `DeploymentPromoteRequest`)."""
    groups = field(body, "Groups") or []
    if not isinstance(groups, list) or not all(isinstance(g, str) for g in groups):
        raise ValueError("Groups must be a list of task group names")
    promote_all = field(body, "All", False)
    if not isinstance(promote_all, bool):
        raise ValueError("All must be true or false")
    return deployment_pb2.DeploymentPromoteRequest(
        deployment_id=deployment_id, groups=groups, all=promote_all
    )


def pause_request(
    deployment_id: str, body: dict[str, Any]
) -> deployment_pb2.DeploymentPauseRequest:
    """`{"Pause": true}` pauses, `{"Pause": false}` resumes."""
    pause = field(body, "Pause", False)
    if not isinstance(pause, bool):
        raise ValueError("Pause must be true or false")
    return deployment_pb2.DeploymentPauseRequest(deployment_id=deployment_id, pause=pause)


def _ids(body: dict[str, Any], key: str) -> list[str]:
    ids = field(body, key) or []
    if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
        raise ValueError(f"{key} must be a list of allocation IDs")
    return ids


def alloc_health_request(
    deployment_id: str, body: dict[str, Any]
) -> deployment_pb2.DeploymentAllocHealthRequest:
    """Nomad's `DeploymentAllocHealthRequest`: `HealthyAllocationIDs` and
    `UnhealthyAllocationIDs` (python-nomad spells the second
    `UnHealthyAllocationIDs`; Go's JSON decoding ignores case, so do we)."""
    return deployment_pb2.DeploymentAllocHealthRequest(
        deployment_id=deployment_id,
        healthy_alloc_ids=_ids(body, "HealthyAllocationIDs"),
        unhealthy_alloc_ids=_ids(body, "UnhealthyAllocationIDs"),
    )
