"""The Task API (Nomad 1.5): a Unix socket in each task's secrets
directory, `secrets/api.sock`, through which the task reaches Nomad's HTTP
API without knowing where it is served. Here the agent proxies it to the
gateway (`--gateway-addr`), which serves Nomad's API.

As in Nomad, every request must carry a token — the task's workload
identity (`identity { env = true }` puts it in `NOMAD_TOKEN`, and
`NOMAD_UNIX_ADDR` then names the socket) or an ACL token — even when ACLs
are off: without one the answer is 401, with one the state does not know
403, both before anything is forwarded. The request then goes to the
gateway with its token, where the token's rights decide as for any other
caller: a task's identity reads its own job's variables and nothing of
another job's.

The socket belongs to the task's user (mode 0600), or to everyone (0666)
when the task names no user, as Nomad's api hook makes it. It is bound
through the secrets directory's descriptor (`/proc/self/fd/N/api.sock`),
so a deep data directory does not hit the 108-byte limit of a socket
path, and a task that replaced its secrets directory by a symlink cannot
make the agent bind (and chown) a socket elsewhere. WebSocket endpoints
(`alloc exec`) are not proxied."""

from __future__ import annotations

import contextlib
import logging
import os
import pwd
import socket
import ssl
from pathlib import Path
from typing import Any

import httpx

from corral.domain.errors import PermissionDenied
from corral.runtime.http_server import HttpServer
from corral.runtime.settings import SecuritySettings
from corral.security.acl_resolve import RemoteResolver

log = logging.getLogger(__name__)

SOCKET_NAME = "api.sock"
#: a request body the proxy takes (Nomad's own API bodies are far smaller)
MAX_BODY = 16 * 1024 * 1024
#: concurrent requests per task (more wait their turn at uvicorn's 503)
MAX_CONCURRENT = 64
#: headers that belong to one hop (RFC 9110 §7.6.1), never forwarded
HOP_BY_HOP = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"proxy-authenticate",
        b"proxy-authorization",
        b"te",
        b"trailer",
        b"transfer-encoding",
        b"upgrade",
        b"host",
        b"content-length",
    }
)


def request_token(headers: list[tuple[bytes, bytes]]) -> str:
    """Nomad's parseToken: `X-Nomad-Token`, else `Authorization: Bearer`."""
    bearer = ""
    for name, value in headers:
        key = name.lower()
        if key == b"x-nomad-token":
            return value.decode("latin-1").strip()
        if key == b"authorization" and not bearer:
            scheme, _, rest = value.decode("latin-1").strip().partition(" ")
            if scheme.lower() == "bearer":
                bearer = rest.strip()
    return bearer


def socket_env(dir_seen_by_task: str) -> dict[str, str]:
    """Nomad's NOMAD_UNIX_ADDR for a task whose secrets directory it sees
    at `dir_seen_by_task`."""
    return {"NOMAD_UNIX_ADDR": f"unix://{dir_seen_by_task.rstrip('/')}/{SOCKET_NAME}"}


async def _plain(send: Any, status: int, text: str) -> None:
    body = text.encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"text/plain; charset=utf-8"),
                (b"content-length", str(len(body)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


class Proxy:
    """The ASGI app behind every task's socket: authenticate, forward."""

    def __init__(self, client: httpx.AsyncClient, resolver: RemoteResolver) -> None:
        self.client = client
        self.resolver = resolver

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            if scope["type"] == "websocket":
                await send({"type": "websocket.close", "code": 1008})
            return
        headers: list[tuple[bytes, bytes]] = list(scope.get("headers") or [])
        token = request_token(headers)
        if not token:
            await _plain(send, 401, "Unauthorized")
            return
        try:
            await self.resolver.resolve_token(token)
        except PermissionDenied:
            await _plain(send, 403, "Forbidden")
            return
        except Exception:
            log.warning("Task API: could not authenticate a request", exc_info=True)
            await _plain(send, 500, "Server error authenticating request\n")
            return
        body = await self._body(receive)
        if body is None:
            await _plain(send, 413, "Request Entity Too Large")
            return
        path = scope.get("raw_path") or scope["path"].encode()
        query = scope.get("query_string") or b""
        url = path.decode("latin-1") + (f"?{query.decode('latin-1')}" if query else "")
        forwarded = [(k, v) for k, v in headers if k.lower() not in HOP_BY_HOP]
        request = self.client.build_request(scope["method"], url, headers=forwarded, content=body)
        try:
            response = await self.client.send(request, stream=True)
        except httpx.HTTPError as exc:
            log.warning("Task API: the gateway did not answer: %s", exc)
            await _plain(send, 502, "the Nomad API (gateway) cannot be reached\n")
            return
        try:
            await send(
                {
                    "type": "http.response.start",
                    "status": response.status_code,
                    "headers": [
                        (k, v) for k, v in response.headers.raw if k.lower() not in HOP_BY_HOP
                    ],
                }
            )
            async for chunk in response.aiter_raw():
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b""})
        except httpx.HTTPError as exc:
            log.info("Task API: the gateway's answer broke off: %s", exc)
        finally:
            await response.aclose()

    @staticmethod
    async def _body(receive: Any) -> bytes | None:
        parts: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return b"".join(parts)
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > MAX_BODY:
                return None
            parts.append(chunk)
            if not message.get("more_body"):
                return b"".join(parts)


