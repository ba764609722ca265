"""/v1/search/fuzzy: Nomad's fuzzy search ("FuzzySearch" in api-docs/search):
the names containing a text, ignoring case, with each match's scope (the
ids of its parents, from the namespace down).

As Nomad's servers (`search { limit_query = 20, limit_results = 100,
min_term_length = 2 }`, its defaults): each context scans its first 20
objects (`Truncations` says there were more or more than 100 matches),
and a text shorter than 2 characters is 400. Inside a job, its name
(`jobs`), groups (`groups`), tasks (`tasks`), services (`services`) and
the `image` (docker), `command` (exec, raw_exec) or `class` (java) of its
tasks' driver configs are matched. Evaluations, deployments and scaling
policies, named by UUID, are not matched against `Text`: as Nomad's, they
are listed by the request's `?prefix=` (its QueryOptions.Prefix; none: the
first 20), as the prefix search lists them.
Matches are sorted as Nomad's: where the text appears first, then the
shortest name, then by name.

The contexts are listed and decided for the token as the prefix search's
(`search.py`): one home for the listings and their ACL filtering."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import grpc
from google.protobuf.json_format import MessageToDict
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute

from corral.v1 import job_pb2, query_pb2, structs_pb2
from services.gateway.authz import ApiRoute
from services.gateway.backend import DEFAULT_TIMEOUT, Backend
from services.gateway.http import NomadError, backend_of, bad_request, metadata_of
from services.gateway.routes.search import (
    CONTEXTS,
    DENIED,
    SEARCH,
    TRUNCATE_LIMIT,
    everything,
    job_readers,
    namespace_of,
    namespace_shown,
    search_body,
    search_response,
)

#: Nomad's `search.limit_query`: objects scanned per context
LIMIT_QUERY = 20
#: Nomad's `search.limit_results`: matches kept per context
LIMIT_RESULTS = 100
#: Nomad's `search.min_term_length`
MIN_TERM_LENGTH = 2
#: contexts named by UUID, listed by `?prefix=` as Nomad's fuzzy search does
PREFIX_CONTEXTS = ("evals", "deployment", "scaling_policy")
#: the driver config key matched per driver, and the context it is found in
DRIVER_KEYS: dict[str, tuple[str, str]] = {
    "docker": ("image", "images"),
    "exec": ("command", "commands"),
    "raw_exec": ("command", "commands"),
    "java": ("class", "classes"),
}

#: a match: (where the text starts in the name, the name, its scope)
Scored = tuple[int, str, list[str]]


class Found:
    """The matches of one search, per context, with their truncations."""

    def __init__(self, text: str) -> None:
        self.text = text.lower()
        self.matches: dict[str, list[Scored]] = {}
        self.truncations: dict[str, bool] = {}

    def add(self, context: str, name: str, scope: list[str]) -> None:
        at = name.lower().find(self.text)
        if at < 0:
            return
        kept = self.matches.setdefault(context, [])
        if len(kept) >= LIMIT_RESULTS:
            self.truncations[context] = True
            return
        kept.append((at, name, scope))

    def body(self) -> dict[str, list[dict[str, Any]]]:
        """Nomad's `Matches`: each context's FuzzyMatch list, best first
        (`Scope` left out when empty, as Nomad's `omitempty`)."""
        out: dict[str, list[dict[str, Any]]] = {}
        for context, kept in self.matches.items():
            kept.sort(key=lambda m: (m[0], len(m[1]), m[1]))
            out[context] = [{"ID": n, "Scope": s} if s else {"ID": n} for _, n, s in kept]
        return out


def _scope_single(context: str, item: Any) -> tuple[str, list[str]]:
    """The matched name of a listed object and its scope, as Nomad's."""
    if context == "nodes":
        return item.name, [item.id]
    if context == "node_pools":
        return item.name, [item.name]
    if context == "allocs":
        return item.name, [namespace_of(item), item.id]
    if context == "variables":
        return item.path, [namespace_of(item), item.path]
    return item.name, []  # namespaces


def match_job(found: Found, job: structs_pb2.Job) -> None:
    """The job's name and the names and driver configs inside it."""
    ns, jid = job.namespace or "default", job.id
    found.add("jobs", job.name, [ns, jid])
    for group in job.task_groups:
        found.add("groups", group.name, [ns, jid])
        for service in group.services:
            found.add("services", service.name, [ns, jid, group.name])
        for task in group.tasks:
            scope = [ns, jid, group.name, task.name]
            found.add("tasks", task.name, [ns, jid, group.name])
            for service in task.services:
                found.add("services", service.name, scope)
            key = DRIVER_KEYS.get(task.driver)
            if key is not None:
                value = MessageToDict(task.config).get(key[0])
                if isinstance(value, str):
                    found.add(key[1], value, scope)


async def _jobs(found: Found, b: Backend, stubs: list[Any], md: Any) -> None:
    """Each listed job read whole (at most LIMIT_QUERY), then matched."""
    for stub in stubs:
        query = query_pb2.QueryOptions(namespace=namespace_of(stub))
        try:
            resp = await b.jobs.Get(
                job_pb2.JobGetRequest(job_id=stub.id, query=query),
                metadata=md,
                timeout=DEFAULT_TIMEOUT,
            )
        except grpc.aio.AioRpcError as exc:
            if exc.code() == grpc.StatusCode.NOT_FOUND:
                continue  # deleted since it was listed
            raise
        match_job(found, resp.job)


async def fuzzy_search(request: Request) -> Response:
    text, wanted = await search_body(request, "Text")
    if len(text) < MIN_TERM_LENGTH:
        raise bad_request(
            f"fuzzy search query must be at least {MIN_TERM_LENGTH} characters, got {len(text)}"
        )
    namespace = request.query_params.get("namespace") or "default"
    uuid_prefix = request.query_params.get("prefix") or ""
    backend, md = backend_of(request), metadata_of(request)
    readable = await job_readers(request)
    found = Found(text)
    searched = False
    index = 0
    for context in wanted:
        prefix = context in PREFIX_CONTEXTS
        shown: Callable[[str], bool] = readable if context == "jobs" else everything
        if not namespace_shown(namespace, shown, alone=len(wanted) == 1):
            continue
        query = query_pb2.QueryOptions(
            prefix=uuid_prefix if prefix else "",
            per_page=TRUNCATE_LIMIT if prefix else LIMIT_QUERY,
            namespace=namespace,
        )
        try:
            items, meta = await CONTEXTS[context].listed(backend, query, md, shown)
            if context == "jobs":
                await _jobs(found, backend, items, md)
        except grpc.aio.AioRpcError as exc:
            if exc.code() in DENIED and len(wanted) > 1:
                continue  # left out of `all`, as Nomad's filtered contexts
            raise
        searched = True
        index = max(index, meta.index)
        if prefix:
            key = CONTEXTS[context].key
            found.matches[context] = [(0, getattr(i, key), []) for i in items]
        elif context != "jobs":
            for item in items:
                found.add(context, *_scope_single(context, item))
        found.truncations[context] = found.truncations.get(context, False) or bool(meta.next_token)
    if not searched:
        raise NomadError(403, "Permission denied")
    if found.truncations.get("jobs"):
        for inside in set(found.matches) - set(CONTEXTS):
            found.truncations[inside] = True  # of jobs not scanned
    return search_response(request, found.body(), found.truncations, index)


ROUTES: list[BaseRoute] = [
    ApiRoute("/v1/search/fuzzy", fuzzy_search, {"PUT": SEARCH, "POST": SEARCH}),
]
