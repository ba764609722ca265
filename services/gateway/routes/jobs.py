"""/v1/jobs and /v1/job/:id/... (Nomad's command/agent/job_endpoint.go
semantics): list, register, read, update, deregister, plan, the job's
allocations, evaluations, versions, summary, actions, scale, dispatch and
periodic force (a job action's run is a WebSocket: alloc_exec.py).

Job ids may hold slashes (a periodic job's children are `<id>/periodic-<t>`),
so `/v1/job/{id}/<action>` routes take the id as a path and `FALLBACK`
(appended by app.py after every module's routes) serves the bare
`/v1/job/{id}`."""

from __future__ import annotations

import base64
import binascii
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute

from corral.runtime.settings import REGION_NAME
from corral.v1 import job_pb2, periodic_pb2, query_pb2
from corral.v1 import structs_pb2 as pb
from services.gateway.authz import READ_JOB, SUBMIT_JOB, ApiRoute, ns
from services.gateway.backend import DEFAULT_TIMEOUT
from services.gateway.http import (
    INT32_MAX,
    NomadError,
    QueryOptions,
    backend_of,
    bad_request,
    body_bytes,
    bool_param,
    json_body,
    listing,
    metadata_of,
    region_of,
    respond,
    unserved,
    whole,
)
from services.gateway.mapping import allocs as alloc_map
from services.gateway.mapping import evals as eval_map
from services.gateway.mapping import jobs as job_map
from services.gateway.mapping import scaling as scaling_map
from services.gateway.mapping.jobs import JobInputError

#: the actions under /v1/job/{id}/ (a DELETE of `/v1/job/x/summary` is a
#: wrong method, not the deregistration of a job named "x/summary")
JOB_ACTIONS = frozenset(
    {
        "plan",
        "allocations",
        "evaluations",
        "versions",
        "summary",
        "scale",
        "dispatch",
        "periodic/force",
        "evaluate",
        "revert",
        "stable",
        "deployments",
        "deployment",
        "services",
        "submission",
        "action",
        "actions",
        "tag",
    }
)


def _namespace(request: Request) -> str:
    return request.query_params.get("namespace", "") or "default"


def _job_arg(body: Any) -> Any:
    if not isinstance(body, dict):
        raise bad_request("Job must be specified")
    job = body.get("Job")
    if job is None:
        raise bad_request("Job must be specified")
    return job


def _parse_job(request: Request, data: Any) -> pb.Job:
    try:
        job = job_map.from_nomad(data)
    except JobInputError as exc:
        raise bad_request(str(exc)) from None
    if not (isinstance(data, dict) and data.get("Namespace")):
        job.namespace = _namespace(request)
    return job


def _job_region(request: Request, body: Any, job: pb.Job) -> str:
    """Where a submitted job goes and runs (Nomad's regionForJob):
    `?region=`, else the request body's `Region`, else the job's own
    (`global` meaning none), else '' (the gateway's region). The job is
    given that region; the call is forwarded there."""
    given = body.get("Region") if isinstance(body, dict) else None
    region = region_of(request) or (given if isinstance(given, str) else "") or job.region
    if region == "global":
        region = ""
    if region and not REGION_NAME.match(region):
        raise bad_request(f"Invalid region: {region[:100]!r}")
    job.region = region
    return region


async def _register(request: Request, path_id: str | None) -> Response:
    body = await json_body(request)
    data = _job_arg(body)
    if path_id is not None and isinstance(data, dict) and data.get("ID") not in (None, path_id):
        raise bad_request("Job ID does not match name")
    job = _parse_job(request, data)
    region = _job_region(request, body, job)
    try:
        submission = job_map.submission_from_nomad(body.get("Submission"))
    except JobInputError as exc:
        raise bad_request(str(exc)) from None
    enforce = bool(body.get("EnforceIndex"))
    modify_index = whole(body.get("JobModifyIndex"), "JobModifyIndex")
    priority = whole(body.get("EvalPriority"), "EvalPriority", high=INT32_MAX)
    resp = await backend_of(request).jobs.Register(
        job_pb2.JobRegisterRequest(
            job=job,
            enforce_index=enforce,
            job_modify_index=modify_index,
            eval_priority=priority,
            submission=submission,
        ),
        metadata=metadata_of(request, region),
        timeout=DEFAULT_TIMEOUT,
    )
    return respond(request, job_map.register_response(resp), index=resp.index)


