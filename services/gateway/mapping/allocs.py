"""Allocations as Nomad's api.Allocation and api.AllocationListStub."""

from __future__ import annotations

from typing import Any

from corral.v1 import structs_pb2 as pb
from services.gateway.mapping.absent import fill
from services.gateway.mapping.common import (
    Field,
    complete_resources,
    entry,
    networks,
    rfc3339,
    to_nomad,
)
from services.gateway.mapping.evals import metrics

#: Corral's own fields of an alloc, kept out of Nomad's api.Allocation: the
#: job's version, modify index, type and priority (Nomad's alloc embeds its
#: Job instead; its list stub carries JobVersion and JobType) and the trace
#: context of the plan that placed it
INTERNAL_FIELDS = ("JobVersion", "JobModifyIndex", "JobType", "JobPriority", "Traceparent")


def _task_event(e: pb.TaskEvent) -> dict[str, Any]:
    """api.TaskEvent: a restart's delay is Nomad's StartDelay."""
    out = to_nomad(e, {"restart_reason_delay": lambda _: None})
    del out["RestartReasonDelay"]
    out["StartDelay"] = e.restart_reason_delay
    return fill("TaskEvent", out) or out


def desired_transition(msg: pb.Allocation) -> dict[str, Any]:
    """api.DesiredTransition: a struct (never null), each flag a *bool."""
    dt = msg.desired_transition
    return {
        "Migrate": dt.migrate or None,
        "Reschedule": dt.reschedule or None,
        "ForceReschedule": dt.force_reschedule or None,
        "NoShutdownDelay": dt.no_shutdown_delay or None,
        "MigrateDisablePlacement": None,
    }


def task_state(msg: pb.TaskState) -> dict[str, Any]:
    """api.TaskState: its times are Go time.Time (RFC 3339), its events'
    times nanoseconds."""
    return to_nomad(
        msg,
        {
            "last_restart": rfc3339,
            "started_at": rfc3339,
            "finished_at": rfc3339,
            "events": lambda evs: [_task_event(e) for e in evs] or None,
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
            "Networks": networks([to_nomad(n) for n in r.networks]) or None,
            "Devices": [to_nomad(d) for d in r.allocated_devices] or None,
        }
    return {
        "Tasks": tasks or None,
        "Shared": {
            "DiskMB": msg.resources.disk_mb,
            "Networks": networks([to_nomad(n) for n in msg.resources.networks]) or None,
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
            "desired_transition": lambda _: desired_transition(msg),
            "metrics": lambda m: metrics(to_nomad(m)) if msg.HasField("metrics") else None,
        },
    )
    for key in INTERNAL_FIELDS:
        del out[key]
    complete_resources(out["Resources"])
    for task_resources in (out["TaskResources"] or {}).values():
        complete_resources(task_resources)
    out["AllocatedResources"] = _allocated_resources(msg)
    out["Job"] = job
    out["Services"] = None
    return fill("Allocation", out) or out


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
    ("DesiredTransition", desired_transition),
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
