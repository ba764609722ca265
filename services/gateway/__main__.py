"""`python -m services.gateway` — run an HTTP gateway process.

    python -m services.gateway --state-addr HOST:PORT [--listen 127.0.0.1:4647]
        [--broker-addr HOST:PORT] [--planner-addr HOST:PORT] [--ready-file F]

Serves Nomad's `/v1` HTTP API (docs/http-api.md) by calling the public gRPC
API of the state service at `--state-addr`, as a user: the ACL token of each
HTTP request goes with the calls it causes; the gateway holds no server
token. Stateless: run as many as needed behind a load balancer. With the TLS
files set (`--ca-file`, `--cert-file`, `--key-file`) it dials the cluster
over mutual TLS and serves HTTPS with the same certificates (or
`--http-cert-file`/`--http-key-file`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import ssl
import sys
from collections.abc import Sequence
from typing import Any

import uvicorn

from corral.domain.errors import ConfigError
from corral.runtime import runner
from corral.runtime.embedded_http import EmbeddedServer
from services.gateway.app import create_app
from services.gateway.backend import Backend, user_security
from services.gateway.config import GatewaySettings

log = logging.getLogger("services.gateway")


def split_listen(listen: str) -> tuple[str, int]:
    host, sep, port = listen.rpartition(":")
    if not sep or not port.isdigit() or int(port) > 65535:
        raise ConfigError(f"--listen expects host:port, got {listen!r}")
    return host.strip("[]") or "127.0.0.1", int(port)


def uvicorn_config(settings: GatewaySettings, app: Any) -> uvicorn.Config:
    host, port = split_listen(settings.listen)
    tls: dict[str, Any] = {}
    sec = settings.security
    if sec.tls:
        tls = {
            "ssl_certfile": settings.http_cert_file or sec.cert_file,
            "ssl_keyfile": settings.http_key_file or sec.key_file,
            "ssl_ca_certs": sec.ca_file,
            "ssl_cert_reqs": ssl.CERT_REQUIRED
            if settings.http_verify_clients
            else ssl.CERT_OPTIONAL,
        }
    return uvicorn.Config(
        app,
        host=host,
        port=port,
        log_config=None,
        access_log=False,
        lifespan="off",
        server_header=False,
        timeout_graceful_shutdown=5,
        **tls,
    )


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


#: how often the HTTPS listener looks for renewed certificate files
CERT_CHECK_INTERVAL = 30.0


def _stamp(paths: Sequence[str]) -> tuple[tuple[float, int], ...]:
    out = []
    for path in paths:
        try:
            st = os.stat(path)
        except OSError:
            out.append((0.0, -1))
            continue
        out.append((st.st_mtime, st.st_size))
    return tuple(out)


async def reload_certificates(
    config: uvicorn.Config, interval: float = CERT_CHECK_INTERVAL
) -> None:
    """Renewed certificate files take effect on the HTTPS listener without
    a restart (as on the gRPC channels, corral/security/tls.py): the listener's
    context loads them again, and new connections present the new chain."""
    ctx = config.ssl
    if ctx is None or not config.ssl_certfile:
        return
    cert, key = str(config.ssl_certfile), str(config.ssl_keyfile or "")
    ca = str(config.ssl_ca_certs or "")
    paths = [p for p in (cert, key, ca) if p]
    seen = _stamp(paths)
    while True:
        await asyncio.sleep(interval)
        now = _stamp(paths)
        if now == seen:
            continue
        try:
            ctx.load_cert_chain(cert, key or None)
            if ca:
                ctx.load_verify_locations(ca)
        except (OSError, ssl.SSLError) as exc:
            # half-written files (the next check sees them whole): keep the old
            log.warning("HTTPS certificate not reloaded yet: %s", exc)
            continue
        seen = now
        log.info("HTTPS certificate reloaded from %s", cert)


class GatewayProcess:
    def __init__(self, settings: GatewaySettings) -> None:
        self.settings = settings
        self.backend: Backend | None = None
        self.app: Any = None
        self.server: EmbeddedServer | None = None
        self._task: asyncio.Task[None] | None = None
        self._reload: asyncio.Task[None] | None = None
        self._probe: asyncio.Task[None] | None = None

    async def start(self) -> runner.Ready:
        s = self.settings
        self.backend = Backend(
            s.state_addr,
            broker_addr=s.broker_addr,
            planner_addr=s.planner_addr,
            security_settings=s.security,
        )
        app = self.app = create_app(s, self.backend)
        config = uvicorn_config(s, app)
        try:
            config.load()
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(f"cannot load the HTTPS certificate: {exc}") from exc
        sock = bind(config.host, config.port)
        self.server = EmbeddedServer(config)
        self._task = asyncio.create_task(self.server.serve(sockets=[sock]), name="http")
        while not self.server.started:
            if self._task.done():
                failure = self._task.exception()
                raise ConfigError(f"cannot serve HTTP on {s.listen}: {failure or 'exited'}")
            await asyncio.sleep(0.02)
        if s.security.tls:
            self._reload = asyncio.create_task(reload_certificates(config), name="https-certs")
        self._probe = asyncio.create_task(self._first_contact(), name="state-probe")
        sock = self.server.servers[0].sockets[0].getsockname()
        address = f"{sock[0]}:{sock[1]}"
        scheme = "https" if s.security.tls else "http"
        log.info("gateway serving Nomad's HTTP API on %s://%s", scheme, address)
        return runner.Ready(address=address, info={"http_addr": f"{scheme}://{address}"})

    async def _first_contact(self) -> None:
        """Not a precondition (the gateway answers 503 while the state is
        away), but said once in the log."""
        assert self.backend is not None
        problem = await self.backend.healthy(timeout=10)
        if problem:
            log.warning("the gateway's state service does not answer yet: %s", problem)

    async def stop(self) -> None:
        if self._probe is not None:
            self._probe.cancel()
        if self._reload is not None:
            self._reload.cancel()
        if self.server is not None:
            self.server.should_exit = True
        if self._task is not None:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await asyncio.wait_for(self._task, 10)
        if self.app is not None:
            await asyncio.to_thread(self.app.state.jobfiles.close)
        if self.backend is not None:
            await self.backend.close()


def main(argv: Sequence[str] | None = None) -> int:
    settings, _ = runner.settings_from_argv(GatewaySettings, argv, __doc__)
    # a user of the cluster, never a server: no server token on any channel
    settings.security = user_security(settings.security)
    runner.setup(settings)
    return runner.run(settings, GatewayProcess)


if __name__ == "__main__":
    sys.exit(main())