# -- /v1/jobs --------------------------------------------------------------


async def jobs_list_or_register(request: Request) -> Response:
    if request.method in ("PUT", "POST"):
        return await _register(request, None)
    q = QueryOptions.from_request(request)
    backend = backend_of(request)

    async def call(query: query_pb2.QueryOptions) -> tuple[list[dict[str, Any]], Any]:
        resp = await backend.jobs.List(
            job_pb2.JobListRequest(query=query), metadata=q.metadata, timeout=q.timeout
        )
        return [job_map.stub(j) for j in resp.jobs], resp.meta

    # the state's order and tokens: `<namespace>.<id>`, as Nomad's
    return await listing(request, q, call, key=lambda j: f"{j['Namespace']}.{j['ID']}")


# -- /v1/job/{id} ----------------------------------------------------------


def _job_id(request: Request) -> str:
    job_id: str = request.path_params["job_id"]
    if not job_id:
        raise NomadError(404, "Missing job ID")
    return job_id


async def job(request: Request) -> Response:
    job_id = _job_id(request)
    head, _, tail = job_id.rpartition("/")
    if head and (tail in JOB_ACTIONS or job_id.endswith(("/periodic/force", "/dispatch/payload"))):
        # an action of a job: served with another method, or not at all
        from services.gateway.routes.unserved import wrong_method

        if wrong_method(request, skip=FALLBACK[0]):
            raise NomadError(405, "Invalid method")
        if tail == "action":
            raise bad_request("a job action runs over a WebSocket: send Upgrade: websocket")
        raise unserved(f"{request.method} /v1/job/:id/{tail}")
    if request.method == "GET":
        q = QueryOptions.from_request(request)
        resp = await backend_of(request).jobs.Get(
            job_pb2.JobGetRequest(job_id=job_id, query=q.proto()),
            metadata=q.metadata,
            timeout=q.timeout,
        )
        return respond(request, job_map.job(resp.job), index=resp.meta.index)
    if request.method in ("PUT", "POST"):
        return await _register(request, job_id)
    # DELETE: deregister (purge removes it and its versions)
    dereg = await backend_of(request).jobs.Deregister(
        job_pb2.JobDeregisterRequest(
            job_id=job_id, namespace=_namespace(request), purge=bool_param(request, "purge")
        ),
        metadata=metadata_of(request),
        timeout=DEFAULT_TIMEOUT,
    )
    return respond(request, job_map.deregister_response(dereg), index=dereg.index)


async def job_allocations(request: Request) -> Response:
    q = QueryOptions.from_request(request)
    resp = await backend_of(request).jobs.Allocations(
        job_pb2.JobGetRequest(
            job_id=_job_id(request), query=q.proto(), all=bool_param(request, "all")
        ),
        metadata=q.metadata,
        timeout=q.timeout,
    )
    return respond(request, [alloc_map.stub(a) for a in resp.allocs], index=resp.meta.index)


async def job_evaluations(request: Request) -> Response:
    q = QueryOptions.from_request(request)
    resp = await backend_of(request).jobs.Evaluations(
        job_pb2.JobGetRequest(job_id=_job_id(request), query=q.proto(), all=True),
        metadata=q.metadata,
        timeout=q.timeout,
    )
    return respond(request, [eval_map.evaluation(e) for e in resp.evals], index=resp.meta.index)


async def job_versions(request: Request) -> Response:
    q = QueryOptions.from_request(request)
    diffs = bool_param(request, "diffs")
    resp = await backend_of(request).jobs.Versions(
        job_pb2.JobVersionsRequest(job_id=_job_id(request), query=q.proto(), diffs=diffs),
        metadata=q.metadata,
        timeout=q.timeout,
    )
    body = {
        "Versions": [job_map.job(v) for v in resp.versions],
        "Diffs": [job_map.diff(d) for d in resp.diffs] if diffs else None,
        "Index": resp.meta.index,
        "KnownLeader": True,
        "LastContact": 0,
    }
    return respond(request, body, index=resp.meta.index)


