"""Mutual TLS for every gRPC server and client, with certificates that
reload from disk and carry the caller's role.

Like Nomad, a certificate names its holder's role in a DNS subject
alternative name: `server.<region>.corral` for the server roles (state,
broker, planner, worker), `client.<region>.corral` for client agents and
`cli.<region>.corral` for operators' tools. Servers require a client
certificate from the same CA and read the role from it (`peer_identity`), so an
agent's certificate cannot call what only servers may; clients check the
server's certificate against the role name, not the address they dialled
(pods move; the name `server.<region>.corral` does not).

Certificates rotate without a restart (cert-manager renews them in place).
One rule notices and loads replaced files, `CertificateWatch`: a file
counts as replaced when its inode, size or modification time changes, and
files that cannot be loaded yet (half-written mid-rotation) keep the old
pair until a later look. The gRPC server looks on every handshake and loads
the new pair; clients look at most every `CHECK_INTERVAL` and build a new
channel for new calls (`ReloadingChannel`), calls in flight finishing on the
old one; the HTTPS listener (corral/runtime/http_server.py) looks
periodically and loads the new chain into its context.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import ssl
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import grpc

from corral.domain.errors import ConfigError
from corral.security import certs

log = logging.getLogger(__name__)

DOMAIN = certs.DEFAULT_DOMAIN

#: how often a client looks at its certificate files (a stat of each)
CHECK_INTERVAL = 1.0
#: how long a replaced client channel stays open for calls in flight on it
RETIRE_AFTER = 60.0


@dataclass(frozen=True)
class CertificateFiles:
    """The CA bundle, certificate chain and key of this process, as paths."""

    ca_file: str
    cert_file: str
    key_file: str

    def read(self) -> tuple[bytes, bytes, bytes]:
        """(ca, chain, key), read now. A missing or unreadable file is a
        configuration error, named."""
        out = []
        for what, path in (("CA", self.ca_file), ("certificate", self.cert_file)):
            out.append(_read(what, path))
        out.append(_read("key", self.key_file))
        return out[0], out[1], out[2]

    def watch(self) -> CertificateWatch:
        """A watch on these files (the one rule for noticing rotations)."""
        return CertificateWatch((self.ca_file, self.cert_file, self.key_file), "TLS files")


T = TypeVar("T")
Stamp = tuple[tuple[int, int, int], ...]


def _stamp(paths: Sequence[str]) -> Stamp:
    """What changes when any file is replaced (inode, size, mtime); a file
    briefly missing mid-rotation stamps as absent."""
    stamps = []
    for path in paths:
        try:
            st = os.stat(path)
            stamps.append((st.st_ino, st.st_size, st.st_mtime_ns))
        except OSError:
            stamps.append((0, 0, 0))
    return tuple(stamps)


class CertificateWatch:
    """Notices replaced certificate files and loads them again: the one
    reload rule of every listener and channel (see the module docstring)."""

    def __init__(self, paths: Sequence[str], what: str) -> None:
        self.paths = tuple(p for p in paths if p)
        self.what = what
        self._stamp = _stamp(self.paths)

    def reload(self, load: Callable[[], T]) -> T | None:
        """`load()` when the files changed since the last load; None when
        they did not, or cannot be loaded yet (then the next look tries
        again and the caller keeps what it has)."""
        now = _stamp(self.paths)
        if now == self._stamp:
            return None
        try:
            loaded = load()
        except (ConfigError, OSError, ssl.SSLError) as exc:
            log.warning("%s changed but cannot be loaded yet: %s", self.what, exc)
            return None
        self._stamp = now
        log.info("%s changed: loaded for new connections", self.what)
        return loaded


def _read(what: str, path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as exc:
        raise ConfigError(f"cannot read the TLS {what} file {path!r}: {exc.strerror}") from None


def server_credentials(files: CertificateFiles) -> grpc.ServerCredentials:
    """Credentials that require a client certificate from our CA and pick
    up replaced files at the next handshake."""
    watch = files.watch()

    def configuration() -> grpc.ServerCertificateConfiguration:
        ca, chain, key = files.read()
        return grpc.ssl_server_certificate_configuration([(key, chain)], root_certificates=ca)

    def fetch() -> grpc.ServerCertificateConfiguration | None:
        return watch.reload(configuration)

    initial = configuration()
    # grpc calls `fetch` per handshake; None (unchanged) is documented, not typed
    return grpc.dynamic_ssl_server_credentials(
        initial,
        fetch,  # type: ignore[arg-type]
        require_client_authentication=True,
    )


def channel_credentials(files: CertificateFiles) -> grpc.ChannelCredentials:
    ca, chain, key = files.read()
    return grpc.ssl_channel_credentials(
        root_certificates=ca, private_key=key, certificate_chain=chain
    )


def peer_identity(context: Any, domain: str = DOMAIN) -> tuple[certs.Role, str] | None:
    """The (role, region) a verified client certificate names, whatever
    the region (a server of another region of the federation), or None."""
    try:
        auth = context.auth_context()
    except Exception:  # noqa: BLE001 - no TLS on this connection
        return None
    return certs.identity_of(auth.get("x509_subject_alternative_name") or [], domain)


async def probe_identity(
    address: str, files: CertificateFiles, timeout: float = 5.0, domain: str = DOMAIN
) -> tuple[certs.Role, str]:
    """The (role, region) named by the certificate of the server at
    `address`, checked against our CA (with our certificate presented, as
    the server requires). Joining a region by address needs it: gRPC checks
    a server's certificate against one name, `server.<region>.corral`, and
    the region is what we do not know yet. Raises ConfigError naming the
    problem."""
    host, _, port = address.rpartition(":")
    ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=files.ca_file)
    ctx.check_hostname = False  # the name is what we learn here; the chain is checked
    ctx.load_cert_chain(files.cert_file, files.key_file)
    ctx.set_alpn_protocols(["h2"])
    try:
        _, writer = await asyncio.wait_for(
            asyncio.open_connection(host.strip("[]") or "127.0.0.1", int(port), ssl=ctx), timeout
        )
    except (OSError, ValueError, TimeoutError, ssl.SSLError) as exc:
        raise ConfigError(f"cannot make a TLS connection to {address}: {exc}") from None
    try:
        cert = writer.get_extra_info("peercert") or {}
    finally:
        writer.close()
        with contextlib.suppress(Exception):
            await writer.wait_closed()
    names = [v for k, v in cert.get("subjectAltName", ()) if k == "DNS"]
    found = certs.identity_of(names, domain)
    if found is None:
        raise ConfigError(f"the certificate of {address} names no Corral role")
    return found


Factory = Callable[[], grpc.aio.Channel]


class _Reloading:
    """A multi-callable that asks its channel for the current connection
    at call time (the stub was built once, the certificates changed since);
    the inner multi-callable is rebuilt only when the channel was."""

    def __init__(self, owner: ReloadingChannel, kind: str, args: tuple[Any, ...], kw: Any) -> None:
        self._owner = owner
        self._kind = kind
        self._args = args
        self._kw = kw
        self._inner: grpc.aio.Channel | None = None
        self._callable: Any = None

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        inner = self._owner.current()
        if inner is not self._inner:
            self._inner = inner
            self._callable = getattr(inner, self._kind)(*self._args, **self._kw)
        return self._callable(*args, **kwargs)


class ReloadingChannel(grpc.aio.Channel):  # type: ignore[misc]
    """A TLS channel that is rebuilt when the certificate files change.

    Calls already under way keep their connection; the old channel closes
    after `RETIRE_AFTER` seconds."""

    def __init__(self, files: CertificateFiles, build: Callable[[grpc.ChannelCredentials], Any]):
        self._files = files
        self._build = build
        self._watch = files.watch()
        self._checked = time.monotonic()
        self._inner: grpc.aio.Channel = build(channel_credentials(files))
        self._retired: list[asyncio.Task[None]] = []

    def current(self) -> grpc.aio.Channel:
        now = time.monotonic()
        if now - self._checked >= CHECK_INTERVAL:
            self._checked = now
            creds = self._watch.reload(lambda: channel_credentials(self._files))
            if creds is not None:
                old, self._inner = self._inner, self._build(creds)
                self._retired = [t for t in self._retired if not t.done()]
                self._retired.append(asyncio.ensure_future(self._retire(old)))
        return self._inner

    @staticmethod
    async def _retire(old: grpc.aio.Channel) -> None:
        await asyncio.sleep(RETIRE_AFTER)
        await old.close()

    def unary_unary(self, *args: Any, **kw: Any) -> Any:
        return _Reloading(self, "unary_unary", args, kw)

    def unary_stream(self, *args: Any, **kw: Any) -> Any:
        return _Reloading(self, "unary_stream", args, kw)

    def stream_unary(self, *args: Any, **kw: Any) -> Any:
        return _Reloading(self, "stream_unary", args, kw)

    def stream_stream(self, *args: Any, **kw: Any) -> Any:
        return _Reloading(self, "stream_stream", args, kw)

    def get_state(self, try_to_connect: bool = False) -> grpc.ChannelConnectivity:
        return self.current().get_state(try_to_connect)

    async def wait_for_state_change(self, last_observed_state: grpc.ChannelConnectivity) -> None:
        await self.current().wait_for_state_change(last_observed_state)

    async def channel_ready(self) -> None:
        await self.current().channel_ready()

    async def close(self, grace: float | None = None) -> None:
        for task in self._retired:
            task.cancel()
        await self._inner.close(grace)

    async def __aenter__(self) -> ReloadingChannel:
        return self

    async def __aexit__(self, *exc: object) -> None:
        with contextlib.suppress(Exception):
            await self.close()
