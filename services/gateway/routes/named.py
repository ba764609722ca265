"""What the routes of a cluster object Nomad knows by its name (a
namespace, a node pool) share: listing them, reading, writing and deleting
one, over a state service whose List, Get, Upsert and Delete take the same
shapes for each (`query`, `name`, the objects, `names`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from corral.v1 import query_pb2
from services.gateway.backend import DEFAULT_TIMEOUT, Backend
from services.gateway.http import (
    QueryOptions,
    backend_of,
    bad_request,
    listing,
    metadata_of,
    object_body,
    respond,
    written,
)


@dataclass(frozen=True, slots=True)
class Named:
    """One kind of named object: its service, messages and JSON."""

    #: the object in error messages ("Namespace", "Node pool")
    title: str
    #: its field in Get's answer (`namespace`) and, plural, in List's
    #: answer and Upsert's request (`namespaces`)
    single: str
    plural: str
    service: Callable[[Backend], Any]
    list_request: Callable[..., Any]
    get_request: Callable[..., Any]
    upsert_request: Callable[..., Any]
    delete_request: Callable[..., Any]
    #: the object as Nomad's JSON, and Nomad's JSON as the object
    #: (ValueError naming the problem)
    show: Callable[[Any], dict[str, Any]]
    from_nomad: Callable[[dict[str, Any]], Any]

    async def listing(self, request: Request) -> Response:
        q = QueryOptions.from_request(request)

        async def fetch(query: query_pb2.QueryOptions) -> tuple[list[dict[str, Any]], Any]:
            resp = await self.service(backend_of(request)).List(
                self.list_request(query=query), metadata=q.metadata, timeout=q.timeout
            )
            return [self.show(o) for o in getattr(resp, self.plural)], resp.meta

        return await listing(request, q, fetch, key="Name")

    async def upsert(self, request: Request, name: str) -> Response:
        """Write the body's object; `name` (the path's, '' for none) must be its."""
        body = await object_body(request)
        try:
            message = self.from_nomad(body)
        except ValueError as exc:
            raise bad_request(str(exc)) from None
        if name and message.name != name:
            raise bad_request(f"{self.title} name does not match request path")
        resp = await self.service(backend_of(request)).Upsert(
            self.upsert_request(**{self.plural: [message]}),
            metadata=metadata_of(request),
            timeout=DEFAULT_TIMEOUT,
        )
        return written(resp.index)

    async def one(self, request: Request, name: str) -> Response:
        """GET, DELETE, or else write the object `name`."""
        service = self.service(backend_of(request))
        if request.method == "GET":
            q = QueryOptions.from_request(request)
            resp = await service.Get(
                self.get_request(name=name, query=q.proto(paginate=False)),
                metadata=q.metadata,
                timeout=q.timeout,
            )
            return respond(request, self.show(getattr(resp, self.single)), index=resp.meta.index)
        if request.method == "DELETE":
            done = await service.Delete(
                self.delete_request(names=[name]),
                metadata=metadata_of(request),
                timeout=DEFAULT_TIMEOUT,
            )
            return written(done.index)
        return await self.upsert(request, name)