async def job_submission(request: Request) -> Response:
    """Nomad requires `version`; so do we (the CLI's gRPC call may omit it)."""
    q = QueryOptions.from_request(request)
    raw = request.query_params.get("version")
    if raw is None or not raw.isascii() or not raw.isdigit():
        raise bad_request("Unable to parse job submission version parameter")
    version = whole(int(raw), "version")
    resp = await backend_of(request).jobs.GetSubmission(
        job_pb2.JobSubmissionRequest(job_id=_job_id(request), version=version, query=q.proto()),
        metadata=q.metadata,
        timeout=q.timeout,
    )
    return respond(request, job_map.submission(resp.submission), index=resp.meta.index)


async def job_actions(request: Request) -> Response:
    """Nomad's Job.GetActions: every action of the job's tasks, flattened,
    each with its task and group (a list of Nomad's JobAction)."""
    q = QueryOptions.from_request(request)
    resp = await backend_of(request).jobs.Get(
        job_pb2.JobGetRequest(job_id=_job_id(request), query=q.proto()),
        metadata=q.metadata,
        timeout=q.timeout,
    )
    return respond(request, job_map.actions(resp.job), index=resp.meta.index)


async def job_summary(request: Request) -> Response:
    q = QueryOptions.from_request(request)
    resp = await backend_of(request).jobs.Summary(
        job_pb2.JobGetRequest(job_id=_job_id(request), query=q.proto()),
        metadata=q.metadata,
        timeout=q.timeout,
    )
    return respond(request, job_map.summary(resp.summary), index=resp.meta.index)


async def job_plan(request: Request) -> Response:
    job_id = _job_id(request)
    body = await json_body(request)
    data = _job_arg(body)
    if isinstance(data, dict) and data.get("ID") not in (None, job_id):
        raise bad_request("Job ID does not match")
    job = _parse_job(request, data)
    region = _job_region(request, body, job)
    resp = await backend_of(request).jobs.Plan(
        job_pb2.JobPlanRequest(job=job, diff=bool(body.get("Diff"))),
        metadata=metadata_of(request, region),
        timeout=DEFAULT_TIMEOUT,
    )
    return respond(request, job_map.plan_response(resp), index=resp.index)


async def job_scale(request: Request) -> Response:
    """GET: the scale status with each group's scaling events; PUT/POST:
    Nomad's api.ScalingRequest (a count, or with none only an event)."""
    job_id = _job_id(request)
    backend = backend_of(request)
    if request.method == "GET":
        q = QueryOptions.from_request(request)
        status = await backend.jobs.ScaleStatus(
            job_pb2.JobGetRequest(job_id=job_id, query=q.proto(paginate=False)),
            metadata=q.metadata,
            timeout=q.timeout,
        )
        return respond(request, scaling_map.scale_status(status), index=status.meta.index)
    body = await json_body(request)
    if not isinstance(body, dict):
        raise bad_request("Scaling request must be a JSON object")
    try:
        scale = scaling_map.scale_request(body, job_id, _namespace(request))
    except ValueError as exc:
        raise bad_request(str(exc)) from None
    resp = await backend.jobs.Scale(scale, metadata=metadata_of(request), timeout=DEFAULT_TIMEOUT)
    return respond(request, job_map.register_response(resp), index=resp.index)


async def job_dispatch(request: Request) -> Response:
    body = await json_body(request) or {}
    if not isinstance(body, dict):
        raise bad_request("Dispatch request must be a JSON object")
    payload = body.get("Payload") or ""
    try:
        raw = base64.b64decode(payload, validate=True) if payload else b""
    except (binascii.Error, TypeError):
        raise bad_request("Payload must be base64") from None
    meta = body.get("Meta") or {}
    if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
        raise bad_request("Meta must be an object of strings")
    resp = await backend_of(request).jobs.Dispatch(
        job_pb2.JobDispatchRequest(
            job_id=_job_id(request),
            namespace=_namespace(request),
            payload=raw,
            meta=meta,
            id_prefix_template=str(body.get("IdPrefixTemplate") or ""),
        ),
        metadata=metadata_of(request),
        timeout=DEFAULT_TIMEOUT,
    )
    return respond(request, _dispatch_response(resp), index=resp.index)


