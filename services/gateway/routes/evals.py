"""/v1/evaluations and /v1/evaluation/:id (+ /allocations)."""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute

from corral.v1 import eval_pb2, query_pb2
from services.gateway.authz import READ_JOB_OBJECT, ApiRoute, ns
from services.gateway.http import (
    QueryOptions,
    apply_filter,
    backend_of,
    bool_param,
    listing,
    respond,
)
from services.gateway.mapping import allocs as alloc_map
from services.gateway.mapping import evals as eval_map


async def evaluations(request: Request) -> Response:
    q = QueryOptions.from_request(request)
    p = request.query_params
    backend = backend_of(request)

    async def call(query: query_pb2.QueryOptions) -> tuple[list[dict[str, Any]], Any]:
        resp = await backend.evals.List(
            eval_pb2.EvalListRequest(
                query=query, job_id=p.get("job", ""), status=p.get("status", "")
            ),
            metadata=q.metadata,
            timeout=q.timeout,
        )
        return [eval_map.evaluation(e) for e in resp.evals], resp.meta

    return await listing(request, q, call, by_creation=True)


async def evaluations_count(request: Request) -> Response:
    """Nomad's count of the evaluations `filter` matches (all without one),
    of the namespaces the token may read: the whole list is read and
    counted here, as a filtered listing is."""
    q = QueryOptions.from_request(request)
    resp = await backend_of(request).evals.List(
        eval_pb2.EvalListRequest(query=q.proto(paginate=False)),
        metadata=q.metadata,
        timeout=q.timeout,
    )
    items = [eval_map.evaluation(e) for e in resp.evals]
    if q.filter:
        items = apply_filter(q.filter, items)
    body = {
        "Count": len(items),
        # Nomad's servers send their QueryMeta in the body too
        "Index": resp.meta.index,
        "LastContact": 0,
        "KnownLeader": True,
        "NextToken": "",
    }
    return respond(request, body, index=resp.meta.index)


async def _get(request: Request, *, related: bool) -> eval_pb2.EvalGetResponse:
    q = QueryOptions.from_request(request)
    resp: eval_pb2.EvalGetResponse = await backend_of(request).evals.Get(
        eval_pb2.EvalGetRequest(
            eval_id=request.path_params["eval_id"],
            query=q.proto(paginate=False),
            include_related=related,
        ),
        metadata=q.metadata,
        timeout=q.timeout,
    )
    return resp


async def evaluation(request: Request) -> Response:
    resp = await _get(request, related=bool_param(request, "related"))
    body = eval_map.evaluation(resp.eval)
    if resp.related:
        body["RelatedEvals"] = [eval_map.stub(e) for e in resp.related]
    return respond(request, body, index=resp.meta.index)


async def evaluation_allocations(request: Request) -> Response:
    resp = await _get(request, related=True)  # the eval's allocs come with its relations
    return respond(request, [alloc_map.stub(a) for a in resp.allocs], index=resp.meta.index)


ROUTES: list[BaseRoute] = [
    ApiRoute("/v1/evaluations", evaluations, {"GET": ns("read-job", filters=True)}),
    ApiRoute("/v1/evaluations/count", evaluations_count, {"GET": ns("read-job", filters=True)}),
    ApiRoute(
        "/v1/evaluation/{eval_id}/allocations", evaluation_allocations, {"GET": READ_JOB_OBJECT}
    ),
    ApiRoute("/v1/evaluation/{eval_id}", evaluation, {"GET": READ_JOB_OBJECT}),
]
