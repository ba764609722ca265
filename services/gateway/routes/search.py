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

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import grpc
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute

from corral.domain.errors import PermissionDenied
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
from services.gateway import authz
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


@dataclass(frozen=True)
class Context:
    """How one of Nomad's search contexts is listed: the list RPC of the
    backend, its request message, the answer's repeated field and the
    matched attribute of each item."""

    rpc: Callable[[Backend], Any]
    request: Callable[..., Any]
    items: str
    key: str

    async def listed(
        self, b: Backend, q: query_pb2.QueryOptions, md: Any, shown: Callable[[str], bool]
    ) -> tuple[list[Any], Any]:
        """The listed items of the namespaces `shown` accepts, and the
        listing's meta (its `next_token` says there were more)."""
        resp = await self.rpc(b)(self.request(query=q), metadata=md, timeout=DEFAULT_TIMEOUT)
        items = getattr(resp, self.items)
        return [i for i in items if shown(namespace_of(i))], resp.meta

    async def matches(
        self, b: Backend, q: query_pb2.QueryOptions, md: Any, shown: Callable[[str], bool]
    ) -> tuple[list[str], Any]:
        """The matching ids of the items of the namespaces `shown` accepts."""
        items, meta = await self.listed(b, q, md, shown)
        return [getattr(i, self.key) for i in items], meta


def namespace_of(item: Any) -> str:
    """An item's namespace (nodes, pools and namespaces have none)."""
    return str(getattr(item, "namespace", "")) or "default"


#: Nomad's contexts (structs.Context) Corral has, in Nomad's order
CONTEXTS: dict[str, Context] = {
    "allocs": Context(lambda b: b.allocs.List, alloc_pb2.AllocListRequest, "allocs", "id"),
    "jobs": Context(lambda b: b.jobs.List, job_pb2.JobListRequest, "jobs", "id"),
    "nodes": Context(lambda b: b.nodes.List, node_pb2.NodeListRequest, "nodes", "id"),
    "node_pools": Context(
        lambda b: b.node_pools.List, node_pool_pb2.NodePoolListRequest, "node_pools", "name"
    ),
    "evals": Context(lambda b: b.evals.List, eval_pb2.EvalListRequest, "evals", "id"),
    "deployment": Context(
        lambda b: b.deployments.List, deployment_pb2.DeploymentListRequest, "deployments", "id"
    ),
    "scaling_policy": Context(
        lambda b: b.scaling.ListPolicies, scaling_pb2.ScalingPolicyListRequest, "policies", "id"
    ),
    "variables": Context(
        lambda b: b.variables.List, variables_pb2.VariablesListRequest, "variables", "path"
    ),
    "namespaces": Context(
        lambda b: b.namespaces.List, namespace_pb2.NamespaceListRequest, "namespaces", "name"
    ),
}
#: Nomad's contexts of objects Corral does not have
ABSENT = ("plugins", "volumes", "host_volumes")
DENIED = (grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.UNAUTHENTICATED)


def wanted_contexts(context: Any) -> list[str]:
    """The contexts a request's `Context` names (`all`: every one)."""
    if context in ("", None, "all"):
        return list(CONTEXTS)
    if context in ABSENT:
        raise bad_request(f"context {context!r}: Corral has no CSI plugins or volumes")
    if not isinstance(context, str) or context not in CONTEXTS:
        raise bad_request(f"context must be one of: all, {', '.join(CONTEXTS)}")
    return [context]


async def search_body(request: Request, field: str) -> tuple[str, list[str]]:
    """A search request's text (`Prefix` or `Text`) and its contexts."""
    body = await json_body(request)
    if not isinstance(body, dict):
        raise bad_request(f"request body must be a JSON object with {field} and Context")
    text = body.get(field) or ""
    if not isinstance(text, str):
        raise bad_request(f"{field} must be a string")
    return text, wanted_contexts(body.get("Context"))


async def prefix_search(request: Request) -> Response:
    prefix, wanted = await search_body(request, "Prefix")
    namespace = request.query_params.get("namespace") or "default"
    backend, md = backend_of(request), metadata_of(request)
    readable = await job_readers(request)
    matches: dict[str, list[str] | None] = {}
    truncations: dict[str, bool] = {}
    index = 0
    for context in wanted:
        query = query_pb2.QueryOptions(prefix=prefix, per_page=TRUNCATE_LIMIT, namespace=namespace)
        # Nomad's job search asks read-job (Corral's job listing list-jobs)
        shown = readable if context == "jobs" else everything
        if not namespace_shown(namespace, shown, alone=len(wanted) == 1):
            continue
        try:
            found, meta = await CONTEXTS[context].matches(backend, query, md, shown)
        except grpc.aio.AioRpcError as exc:
            if exc.code() in DENIED and len(wanted) > 1:
                continue  # left out of `all`, as Nomad's filtered contexts
            raise
        matches[context] = found or None
        truncations[context] = bool(meta.next_token)
        index = max(index, meta.index)
    if not matches:
        raise NomadError(403, "Permission denied")
    return search_response(request, matches, truncations, index)


def search_response(
    request: Request, matches: dict[str, Any], truncations: dict[str, bool], index: int
) -> Response:
    """A search's answer: its matches and truncations with Nomad's
    QueryMeta, which its servers send in the body too."""
    body = {
        "Matches": matches,
        "Truncations": truncations,
        "Index": index,
        "LastContact": 0,
        "KnownLeader": True,
        "NextToken": "",
    }
    return respond(request, body, index=index)


def everything(_namespace: str) -> bool:
    return True


def namespace_shown(namespace: str, shown: Callable[[str], bool], *, alone: bool) -> bool:
    """Whether a context is searched in `namespace` (`*`: each item's own
    namespace decides); a context asked for alone in a namespace the token
    may not read is 403."""
    if namespace == "*" or shown(namespace):
        return True
    if alone:
        raise NomadError(403, "Permission denied")
    return False


async def job_readers(request: Request) -> Callable[[str], bool]:
    """Which namespaces' jobs the token may find: `read-job`, as Nomad's
    search asks (ACLs off: all)."""
    try:
        resolved = await authz.resolve(request)
    except PermissionDenied:
        raise NomadError(403, "Permission denied") from None
    if resolved is None:
        return everything
    found = resolved.acl
    return lambda namespace: found.allows_namespace(namespace, "read-job")


#: each context decided by its listing's rule at the state (jobs: and
#: `read-job`, decided here); the tests' sample searches jobs
SEARCH = Need(
    summary="each context its listing's need: `list-jobs` and `read-job` in the namespace for "
    "jobs, `read-job` for evals, allocs, deployments, `node:read` for nodes, ...; `all` "
    "leaves out the contexts the token may not list",
    namespace=(("list-jobs",), ("read-job",)),
    filters=True,
)

ROUTES: list[BaseRoute] = [
    ApiRoute("/v1/search", prefix_search, {"PUT": SEARCH, "POST": SEARCH}),
]
