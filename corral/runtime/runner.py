"""The one way to start a role process.

`main(Settings, build)` is all a role's `__main__` calls: it reads the
settings (corral/runtime/settings.py), sets up logging, GC tuning and tracing, and
runs the service `build` makes from them: it starts it, serves metrics,
keeps it registered as a cluster member, writes the ready file that `corral
dev` and the tests wait for, and stops it gracefully on SIGTERM or SIGINT.
The broker and the planner share one more piece, `LeaderRole`: a replica
kept warm, a gRPC server that answers as a standby until this process wins
the advisory-lock election, and the on_elected/on_lost hooks. A role that
serves HTTP (the gateway) is an `HttpRole`: its ASGI application on the one
HTTP bootstrap (corral/runtime/http_server.py), started, reloading its
certificates, reported ready and stopped like every other role.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from corral.domain.errors import ConfigError
from corral.runtime import event_loop, telemetry
from corral.runtime.http_server import Https, HttpServer
from corral.runtime.leader import LeaderElection
from corral.runtime.probe import LEADER_SERVICE
from corral.runtime.process import new_member_id, register_member_loop, tune_gc, write_ready_file
from corral.runtime.replica import Replica
from corral.runtime.server import GrpcServer, install_signal_handlers
from corral.runtime.settings import (
    Dsn,
    HttpSettings,
    ProcessSettings,
    ServerSettings,
    Settings,
    StateAddr,
    load,
)
from corral.security import transport
from corral.security.acl_resolve import RemoteResolver
from corral.v1 import state_pb2

log = logging.getLogger(__name__)


@dataclass
class Ready:
    """What a started service tells the runner."""

    #: where others reach it (the ready file's `address`)
    address: str
    #: registered with the state service at `state_addr` as this cluster
    #: member, if any (the state registers itself in its own database)
    member: state_pb2.Member | None = None
    state_addr: str = ""
    #: reported as the member's leader flag on every refresh
    is_leader: Callable[[], bool] | None = None
    #: more keys for the ready file (e.g. the agent's node_id)
    info: dict[str, Any] = field(default_factory=dict)


class Service(Protocol):
    async def start(self) -> Ready: ...

    async def stop(self) -> None: ...


P = TypeVar("P", bound=ProcessSettings)
Build = Callable[[P], Service]


def member(role: str, address: str) -> state_pb2.Member:
    """This process as a cluster member (`corral operator members`)."""
    return state_pb2.Member(
        id=new_member_id(role),
        role=role,
        address=address,
        started_at=time.time_ns(),
        version="1",
    )


def _start_metrics(listen: str) -> str:
    if not listen:
        return ""
    host = listen.rpartition(":")[0] or "127.0.0.1"
    return f"{host}:{telemetry.start_metrics_server(listen)}"


async def serve(settings: P, build: Build[P]) -> int:
    """Run the service until SIGTERM/SIGINT, then stop it gracefully."""
    role = settings.ROLE
    stop = asyncio.Event()
    service = build(settings)
    ready = await service.start()
    install_signal_handlers(stop.set)
    tasks: list[asyncio.Task[None]] = []
    if ready.member is not None:
        tasks.append(
            asyncio.create_task(
                register_member_loop(
                    ready.state_addr, ready.member, stop, is_leader=ready.is_leader
                ),
                name="member",
            )
        )
    metrics = _start_metrics(settings.metrics_listen)
    write_ready_file(
        settings.ready_file, role=role, address=ready.address, metrics=metrics, **ready.info
    )
    log.info("%s ready on %s", role, ready.address)
    await stop.wait()
    log.info("%s shutting down", role)
    await service.stop()
    for task in tasks:
        task.cancel()
    for task in tasks:
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task
    return 0


def setup(settings: ProcessSettings) -> None:
    """Logging, GC tuning and tracing, before anything else runs."""
    telemetry.setup_logging(
        settings.ROLE, settings.log_level, json_logs=settings.log_format == "json"
    )
    tune_gc()
    transport.configure(settings.security)
    telemetry.setup_tracing(f"corral-{settings.ROLE}")
    telemetry.set_build_info(settings.ROLE)


S = TypeVar("S", bound=Settings)


def settings_from_argv(
    model: type[S], argv: Sequence[str] | None, doc: str | None, commands: Sequence[str] = ()
) -> tuple[S, str]:
    """`model` from the command line (default sys.argv) and the environment."""
    module = sys.modules.get("__main__")
    spec = getattr(module, "__spec__", None)
    prog = f"python -m {spec.name.removesuffix('.__main__')}" if spec else model.ROLE
    return load(
        model,
        sys.argv[1:] if argv is None else argv,
        prog=prog,
        description=doc,
        commands=commands,
    )


def main(
    model: type[P], build: Build[P], *, doc: str | None, argv: Sequence[str] | None = None
) -> int:
    """The whole of a role's `main()`: settings, setup, serve."""
    settings, _ = settings_from_argv(model, argv, doc)
    setup(settings)
    return run(settings, build)


def run(settings: P, build: Build[P]) -> int:
    """Serve until stopped; settings it cannot start with end the process
    with status 2 and one log line, no traceback."""
    try:
        return event_loop.run(serve(settings, build), settings.event_loop)
    except ConfigError as exc:
        log.error("%s cannot start: %s", settings.ROLE, exc)
        return 2


