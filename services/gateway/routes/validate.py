"""/v1/validate/job: Nomad's "Validate Job" (`nomad job validate` of a JSON
job, python-nomad's `validate.validate_job`): the job checked as a
registration would check it, nothing written.

The gateway's parse of Nomad's JSON is the registration's first gate (the
job language's validation, services/gateway/mapping/jobs.py) and needs no
RPC, so the gateway answers alone, deciding the token's `read-job` in the
job's namespace as Nomad's Job.Validate does. As Nomad's, a job that fails
its checks answers 200 with the problems in `ValidationErrors` and
`Error`; a body without a job is 400. The state's own bounds on sizes
(docs/http-api.md) are checked when the job is registered."""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute

from services.gateway import authz
from services.gateway.authz import ApiRoute, Need
from services.gateway.http import bad_request, json_body, respond
from services.gateway.mapping import jobs as job_map
from services.gateway.mapping.jobs import JobInputError


def _job_namespace(request: Request, data: dict[str, Any]) -> str:
    """Where the job would live: its `Namespace`, else `?namespace=`, as a
    registration decides."""
    named = data.get("Namespace")
    if isinstance(named, str) and named:
        return named
    return request.query_params.get("namespace") or "default"


async def validate_job(request: Request) -> Response:
    body = await json_body(request)
    data = body.get("Job") if isinstance(body, dict) else None
    if data is None:
        raise bad_request("Job must be specified")
    if not isinstance(data, dict):
        raise bad_request("Job must be a JSON object")
    await authz.check(request, VALIDATE, _job_namespace(request, data))
    problems: list[str] = []
    try:
        job_map.from_nomad(data)
    except JobInputError as exc:
        problems.append(str(exc))
    return respond(
        request,
        {
            "DriverConfigValidated": True,
            "ValidationErrors": problems or None,
            "Error": "; ".join(problems),
            "Warnings": "",
        },
    )


VALIDATE = Need(
    summary="`read-job` in the job's namespace",
    namespace=(("read-job",),),
    gateway=True,
    per_object=True,
)

ROUTES: list[BaseRoute] = [
    ApiRoute("/v1/validate/job", validate_job, {"PUT": VALIDATE, "POST": VALIDATE}),
]
