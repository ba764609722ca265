"""Jobs: our Job / JobListStub / JobSummary protos as Nomad's api.Job,
api.JobListStub and api.JobSummary, and Nomad's job JSON as our Job (through
the CLI's own parser of Nomad's JSON, corral/domain/jobspec/json.py)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import unquote_plus

from google.protobuf.message import Message

from corral.domain import actions as job_actions
from corral.domain.jobspec import json as jobspec_json
from corral.domain.jobspec.errors import JobspecError
from corral.v1 import job_pb2
from corral.v1 import structs_pb2 as pb
from services.gateway.mapping.absent import fill, fill_all
from services.gateway.mapping.common import (
    Field,
    complete_resources,
    entry,
    networks,
    rfc3339,
    to_nomad,
)
from services.gateway.mapping.evals import evaluation, metrics
from services.gateway.mapping.services import check_header

#: the region of a job stored before jobs carried theirs (Nomad's default name)
REGION = "global"


class JobInputError(ValueError):
    """A submitted job Nomad's JSON parser refused; the message names the field."""


def _periodic(p: pb.PeriodicConfig) -> dict[str, Any]:
    return {
        "Enabled": p.enabled,
        "Spec": p.spec,
        "Specs": list(p.crons) or None,
        "SpecType": "cron",
        "ProhibitOverlap": p.prohibit_overlap,
        "TimeZone": p.time_zone or "UTC",
    }


def job(msg: pb.Job) -> dict[str, Any]:
    """A job as Nomad's api.Job."""
    out = to_nomad(
        msg,
        {
            "periodic": lambda p: _periodic(p) if msg.HasField("periodic") else None,
        },
    )
    out["Region"] = msg.region or REGION
    out["Multiregion"] = None
    out["Dispatched"] = msg.dispatched
    fill("Job", out)
    for tg in out.get("TaskGroups") or []:
        fill("TaskGroup", tg)
        networks(tg.get("Networks"))
        _nomad_services(tg)
        if tg.get("Scaling") is not None:
            tg["Scaling"]["Namespace"] = msg.namespace
        for task in tg.get("Tasks") or []:
            fill("Task", task)
            fill("LogConfig", task.get("LogConfig"))
            fill("WorkloadIdentity", task.get("Identity"))
            fill_all("WorkloadIdentity", task.get("Identities"))
            complete_resources(task.get("Resources"))
            _nomad_services(task)
            for policy in task.get("ScalingPolicies") or []:
                policy["Namespace"] = msg.namespace
    return out


def actions(msg: pb.Job) -> list[dict[str, Any]]:
    """Nomad's []*JobAction of a job: each action with its task and group."""
    return [
        {
            "Name": a.name,
            "Command": a.command,
            "Args": list(a.args) or None,
            "TaskName": task,
            "TaskGroupName": group,
        }
        for group, task, a in job_actions.of_job(msg)
    ]


def _nomad_services(owner: dict[str, Any]) -> None:
    """A group's or task's services as Nomad spells them: check headers as
    map[string][]string, Nomad's fields Corral lacks at their unset values."""
    for service in owner.get("Services") or []:
        fill("Service", service)
        for check in service.get("Checks") or []:
            fill("ServiceCheck", check)
            check["Header"] = check_header(check.get("Header"))


def _summary(
    job_id: str, namespace: str, groups: Mapping[str, Message], create_index: int, modify_index: int
) -> dict[str, Any]:
    return {
        "JobID": job_id,
        "Namespace": namespace,
        "Summary": {name: to_nomad(tg) for name, tg in groups.items()},
        "Children": {"Pending": 0, "Running": 0, "Dead": 0},
        "CreateIndex": create_index,
        "ModifyIndex": modify_index,
    }


def summary(msg: pb.JobSummary) -> dict[str, Any]:
    """api.JobSummary (Children: dispatched/periodic children are not counted)."""
    return _summary(msg.job_id, msg.namespace, msg.summary, msg.create_index, msg.modify_index)


#: api.JobListStub's fields (its JobSummary is the job's own)
_STUB: tuple[Field, ...] = (
    "id",
    "parent_id",
    "name",
    "namespace",
    ("Datacenters", lambda m: list(m.datacenters) or None),
    ("Multiregion", lambda m: None),
    "type",
    "priority",
    "periodic",
    "parameterized",
    "stop",
    "status",
    ("StatusDescription", lambda m: ""),
    (
        "JobSummary",
        lambda m: _summary(m.id, m.namespace, m.summary, m.create_index, m.modify_index),
    ),
    "create_index",
    "modify_index",
    "job_modify_index",
    "submit_time",
    "node_pool",
    ("Meta", lambda m: dict(m.meta) or None),
)


def stub(msg: job_pb2.JobListStub) -> dict[str, Any]:
    """A job list entry as Nomad's api.JobListStub."""
    return entry(msg, _STUB)


def register_response(resp: job_pb2.JobRegisterResponse) -> dict[str, Any]:
    """api.JobRegisterResponse."""
    return {
        "EvalID": resp.eval_id,
        "EvalCreateIndex": resp.eval_create_index,
        "JobModifyIndex": resp.job_modify_index,
        "Warnings": resp.warnings,
        "Index": resp.index,
        "LastContact": 0,
        "KnownLeader": True,
    }


