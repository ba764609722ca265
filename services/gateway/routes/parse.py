"""/v1/jobs/parse: an HCL job file as Nomad's JSON job (api.Job).

As Nomad's, it needs `parse-job` or `submit-job` (or `read-job`) in the
request's namespace: the gateway decides it (no RPC is involved), with the
token resolved and compiled as the servers do (services/gateway/authz.py).
The CLI's own HCL parser reads the file (corral/domain/jobspec/hcl.py),
within its limits of size, nesting and CPU time
(corral/domain/jobspec/limits.py), in the gateway's parse worker process
(services/gateway/jobfiles.py), and the gateway's job mapping writes it out,
so what this answers registers unchanged through /v1/jobs. Differences from
Nomad (docs/http-api.md): the job always comes back canonicalized (our
parser applies Nomad's defaults as it validates; `Canonicalize: false`
changes nothing). `Variables` is a var file's text (HCL or JSON) giving the
job's input variables their values; as in Nomad, filesystem functions
(file(), fileset(), ...) are disabled here and a value for an undeclared
variable is ignored."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute

from corral.domain.jobspec import limits
from corral.domain.jobspec.errors import JobspecError
from corral.domain.nomad_json import body_field as field
from services.gateway.authz import ApiRoute, Need
from services.gateway.http import NomadError, bad_request, json_body, respond
from services.gateway.jobfiles import JobFileParser, ParserBusy
from services.gateway.mapping import jobs as job_map

_FILENAME = "job.nomad.hcl"


async def parse(request: Request) -> Response:
    body = await json_body(request)
    if not isinstance(body, dict):
        raise bad_request("request body must be a JSON object with JobHCL")
    text = field(body, "JobHCL")
    if not isinstance(text, str) or not text.strip():
        raise bad_request("Job HCL must be specified (JobHCL)")
    if len(text.encode("utf-8", errors="replace")) > limits.MAX_JOBSPEC_BYTES:
        raise NomadError(
            413, f"JobHCL is larger than {limits.MAX_JOBSPEC_BYTES} bytes (the jobspec size limit)"
        )
    canonicalize = field(body, "Canonicalize", False)
    if not isinstance(canonicalize, bool):
        raise bad_request("Canonicalize must be true or false")
    variables = field(body, "Variables", "") or ""
    if not isinstance(variables, str):
        raise bad_request("Variables must be a string (the text of a var file)")
    if len(variables.encode("utf-8", errors="replace")) > limits.MAX_JOBSPEC_BYTES:
        raise NomadError(
            413,
            f"Variables is larger than {limits.MAX_JOBSPEC_BYTES} bytes (the jobspec size limit)",
        )
    parser: JobFileParser = request.app.state.jobfiles
    try:
        job = await parser.parse_hcl(text, _FILENAME, variables)
    except JobspecError as exc:
        raise bad_request(f"error parsing: {exc}") from None
    except ParserBusy as exc:
        raise NomadError(429, str(exc)) from None
    return respond(request, job_map.job(job))


PARSE = Need(
    summary="`parse-job`, `submit-job` or `read-job` in the namespace",
    namespace=(("parse-job", "submit-job", "read-job"),),
    gateway=True,
)

ROUTES: list[BaseRoute] = [
    ApiRoute("/v1/jobs/parse", parse, {"PUT": PARSE, "POST": PARSE}),
]