class LeaderSettings(ServerSettings):
    """A leader-elected role (broker, planner): the election's database and
    the state its replica follows."""

    dsn: Dsn
    state_addr: StateAddr


L = TypeVar("L", bound=LeaderSettings)


class LeaderRole:
    """The skeleton the broker and the planner share.

    Every process keeps a replica warm and serves its API; the one holding
    the role's advisory lock is the leader, the others answer as standbys
    (their servicers ask `is_leader` and point at `leader_address`). A
    subclass adds its servicers in `add_services`, takes office in
    `on_elected`, steps down in `on_lost` (also called at shutdown while
    in office; it must be idempotent) and closes its clients in `close`."""

    def __init__(self, settings: LeaderSettings) -> None:
        self.settings = settings
        self.role = settings.ROLE
        self.replica = Replica(settings.state_addr, name=self.role)
        # operators' calls (stats) carry ACL tokens the state resolves
        self._acl_channel = transport.dial(settings.state_addr)
        self.server = GrpcServer(
            settings.listen,
            name=self.role,
            settings=settings.security,
            resolver=RemoteResolver(self._acl_channel),
        )
        self.address = ""
        self.election: LeaderElection | None = None
        self._in_office = False
        self._tasks: list[asyncio.Task[None]] = []

    # -- what a role fills in

    def add_services(self) -> None:
        """Add the role's servicers to `self.server` (before it starts)."""

    async def on_elected(self) -> None:
        """Take office: the lock is held."""

    async def on_lost(self) -> None:
        """Step down: the lock is gone (or the process is stopping)."""

    def background(self) -> list[asyncio.Task[None]]:
        """Tasks that run on every process, leader or not, until stop."""
        return []

    async def close(self) -> None:
        """Close the role's own clients, after everything else stopped."""

    # -- the skeleton

    def is_leader(self) -> bool:
        return self.election is not None and self.election.is_leader

    async def leader_address(self) -> str:
        return await self.election.leader_address() if self.election is not None else ""

    async def _elected(self) -> None:
        self._in_office = True
        await self.on_elected()
        # readiness: Kubernetes routes the role's Service to the leader only
        await self.server.set_serving(LEADER_SERVICE, True)

    async def _lost(self) -> None:
        await self.server.set_serving(LEADER_SERVICE, False)
        await self.on_lost()
        self._in_office = False

    async def start(self) -> Ready:
        await self.replica.start()
        self.add_services()
        await self.server.start()
        # a standby until elected (corral/runtime/probe.py, the pods' readiness probe)
        await self.server.set_serving(LEADER_SERVICE, False)
        self.address = self.settings.advertise or self.server.bound_address
        self.election = LeaderElection(self.settings.dsn, self.role, self.address)
        self._tasks = [
            asyncio.create_task(self.election.run(self._elected, self._lost), name="election"),
            *self.background(),
        ]
        return Ready(
            self.address,
            member(self.role, self.address),
            self.settings.state_addr,
            self.is_leader,
        )

    async def stop(self) -> None:
        await self.server.stop(grace=5.0)
        if self.election is not None:
            await self.election.stop()
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        if self._in_office:
            await self._lost()
        await self.replica.stop()
        await self._acl_channel.close()
        await self.close()


class HttpRole:
    """The skeleton of a role that serves HTTP (the gateway).

    A subclass builds its ASGI application in `open` (called inside the
    running event loop, so it may open gRPC channels there), may start
    background work in `on_started`, and closes its clients in `close`,
    after the server stopped. The server is `HttpServer` on `listen`, HTTPS
    with the process's certificates (or `http_cert_file`/`http_key_file`)
    when TLS is on."""

    def __init__(self, settings: HttpSettings) -> None:
        self.settings = settings
        self.role = settings.ROLE
        self.server: HttpServer | None = None

    # -- what a role fills in

    def open(self) -> Any:
        """The ASGI application to serve."""
        raise NotImplementedError

    async def on_started(self) -> None:
        """The server accepts connections (`self.server.url`)."""

    async def close(self) -> None:
        """Close the role's own clients, after the server stopped."""

    def server_options(self) -> dict[str, Any]:
        """More of uvicorn's settings for this role's server (limits)."""
        return {}

    # -- the skeleton

    def https(self) -> Https | None:
        s, sec = self.settings, self.settings.security
        if not sec.tls:
            return None
        return Https(
            cert_file=s.http_cert_file or sec.cert_file,
            key_file=s.http_key_file or sec.key_file,
            ca_file=sec.ca_file,
            verify_clients=s.http_verify_clients,
        )

    async def start(self) -> Ready:
        app = self.open()
        try:
            self.server = HttpServer(
                self.settings.listen,
                app,
                name=self.role,
                https=self.https(),
                **self.server_options(),
            )
            await self.server.start()
        except BaseException:
            await self.close()
            raise
        await self.on_started()
        log.info("%s serving HTTP on %s", self.role, self.server.url)
        return Ready(address=self.server.bound_address, info={"http_addr": self.server.url})

    async def stop(self) -> None:
        if self.server is not None:
            await self.server.stop()
        await self.close()
