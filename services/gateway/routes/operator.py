"""/v1/operator/scheduler/configuration (GET, PUT/POST with `?cas=`) and
/v1/operator/snapshot (GET saves, PUT/POST restores)."""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator
from typing import Any

import grpc
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import BaseRoute

from corral.v1 import operator_pb2
from services.gateway.authz import MANAGEMENT, OPERATOR_READ, OPERATOR_WRITE, ApiRoute
from services.gateway.backend import DEFAULT_TIMEOUT
from services.gateway.http import (
    NomadError,
    QueryOptions,
    backend_of,
    bad_request,
    int_param,
    json_body,
    metadata_of,
    respond,
    written,
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


#: the state process reads and writes a whole snapshot in this time at most
SNAPSHOT_TIMEOUT = 3600.0
#: bytes of the request body per SnapshotRestore message
RESTORE_CHUNK = 1 << 20


async def snapshot(request: Request) -> Response:
    if request.method == "GET":
        return await _snapshot_save(request)
    return await _snapshot_restore(request)


async def _snapshot_save(request: Request) -> Response:
    """The archive as the body, as Nomad's: its index in `X-Nomad-Index`,
    its SHA-256 in `Digest` (what Nomad's api client checks). `?stale` is
    accepted: every state process answers from the same database."""
    call: Any = backend_of(request).operator.SnapshotSave(
        operator_pb2.SnapshotSaveRequest(stale="stale" in request.query_params),
        metadata=metadata_of(request),
        timeout=SNAPSHOT_TIMEOUT,
    )
    it = call.__aiter__()
    # the header (or the error) before the answer starts: a refusal is a 4xx
    head: operator_pb2.SnapshotSaveResponse = await it.__anext__()

    async def body() -> AsyncIterator[bytes]:
        try:
            async for msg in it:
                yield msg.data
        except grpc.aio.AioRpcError:
            return  # the body ends short of Content-Length: the client sees it broke
        finally:
            call.cancel()

    digest = base64.b64encode(bytes.fromhex(head.sha256)).decode()
    headers = {
        "X-Nomad-Index": str(max(head.index, 1)),
        "X-Nomad-KnownLeader": "true",
        "X-Nomad-LastContact": "0",
        "Digest": f"sha-256={digest}",
        "Content-Length": str(head.size),
    }
    return StreamingResponse(body(), headers=headers, media_type="application/octet-stream")


async def _snapshot_restore(request: Request) -> Response:
    """The body, as it arrives, to the state (which bounds its size); the
    restore's index in `X-Nomad-Index` and no body, as Nomad's."""

    async def chunks() -> AsyncIterator[operator_pb2.SnapshotRestoreRequest]:
        pending = bytearray()
        sent = False
        async for data in request.stream():
            pending += data
            while len(pending) >= RESTORE_CHUNK:
                yield operator_pb2.SnapshotRestoreRequest(data=bytes(pending[:RESTORE_CHUNK]))
                sent = True
                del pending[:RESTORE_CHUNK]
        if pending or not sent:
            # at least one message, even empty: the state checks the token on
            # a stream's first message, before it says the body is empty
            yield operator_pb2.SnapshotRestoreRequest(data=bytes(pending))

    call: Any = backend_of(request).operator.SnapshotRestore(
        chunks(), metadata=metadata_of(request), timeout=SNAPSHOT_TIMEOUT
    )
    index = 0
    async for resp in call:
        index = resp.index
    if not index:
        raise NomadError(500, "the state ended the snapshot restore without an answer")
    return written(index)


ROUTES: list[BaseRoute] = [
    ApiRoute(
        "/v1/operator/scheduler/configuration",
        scheduler_configuration,
        {"GET": OPERATOR_READ, "PUT": OPERATOR_WRITE, "POST": OPERATOR_WRITE},
    ),
    ApiRoute(
        "/v1/operator/snapshot",
        snapshot,
        {"GET": MANAGEMENT, "PUT": MANAGEMENT, "POST": MANAGEMENT},
    ),
]
