"""/v1/vars and /v1/var/:path (Nomad's command/agent/variable_endpoint.go)
over the Variables service.

* GET /v1/vars?prefix=&namespace= (`*` = every namespace): the variables'
  metadata the token may list;
* GET /v1/var/:path: the variable, 404 "variable not found" without one;
* PUT/POST /v1/var/:path: write it; `?cas=N` only if its modify index is N
  (0: only if it does not exist); `?lock-acquire`, `?lock-release`,
  `?lock-renew` for Nomad 1.7's locks;
* DELETE /v1/var/:path[?cas=N]: 204.

A check-and-set mismatch or a lock held by someone else answers 409 with
the current variable (its items only if the token may read them), as
Nomad's. The namespace is the body's `Namespace`, else `?namespace=`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import grpc
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute

from corral.domain import variables as var_map
from corral.v1 import structs_pb2 as pb
from corral.v1 import variables_pb2
from services.gateway.authz import ApiRoute, Need
from services.gateway.backend import DEFAULT_TIMEOUT
from services.gateway.http import (
    NomadError,
    QueryOptions,
    apply_filter,
    backend_of,
    bad_request,
    int_param,
    json_body,
    metadata_of,
    respond,
)

LOCK_OPS = ("lock-acquire", "lock-release", "lock-renew")
#: what the state says when a lock is not the caller's (Nomad answers 409)
_LOCK_CONFLICTS = ("doesn't hold a lock", "attempting to modify locked variable")


def _headers(index: int) -> dict[str, str]:
    return {
        "X-Nomad-Index": str(max(index, 1)),
        "X-Nomad-KnownLeader": "true",
        "X-Nomad-LastContact": "0",
    }


@contextlib.contextmanager
def _lock_conflicts() -> Iterator[None]:
    """A lock that is not the caller's answers 409, as Nomad's."""
    try:
        yield
    except grpc.aio.AioRpcError as exc:
        details = exc.details() or ""
        if exc.code() == grpc.StatusCode.FAILED_PRECONDITION and any(
            c in details for c in _LOCK_CONFLICTS
        ):
            raise NomadError(409, details) from None
        raise


# -- list ----------------------------------------------------------------------


def _page(q: QueryOptions, items: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], str]:
    """A page of filtered items as the state pages them ("ns.path" tokens)."""
    keyed = sorted(items, key=lambda i: (i["Namespace"], i["Path"]))
    if q.next_token:
        ns, _, path = q.next_token.partition(".")
        keyed = [i for i in keyed if (i["Namespace"], i["Path"]) >= (ns, path)]
    if q.per_page and len(keyed) > q.per_page:
        nxt = keyed[q.per_page]
        return keyed[: q.per_page], f"{nxt['Namespace']}.{nxt['Path']}"
    return keyed, ""


async def variables(request: Request) -> Response:
    q = QueryOptions.from_request(request)
    backend = backend_of(request)
    resp = await backend.variables.List(
        variables_pb2.VariablesListRequest(query=q.proto(paginate=not q.filter)),
        metadata=q.metadata,
        timeout=q.timeout,
    )
    items = [var_map.metadata(v) for v in resp.variables]
    if not q.filter:
        return respond(request, items, index=resp.meta.index, next_token=resp.meta.next_token)
    page, token = _page(q, apply_filter(q.filter, items))
    return respond(request, page, index=resp.meta.index, next_token=token)


# -- one variable ------------------------------------------------------------------


def _path(request: Request) -> str:
    path: str = request.path_params["path"]
    if not path:
        raise bad_request("missing variable path")
    return path


async def read(request: Request) -> Response:
    q = QueryOptions.from_request(request)
    resp = await backend_of(request).variables.Read(
        variables_pb2.VariablesReadRequest(path=_path(request), query=q.proto(paginate=False)),
        metadata=q.metadata,
        timeout=q.timeout,
    )
    if not resp.found:
        return Response("variable not found", status_code=404, headers=_headers(resp.meta.index))
    return respond(request, var_map.variable(resp.variable), index=resp.meta.index)


def _lock_operation(request: Request) -> str:
    given = [op for op in LOCK_OPS if op in request.query_params]
    if len(given) > 1:
        raise bad_request("multiple lock operations")
    return given[0] if given else ""


async def _body(request: Request, path: str) -> tuple[pb.Variable, str]:
    try:
        v, body_namespace = var_map.from_nomad(await json_body(request), path)
    except var_map.VariableInputError as exc:
        raise bad_request(str(exc)) from None
    namespace = body_namespace or request.query_params.get("namespace", "") or "default"
    v.metadata.namespace = ""  # the request's namespace says it
    return v, namespace


async def _apply(
    request: Request, op: str, v: pb.Variable, namespace: str
) -> variables_pb2.VariablesApplyResponse:
    with _lock_conflicts():
        resp: variables_pb2.VariablesApplyResponse = await backend_of(request).variables.Apply(
            variables_pb2.VariablesApplyRequest(op=op, variable=v, namespace=namespace),
            metadata=metadata_of(request),
            timeout=DEFAULT_TIMEOUT,
        )
    return resp


def _answer(
    request: Request, resp: variables_pb2.VariablesApplyResponse, *, deleted: bool = False
) -> Response:
    if resp.result != "ok":
        body = var_map.variable(resp.conflict)
        return respond(request, body, index=resp.conflict.metadata.modify_index, status=409)
    if deleted:
        return Response(status_code=204, headers=_headers(resp.index))
    return respond(request, var_map.variable(resp.output), index=resp.index)


async def write(request: Request) -> Response:
    path = _path(request)
    lock_op = _lock_operation(request)
    cas = request.query_params.get("cas", "")
    if cas and lock_op:
        raise bad_request("CAS can't be used with lock operations")
    v, namespace = await _body(request, path)
    if lock_op == "lock-renew":
        with _lock_conflicts():
            renewed = await backend_of(request).variables.RenewLock(
                variables_pb2.VariablesRenewLockRequest(
                    namespace=namespace, path=path, lock_id=v.metadata.lock.id
                ),
                metadata=metadata_of(request),
                timeout=DEFAULT_TIMEOUT,
            )
        return respond(request, var_map.metadata(renewed.variable), index=renewed.index)
    if lock_op:
        return _answer(request, await _apply(request, lock_op, v, namespace))
    if not v.items:
        raise bad_request("variable missing required Items object")
    op = "set"
    if cas:
        op = "cas"
        v.metadata.modify_index = int_param(request, "cas")
    return _answer(request, await _apply(request, op, v, namespace))


async def delete(request: Request) -> Response:
    path = _path(request)
    namespace = request.query_params.get("namespace", "") or "default"
    v = pb.Variable(metadata=pb.VariableMetadata(path=path))
    op = "delete"
    if request.query_params.get("cas", ""):
        op = "delete-cas"
        v.metadata.modify_index = int_param(request, "cas")
    return _answer(request, await _apply(request, op, v, namespace), deleted=True)


async def variable(request: Request) -> Response:
    if request.method == "GET":
        return await read(request)
    if request.method == "DELETE":
        return await delete(request)
    return await write(request)


#: the token's `variables` rules on the variable's path, as Nomad's (or a
#: workload identity's implicit policy: its own job's variables)
LISTED = Need(summary="lists the variables whose paths the token may `list`", filters=True)
READ = Need(summary="`read` on the variable's path", variables=("read",), per_object=True)
WRITE = Need(summary="`write` on the variable's path", variables=("write",), per_object=True)
DESTROY = Need(summary="`destroy` on the variable's path", variables=("destroy",), per_object=True)

ROUTES: list[BaseRoute] = [
    ApiRoute("/v1/vars", variables, {"GET": LISTED}),
    ApiRoute(
        "/v1/var/{path:path}",
        variable,
        {"GET": READ, "PUT": WRITE, "POST": WRITE, "DELETE": DESTROY},
    ),
]
