"""/v1/operator/scheduler/configuration (GET, PUT/POST with `?cas=`)."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute

from corral.v1 import operator_pb2
from services.gateway.authz import OPERATOR_READ, OPERATOR_WRITE, ApiRoute
from services.gateway.backend import DEFAULT_TIMEOUT
from services.gateway.http import (
    QueryOptions,
    backend_of,
    bad_request,
    int_param,
    json_body,
    metadata_of,
    respond,
)
from services.gateway.mapping import operator as op_map


async def scheduler_configuration(request: Request) -> Response:
    backend = backend_of(request)
    if request.method == "GET":
        q = QueryOptions.from_request(request)
        resp = await backend.operator.SchedulerGetConfiguration(
            operator_pb2.SchedulerGetConfigurationRequest(query=q.proto(paginate=False)),
            metadata=q.metadata,
            timeout=q.timeout,
        )
        body = {
            "SchedulerConfig": op_map.scheduler_config(resp.config),
            "Index": resp.index,
            "KnownLeader": True,
            "LastContact": 0,
        }
        return respond(request, body, index=resp.index)
    try:
        cfg = op_map.scheduler_config_from_nomad(await json_body(request))
    except op_map.ConfigInputError as exc:
        raise bad_request(str(exc)) from None
    cas = "cas" in request.query_params
    if cas:
        cfg.modify_index = int_param(request, "cas")
    resp = await backend.operator.SchedulerSetConfiguration(
        operator_pb2.SchedulerSetConfigurationRequest(config=cfg, cas=cas),
        metadata=metadata_of(request),
        timeout=DEFAULT_TIMEOUT,
    )
    return respond(request, {"Updated": resp.updated, "Index": resp.index}, index=resp.index)


ROUTES: list[BaseRoute] = [
    ApiRoute(
        "/v1/operator/scheduler/configuration",
        scheduler_configuration,
        {"GET": OPERATOR_READ, "PUT": OPERATOR_WRITE, "POST": OPERATOR_WRITE},
    ),
]
