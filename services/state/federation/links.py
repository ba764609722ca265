"""This region's links to the other regions of a federation, and the
forwarding of calls over them (Nomad's WAN membership and `forwardRegion`).

Every state process keeps the same table of regions: those configured
(`--federation-peer REGION=ADDR`, or `ADDR` alone, its region learned at
the first answer) and those joined at run time (`corral server join`, kept
in the database by `peers`, read again at every probe round so that a join
made through one state process reaches the others). Each link has the
addresses of the other region's state servers, each address its health:
every `--federation-probe-interval` seconds this process says `Hello` to
every address (who it is, where its region is reached, its authoritative
region and its state servers) and the answer says the same of the other
region, so each side learns the other (a region that joins is joined).

A call that names another region (`x-corral-region`, checked by the access
guard first) goes to a state server of that region: the healthy ones in
random order, then those never probed, then the failed ones, each tried
while no connection can be made (`corral.runtime.forward.Unreachable`).
When none answers, or no such region is known, the caller gets Nomad's
"No path to region" naming it. Forwarded calls carry the caller's ACL token
and no server token: the other region judges the caller by that token, as
a user (a server of another region is no server there).

With TLS a channel to another region checks its certificate names
`server.<that region>.corral`; joining an address whose region is not
known yet reads it from the certificate first (`tls.probe_identity`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import grpc
from google.protobuf.message import Message
from pydantic import SecretStr

from corral.domain.errors import (
    ConfigError,
    InvalidArgument,
    NoRegionPath,
    NotFound,
    PermissionDenied,
)
from corral.runtime import forward
from corral.runtime.settings import ADDRESS, REGION_NAME, SecuritySettings
from corral.security import tls, transport
from corral.v1 import federation_pb2, state_pb2
from services.state import metrics
from services.state.call_limits import CallLimits
from services.state.config import FederationSettings
from services.state.db.database import Database
from services.state.federation import peers

log = logging.getLogger(__name__)

ALIVE, FAILED, UNKNOWN = "alive", "failed", "unknown"
CONFIG, JOIN = "config", "join"
HELLO = "/corral.v1.Federation/Hello"
#: a region advertises at most this many addresses; a join names at most this many
MAX_ADDRESSES = 32
#: a probe (and a join's first contact) that takes longer has failed
PROBE_TIMEOUT = 5.0
#: a state member last seen longer ago than this is not advertised
MEMBER_FRESH_S = 30.0

#: channels between regions: no automatic retries (the link picks the next
#: server itself), a connection attempt given up after 5 s (a silent host
#: would otherwise hold a call for gRPC's 20 s)
CHANNEL_OPTIONS: list[tuple[str, Any]] = [
    ("grpc.enable_retries", 0),
    ("grpc.min_reconnect_backoff_ms", 5000),
    ("grpc.max_receive_message_length", transport.MAX_MESSAGE_BYTES),
]

R = TypeVar("R", bound=Message)


def check_address(address: str, field_name: str) -> str:
    address = address.strip()
    if not ADDRESS.match(address):
        raise InvalidArgument(field_name, f"{address[:300]!r} is not host:port")
    return address


def check_region(region: str, field_name: str) -> str:
    if not REGION_NAME.match(region):
        raise InvalidArgument(
            field_name, f"{region[:100]!r} is not a region name (letters, digits, - and _)"
        )
    return region


@dataclass
class Endpoint:
    """One address of another region's state servers, and its health."""

    address: str
    status: str = UNKNOWN
    last_contact: int = 0
    last_error: str = ""
    last_failure: int = 0

    def ok(self) -> None:
        self.status, self.last_contact, self.last_error = ALIVE, time.time_ns(), ""

    def failed(self, reason: str) -> None:
        self.status, self.last_error, self.last_failure = FAILED, reason, time.time_ns()


