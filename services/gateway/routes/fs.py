"""`/v1/client/fs/{ls,stat,cat,readat,stream}/:alloc`: the files of an
alloc's directory, from the agent running it (its ClientFS service), as
Nomad's HTTP API has them. `ls` and `stat` answer Nomad's AllocFileInfo;
`cat` and `readat` the file's bytes; `stream` Nomad's StreamFrame JSON
objects one after another (`{"Offset", "Data" (base64), "File",
"FileEvent"}`, empty fields left out, `{}` a heartbeat), following the file
unless `follow=false`."""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator
from typing import Any

import grpc
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import BaseRoute

from corral.v1 import alloc_pb2
from services.gateway.authz import ApiRoute, at_alloc_agent
from services.gateway.backend import DEFAULT_TIMEOUT
from services.gateway.http import (
    backend_of,
    bad_request,
    bool_param,
    int_param,
    metadata_of,
    region_of,
    respond,
)
from services.gateway.mapping.common import rfc3339
from services.gateway.routes.allocs import alloc_agent


def file_info(f: alloc_pb2.AllocFileInfo) -> dict[str, Any]:
    """Nomad's AllocFileInfo."""
    return {
        "Name": f.name,
        "IsDir": f.is_dir,
        "Size": f.size,
        "FileMode": f.file_mode,
        "ModTime": rfc3339(f.mod_time),
        "ContentType": f.content_type,
    }


def _path(request: Request, *, required: bool) -> str:
    path = request.query_params.get("path", "")
    if required and not path:
        raise bad_request("must provide a file name")
    return path or "/"


async def ls(request: Request) -> Response:
    path = _path(request, required=False)
    alloc, address = await alloc_agent(request)
    resp = (
        await backend_of(request)
        .client_fs(address, region_of(request))
        .List(
            alloc_pb2.FsListRequest(alloc_id=alloc.id, path=path),
            metadata=metadata_of(request),
            timeout=DEFAULT_TIMEOUT,
        )
    )
    return respond(request, [file_info(f) for f in resp.files])


async def stat(request: Request) -> Response:
    path = _path(request, required=True)
    alloc, address = await alloc_agent(request)
    resp = (
        await backend_of(request)
        .client_fs(address, region_of(request))
        .Stat(
            alloc_pb2.FsStatRequest(alloc_id=alloc.id, path=path),
            metadata=metadata_of(request),
            timeout=DEFAULT_TIMEOUT,
        )
    )
    return respond(request, file_info(resp.info))


def _offset(request: Request, *, required: bool) -> int:
    raw = request.query_params.get("offset")
    if raw is None or raw == "":
        if required:
            raise bad_request('error parsing offset: strconv.ParseInt: parsing "": invalid syntax')
        return 0
    return int_param(request, "offset")


async def _stream(
    request: Request, fs_request: alloc_pb2.FsStreamRequest, *, raw: bool
) -> Response:
    """The agent's frames as the HTTP body: the first one (or the error)
    before the answer starts, so a bad path is a 4xx, not a broken body."""
    alloc, address = await alloc_agent(request)
    fs_request.alloc_id = alloc.id
    call: Any = backend_of(request).client_fs(address, region_of(request)).Stream
    stream = call(
        fs_request,
        metadata=metadata_of(request),
        timeout=None if fs_request.follow else DEFAULT_TIMEOUT,
    )
    it = stream.__aiter__()
    try:
        first: alloc_pb2.FsStreamFrame | None = await it.__anext__()
    except StopAsyncIteration:
        first = None

    def encode(frame: alloc_pb2.FsStreamFrame) -> bytes:
        if raw:
            return frame.data
        body: dict[str, Any] = {}
        if frame.offset:
            body["Offset"] = frame.offset
        if frame.data:
            body["Data"] = base64.b64encode(frame.data).decode()
        if frame.file:
            body["File"] = frame.file
        if frame.file_event:
            body["FileEvent"] = frame.file_event
        return json.dumps(body).encode()

    async def body() -> AsyncIterator[bytes]:
        try:
            if first is not None:
                yield encode(first)
            async for frame in it:
                yield encode(frame)
        except grpc.aio.AioRpcError:
            return  # the agent went away mid-stream: end the body
        finally:
            stream.cancel()

    media = "application/octet-stream" if raw else "application/json"
    return StreamingResponse(
        body(), media_type=media, headers={"X-Content-Type-Options": "nosniff"}
    )


async def cat(request: Request) -> Response:
    path = _path(request, required=True)
    return await _stream(request, alloc_pb2.FsStreamRequest(path=path), raw=True)


async def readat(request: Request) -> Response:
    path = _path(request, required=True)
    fs_request = alloc_pb2.FsStreamRequest(
        path=path,
        offset=_offset(request, required=True),
        limit=int_param(request, "limit"),
    )
    return await _stream(request, fs_request, raw=True)


async def stream(request: Request) -> Response:
    path = _path(request, required=True)
    origin = request.query_params.get("origin", "") or "start"
    if origin not in ("start", "end"):
        raise bad_request("origin must be start or end")
    follow = request.query_params.get("follow", "") == "" or bool_param(request, "follow")
    fs_request = alloc_pb2.FsStreamRequest(
        path=path,
        offset=_offset(request, required=False),
        origin=origin,
        follow=follow,
    )
    return await _stream(request, fs_request, raw=False)


#: Nomad's needs read-fs; the gateway finds the alloc's agent with
#: Alloc.Get and Node.Get first, so Corral's needs read-job and node:read
#: as well (as the logs, docs/http-api.md)
READ_FS = at_alloc_agent("read-fs")

ROUTES: list[BaseRoute] = [
    ApiRoute("/v1/client/fs/ls/{alloc_id}", ls, {"GET": READ_FS}),
    ApiRoute("/v1/client/fs/stat/{alloc_id}", stat, {"GET": READ_FS}),
    ApiRoute("/v1/client/fs/cat/{alloc_id}", cat, {"GET": READ_FS}),
    ApiRoute("/v1/client/fs/readat/{alloc_id}", readat, {"GET": READ_FS}),
    ApiRoute("/v1/client/fs/stream/{alloc_id}", stream, {"GET": READ_FS}),
]
