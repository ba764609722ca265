"""/v1/jobs/parse: an HCL job file as Nomad's JSON job (api.Job).

The CLI's own HCL parser reads it (corral/domain/jobspec/hcl.py, run in a thread:
parsing is CPU work and must not stall the event loop) and the gateway's
job mapping writes it out, so what this answers registers unchanged through
/v1/jobs. Differences from Nomad (docs/http-api.md): the job always comes
back canonicalized (our parser applies Nomad's defaults as it validates;
`Canonicalize: false` changes nothing). `Variables` is a var file's text
(HCL or JSON) giving the job's input variables their values; as in Nomad,
filesystem functions (file(), fileset(), ...) are disabled here and a value
for an undeclared variable is ignored."""

from __future__ import annotations

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from corral.domain.jobspec import hcl
from corral.domain.jobspec.errors import JobspecError
from corral.domain.jobspec.language.variables import VarInputs
from corral.domain.nomad_json import body_field as field
from services.gateway.http import bad_request, json_body, respond
from services.gateway.mapping import jobs as job_map

#: the largest job file parsed (Corral's own job size bound is far below)
MAX_HCL_BYTES = 1024 * 1024
_FILENAME = "job.nomad.hcl"


async def parse(request: Request) -> Response:
    body = await json_body(request)
    if not isinstance(body, dict):
        raise bad_request("request body must be a JSON object with JobHCL")
    text = field(body, "JobHCL")
    if not isinstance(text, str) or not text.strip():
        raise bad_request("Job HCL must be specified (JobHCL)")
    if len(text.encode("utf-8", errors="replace")) > MAX_HCL_BYTES:
        raise bad_request(f"JobHCL is larger than {MAX_HCL_BYTES} bytes")
    canonicalize = field(body, "Canonicalize", False)
    if not isinstance(canonicalize, bool):
        raise bad_request("Canonicalize must be true or false")
    variables = field(body, "Variables", "") or ""
    if not isinstance(variables, str):
        raise bad_request("Variables must be a string (the text of a var file)")
    if len(variables.encode("utf-8", errors="replace")) > MAX_HCL_BYTES:
        raise bad_request(f"Variables is larger than {MAX_HCL_BYTES} bytes")
    inputs = VarInputs(content=variables, strict=False)
    try:
        job = await run_in_threadpool(hcl.parse, text, _FILENAME, inputs, allow_fs=False)
    except JobspecError as exc:
        raise bad_request(f"error parsing: {exc}") from None
    return respond(request, job_map.job(job))


ROUTES: list[BaseRoute] = [
    Route("/v1/jobs/parse", parse, methods=["PUT", "POST"]),
]