def submission(msg: pb.JobSubmission) -> dict[str, Any]:
    """api.JobSubmission as GET /v1/job/:id/submission answers it (the
    variable flags as they were given, not escaped)."""
    return {
        "Source": msg.source,
        "Format": msg.format,
        "VariableFlags": dict(msg.variable_flags) or None,
        "Variables": msg.variables,
        "Namespace": msg.namespace,
        "JobID": msg.job_id,
        "Version": msg.version,
        "JobModifyIndex": msg.job_modify_index,
    }


def submission_from_nomad(data: Any) -> pb.JobSubmission | None:
    """A register request's `Submission`. Nomad's api client query-escapes
    each variable flag's value (api.JobSubmission.Canonicalize) and its
    agent unescapes them on the way out; here they are unescaped on the way
    in, so the state keeps what the user wrote."""
    if data is None:
        return None
    if not isinstance(data, dict):
        raise JobInputError("Submission: expected an object")
    out = pb.JobSubmission()
    for key, field in (("Source", "source"), ("Format", "format"), ("Variables", "variables")):
        value = data.get(key)
        if value is None:
            continue
        if not isinstance(value, str):
            raise JobInputError(f"Submission.{key}: expected a string")
        setattr(out, field, value)
    flags = data.get("VariableFlags")
    if flags is not None:
        if not isinstance(flags, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in flags.items()
        ):
            raise JobInputError("Submission.VariableFlags: expected an object of strings")
        out.variable_flags.update({k: unquote_plus(v) for k, v in flags.items()})
    return out


def deregister_response(resp: job_pb2.JobDeregisterResponse) -> dict[str, Any]:
    """api.JobDeregisterResponse."""
    return {
        "EvalID": resp.eval_id,
        "EvalCreateIndex": resp.eval_create_index,
        "JobModifyIndex": resp.job_modify_index,
        "Index": resp.index,
        "LastContact": 0,
        "KnownLeader": True,
    }


def from_nomad(data: Any) -> pb.Job:
    """Nomad's api.Job JSON as our Job, with Nomad's defaults applied and
    validated (raises JobInputError naming the field)."""
    if not isinstance(data, dict):
        raise JobInputError("Job must be a JSON object")
    try:
        return jobspec_json.from_nomad(data, "job")
    except JobspecError as exc:
        what = f"{exc.field}: {exc.problem}" if exc.field else exc.problem
        raise JobInputError(what) from None


def _field_diff(d: job_pb2.FieldDiff) -> dict[str, Any]:
    return {"Type": d.type, "Name": d.name, "Old": d.old, "New": d.new, "Annotations": None}


def _object_diff(d: job_pb2.ObjectDiff) -> dict[str, Any]:
    return {
        "Type": d.type,
        "Name": d.name,
        "Fields": [_field_diff(f) for f in d.fields] or None,
        "Objects": [_object_diff(o) for o in d.objects] or None,
    }


def diff(d: job_pb2.JobDiff) -> dict[str, Any]:
    """api.JobDiff (task diffs are folded into the group's objects)."""
    return {
        "Type": d.type,
        "ID": d.id,
        "Fields": [_field_diff(f) for f in d.fields] or None,
        "Objects": [_object_diff(o) for o in d.objects] or None,
        "TaskGroups": [
            {
                "Type": tg.type,
                "Name": tg.name,
                "Fields": [_field_diff(f) for f in tg.fields] or None,
                "Objects": [_object_diff(o) for o in tg.objects] or None,
                "Tasks": None,
                "Updates": dict(tg.updates) or None,
            }
            for tg in d.task_groups
        ]
        or None,
    }


def plan_response(resp: job_pb2.JobPlanResponse) -> dict[str, Any]:
    """api.JobPlanResponse."""
    return {
        "JobModifyIndex": resp.job_modify_index,
        "CreatedEvals": [evaluation(e) for e in resp.created_evals] or None,
        "Diff": diff(resp.diff) if resp.HasField("diff") else None,
        "Annotations": to_nomad(resp.annotations) if resp.HasField("annotations") else None,
        "FailedTGAllocs": {k: metrics(to_nomad(v)) for k, v in resp.failed_tg_allocs.items()}
        or None,
        "NextPeriodicLaunch": rfc3339(resp.next_periodic_launch),
        "Warnings": resp.warnings,
    }


def scale_status(msg: pb.Job, allocs: list[pb.Allocation]) -> dict[str, Any]:
    """api.JobScaleStatusResponse from the job and its live allocations."""
    groups: dict[str, dict[str, Any]] = {}
    for tg in msg.task_groups:
        groups[tg.name] = {
            "Desired": tg.count,
            "Placed": 0,
            "Running": 0,
            "Healthy": 0,
            "Unhealthy": 0,
            "Events": None,
        }
    for a in allocs:
        g = groups.get(a.task_group)
        if g is None or a.desired_status != "run":
            continue
        g["Placed"] += 1
        if a.client_status == "running":
            g["Running"] += 1
        if a.HasField("deployment_status") and a.deployment_status.HasField("healthy"):
            g["Healthy" if a.deployment_status.healthy else "Unhealthy"] += 1
    return {
        "JobID": msg.id,
        "Namespace": msg.namespace,
        "JobModifyIndex": msg.job_modify_index,
        "JobCreateIndex": msg.create_index,
        "JobStopped": msg.stop,
        "TaskGroups": groups,
    }