def _dispatch_response(resp: job_pb2.JobDispatchResponse) -> dict[str, Any]:
    return {
        "DispatchedJobID": resp.dispatched_job_id,
        "EvalID": resp.eval_id,
        "EvalCreateIndex": resp.eval_create_index,
        "JobCreateIndex": resp.job_create_index,
        "Index": resp.index,
    }


async def job_dispatch_payload(request: Request) -> Response:
    """Nomad's dispatch with the request body, as it is, for the payload
    (no meta): `curl --data-binary @file .../dispatch/payload`."""
    raw = await body_bytes(request)
    resp = await backend_of(request).jobs.Dispatch(
        job_pb2.JobDispatchRequest(
            job_id=_job_id(request), namespace=_namespace(request), payload=raw
        ),
        metadata=metadata_of(request),
        timeout=DEFAULT_TIMEOUT,
    )
    return respond(request, _dispatch_response(resp), index=resp.index)


async def job_periodic_force(request: Request) -> Response:
    resp = await backend_of(request).periodic.Force(
        periodic_pb2.PeriodicForceRequest(job_id=_job_id(request), namespace=_namespace(request)),
        metadata=metadata_of(request),
        timeout=60,
    )
    out = {"EvalID": resp.eval_id, "EvalCreateIndex": resp.eval_create_index, "Index": resp.index}
    return respond(request, out, index=resp.index)


async def job_revert(request: Request) -> Response:
    body = await json_body(request)
    if not isinstance(body, dict):
        raise bad_request("revert request must be a JSON object")
    if body.get("JobVersion") is None:
        raise bad_request("JobVersion must be set")
    version = whole(body.get("JobVersion"), "JobVersion")
    prior_given = body.get("EnforcePriorVersion") is not None
    prior = whole(body.get("EnforcePriorVersion"), "EnforcePriorVersion")
    resp = await backend_of(request).jobs.Revert(
        job_pb2.JobRevertRequest(
            job_id=_job_id(request),
            namespace=_namespace(request),
            version=version,
            enforce_prior_version=prior_given,
            prior_version=prior,
        ),
        metadata=metadata_of(request),
        timeout=DEFAULT_TIMEOUT,
    )
    return respond(request, job_map.register_response(resp), index=resp.index)


async def _optional_body(request: Request) -> dict[str, Any]:
    body = await json_body(request)
    if body is None:
        return {}
    if not isinstance(body, dict):
        raise bad_request("request body must be a JSON object")
    return body


async def job_evaluate(request: Request) -> Response:
    """Nomad's force-evaluate: a body is optional (Nomad's compatibility
    with clients sending none); with one, its `JobID` must name the job."""
    job_id = _job_id(request)
    body = await _optional_body(request)
    if body:
        if not body.get("JobID"):
            raise bad_request("Job ID must be specified")
        if body["JobID"] != job_id:
            raise bad_request("JobID not same as job name")
    options = body.get("EvalOptions") or {}
    if not isinstance(options, dict):
        raise bad_request("EvalOptions must be a JSON object")
    force = options.get("ForceReschedule", False)
    if not isinstance(force, bool):
        raise bad_request("EvalOptions.ForceReschedule must be true or false")
    resp = await backend_of(request).jobs.Evaluate(
        job_pb2.JobEvaluateRequest(
            job_id=job_id, namespace=_namespace(request), force_reschedule=force
        ),
        metadata=metadata_of(request),
        timeout=DEFAULT_TIMEOUT,
    )
    return respond(request, job_map.register_response(resp), index=resp.index)


async def job_stable(request: Request) -> Response:
    job_id = _job_id(request)
    body = await _optional_body(request)
    if not body.get("JobID"):
        raise bad_request("JobID must be specified")
    if body["JobID"] != job_id:
        raise bad_request("Job ID does not match")
    stable = body.get("Stable", False)
    if not isinstance(stable, bool):
        raise bad_request("Stable must be true or false")
    resp = await backend_of(request).jobs.Stable(
        job_pb2.JobStableRequest(
            job_id=job_id,
            namespace=_namespace(request),
            version=whole(body.get("JobVersion"), "JobVersion"),
            stable=stable,
        ),
        metadata=metadata_of(request),
        timeout=DEFAULT_TIMEOUT,
    )
    out = {"JobModifyIndex": resp.job_modify_index, "Index": resp.index}
    return respond(request, out, index=resp.index)


