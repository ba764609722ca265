"""The one HTTP server bootstrap, the HTTP counterpart of `server.py`.

A role that serves HTTP (the gateway: Nomad's `/v1` API and the web UI;
the client agent: each task's Task API socket) gets: uvicorn inside the
runner's event loop (the runner owns the signals, the start-up and the
shutdown), a listening socket bound before serving so a port in use is a
clear start-up error rather than uvicorn ending the process (or a socket
the caller bound itself, such as a Unix socket), port 0 with the bound
address reported, HTTPS with the process's certificates when TLS is on (a
client certificate required or optional), renewed certificate files loaded
without a restart by the same watch as the gRPC servers and channels
(`corral.security.tls.CertificateWatch`), and a graceful stop: requests in
flight get `grace` seconds to finish.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import uvicorn

from corral.domain.errors import ConfigError
from corral.security.tls import CertificateWatch

log = logging.getLogger(__name__)

#: how often the HTTPS listener looks for renewed certificate files
CERT_CHECK_INTERVAL = 30.0


@dataclass(frozen=True, slots=True)
class Https:
    """The files an HTTPS listener presents and trusts."""

    cert_file: str
    key_file: str
    ca_file: str
    #: require a client certificate the CA signed (else optional)
    verify_clients: bool = False


class _Uvicorn(uvicorn.Server):
    """uvicorn inside the runner's event loop: the runner owns the signals."""

    def install_signal_handlers(self) -> None:  # uvicorn < 0.29
        return None

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:  # uvicorn >= 0.29
        yield


def split_listen(listen: str) -> tuple[str, int]:
    host, sep, port = listen.rpartition(":")
    if not sep or not port.isdigit() or int(port) > 65535:
        raise ConfigError(f"--listen expects host:port, got {listen!r}")
    return host.strip("[]") or "127.0.0.1", int(port)


def bind(host: str, port: int) -> socket.socket:
    """The listening socket, bound here so that a port in use is a clear
    start-up error (uvicorn would exit the process)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise ConfigError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from exc
    sock.listen(2048)
    sock.setblocking(False)
    return sock


class HttpServer:
    """An ASGI application served on `listen` (see the module docstring).

    Usage::

        server = HttpServer("127.0.0.1:0", app, name="gateway", https=None)
        await server.start()          # ConfigError when it cannot serve
        server.url                    # http://127.0.0.1:40123
        await server.stop()

    `listen` is host:port, or a listening socket the caller bound (it is
    served as it is); `options` are more of uvicorn's settings (limits).
    """

    def __init__(
        self,
        listen: str | socket.socket,
        app: Any,
        *,
        name: str,
        https: Https | None = None,
        check_interval: float = CERT_CHECK_INTERVAL,
        **options: Any,
    ) -> None:
        self.name = name
        self.https = https
        self.check_interval = check_interval
        self._sock = listen if isinstance(listen, socket.socket) else None
        host, port = split_listen(listen) if isinstance(listen, str) else ("", 0)
        tls: dict[str, Any] = {}
        if https is not None:
            tls = {
                "ssl_certfile": https.cert_file,
                "ssl_keyfile": https.key_file,
                "ssl_ca_certs": https.ca_file,
                "ssl_cert_reqs": ssl.CERT_REQUIRED if https.verify_clients else ssl.CERT_OPTIONAL,
            }
        self.config = uvicorn.Config(
            app,
            host=host,
            port=port,
            log_config=None,
            access_log=False,
            lifespan="off",
            server_header=False,
            **({"timeout_graceful_shutdown": 5} | tls | options),
        )
        self.bound_address = ""
        self._server: _Uvicorn | None = None
        self._task: asyncio.Task[None] | None = None
        self._reload: asyncio.Task[None] | None = None

    @property
    def scheme(self) -> str:
        return "https" if self.https is not None else "http"

    @property
    def url(self) -> str:
        return f"{self.scheme}://{self.bound_address}"

    async def start(self) -> None:
        """Bind and serve; return once accepting connections."""
        try:
            self.config.load()
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(f"cannot load the HTTPS certificate: {exc}") from exc
        sock = self._sock or bind(self.config.host, self.config.port)
        self._server = _Uvicorn(self.config)
        self._task = asyncio.create_task(self._server.serve(sockets=[sock]), name=self.name)
        while not self._server.started:
            if self._task.done():
                failure = self._task.exception()
                where = (
                    self._sock.getsockname()
                    if self._sock is not None
                    else f"{self.config.host}:{self.config.port}"
                )
                raise ConfigError(f"cannot serve HTTP on {where}: {failure or 'exited'}")
            await asyncio.sleep(0.02)
        name = self._server.servers[0].sockets[0].getsockname()
        self.bound_address = name if isinstance(name, str) else f"{name[0]}:{name[1]}"
        if self.https is not None:
            self._reload = asyncio.create_task(self._reload_certificates(), name="https-certs")

    async def _reload_certificates(self) -> None:
        """Renewed certificate files take effect on the listener without a
        restart: its context loads them again, and new connections present
        the new chain (and trust the new CA)."""
        https, ctx = self.https, self.config.ssl
        if https is None or ctx is None:
            return
        watch = CertificateWatch(
            (https.cert_file, https.key_file, https.ca_file), "HTTPS certificate files"
        )

        def load() -> ssl.SSLContext:
            ctx.load_cert_chain(https.cert_file, https.key_file or None)
            if https.ca_file:
                ctx.load_verify_locations(https.ca_file)
            return ctx

        while True:
            await asyncio.sleep(self.check_interval)
            watch.reload(load)

    async def stop(self, grace: float = 10.0) -> None:
        """Stop accepting, let requests in flight finish (uvicorn's graceful
        shutdown, at most `grace` seconds in all)."""
        if self._reload is not None:
            self._reload.cancel()
        if self._server is not None:
            self._server.should_exit = True
        if self._task is not None:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await asyncio.wait_for(self._task, grace)