@dataclass
class Link:
    """This region's link to `region`."""

    region: str
    source: str
    endpoints: dict[str, Endpoint] = field(default_factory=dict)
    authoritative_region: str = ""
    servers: list[federation_pb2.RegionServer] = field(default_factory=list)

    def set_addresses(self, addresses: Sequence[str]) -> None:
        """Keep these addresses (an address kept before keeps its health)."""
        self.endpoints = {a: self.endpoints.get(a) or Endpoint(a) for a in addresses}

    @property
    def status(self) -> str:
        states = {e.status for e in self.endpoints.values()}
        if ALIVE in states:
            return ALIVE
        return FAILED if FAILED in states else UNKNOWN

    def candidates(self) -> list[Endpoint]:
        """The order to try its servers in: healthy ones (shuffled, to
        spread the load), then the never probed, then the failed (the one
        that failed longest ago first)."""
        alive = [e for e in self.endpoints.values() if e.status == ALIVE]
        random.shuffle(alive)
        unknown = [e for e in self.endpoints.values() if e.status == UNKNOWN]
        failed = sorted(
            (e for e in self.endpoints.values() if e.status == FAILED),
            key=lambda e: e.last_failure,
        )
        return [*alive, *unknown, *failed]

    def proto(self) -> federation_pb2.RegionLink:
        eps = list(self.endpoints.values())
        failing = [e for e in eps if e.status == FAILED]
        return federation_pb2.RegionLink(
            region=self.region,
            addresses=sorted(self.endpoints),
            source=self.source,
            status=self.status,
            last_contact=max((e.last_contact for e in eps), default=0),
            last_error=""
            if self.status == ALIVE
            else "; ".join(f"{e.address}: {e.last_error}" for e in failing),
            authoritative_region=self.authoritative_region,
            servers=self.servers,
        )


def _blocking(request: Any) -> bool:
    """Whether a request is a blocking query (`QueryOptions.min_index`)."""
    query = getattr(request, "query", None)
    return bool(getattr(query, "min_index", 0))


def _reason(exc: BaseException) -> str:
    if isinstance(exc, grpc.aio.AioRpcError):
        return f"{exc.code().name}: {exc.details() or ''}".strip()
    if isinstance(exc, TimeoutError):
        return f"no answer within {PROBE_TIMEOUT:g}s"
    return str(exc) or type(exc).__name__


