"""/v1/jobs/statuses (Nomad 1.9's job list for its web UI, Job.Statuses):
GET, or POST (GET too, as Nomad) with `{"Jobs": [{"ID", "Namespace"}],
"IncludeChildren"}` for those jobs only. Paged by the jobs' modify index,
most recently changed first; `include_children`, `reverse`, `filter`, and
Nomad's blocking query whose index is the newest change on the page."""

from __future__ import annotations

from itertools import dropwhile
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute

from corral.v1 import job_pb2
from services.gateway.authz import ApiRoute, ns
from services.gateway.http import (
    QueryOptions,
    apply_filter,
    backend_of,
    bad_request,
    bool_param,
    json_body,
    respond,
)
from services.gateway.mapping.job_statuses import job_status


def _asked_jobs(body: Any) -> tuple[list[job_pb2.NamespacedJobID], bool]:
    """The jobs a body names and its IncludeChildren."""
    if not isinstance(body, dict):
        raise bad_request("error decoding request: the body must be a JSON object")
    jobs = body.get("Jobs")
    if not jobs:
        raise bad_request("no jobs in request")
    if not isinstance(jobs, list):
        raise bad_request("error decoding request: Jobs must be a list")
    out = []
    for i, j in enumerate(jobs):
        if not isinstance(j, dict) or not isinstance(j.get("ID", ""), str):
            raise bad_request(f"error decoding request: Jobs[{i}] must be {{ID, Namespace}}")
        space = j.get("Namespace") or "default"
        if not isinstance(space, str):
            raise bad_request(f"error decoding request: Jobs[{i}].Namespace must be a string")
        out.append(job_pb2.NamespacedJobID(namespace=space, id=j.get("ID", "")))
    children = body.get("IncludeChildren", False)
    if not isinstance(children, bool):
        raise bad_request("error decoding request: IncludeChildren must be true or false")
    return out, children


def _filtered_page(
    q: QueryOptions, items: list[dict[str, Any]]
) -> tuple[list[dict[str, Any]], str]:
    """A page of the filtered list, as the state pages the whole one: in
    its order, from the first entry not past the token (a modify index)."""
    if q.next_token:
        target = int(q.next_token) if q.next_token.isdigit() else 0
        newest_first = not q.reverse
        items = list(
            dropwhile(
                lambda i: i["ModifyIndex"] > target if newest_first else i["ModifyIndex"] < target,
                items,
            )
        )
    if q.per_page and len(items) > q.per_page:
        return items[: q.per_page], str(items[q.per_page]["ModifyIndex"])
    return items, ""


async def jobs_statuses(request: Request) -> Response:
    q = QueryOptions.from_request(request)
    include_children = bool_param(request, "include_children")
    body = await json_body(request)
    asked: list[job_pb2.NamespacedJobID] = []
    if body is not None:
        asked, children = _asked_jobs(body)
        include_children = include_children or children
    query = q.proto(paginate=not q.filter)
    if asked and query.namespace == "default":
        # jobs of any namespace (the state narrows it to theirs if one)
        query.namespace = "*"
    req = job_pb2.JobStatusesRequest(query=query, jobs=asked, include_children=include_children)
    resp = await backend_of(request).jobs.Statuses(req, metadata=q.metadata, timeout=q.timeout)
    items = [job_status(j) for j in resp.jobs]
    token = resp.meta.next_token
    if q.filter:
        items, token = _filtered_page(q, apply_filter(q.filter, items))
    return respond(request, items, index=resp.meta.index, next_token=token)


READ = ns("read-job", filters=True)

ROUTES: list[BaseRoute] = [
    ApiRoute("/v1/jobs/statuses", jobs_statuses, {"GET": READ, "POST": READ}),
]
