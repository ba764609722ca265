"""/v1/search: Nomad's prefix search ("Search" in api-docs/search): the ids
(names, paths) of every object of a context starting with a prefix, at most
20 per context, with `Truncations` saying where there were more.

Each context is read through its own list RPC with the caller's token, so
each is decided by the rule that decides its listing (read-job for jobs,
evals, allocs and deployments, node:read for nodes, ...), as Nomad's
servers filter the contexts by the token. A context the token may not
read is left out of `all`, and asked for alone it is 403. Corral has no
CSI plugins or volumes nor host volumes: `plugins`, `volumes` and
`host_volumes` are not searched by `all` and refused alone (400). The
prefix matches ids as they are (Nomad rounds an odd-length UUID prefix
down for its index and then filters by the whole prefix: the same
matches)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import grpc
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute

from corral.v1 import (
    alloc_pb2,
    deployment_pb2,
    eval_pb2,
    job_pb2,
    namespace_pb2,
    node_pb2,
    node_pool_pb2,
    query_pb2,
    scaling_pb2,
    variables_pb2,
)
from services.gateway.authz import ApiRoute, Need
from services.gateway.backend import DEFAULT_TIMEOUT, Backend
from services.gateway.http import (
    NomadError,
    backend_of,
    bad_request,
    json_body,
    metadata_of,
    respond,
)

#: Nomad's limit of matches per context
TRUNCATE_LIMIT = 20

Lister = Callable[[Backend, query_pb2.QueryOptions, Any], Awaitable[tuple[list[str], Any]]]


async def _jobs(b: Backend, q: query_pb2.QueryOptions, md: Any) -> tuple[list[str], Any]:
    r = await b.jobs.List(job_pb2.JobListRequest(query=q), metadata=md, timeout=DEFAULT_TIMEOUT)
    return [j.id for j in r.jobs], r.meta


async def _evals(b: Backend, q: query_pb2.QueryOptions, md: Any) -> tuple[list[str], Any]:
    r = await b.evals.List(eval_pb2.EvalListRequest(query=q), metadata=md, timeout=DEFAULT_TIMEOUT)
    return [e.id for e in r.evals], r.meta


async def _allocs(b: Backend, q: query_pb2.QueryOptions, md: Any) -> tuple[list[str], Any]:
    r = await b.allocs.List(
        alloc_pb2.AllocListRequest(query=q), metadata=md, timeout=DEFAULT_TIMEOUT
    )
    return [a.id for a in r.allocs], r.meta


async def _nodes(b: Backend, q: query_pb2.QueryOptions, md: Any) -> tuple[list[str], Any]:
    r = await b.nodes.List(node_pb2.NodeListRequest(query=q), metadata=md, timeout=DEFAULT_TIMEOUT)
    return [n.id for n in r.nodes], r.meta


async def _deployments(b: Backend, q: query_pb2.QueryOptions, md: Any) -> tuple[list[str], Any]:
    r = await b.deployments.List(
        deployment_pb2.DeploymentListRequest(query=q), metadata=md, timeout=DEFAULT_TIMEOUT
    )
    return [d.id for d in r.deployments], r.meta


async def _node_pools(b: Backend, q: query_pb2.QueryOptions, md: Any) -> tuple[list[str], Any]:
    r = await b.node_pools.List(
        node_pool_pb2.NodePoolListRequest(query=q), metadata=md, timeout=DEFAULT_TIMEOUT
    )
    return [p.name for p in r.node_pools], r.meta


async def _namespaces(b: Backend, q: query_pb2.QueryOptions, md: Any) -> tuple[list[str], Any]:
    r = await b.namespaces.List(
        namespace_pb2.NamespaceListRequest(query=q), metadata=md, timeout=DEFAULT_TIMEOUT
    )
    return [n.name for n in r.namespaces], r.meta


async def _scaling(b: Backend, q: query_pb2.QueryOptions, md: Any) -> tuple[list[str], Any]:
    r = await b.scaling.ListPolicies(
        scaling_pb2.ScalingPolicyListRequest(query=q), metadata=md, timeout=DEFAULT_TIMEOUT
    )
    return [p.id for p in r.policies], r.meta


async def _variables(b: Backend, q: query_pb2.QueryOptions, md: Any) -> tuple[list[str], Any]:
    r = await b.variables.List(
        variables_pb2.VariablesListRequest(query=q), metadata=md, timeout=DEFAULT_TIMEOUT
    )
    return [v.path for v in r.variables], r.meta


#: Nomad's contexts (structs.Context) Corral has, in Nomad's order
CONTEXTS: dict[str, Lister] = {
    "allocs": _allocs,
    "jobs": _jobs,
    "nodes": _nodes,
    "node_pools": _node_pools,
    "evals": _evals,
    "deployment": _deployments,
    "scaling_policy": _scaling,
    "variables": _variables,
    "namespaces": _namespaces,
}
#: Nomad's contexts of objects Corral does not have
ABSENT = ("plugins", "volumes", "host_volumes")
_DENIED = (grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.UNAUTHENTICATED)


def _contexts(context: Any) -> list[str]:
    if context in ("", None, "all"):
        return list(CONTEXTS)
    if context in ABSENT:
        raise bad_request(f"context {context!r}: Corral has no CSI plugins or volumes")
    if not isinstance(context, str) or context not in CONTEXTS:
        raise bad_request(f"context must be one of: all, {', '.join(CONTEXTS)}")
    return [context]


async def prefix_search(request: Request) -> Response:
    body = await json_body(request)
    if not isinstance(body, dict):
        raise bad_request("request body must be a JSON object with Prefix and Context")
    prefix = body.get("Prefix") or ""
    if not isinstance(prefix, str):
        raise bad_request("Prefix must be a string")
    wanted = _contexts(body.get("Context"))
    namespace = request.query_params.get("namespace") or "default"
    backend, md = backend_of(request), metadata_of(request)
    matches: dict[str, list[str] | None] = {}
    truncations: dict[str, bool] = {}
    index = 0
    for context in wanted:
        query = query_pb2.QueryOptions(prefix=prefix, per_page=TRUNCATE_LIMIT, namespace=namespace)
        try:
            found, meta = await CONTEXTS[context](backend, query, md)
        except grpc.aio.AioRpcError as exc:
            if exc.code() in _DENIED and len(wanted) > 1:
                continue  # left out of `all`, as Nomad's filtered contexts
            raise
        matches[context] = found or None
        truncations[context] = bool(meta.next_token)
        index = max(index, meta.index)
    if not matches:
        raise NomadError(403, "Permission denied")
    body = {
        "Matches": matches,
        "Truncations": truncations,
        # Nomad's servers send their QueryMeta in the body too
        "Index": index,
        "LastContact": 0,
        "KnownLeader": True,
        "NextToken": "",
    }
    return respond(request, body, index=index)


#: each context decided by its listing's rule at the state: `read-job` for
#: jobs, evals, allocs and deployments (the tests' sample searches jobs)
SEARCH = Need(
    summary="each context its listing's need (`read-job` in the namespace for jobs, evals, "
    "allocs, deployments; `node:read` for nodes; ...); `all` leaves out the contexts the "
    "token may not list",
    namespace=(("read-job",),),
    filters=True,
)

ROUTES: list[BaseRoute] = [
    ApiRoute("/v1/search", prefix_search, {"PUT": SEARCH, "POST": SEARCH}),
]