class Federation:
    """The link table of one state process, and the `Forwarder` of its
    gRPC server (corral/runtime/server.py)."""

    def __init__(
        self,
        db: Database,
        region: str,
        settings: FederationSettings,
        security: SecuritySettings,
        limits: CallLimits | None = None,
    ) -> None:
        self.db = db
        #: the bound on calls that wait, per caller's connection: a
        #: forwarded blocking query or stream holds a coroutine here as the
        #: local one does, and on the other region it counts against this
        #: process's one connection there, which every caller shares
        self.limits = limits or CallLimits()
        self.region = region
        self.settings = settings
        self.security = security
        self.authoritative_region = settings.authoritative_region or region
        #: this process's own address (set once its server listens)
        self.address = ""
        self.links: dict[str, Link] = {}
        #: configured addresses whose region is not known yet
        self.seeds: dict[str, Endpoint] = {}
        #: the ACL replication status this process reports (on the leader)
        self.replication = federation_pb2.ReplicationStatus(
            enabled=False, source_region=self.authoritative_region, status="disabled"
        )
        self._channels: dict[tuple[str, str], grpc.aio.Channel] = {}
        #: held while the joined links change in memory and in the database
        #: together (a join, a forget, a refresh from the database): a
        #: refresh that read the table before a join saved must not drop
        #: the link the join just made
        self._joined = asyncio.Lock()
        # forwarded and relayed calls: no server token (they are users' calls)
        self._user = security.model_copy(update={"server_token": SecretStr("")})
        for entry in settings.peers:
            name, sep, address = entry.rpartition("=")
            if not sep:
                self.seeds.setdefault(address, Endpoint(address))
            elif name != region:
                link = self.links.setdefault(name, Link(name, CONFIG))
                link.set_addresses([*link.endpoints, address])

    @property
    def authoritative(self) -> bool:
        """Whether this region owns ACL policies, roles and global tokens."""
        return self.authoritative_region == self.region

    # -- channels ------------------------------------------------------------

    def _channel(self, address: str, region: str) -> grpc.aio.Channel:
        key = (address, region)
        ch = self._channels.get(key)
        if ch is None:
            ch = self._channels[key] = transport.dial(
                address, settings=self._user, region=region, options=CHANNEL_OPTIONS
            )
        return ch

    def _peer_metadata(self) -> list[tuple[str, str]]:
        """What a call between the state servers of two regions carries: on
        a plaintext federation the server token (every region's the same),
        with TLS nothing (the server certificate is the proof)."""
        return transport.call_metadata(self.security, peer="server")

    async def close(self) -> None:
        for ch in self._channels.values():
            with contextlib.suppress(Exception):
                await ch.close()
        self._channels.clear()

    # -- who we are ----------------------------------------------------------

    async def own_servers(self) -> list[federation_pb2.RegionServer]:
        """This region's state servers, from the members table."""
        out = []
        for payload, age in await self.db.members(role="state", max_age_s=MEMBER_FRESH_S * 2):
            m = state_pb2.Member.FromString(payload)
            out.append(
                federation_pb2.RegionServer(
                    name=f"{m.id}.{self.region}",
                    address=m.address,
                    region=self.region,
                    status=ALIVE if age < MEMBER_FRESH_S else FAILED,
                    leader=m.leader,
                    version=m.version,
                )
            )
        return out

    async def hello(self) -> federation_pb2.FederationHello:
        """What this region says of itself."""
        servers = await self.own_servers()
        if self.settings.advertise:
            addresses = [self.settings.advertise]
        else:
            addresses = [s.address for s in servers if s.status == ALIVE and s.address]
            if not addresses and self.address:
                addresses = [self.address]
        return federation_pb2.FederationHello(
            region=self.region,
            addresses=addresses[:MAX_ADDRESSES],
            authoritative_region=self.authoritative_region,
            servers=servers,
        )

    # -- the other regions ---------------------------------------------------

    def regions(self) -> list[str]:
        return sorted({self.region, *self.links})

    async def refresh(self) -> None:
        """Take up what the database holds: regions joined through another
        state process of this region, and regions forgotten there."""
        async with self._joined:
            self._take_up(await peers.load(self.db))

    def _take_up(self, stored: dict[str, list[str]]) -> None:
        for name, addresses in stored.items():
            link = self.links.get(name)
            if link is None:
                link = self.links[name] = Link(name, JOIN)
            if link.source == JOIN and set(addresses) != set(link.endpoints):
                link.set_addresses(addresses)
        for name in [n for n, link in self.links.items() if link.source == JOIN]:
            if name not in stored:
                del self.links[name]

    async def _hello_to(self, address: str, region: str) -> federation_pb2.FederationHello:
        call = self._channel(address, region).unary_unary(
            HELLO,
            request_serializer=federation_pb2.FederationHello.SerializeToString,
            response_deserializer=federation_pb2.FederationHello.FromString,
        )
        answer: federation_pb2.FederationHello = await call(
            await self.hello(), metadata=self._peer_metadata(), timeout=PROBE_TIMEOUT
        )
        return answer

    async def discover(self, address: str) -> federation_pb2.FederationHello:
        """Contact a state server whose region is not known yet: its
        certificate (with TLS) and its answer name it. Raises ConfigError
        naming what is wrong."""
        region = self.region  # a plaintext channel checks no name
        if self.security.tls:
            role, region = await tls.probe_identity(address, self.security.files, PROBE_TIMEOUT)
            if role != "server":
                raise ConfigError(f"{address} is a Corral {role}, not a state server")
        try:
            answer = await self._hello_to(address, region)
        except (grpc.aio.AioRpcError, TimeoutError) as exc:
            raise ConfigError(f"{address} did not answer: {_reason(exc)}") from None
        if self.security.tls and answer.region != region:
            raise ConfigError(
                f"{address} holds a certificate of region {region!r} but answers as "
                f"region {answer.region!r}"
            )
        if answer.region == self.region:
            raise ConfigError(f"{address} is a state server of this region ({self.region!r})")
        return answer

    async def learn(self, hello: federation_pb2.FederationHello, via: Sequence[str] = ()) -> Link:
        """Take up what a region said of itself (in a probe's answer, a
        join's, or its own Hello): its link, its addresses (kept in the
        database unless it is configured), its servers. An address that
        answers stays; one the region no longer advertises goes once it
        fails."""
        async with self._joined:
            return await self._learn(hello, via)

    async def _learn(self, hello: federation_pb2.FederationHello, via: Sequence[str]) -> Link:
        name = hello.region
        link = self.links.get(name)
        if link is None:
            link = self.links[name] = Link(name, JOIN)
        link.authoritative_region = hello.authoritative_region
        link.servers = list(hello.servers)
        if link.source == CONFIG:
            return link
        keep = [a for a, e in link.endpoints.items() if e.status != FAILED]
        wanted = list(dict.fromkeys([*via, *hello.addresses, *keep]))[:MAX_ADDRESSES]
        if set(wanted) != set(link.endpoints) or not link.endpoints:
            link.set_addresses(wanted)
            await peers.save(self.db, name, wanted)
        return link

    async def _probe(self, link: Link, ep: Endpoint) -> None:
        try:
            answer = await self._hello_to(ep.address, link.region)
        except (grpc.aio.AioRpcError, TimeoutError) as exc:
            ep.failed(_reason(exc))
            return
        if answer.region != link.region:
            ep.failed(f"answers as region {answer.region!r}")
            return
        ep.ok()
        await self.learn(answer)

    async def _probe_seed(self, ep: Endpoint) -> None:
        try:
            answer = await self.discover(ep.address)
        except ConfigError as exc:
            ep.failed(str(exc))
            return
        link = self.links.setdefault(answer.region, Link(answer.region, CONFIG))
        link.source = CONFIG
        link.set_addresses([*link.endpoints, ep.address])
        link.endpoints[ep.address].ok()
        del self.seeds[ep.address]
        await self.learn(answer)

    async def probe_all(self) -> None:
        """One round: every address of every link, and every seed."""
        probes = [
            self._probe(link, ep)
            for link in list(self.links.values())
            for ep in list(link.endpoints.values())
        ]
        probes += [self._probe_seed(ep) for ep in list(self.seeds.values())]
        results = await asyncio.gather(*probes, return_exceptions=True)
        for r in results:
            if isinstance(r, Exception):
                log.warning("federation probe failed: %s", r)
        for name, link in self.links.items():
            metrics.FEDERATION_LINK_ALIVE.labels(name).set(1 if link.status == ALIVE else 0)

    async def run(self, stop: asyncio.Event) -> None:
        """Probe every link every interval until `stop`."""
        while not stop.is_set():
            try:
                await self.refresh()
                await self.probe_all()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("federation probe round failed: %s", exc)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.settings.probe_interval)

    # -- the RPCs' work ------------------------------------------------------

    async def greet(
        self, hello: federation_pb2.FederationHello, context: Any
    ) -> federation_pb2.FederationHello:
        """Another region's Hello: learn it, answer ours."""
        check_region(hello.region, "region")
        if hello.region == self.region:
            raise InvalidArgument(
                "region",
                f"{hello.region!r} is this region's own name: regions need names of their own",
            )
        if len(hello.addresses) > MAX_ADDRESSES:
            raise InvalidArgument("addresses", f"at most {MAX_ADDRESSES}")
        for i, a in enumerate(hello.addresses):
            check_address(a, f"addresses[{i}]")
        if self.security.tls:
            identity = tls.peer_identity(context)
            if identity is None or identity[1] != hello.region:
                raise PermissionDenied(
                    f"Permission denied: a server certificate of region {hello.region!r} is "
                    "needed to speak for it"
                )
        if len(hello.servers) > MAX_ADDRESSES:
            del hello.servers[MAX_ADDRESSES:]
        if hello.addresses:
            await self.learn(hello)
        return await self.hello()

    async def join(self, addresses: Sequence[str]) -> federation_pb2.FederationJoinResponse:
        """Contact each address, learn its region and keep it."""
        if not addresses:
            raise InvalidArgument("addresses", "give at least one host:port")
        if len(addresses) > MAX_ADDRESSES:
            raise InvalidArgument("addresses", f"at most {MAX_ADDRESSES}")
        wanted = [check_address(a, f"addresses[{i}]") for i, a in enumerate(addresses)]
        out = federation_pb2.FederationJoinResponse()
        errors = []

        async def contact(address: str) -> federation_pb2.FederationHello | str:
            try:
                return await self.discover(address)
            except ConfigError as exc:
                return str(exc)

        # all at once: a join of many silent addresses takes one probe's
        # timeout, not one per address
        answers = await asyncio.gather(*(contact(a) for a in wanted))
        for address, answer in zip(wanted, answers, strict=True):
            if isinstance(answer, str):
                errors.append(answer)
                continue
            link = await self.learn(answer, via=[address])
            if address in link.endpoints:
                link.endpoints[address].ok()
            out.joined += 1
            if answer.region not in out.regions:
                out.regions.append(answer.region)
            log.info("joined region %s at %s", answer.region, address)
        out.error = "; ".join(errors)
        return out

    async def force_leave(self, region: str) -> None:
        check_region(region, "region")
        async with self._joined:
            link = self.links.get(region)
            if link is None:
                raise NotFound(f"region {region!r} is not known here")
            if link.source == CONFIG:
                raise InvalidArgument(
                    "region",
                    f"region {region!r} is configured (--federation-peer): remove it from the "
                    "configuration instead",
                )
            await peers.forget(self.db, region)
            del self.links[region]
        log.info("forgot region %s", region)

    async def status(
        self, replication: federation_pb2.ReplicationStatus
    ) -> federation_pb2.FederationStatus:
        out = federation_pb2.FederationStatus(
            region=self.region,
            authoritative_region=self.authoritative_region,
            acl_replication=replication,
        )
        out.servers.extend(await self.own_servers())
        for name in sorted(self.links):
            link = self.links[name]
            out.links.append(link.proto())
            if link.status == ALIVE and link.servers:
                out.servers.extend(link.servers)
            else:
                for address in sorted(link.endpoints):
                    out.servers.append(
                        federation_pb2.RegionServer(
                            name=f"{address}.{name}",
                            address=address,
                            region=name,
                            status=FAILED if link.status == FAILED else UNKNOWN,
                        )
                    )
        for ep in self.seeds.values():
            out.links.append(
                federation_pb2.RegionLink(
                    addresses=[ep.address],
                    source=CONFIG,
                    status=ep.status,
                    last_error=ep.last_error,
                )
            )
        return out

    # -- forwarding (corral.runtime.server.Forwarder) ------------------------

    def _link(self, region: str) -> Link:
        link = self.links.get(region)
        if link is None or not link.endpoints:
            known = ", ".join(self.regions())
            raise NoRegionPath(
                region, f"no such region is known here (known: {known})", known=False
            )
        return link

    def _no_path(self, region: str, errors: list[str]) -> NoRegionPath:
        metrics.FEDERATION_FORWARDED.labels(region, "unreachable").inc()
        return NoRegionPath(
            region, "none of its state servers answered (" + "; ".join(errors) + ")"
        )

    async def unary(self, region: str, method: str, request: Any, context: Any) -> bytes:
        if _blocking(request):
            with self.limits.waiting(f"forwarded blocking query {method}"):
                return await self._unary(region, method, request, context)
        return await self._unary(region, method, request, context)

    async def _unary(self, region: str, method: str, request: Any, context: Any) -> bytes:
        link = self._link(region)
        md = forward.metadata(context, region, self.region)
        errors = []
        for ep in link.candidates():
            try:
                answer = await forward.unary(
                    self._channel(ep.address, region), method, request, context, md
                )
            except forward.Unreachable as exc:
                ep.failed(exc.reason)
                errors.append(f"{ep.address}: {exc.reason}")
                continue
            ep.ok()
            metrics.FEDERATION_FORWARDED.labels(region, "forwarded").inc()
            return answer
        raise self._no_path(region, errors)

    async def stream(
        self, region: str, method: str, request: Any, context: Any
    ) -> AsyncIterator[bytes]:
        with self.limits.waiting(f"forwarded stream {method}"):
            async for item in self._stream(region, method, request, context):
                yield item

    async def _stream(
        self, region: str, method: str, request: Any, context: Any
    ) -> AsyncIterator[bytes]:
        link = self._link(region)
        md = forward.metadata(context, region, self.region)
        errors = []
        for ep in link.candidates():
            try:
                async for item in forward.stream(
                    self._channel(ep.address, region), method, request, context, md
                ):
                    yield item
            except forward.Unreachable as exc:
                ep.failed(exc.reason)
                errors.append(f"{ep.address}: {exc.reason}")
                continue
            metrics.FEDERATION_FORWARDED.labels(region, "forwarded").inc()
            return
        raise self._no_path(region, errors)

    async def call(
        self,
        region: str,
        method: str,
        request: Message,
        response: Callable[[bytes], R],
        timeout: float,
    ) -> R:
        """A call between the state servers of two regions (the replication's
        blocking queries): to a server of `region` that answers, as a
        server of the federation."""
        link = self._link(region)
        errors = []
        for ep in link.candidates():
            ch = self._channel(ep.address, region)
            stub: Any = ch.unary_unary(
                method,
                request_serializer=lambda m: m.SerializeToString(),
                response_deserializer=response,
            )
            try:
                answer: R = await stub(request, metadata=self._peer_metadata(), timeout=timeout)
            except grpc.aio.AioRpcError as exc:
                reached = ch.get_state() == grpc.ChannelConnectivity.READY
                if exc.code() == grpc.StatusCode.UNAVAILABLE and not reached:
                    ep.failed(exc.details() or "unavailable")
                    errors.append(f"{ep.address}: {exc.details()}")
                    continue
                raise
            return answer
        raise self._no_path(region, errors)
