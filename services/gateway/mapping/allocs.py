"""Allocations as Nomad's api.Allocation and api.AllocationListStub."""

from __future__ import annotations

from typing import Any

from corral.v1 import structs_pb2 as pb
from services.gateway.mapping.common import Field, entry, rfc3339, to_nomad


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


#: api.AllocationListStub's fields
_STUB: tuple[Field, ...] = (
    "id",
    "eval_id",
    "name",
    "namespace",
    "node_id",
    "node_name",
    "job_id",
    "job_type",
    "job_version",
    "task_group",
    ("AllocatedResources", lambda m: _allocated_resources(m)),
    "desired_status",
    "desired_description",
    "client_status",
    "client_description",
    ("DesiredTransition", lambda m: to_nomad(m.desired_transition)),
    ("TaskStates", lambda m: _task_states(m.task_states)),
    ("DeploymentStatus", lambda m: _deployment_status(m)),
    "followup_eval_id",
    "next_allocation",
    (
        "RescheduleTracker",
        lambda m: to_nomad(m.reschedule_tracker) if m.HasField("reschedule_tracker") else None,
    ),
    ("PreemptedAllocations", lambda m: list(m.preempted_allocations) or None),
    "preempted_by_allocation",
    "create_index",
    "modify_index",
    "create_time",
    "modify_time",
)


def stub(msg: pb.Allocation) -> dict[str, Any]:
    """An allocation list entry (api.AllocationListStub)."""
    return entry(msg, _STUB)