async def job_version_tag(request: Request) -> Response:
    """Nomad's version tags: PUT/POST `{"Version", "Latest", "Description"}`
    names a version (`Latest`: the current one; otherwise `Version`, 0 when
    absent, as Nomad reads it), DELETE takes the name away. Answers Nomad's
    JobTagResponse."""
    job_id, name = _job_id(request), request.path_params["name"]
    req = job_pb2.JobTagVersionRequest(job_id=job_id, namespace=_namespace(request), name=name)
    if request.method == "DELETE":
        req.unset = True
    else:
        body = await _optional_body(request)
        version = body.get("Version")
        latest = body.get("Latest", False)
        if not isinstance(latest, bool):
            raise bad_request("Latest must be true or false")
        description = body.get("Description") or ""
        if not isinstance(description, str):
            raise bad_request("Description must be a string")
        req.version = whole(version, "Version")
        req.latest = latest
        req.description = description
    resp = await backend_of(request).jobs.TagVersion(
        req, metadata=metadata_of(request), timeout=DEFAULT_TIMEOUT
    )
    out = {
        "Name": resp.name if not req.unset else "",
        "Description": resp.description,
        "TaggedTime": resp.tagged_time,
        "Index": resp.index,
        "LastContact": 0,
        "KnownLeader": True,
        "NextToken": "",
    }
    return respond(request, out, index=resp.index)


WRITE = {"PUT": SUBMIT_JOB, "POST": SUBMIT_JOB}
READ = {"GET": READ_JOB}
#: Nomad's Job.Scale takes either, and its Job.ScaleStatus either of these
SCALE = ns("scale-job", "submit-job")
SCALE_STATUS = ns("read-job", "read-job-scaling")
#: Nomad's Periodic.Force takes either (or its force-periodic-job, which
#: Corral's policies do not have)
FORCE = ns("dispatch-job", "submit-job")
DISPATCH = ns("dispatch-job")
#: Nomad's Job.TagVersion takes either
TAG = ns("submit-job", "tag-job-version")

ROUTES: list[BaseRoute] = [
    ApiRoute("/v1/job/{job_id:path}/revert", job_revert, WRITE),
    ApiRoute("/v1/job/{job_id:path}/evaluate", job_evaluate, WRITE),
    ApiRoute("/v1/job/{job_id:path}/stable", job_stable, WRITE),
    ApiRoute(
        "/v1/jobs",
        jobs_list_or_register,
        {"GET": ns("list-jobs", filters=True), **WRITE},
    ),
    ApiRoute("/v1/job/{job_id:path}/plan", job_plan, WRITE),
    ApiRoute("/v1/job/{job_id:path}/allocations", job_allocations, READ),
    ApiRoute("/v1/job/{job_id:path}/evaluations", job_evaluations, READ),
    ApiRoute("/v1/job/{job_id:path}/versions", job_versions, READ),
    ApiRoute("/v1/job/{job_id:path}/summary", job_summary, READ),
    ApiRoute("/v1/job/{job_id:path}/submission", job_submission, READ),
    ApiRoute("/v1/job/{job_id:path}/actions", job_actions, READ),
    ApiRoute(
        "/v1/job/{job_id:path}/scale",
        job_scale,
        {"GET": SCALE_STATUS, "PUT": SCALE, "POST": SCALE},
    ),
    ApiRoute("/v1/job/{job_id:path}/dispatch", job_dispatch, {"PUT": DISPATCH, "POST": DISPATCH}),
    ApiRoute(
        "/v1/job/{job_id:path}/dispatch/payload",
        job_dispatch_payload,
        {"PUT": DISPATCH, "POST": DISPATCH},
    ),
    ApiRoute(
        "/v1/job/{job_id:path}/versions/{name}/tag",
        job_version_tag,
        {"PUT": TAG, "POST": TAG, "DELETE": TAG},
    ),
    ApiRoute(
        "/v1/job/{job_id:path}/periodic/force", job_periodic_force, {"PUT": FORCE, "POST": FORCE}
    ),
]

#: the bare /v1/job/{id}; app.py puts it after every module's routes
FALLBACK: list[BaseRoute] = [
    ApiRoute("/v1/job/{job_id:path}", job, {**READ, **WRITE, "DELETE": SUBMIT_JOB}),
]
