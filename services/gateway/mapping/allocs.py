"""Allocations as Nomad's api.Allocation and api.AllocationListStub."""

from __future__ import annotations

from typing import Any

from corral.v1 import structs_pb2 as pb
from services.gateway.mapping.common import rfc3339, to_nomad


def task_state(msg: pb.TaskState) -> dict[str, Any]:
    """api.TaskState: its times are Go time.Time (RFC 3339), its events'
    times nanoseconds."""
    return to_nomad(
        msg,
        {
            "last_restart": rfc3339,
            "started_at": rfc3339,
            "finished_at": rfc3339,
            "events": lambda evs: [to_nomad(e) for e in evs] or None,
        },
    )


def _task_states(states: Any) -> dict[str, Any] | None:
    return {name: task_state(s) for name, s in states.items()} or None


def _deployment_status(msg: pb.Allocation) -> dict[str, Any] | None:
    if not msg.HasField("deployment_status"):
        return None
    ds = msg.deployment_status
    return {
        "Healthy": ds.healthy if ds.HasField("healthy") else None,
        "Timestamp": rfc3339(ds.timestamp),
        "Canary": ds.canary,
        "ModifyIndex": ds.modify_index,
    }


def _allocated_resources(msg: pb.Allocation) -> dict[str, Any]:
    """Nomad's AllocatedResources from our per-task and group resources."""
    tasks = {}
    for name, r in msg.task_resources.items():
        tasks[name] = {
            "Cpu": {"CpuShares": r.cpu, "ReservedCores": None},
            "Memory": {"MemoryMB": r.memory_mb, "MemoryMaxMB": r.memory_max_mb},
            "Networks": [to_nomad(n) for n in r.networks] or None,
            "Devices": [to_nomad(d) for d in r.allocated_devices] or None,
        }
    return {
        "Tasks": tasks or None,
        "Shared": {
            "DiskMB": msg.resources.disk_mb,
            "Networks": [to_nomad(n) for n in msg.resources.networks] or None,
            "Ports": None,
        },
    }


def alloc(msg: pb.Allocation, job: dict[str, Any] | None = None) -> dict[str, Any]:
    """A full allocation (api.Allocation); `job` is the Nomad JSON of its
    job version when the caller has it (Nomad embeds it)."""
    out = to_nomad(
        msg,
        {
            "task_states": _task_states,
            "deployment_status": lambda _: _deployment_status(msg),
            "alloc_states": lambda states: (
                [{"Field": st.field, "Value": st.value, "Time": rfc3339(st.time)} for st in states]
                or None
            ),
            "traceparent": lambda v: v,
        },
    )
    out["AllocatedResources"] = _allocated_resources(msg)
    out["Job"] = job
    out["Services"] = None
    return out


def stub(msg: pb.Allocation) -> dict[str, Any]:
    """An allocation list entry (api.AllocationListStub)."""
    return {
        "ID": msg.id,
        "EvalID": msg.eval_id,
        "Name": msg.name,
        "Namespace": msg.namespace,
        "NodeID": msg.node_id,
        "NodeName": msg.node_name,
        "JobID": msg.job_id,
        "JobType": msg.job_type,
        "JobVersion": msg.job_version,
        "TaskGroup": msg.task_group,
        "AllocatedResources": _allocated_resources(msg),
        "DesiredStatus": msg.desired_status,
        "DesiredDescription": msg.desired_description,
        "ClientStatus": msg.client_status,
        "ClientDescription": msg.client_description,
        "DesiredTransition": to_nomad(msg.desired_transition),
        "TaskStates": _task_states(msg.task_states),
        "DeploymentStatus": _deployment_status(msg),
        "FollowupEvalID": msg.followup_eval_id,
        "NextAllocation": msg.next_allocation,
        "RescheduleTracker": to_nomad(msg.reschedule_tracker)
        if msg.HasField("reschedule_tracker")
        else None,
        "PreemptedAllocations": list(msg.preempted_allocations) or None,
        "PreemptedByAllocation": msg.preempted_by_allocation,
        "CreateIndex": msg.create_index,
        "ModifyIndex": msg.modify_index,
        "CreateTime": msg.create_time,
        "ModifyTime": msg.modify_time,
    }
