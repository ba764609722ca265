"""Nomad's JobStatusesJob (the answer of `/v1/jobs/statuses`, Nomad's
nomad/structs type: its api package has none) from Job.Statuses."""

from __future__ import annotations

from typing import Any

from corral.v1 import job_pb2


def _alloc(a: job_pb2.JobStatusesAlloc) -> dict[str, Any]:
    return {
        "ID": a.id,
        "Group": a.group,
        "ClientStatus": a.client_status,
        "NodeID": a.node_id,
        "DeploymentStatus": {
            "Canary": a.canary,
            "Healthy": a.healthy if a.HasField("healthy") else None,
        },
        "JobVersion": a.job_version,
        "FollowupEvalID": a.followup_eval_id,
        "HasPausedTask": False,  # tasks are paused only in Nomad Enterprise
    }


def _deployment(d: job_pb2.JobStatusesLatestDeployment) -> dict[str, Any]:
    return {
        "ID": d.id,
        "IsActive": d.is_active,
        "JobVersion": d.job_version,
        "Status": d.status,
        "StatusDescription": d.status_description,
        "AllAutoPromote": d.all_auto_promote,
        "RequiresPromotion": d.requires_promotion,
    }


def job_status(j: job_pb2.JobStatusesJob) -> dict[str, Any]:
    return {
        "ID": j.id,
        "Namespace": j.namespace,
        "Name": j.name,
        "Type": j.type,
        "NodePool": j.node_pool,
        "Datacenters": list(j.datacenters) or None,
        "Priority": j.priority,
        "Version": j.version,
        "SubmitTime": j.submit_time,
        "ModifyIndex": j.modify_index,
        "Allocs": [_alloc(a) for a in j.allocs] or None,
        "GroupCountSum": j.group_count_sum,
        # a parent's list is never null, even empty (Nomad)
        "ChildStatuses": list(j.child_statuses) if j.has_children else None,
        "ParentID": j.parent_id,
        "LatestDeployment": (
            _deployment(j.latest_deployment) if j.HasField("latest_deployment") else None
        ),
        "Stop": j.stop,
        "IsPack": j.is_pack,
        "Status": j.status,
    }
