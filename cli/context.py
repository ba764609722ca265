"""What every command module shares, kept apart from `cli.main` (which
imports the command modules to build the parser): the per-invocation
`Context`, the errors that become exit codes, the shared flags and the one
translation of a gRPC status into a sentence a person can act on."""

from __future__ import annotations

import argparse
import os
import socket
import ssl
import sys
from collections.abc import Callable, Sequence
from typing import Any, NoReturn, TypeVar

import grpc
from pydantic import ValidationError

from cli.client import ENV_REGION, Client, resolve_address, resolve_token
from corral.domain.errors import NO_REGION_PATH
from corral.runtime.settings import REGION_NAME
from corral.security import certs, transport

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_INTERRUPTED = 130

Handler = Callable[[argparse.Namespace, "Context"], int]


class UsageError(Exception):
    """Wrong flags or arguments (exit 1, like Nomad)."""


class CliError(Exception):
    """A problem to report as one `Error: ...` line (exit 1)."""


class Parser(argparse.ArgumentParser):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{message}\n\n{self.format_usage().strip()}")


class Context:
    """What a command handler gets besides its flags: a lazily opened
    client for `-address`/CORRAL_ADDR carrying `-token`/CORRAL_TOKEN and
    `-region`/CORRAL_REGION, and the output streams."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.address = resolve_address(getattr(args, "address", None))
        self._args = args
        self.token = resolve_token(getattr(args, "token", None))
        #: the region the command's requests are for ('' = the server's own);
        #: only commands that talk to the cluster have `-region` as such
        #: (`tls cert create -region` names a certificate's region)
        talks = hasattr(args, "address")
        self.region = resolve_region(getattr(args, "region", None)) if talks else ""
        self._client: Client | None = None
        self.out = sys.stdout
        self.err = sys.stderr

    @property
    def client(self) -> Client:
        if self._client is None:
            self._client = Client(self.address, _security(self._args), self.token, self.region)
        return self._client

    def use_region(self, region: str) -> None:
        """From now on, requests are for `region` (Nomad's `job run`: a job
        naming its region goes there, whatever -region says)."""
        if region != self.region:
            self.close()
            self._client = None
            self.region = region

    def for_region(self, region: str) -> Client:
        """A client whose requests are for `region` (the same server,
        which forwards them): `job run` of a job naming its region,
        `operator members -all-regions`."""
        if region == self.region:
            return self.client
        return Client(self.address, _security(self._args), self.token, region)

    def close(self) -> None:
        if self._client is not None:
            self._client.close()


def add_address(p: argparse.ArgumentParser) -> None:
    """-address and the TLS flags: every command that talks to the cluster."""
    p.add_argument(
        "-address",
        "--address",
        dest="address",
        default=None,
        help="state service gRPC address (env CORRAL_ADDR, default 127.0.0.1:4646)",
    )
    p.add_argument(
        "-token",
        "--token",
        dest="token",
        default=None,
        help="ACL token secret id sent with every call (env CORRAL_TOKEN)",
    )
    p.add_argument(
        "-region",
        "--region",
        dest="region",
        default=None,
        help="the region the request is for; the server forwards it there "
        "(env CORRAL_REGION, default the region of the server at -address)",
    )
    for flag, env, what in _TLS_FLAGS:
        p.add_argument(
            f"-{flag}", f"--{flag}", dest=flag.replace("-", "_"), default=None,
            help=f"{what} (env {env})",
        )  # fmt: skip


_TLS_FLAGS = (
    ("ca-file", "CORRAL_CA_FILE", "CA bundle to verify the servers with (turns TLS on)"),
    ("cert-file", "CORRAL_CERT_FILE", "client certificate (corral tls cert create -cli)"),
    ("key-file", "CORRAL_KEY_FILE", "client certificate's key"),
)


def _security(args: argparse.Namespace) -> transport.SecuritySettings:
    """The environment's TLS settings, with this command's flags over them.
    The servers dialled are those of the region the client certificate
    names (`cli.<region>.corral`): CORRAL_REGION and -region say which
    region a request is for, not whose servers the CLI talks to."""
    base = transport.current()
    given = {
        name: value
        for name in ("ca_file", "cert_file", "key_file")
        if (value := getattr(args, name, None))
    }
    try:
        settings = (
            transport.SecuritySettings.model_validate({**base.model_dump(), **given})
            if given
            else base
        )
    except ValidationError as exc:
        first = exc.errors()[0]
        where = "-" + str(first["loc"][0]).replace("_", "-") if first["loc"] else "TLS flags"
        raise UsageError(f"{where}: {first['msg']}") from None
    if not settings.tls:
        return settings
    home = _certificate_region(settings.cert_file)
    return settings.model_copy(update={"region": home}) if home else settings


def _certificate_region(path: str) -> str:
    """The region a certificate file names ('' when unreadable or none)."""
    try:
        with open(path, "rb") as f:
            found = certs.cert_identity(f.read())
    except OSError:
        return ""
    return found[1] if found is not None else ""


def resolve_region(flag: str | None) -> str:
    """-region, else CORRAL_REGION ('' = the region of the server dialled)."""
    region = (flag or os.environ.get(ENV_REGION) or "").strip()
    if region and not REGION_NAME.match(region):
        raise UsageError(f"-region: {region[:100]!r} is not a region name")
    return region


T = TypeVar("T")


def by_prefix(items: Sequence[T], name: str, key: Callable[[T], str], what: str) -> T:
    """Nomad's lookup of a named object: the exact name, else the one name
    `name` prefixes (`items` are those the server listed for the prefix)."""
    exact = [i for i in items if key(i) == name]
    if exact:
        return exact[0]
    if not items:
        raise CliError(f'No {what} with prefix "{name}" found')
    if len(items) > 1:
        raise CliError(
            f'Prefix "{name}" matched more than one {what}: ' + ", ".join(key(i) for i in items)
        )
    return items[0]


def all_pages(fetch: Callable[[str], tuple[Sequence[T], str]]) -> list[T]:
    """Every item of a paged list: `fetch(next_token)` answers one page and
    the token of the next ('' after the last)."""
    out: list[T] = []
    token = ""
    while True:
        items, token = fetch(token)
        out.extend(items)
        if not token:
            return out


def read_input(path: str, what: str) -> str:
    """A file the command reads, or standard input for `-`."""
    if path == "-":
        return sys.stdin.read()
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise CliError(f"cannot read {what} {path!r}: {exc}") from None


def add_json(p: argparse.ArgumentParser) -> None:
    p.add_argument("-json", "--json", dest="json", action="store_true", help="print JSON")


def add_verbose(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "-verbose", "--verbose", dest="verbose", action="store_true", help="full ids and details"
    )


def common(p: argparse.ArgumentParser, *, json: bool = False, verbose: bool = False) -> None:
    """The flags most commands share: -address and -token, and -json /
    -verbose where they apply."""
    add_address(p)
    if json:
        add_json(p)
    if verbose:
        add_verbose(p)


def speaks_tls(address: str, timeout: float = 2.0) -> bool:
    """Whether the server at `address` answers a TLS handshake (without
    checking who it is: only to tell a user that it wants TLS)."""
    host, _, port = address.rpartition(":")
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    try:
        with (
            socket.create_connection((host.strip("[]") or "127.0.0.1", int(port)), timeout) as raw,
            context.wrap_socket(raw),
        ):
            return True
    except (OSError, ValueError):
        return False


TLS_HINT = (
    "export CORRAL_CA_FILE, CORRAL_CERT_FILE and CORRAL_KEY_FILE (or pass -ca-file, "
    "-cert-file and -key-file); `corral dev -tls` prints the export lines"
)


def grpc_message(exc: grpc.RpcError, address: str) -> str:
    """A sentence a person can act on, from a gRPC status."""
    code = exc.code() if hasattr(exc, "code") else None
    details = (exc.details() if hasattr(exc, "details") else None) or str(code)
    if details.startswith(NO_REGION_PATH):
        return details  # the server at `address` answered: another region is away
    if code == grpc.StatusCode.UNAVAILABLE:
        lowered = details.lower()
        if "tls handshake failed" in lowered or "ssl_error" in lowered:
            return (
                f"the TLS handshake with {address} failed: is it a Corral started with TLS, "
                "and were the CA file and certificate made for it? "
                f"({details})"
            )
        if "socket closed" in lowered and speaks_tls(address):
            # a plaintext call to a server that only speaks TLS
            return f"the Corral at {address} requires TLS: {TLS_HINT}"
        if (
            "connect" in lowered
            or "refused" in lowered
            or "dns" in lowered
            or "failed to" in lowered
        ):
            reason = "connection refused" if "refused" in lowered else details
            return (
                f"cannot reach Corral at {address} ({reason}); is `corral dev` running? "
                "Set -address or CORRAL_ADDR to point elsewhere"
            )
        return f"{details} (server unavailable at {address})"
    if code == grpc.StatusCode.UNIMPLEMENTED:
        return f"the server at {address} does not implement this call ({details})"
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return f"timed out waiting for {address} ({details})"
    return details
