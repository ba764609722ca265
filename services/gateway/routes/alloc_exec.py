"""`/v1/client/allocation/:alloc/exec`: Nomad's alloc exec WebSocket,
relayed to the alloc's agent over the bidirectional `ClientAlloc.Exec`; and
`/v1/job/:job/action`, a job's action run the same way (`action`,
`allocID`, `task` in the query: the agent finds the action's command).

The query names `task`, `command` (a JSON list of strings) and `tty`; with
`ws_handshake=true` the first message is `{"version": 1, "auth_token":
"..."}` (browsers cannot set headers; a token also given as a header must
be the same). Then, as Nomad's api.ExecStreamingInput/Output, one JSON
object per text message: in, `{"stdin": {"data": base64, "close": bool}}`,
`{"tty_size": {"height", "width"}}` or `{}` (a heartbeat); out,
`{"stdout": {"data": base64}}`, `{"stderr": ...}` and last `{"exited":
true, "result": {"exit_code": N}}`, after which the socket closes normally.
An error closes it with Nomad's codes (1011 for a server error, 1008 for
anything else) and the message as the reason. When the caller goes away
the call to the agent is cancelled, and the agent kills the command.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
from starlette.routing import BaseRoute
from starlette.websockets import WebSocket, WebSocketDisconnect

from corral.domain import task_exec
from corral.domain.errors import bounded_message
from corral.v1 import alloc_pb2
from services.gateway.authz import ApiWebSocketRoute, at_alloc_agent
from services.gateway.backend import Metadata, token_metadata
from services.gateway.http import GRPC_TO_HTTP, NomadError, bad_request, token_of
from services.gateway.routes.allocs import find_alloc_agent

#: how long the caller may take to send the handshake
HANDSHAKE_TIMEOUT = 30.0
#: the handshake version Nomad speaks
HANDSHAKE_VERSION = 1
#: a WebSocket close reason is at most 123 bytes of UTF-8
MAX_REASON_BYTES = 123
WS_NORMAL, WS_POLICY, WS_INTERNAL = 1000, 1008, 1011


def _reason(message: str) -> str:
    return (
        bounded_message(" ".join(message.split()), MAX_REASON_BYTES)
        .encode()[:MAX_REASON_BYTES]
        .decode(errors="ignore")
    )


def _ws_code(status: int) -> int:
    """Nomad's toWsCode: 500 is an internal error, anything else a policy one."""
    return WS_INTERNAL if status >= 500 else WS_POLICY


def _flag(ws: WebSocket, name: str) -> bool:
    raw = ws.query_params.get(name, "")
    if raw == "":
        return False
    if raw.lower() in ("1", "true", "t"):
        return True
    if raw.lower() in ("0", "false", "f"):
        return False
    raise bad_request(f"{name} value is not a boolean: {raw!r}")


def _command(ws: WebSocket) -> list[str]:
    raw = ws.query_params.get("command", "")
    try:
        command = json.loads(raw) if raw else []
    except ValueError:
        raise bad_request("command must be a JSON list of strings") from None
    if not isinstance(command, list) or not all(isinstance(c, str) for c in command):
        raise bad_request("command must be a JSON list of strings")
    if not command:
        raise bad_request("command is not present")
    return command


async def _handshake(ws: WebSocket, header_token: str) -> str:
    try:
        text = await asyncio.wait_for(ws.receive_text(), HANDSHAKE_TIMEOUT)
        message = json.loads(text)
    except TimeoutError:
        raise bad_request("no handshake message arrived") from None
    except (ValueError, KeyError):
        raise bad_request("the handshake must be a JSON object") from None
    if not isinstance(message, dict):
        raise bad_request("the handshake must be a JSON object")
    token = str(message.get("auth_token") or "")
    if header_token and header_token != token:
        raise bad_request("handshake auth token mismatched auth header token")
    if message.get("version") != HANDSHAKE_VERSION:
        raise bad_request(f"unexpected handshake value: {message.get('version')}")
    return token


def _input(text: str) -> alloc_pb2.AllocExecRequest | None:
    """One caller message as the agent's; None for a heartbeat."""
    try:
        message = json.loads(text)
    except ValueError:
        raise bad_request("exec input must be JSON") from None
    if not isinstance(message, dict):
        raise bad_request("exec input must be a JSON object")
    stdin, size = message.get("stdin"), message.get("tty_size")
    if isinstance(stdin, dict):
        try:
            data = base64.b64decode(stdin.get("data") or "", validate=True)
        except (binascii.Error, ValueError, TypeError):
            raise bad_request("stdin data must be base64") from None
        return alloc_pb2.AllocExecRequest(
            stdin=alloc_pb2.ExecIO(data=data, close=bool(stdin.get("close")))
        )
    if isinstance(size, dict):
        try:
            height, width = int(size.get("height") or 0), int(size.get("width") or 0)
        except (TypeError, ValueError):
            raise bad_request("tty_size needs whole numbers") from None
        return alloc_pb2.AllocExecRequest(
            tty_size=alloc_pb2.TerminalSize(
                height=max(0, min(height, 65535)), width=max(0, min(width, 65535))
            )
        )
    return None


def _output(resp: alloc_pb2.AllocExecResponse) -> dict[str, Any] | None:
    if resp.exited:
        return {"exited": True, "result": {"exit_code": resp.exit_code}}
    for name in ("stdout", "stderr"):
        if resp.HasField(name):
            io: alloc_pb2.ExecIO = getattr(resp, name)
            out: dict[str, Any] = {}
            if io.data:
                out["data"] = base64.b64encode(io.data).decode()
            if io.close:
                out["close"] = True
            return {name: out}
    return None


