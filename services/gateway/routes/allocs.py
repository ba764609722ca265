"""/v1/allocations, /v1/allocation/:id, /v1/allocation/:id/stop, and what
the alloc's agent serves: task logs at /v1/client/fs/logs/:alloc, resource
usage at /v1/client/allocation/:alloc/stats, and signals and restarts at
/v1/client/allocation/:alloc/signal and /restart."""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator
from typing import Any

import grpc
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import BaseRoute

from corral.v1 import alloc_pb2, job_pb2, node_pb2, query_pb2
from corral.v1 import structs_pb2 as pb
from services.gateway.authz import ALLOC_AGENT_READ, READ_JOB_OBJECT, ApiRoute, at_alloc_agent, ns
from services.gateway.backend import DEFAULT_TIMEOUT, Backend, Metadata
from services.gateway.http import (
    NomadError,
    QueryOptions,
    backend_of,
    bad_request,
    bool_param,
    int_param,
    listing,
    metadata_of,
    object_body,
    region_of,
    respond,
)
from services.gateway.mapping import allocs as alloc_map
from services.gateway.mapping import jobs as job_map
from services.gateway.mapping import stats as stats_map


async def allocations(request: Request) -> Response:
    q = QueryOptions.from_request(request)
    p = request.query_params
    backend = backend_of(request)

    async def call(query: query_pb2.QueryOptions) -> tuple[list[dict[str, Any]], Any]:
        resp = await backend.allocs.List(
            alloc_pb2.AllocListRequest(
                query=query,
                job_id=p.get("job", ""),
                node_id=p.get("node", ""),
                client_status=p.get("client_status", ""),
            ),
            metadata=q.metadata,
            timeout=q.timeout,
        )
        return [alloc_map.stub(a) for a in resp.allocs], resp.meta

    return await listing(request, q, call, by_creation=True)


async def allocation(request: Request) -> Response:
    q = QueryOptions.from_request(request)
    backend = backend_of(request)
    resp = await backend.allocs.Get(
        alloc_pb2.AllocGetRequest(
            alloc_id=request.path_params["alloc_id"], query=q.proto(paginate=False)
        ),
        metadata=q.metadata,
        timeout=q.timeout,
    )
    a = resp.alloc
    job = None
    # Nomad embeds the alloc's job version; ours is read from the versions
    # (absent once the job was purged)
    try:
        versions = await backend.jobs.Versions(
            job_pb2.JobVersionsRequest(
                job_id=a.job_id, query=query_pb2.QueryOptions(namespace=a.namespace)
            ),
            metadata=q.metadata,
            timeout=DEFAULT_TIMEOUT,
        )
        found = next((v for v in versions.versions if v.version == a.job_version), None)
        job = job_map.job(found) if found is not None else None
    except grpc.aio.AioRpcError as exc:
        if exc.code() != grpc.StatusCode.NOT_FOUND:
            raise
    return respond(request, alloc_map.alloc(a, job), index=resp.meta.index)


async def allocation_stop(request: Request) -> Response:
    resp = await backend_of(request).allocs.Stop(
        alloc_pb2.AllocStopRequest(
            alloc_id=request.path_params["alloc_id"],
            no_shutdown_delay=bool_param(request, "no_shutdown_delay"),
        ),
        metadata=metadata_of(request),
        timeout=DEFAULT_TIMEOUT,
    )
    return respond(request, {"EvalID": resp.eval_id, "Index": resp.index}, index=resp.index)


async def alloc_agent(request: Request) -> tuple[pb.Allocation, str]:
    """The alloc of the path and the address of the agent running it."""
    return await find_alloc_agent(
        backend_of(request), metadata_of(request), request.path_params["alloc_id"]
    )


async def find_alloc_agent(
    backend: Backend, md: Metadata, alloc_id: str
) -> tuple[pb.Allocation, str]:
    """An alloc (id or prefix) and the address of the agent running it."""
    got = await backend.allocs.Get(
        alloc_pb2.AllocGetRequest(alloc_id=alloc_id),
        metadata=md,
        timeout=DEFAULT_TIMEOUT,
    )
    alloc = got.alloc
    if not alloc.node_id:
        raise NomadError(404, "allocation is not placed on a node")
    node = await backend.nodes.Get(
        node_pb2.NodeGetRequest(node_id=alloc.node_id), metadata=md, timeout=DEFAULT_TIMEOUT
    )
    if not node.node.http_addr:
        raise NomadError(404, f"node {alloc.node_id} has no address to reach its agent")
    return alloc, node.node.http_addr


async def allocation_stats(request: Request) -> Response:
    """Nomad's client/structs.AllocResourceUsage (`?task=` for one task)."""
    alloc, address = await alloc_agent(request)
    resp = (
        await backend_of(request)
        .client_alloc(address, region_of(request))
        .Stats(
            alloc_pb2.AllocStatsRequest(
                alloc_id=alloc.id, task=request.query_params.get("task", "")
            ),
            metadata=metadata_of(request),
            timeout=DEFAULT_TIMEOUT,
        )
    )
    return respond(request, stats_map.alloc_usage(resp.usage))


def _text(body: dict[str, Any], key: str) -> str:
    value = body.get(key)
    if value is None:
        return ""
    if not isinstance(value, str):
        raise bad_request(f"{key} must be a string")
    return value


