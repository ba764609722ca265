"""/v1/deployments, /v1/deployment/:id and its actions, and a job's
deployments (Nomad's command/agent/deployment_endpoint.go semantics) over
the Deployment service.

Reads are blocking queries (`index`, `wait`); the list takes `prefix`,
`namespace`, `filter` and pages (`per_page`, `next_token`). The actions
take Nomad's bodies (`{"All": true}` or `{"Groups": [...]}`, `{"Pause":
bool}`, `{"HealthyAllocationIDs": [...], "UnhealthyAllocationIDs": [...]}`)
and answer Nomad's DeploymentUpdateResponse."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute

from corral.v1 import deployment_pb2, query_pb2
from services.gateway.authz import (
    READ_JOB,
    READ_JOB_OBJECT,
    SUBMIT_JOB_OBJECT,
    ApiRoute,
    ns,
)
from services.gateway.backend import DEFAULT_TIMEOUT
from services.gateway.http import (
    QueryOptions,
    backend_of,
    bad_request,
    json_body,
    listing,
    metadata_of,
    respond,
)
from services.gateway.mapping import allocs as alloc_map
from services.gateway.mapping import deployments as deployment_map


async def _list(
    request: Request, q: QueryOptions, query: query_pb2.QueryOptions, job_id: str = ""
) -> tuple[list[dict[str, Any]], query_pb2.QueryMeta]:
    resp = await backend_of(request).deployments.List(
        deployment_pb2.DeploymentListRequest(query=query, job_id=job_id),
        metadata=q.metadata,
        timeout=q.timeout,
    )
    return [deployment_map.deployment(d) for d in resp.deployments], resp.meta


async def deployments(request: Request) -> Response:
    q = QueryOptions.from_request(request)

    async def fetch(query: query_pb2.QueryOptions) -> tuple[list[dict[str, Any]], Any]:
        return await _list(request, q, query)

    return await listing(request, q, fetch, by_creation=True)


async def _get(request: Request) -> deployment_pb2.DeploymentGetResponse:
    q = QueryOptions.from_request(request)
    resp: deployment_pb2.DeploymentGetResponse = await backend_of(request).deployments.Get(
        deployment_pb2.DeploymentGetRequest(
            deployment_id=request.path_params["deployment_id"], query=q.proto(paginate=False)
        ),
        metadata=q.metadata,
        timeout=q.timeout,
    )
    return resp


async def deployment(request: Request) -> Response:
    resp = await _get(request)
    return respond(request, deployment_map.deployment(resp.deployment), index=resp.meta.index)


async def deployment_allocations(request: Request) -> Response:
    resp = await _get(request)
    return respond(request, [alloc_map.stub(a) for a in resp.allocs], index=resp.meta.index)


async def _body(request: Request) -> dict[str, Any]:
    body = await json_body(request)
    if body is None:
        return {}
    if not isinstance(body, dict):
        raise bad_request("request body must be a JSON object")
    path_id = request.path_params["deployment_id"]
    named = body.get("DeploymentID")
    if named not in (None, "", path_id):
        raise bad_request("Deployment ID does not match")
    return body


def _action(rpc: str, build: Callable[[str, dict[str, Any]], Any]) -> Callable[[Request], Any]:
    """A POST/PUT action on one deployment: the body → our request → the
    RPC → Nomad's DeploymentUpdateResponse."""

    async def handler(request: Request) -> Response:
        body = await _body(request)
        try:
            message = build(request.path_params["deployment_id"], body)
        except ValueError as exc:
            raise bad_request(str(exc)) from None
        resp: deployment_pb2.DeploymentUpdateResponse = await getattr(
            backend_of(request).deployments, rpc
        )(message, metadata=metadata_of(request), timeout=DEFAULT_TIMEOUT)
        return respond(request, deployment_map.update_response(resp), index=resp.index)

    return handler


def _fail(deployment_id: str, body: dict[str, Any]) -> deployment_pb2.DeploymentFailRequest:
    return deployment_pb2.DeploymentFailRequest(deployment_id=deployment_id)


# -- a job's deployments -----------------------------------------------------


async def job_deployments(request: Request) -> Response:
    """Newest first (a job's own list is not paged)."""
    q = QueryOptions.from_request(request)
    query = q.proto(paginate=False)
    query.reverse = True
    items, meta = await _list(request, q, query, job_id=request.path_params["job_id"])
    return respond(request, items, index=meta.index)


async def job_latest_deployment(request: Request) -> Response:
    """The job's newest deployment, or null (Nomad answers 200 with null)."""
    q = QueryOptions.from_request(request)
    items, meta = await _list(
        request, q, q.proto(paginate=False), job_id=request.path_params["job_id"]
    )
    latest = max(items, key=lambda d: d["CreateIndex"], default=None)
    return respond(request, latest, index=meta.index)


_ACTION = {"PUT": SUBMIT_JOB_OBJECT, "POST": SUBMIT_JOB_OBJECT}
_READ_OBJECT = {"GET": READ_JOB_OBJECT}

ROUTES: list[BaseRoute] = [
    ApiRoute("/v1/deployments", deployments, {"GET": ns("read-job", filters=True)}),
    ApiRoute("/v1/deployment/allocations/{deployment_id}", deployment_allocations, _READ_OBJECT),
    ApiRoute(
        "/v1/deployment/promote/{deployment_id}",
        _action("Promote", deployment_map.promote_request),
        _ACTION,
    ),
    ApiRoute("/v1/deployment/fail/{deployment_id}", _action("Fail", _fail), _ACTION),
    ApiRoute(
        "/v1/deployment/pause/{deployment_id}",
        _action("Pause", deployment_map.pause_request),
        _ACTION,
    ),
    ApiRoute(
        "/v1/deployment/allocation-health/{deployment_id}",
        _action("SetAllocHealth", deployment_map.alloc_health_request),
        _ACTION,
    ),
    ApiRoute("/v1/deployment/{deployment_id}", deployment, _READ_OBJECT),
    ApiRoute("/v1/job/{job_id:path}/deployments", job_deployments, {"GET": READ_JOB}),
    ApiRoute("/v1/job/{job_id:path}/deployment", job_latest_deployment, {"GET": READ_JOB}),
]