def upstream_ssl(security: SecuritySettings) -> ssl.SSLContext | None:
    """With TLS, the gateway is verified with the cluster's CA and the
    agent presents its own certificate."""
    if not security.tls:
        return None
    ctx = ssl.create_default_context(cafile=security.ca_file)
    ctx.load_cert_chain(security.cert_file, security.key_file)
    return ctx


class TaskSocket:
    """One task's socket and the server answering on it."""

    def __init__(self, server: HttpServer, path: Path) -> None:
        self.server = server
        self.path = path

    async def close(self) -> None:
        await self.server.stop(grace=5)
        with contextlib.suppress(OSError):
            self.path.unlink()


class TaskAPI:
    """The agent's Task API: `open` one socket per task (see the module
    doc); `gateway` is the HTTP API's base URL."""

    def __init__(
        self, gateway: str, resolver: RemoteResolver, *, security: SecuritySettings
    ) -> None:
        self.gateway = gateway.rstrip("/")
        context = upstream_ssl(security) if self.gateway.startswith("https:") else None
        self.client = httpx.AsyncClient(
            base_url=self.gateway,
            verify=context if context is not None else True,
            # blocking queries and the event stream answer late: no read timeout
            timeout=httpx.Timeout(connect=10.0, read=None, write=60.0, pool=30.0),
            limits=httpx.Limits(max_connections=256, max_keepalive_connections=32),
            follow_redirects=False,
        )
        self.app = Proxy(self.client, resolver)

    async def open(self, secrets_dir: Path, user: str) -> TaskSocket:
        """Listen on `secrets_dir/api.sock` for a task running as `user`
        ("" = no user of its own). OSError when the socket cannot be made,
        ConfigError when it cannot be served."""
        sock = _bind(secrets_dir, user)
        server = HttpServer(
            sock,
            self.app,
            name="task-api",
            proxy_headers=False,
            limit_concurrency=MAX_CONCURRENT,
            timeout_graceful_shutdown=1,
            ws="none",
        )
        try:
            await server.start()
        except BaseException:
            sock.close()
            raise
        return TaskSocket(server, secrets_dir / SOCKET_NAME)

    async def close(self) -> None:
        await self.client.aclose()


def _bind(secrets_dir: Path, user: str) -> socket.socket:
    """The listening socket in `secrets_dir`, owned as Nomad's
    users.SocketFileFor makes it (see the module doc)."""
    dir_fd = os.open(secrets_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(SOCKET_NAME, dir_fd=dir_fd)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.bind(f"/proc/self/fd/{dir_fd}/{SOCKET_NAME}")
            owner = _uid(user)
            if owner is not None and os.geteuid() == 0:
                os.chown(SOCKET_NAME, owner, -1, dir_fd=dir_fd, follow_symlinks=False)
                os.chmod(SOCKET_NAME, 0o600, dir_fd=dir_fd)
            else:
                os.chmod(SOCKET_NAME, 0o666, dir_fd=dir_fd)
            sock.listen(128)
            sock.setblocking(False)
        except BaseException:
            sock.close()
            raise
        return sock
    finally:
        os.close(dir_fd)


def _uid(user: str) -> int | None:
    if not user:
        return None
    try:
        return pwd.getpwnam(user).pw_uid
    except KeyError:
        return None