async def allocation_signal(request: Request) -> Response:
    """Nomad's PUT/POST /v1/client/allocation/:id/signal, body
    {"Signal": "SIGUSR1", "Task": "web"}: every running task without Task.
    No Signal is SIGINT, what Nomad's drivers send for one they are not given."""
    body = await object_body(request, required=False)
    signal, task = _text(body, "Signal") or "SIGINT", _text(body, "Task")
    alloc, address = await alloc_agent(request)
    await (
        backend_of(request)
        .client_alloc(address, region_of(request))
        .Signal(
            alloc_pb2.AllocSignalRequest(alloc_id=alloc.id, task=task, signal=signal),
            metadata=metadata_of(request),
            timeout=DEFAULT_TIMEOUT,
        )
    )
    return respond(request, {"Index": 0})


async def allocation_restart(request: Request) -> Response:
    """Nomad's PUT/POST /v1/client/allocation/:id/restart, body
    {"TaskName": "web"} or {"AllTasks": true}; none restarts the running tasks."""
    body = await object_body(request, required=False)
    task = _text(body, "TaskName")
    all_tasks = body.get("AllTasks") or False
    if not isinstance(all_tasks, bool):
        raise bad_request("AllTasks must be true or false")
    alloc, address = await alloc_agent(request)
    await (
        backend_of(request)
        .client_alloc(address, region_of(request))
        .Restart(
            alloc_pb2.AllocRestartRequest(alloc_id=alloc.id, task=task, all_tasks=all_tasks),
            metadata=metadata_of(request),
            # the old runs end first: a kill timeout of the agent's maximum
            timeout=DEFAULT_TIMEOUT + 60,
        )
    )
    return respond(request, {"Index": 0})


async def logs(request: Request) -> Response:
    """Nomad's log streaming: JSON frames {"Data": base64, "File", "Offset"}
    one after another, or the raw bytes with `plain=true`."""
    p = request.query_params
    task = p.get("task", "")
    if not task:
        raise bad_request("must include task name")
    kind = p.get("type", "stdout")
    if kind not in ("stdout", "stderr"):
        raise bad_request("must include a type of stdout or stderr")
    origin = p.get("origin", "start") or "start"
    if origin not in ("start", "end"):
        raise bad_request("origin must be start or end")
    follow = bool_param(request, "follow")
    plain = bool_param(request, "plain")
    offset = int_param(request, "offset")
    backend = backend_of(request)
    md = metadata_of(request)
    alloc, address = await alloc_agent(request)
    logs_call: Any = backend.client_alloc(address, region_of(request)).Logs
    stream = logs_call(
        alloc_pb2.AllocLogsRequest(
            alloc_id=alloc.id, task=task, type=kind, follow=follow, offset=offset, origin=origin
        ),
        metadata=md,
        timeout=None if follow else DEFAULT_TIMEOUT,
    )
    it = stream.__aiter__()
    # the first chunk (or the error) before the answer starts: a bad task
    # name is a 4xx, not a broken stream
    try:
        first: alloc_pb2.AllocLogsChunk | None = await it.__anext__()
    except StopAsyncIteration:
        first = None

    def frame(chunk: alloc_pb2.AllocLogsChunk) -> bytes:
        if plain:
            return chunk.data
        body = {
            "Data": base64.b64encode(chunk.data).decode(),
            "File": chunk.file,
            "Offset": chunk.offset,
        }
        return json.dumps(body).encode()

    async def body() -> AsyncIterator[bytes]:
        try:
            if first is not None:
                yield frame(first)
            async for chunk in it:
                yield frame(chunk)
        except grpc.aio.AioRpcError:
            return  # the agent went away mid-stream: end the body
        finally:
            stream.cancel()

    media = "text/plain; charset=utf-8" if plain else "application/json"
    return StreamingResponse(body(), media_type=media)


STOP = ns("alloc-lifecycle", per_object=True)
#: Nomad's needs read-logs (or read-fs) only; the gateway finds the alloc's
#: agent with Alloc.Get and Node.Get first, so Corral's needs read-job and
#: node:read as well (docs/http-api.md)
LOGS = at_alloc_agent("read-logs")

#: Nomad's needs alloc-lifecycle; the gateway finds the alloc's agent with
#: Alloc.Get and Node.Get first (read-job, node:read), and the agent checks
#: alloc-lifecycle itself
ALLOC_LIFECYCLE = at_alloc_agent("alloc-lifecycle")

ROUTES: list[BaseRoute] = [
    ApiRoute("/v1/allocations", allocations, {"GET": ns("read-job", filters=True)}),
    ApiRoute("/v1/allocation/{alloc_id}/stop", allocation_stop, {"PUT": STOP, "POST": STOP}),
    ApiRoute("/v1/allocation/{alloc_id}", allocation, {"GET": READ_JOB_OBJECT}),
    ApiRoute("/v1/client/fs/logs/{alloc_id}", logs, {"GET": LOGS}),
    ApiRoute("/v1/client/allocation/{alloc_id}/stats", allocation_stats, {"GET": ALLOC_AGENT_READ}),
    ApiRoute(
        "/v1/client/allocation/{alloc_id}/signal",
        allocation_signal,
        {"PUT": ALLOC_LIFECYCLE, "POST": ALLOC_LIFECYCLE},
    ),
    ApiRoute(
        "/v1/client/allocation/{alloc_id}/restart",
        allocation_restart,
        {"PUT": ALLOC_LIFECYCLE, "POST": ALLOC_LIFECYCLE},
    ),
]