async def exec_socket(ws: WebSocket) -> None:
    await _serve(ws, _session)


async def action_socket(ws: WebSocket) -> None:
    await _serve(ws, _action_session)


async def _serve(ws: WebSocket, session: Callable[[WebSocket], Awaitable[tuple[int, str]]]) -> None:
    await ws.accept()
    try:
        code, reason = await session(ws)
    except NomadError as exc:
        code, reason = _ws_code(exc.status), exc.message
    except grpc.aio.AioRpcError as exc:
        status = GRPC_TO_HTTP.get(exc.code(), 500)
        code = _ws_code(status)
        reason = "Permission denied" if status == 403 else (exc.details() or exc.code().name)
    except WebSocketDisconnect:
        return
    with contextlib.suppress(RuntimeError, WebSocketDisconnect):
        await ws.close(code, _reason(reason))


async def _caller(ws: WebSocket) -> Metadata:
    """The caller's token (from the handshake with `ws_handshake=true`) as
    the metadata of the calls made for it."""
    token = token_of(ws)
    if _flag(ws, "ws_handshake"):
        token = await _handshake(ws, token)
    return token_metadata(token)


def _required(ws: WebSocket, name: str, missing: str) -> str:
    value = ws.query_params.get(name, "")
    if not value:
        raise bad_request(missing)
    return value


async def _session(ws: WebSocket) -> tuple[int, str]:
    """Relay one exec; the close code and reason it ends with."""
    md = await _caller(ws)
    task = _required(ws, "task", "must provide task name")
    command = _command(ws)
    tty = _flag(ws, "tty")
    backend = ws.app.state.backend
    alloc, address = await find_alloc_agent(backend, md, ws.path_params["alloc_id"])
    setup = alloc_pb2.ExecSetup(alloc_id=alloc.id, task=task, command=command, tty=tty)
    return await _relay(ws, address, md, setup)


async def _action_session(ws: WebSocket) -> tuple[int, str]:
    """Nomad's /v1/job/:id/action: the job's action `action` run in task
    `task` of alloc `allocID` (required: Nomad's CLI picks one, the API does
    not), relayed as alloc exec relays a command. `group` is accepted and,
    as Nomad's servers do, not needed: the alloc has one group."""
    md = await _caller(ws)
    action = _required(ws, "action", "must provide action name")
    alloc_id = _required(ws, "allocID", "missing AllocID")
    task = _required(ws, "task", "must provide task name")
    tty = _flag(ws, "tty")
    alloc, address = await find_alloc_agent(ws.app.state.backend, md, alloc_id)
    setup = alloc_pb2.ExecSetup(
        alloc_id=alloc.id, task=task, action=action, job_id=ws.path_params["job_id"], tty=tty
    )
    return await _relay(ws, address, md, setup)


async def _relay(
    ws: WebSocket, address: str, md: Metadata, setup: alloc_pb2.ExecSetup
) -> tuple[int, str]:
    """One command run by the alloc's agent, relayed between the socket and
    `ClientAlloc.Exec`; the close code and reason it ends with."""
    backend = ws.app.state.backend
    inbox: asyncio.Queue[alloc_pb2.AllocExecRequest | None] = asyncio.Queue(maxsize=16)

    async def requests() -> AsyncIterator[alloc_pb2.AllocExecRequest]:
        yield alloc_pb2.AllocExecRequest(setup=setup)
        if not task_exec.started(await call.initial_metadata()):
            # refused: writing now would hide the agent's status (task_exec.py)
            await asyncio.Event().wait()
        while (item := await inbox.get()) is not None:
            yield item

    call: Any = backend.client_alloc(address).Exec(requests(), metadata=md)
    failed: list[NomadError] = []
    gone = False

    async def read_socket() -> None:
        nonlocal gone
        try:
            while True:
                item = _input(await ws.receive_text())
                if item is not None:
                    await inbox.put(item)
        except NomadError as exc:
            failed.append(exc)
        except (WebSocketDisconnect, RuntimeError):
            gone = True  # the caller went away: so does the command
        call.cancel()

    reader = asyncio.create_task(read_socket())
    try:
        async for resp in call:
            out = _output(resp)
            if out is not None:
                await ws.send_text(json.dumps(out))
            if resp.exited:
                return WS_NORMAL, ""
    except grpc.aio.AioRpcError as exc:
        if exc.code() != grpc.StatusCode.CANCELLED:
            raise
    finally:
        reader.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await reader
        call.cancel()
    if failed:
        raise failed[0]
    if gone:
        raise WebSocketDisconnect(WS_NORMAL)
    return WS_INTERNAL, "the exec stream ended before the command's exit code"


#: Nomad's needs alloc-exec (and alloc-node-exec for a driver without file
#: system isolation, which the agent checks); the gateway finds the alloc's
#: agent with Alloc.Get and Node.Get first: read-job and node:read as well
EXEC = at_alloc_agent("alloc-exec", " (raw_exec: `alloc-node-exec` too)")

ROUTES: list[BaseRoute] = [
    ApiWebSocketRoute("/v1/client/allocation/{alloc_id}/exec", exec_socket, EXEC),
    # Nomad's job action: the same needs (the agent checks alloc-exec)
    ApiWebSocketRoute("/v1/job/{job_id:path}/action", action_socket, EXEC),
]
