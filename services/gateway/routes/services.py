"""Nomad's native service discovery (command/agent/service_registration_endpoint.go):
/v1/services, /v1/service/:name (choose, tag, filter, blocking queries),
DELETE /v1/service/:name/:id, a job's and an alloc's instances
(/v1/job/:id/services, /v1/allocation/:id/services), and an alloc's check
results, read from the agent that runs it (/v1/client/allocation/:id/checks)."""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute

from corral.domain import services
from corral.security import access
from corral.v1 import alloc_pb2, service_pb2
from corral.v1 import structs_pb2 as pb
from services.gateway.authz import (
    ALLOC_AGENT_READ,
    INVALID,
    READ_JOB,
    READ_JOB_OBJECT,
    ApiRoute,
    ns,
)
from services.gateway.backend import DEFAULT_TIMEOUT
from services.gateway.http import (
    NomadError,
    QueryOptions,
    apply_filter,
    backend_of,
    bad_request,
    local_page,
    metadata_of,
    region_of,
    respond,
)
from services.gateway.mapping import services as service_map
from services.gateway.routes.allocs import alloc_agent


async def services_list(request: Request) -> Response:
    q = QueryOptions.from_request(request)
    resp = await backend_of(request).services.List(
        service_pb2.ServiceListRequest(query=q.proto(paginate=False)),
        metadata=q.metadata,
        timeout=q.timeout,
    )
    items = [service_map.list_stub(ns) for ns in resp.namespaces]
    if q.filter:
        items = apply_filter(q.filter, items)
    return respond(request, items, index=resp.meta.index)


async def service_get(request: Request) -> Response:
    """The instances of a service. Without a filter the state pages and
    chooses; with one, Nomad filters before it pages, so the whole list is
    read, filtered, paged and then chosen from here."""
    q = QueryOptions.from_request(request)
    name = request.path_params["name"]
    choose = request.query_params.get("choose", "")
    if choose:
        try:
            services.choose([], choose)
        except ValueError as exc:
            raise bad_request(f"failed to choose services: {exc}") from None
    tag = request.query_params.get("tag", "")
    call: Any = backend_of(request).services.GetService
    resp = await call(
        service_pb2.ServiceGetRequest(
            service_name=name,
            query=q.proto(paginate=not q.filter),
            choose="" if q.filter else choose,
            tag=tag,
        ),
        metadata=q.metadata,
        timeout=q.timeout,
    )
    if not q.filter:
        items = [service_map.registration(r) for r in resp.registrations]
        return respond(request, items, index=resp.meta.index, next_token=resp.meta.next_token)
    by_id = {r.id: r for r in resp.registrations}
    kept = apply_filter(q.filter, [service_map.registration(r) for r in resp.registrations])
    page, token = local_page(q, kept)
    regs: list[pb.ServiceRegistration] = [by_id[i["ID"]] for i in page]
    if choose:
        regs = services.choose(regs, choose)
    items = [service_map.registration(r) for r in regs]
    return respond(request, items, index=resp.meta.index, next_token=token)


async def service_delete(request: Request) -> Response:
    resp = await backend_of(request).services.DeleteByID(
        service_pb2.ServiceDeleteByIDRequest(
            namespace=request.query_params.get("namespace", "") or "default",
            id=request.path_params["id"],
        ),
        metadata=metadata_of(request),
        timeout=DEFAULT_TIMEOUT,
    )
    return respond(request, None, index=resp.index)


async def service_invalid(request: Request) -> Response:
    raise bad_request("invalid URI")


async def job_services(request: Request) -> Response:
    q = QueryOptions.from_request(request)
    job_id = request.path_params["job_id"]
    if not job_id:
        raise NomadError(404, "Missing job ID")
    resp = await backend_of(request).services.ListByJob(
        service_pb2.ServiceListByJobRequest(job_id=job_id, query=q.proto(paginate=False)),
        metadata=q.metadata,
        timeout=q.timeout,
    )
    items = [service_map.registration(r) for r in resp.registrations]
    return respond(request, items, index=resp.meta.index)


async def alloc_services(request: Request) -> Response:
    q = QueryOptions.from_request(request)
    resp = await backend_of(request).services.ListByAlloc(
        service_pb2.ServiceListByAllocRequest(
            alloc_id=request.path_params["alloc_id"], query=q.proto(paginate=False)
        ),
        metadata=q.metadata,
        timeout=q.timeout,
    )
    items = [service_map.registration(r) for r in resp.registrations]
    return respond(request, items, index=resp.meta.index)


async def alloc_checks(request: Request) -> Response:
    """Nomad's client endpoint: check id → its latest result, as the
    alloc's client last ran it (nothing for an alloc that stopped)."""
    alloc, address = await alloc_agent(request)
    checks_call: Any = (
        backend_of(request).client_alloc(address, region_of(request)).Checks
    )  # the async stub
    resp = await checks_call(
        alloc_pb2.AllocChecksRequest(alloc_id=alloc.id),
        metadata=metadata_of(request),
        timeout=DEFAULT_TIMEOUT,
    )
    return respond(request, {r.id: service_map.check_result(r) for r in resp.results})


#: Nomad's ServiceRegistration.DeleteByID takes either
DELETE = ns(access.SUBMIT_JOB, access.DELETE_SERVICE)

ROUTES: list[BaseRoute] = [
    ApiRoute("/v1/services", services_list, {"GET": ns("read-job", filters=True)}),
    ApiRoute("/v1/service/{name}", service_get, {"GET": READ_JOB}),
    ApiRoute("/v1/service/{name}/{id}", service_delete, {"DELETE": DELETE}),
    ApiRoute(
        "/v1/service/{name}/{id}/{rest:path}", service_invalid, {"GET": INVALID, "DELETE": INVALID}
    ),
    ApiRoute("/v1/job/{job_id:path}/services", job_services, {"GET": READ_JOB}),
    ApiRoute("/v1/allocation/{alloc_id}/services", alloc_services, {"GET": READ_JOB_OBJECT}),
    ApiRoute("/v1/client/allocation/{alloc_id}/checks", alloc_checks, {"GET": ALLOC_AGENT_READ}),
]
