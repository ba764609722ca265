"""Who this process is on the wire, and the one way it dials another.

Every role's settings include `SecuritySettings` (TLS files, region, the
server token, ACLs on or off), read from the same flags and variables in
every role (`CORRAL_CA_FILE`, `CORRAL_CERT_FILE`, `CORRAL_KEY_FILE`,
`CORRAL_REGION`, `CORRAL_SERVER_TOKEN`, `CORRAL_ACL_ENABLED`). `configure`
makes them the process's; `dial` then opens every client channel with
them:

* with TLS, a mutual-TLS channel that checks the peer's certificate names
  the role dialled (`server.<region>.corral` by default) and presents ours;
* without TLS, a plaintext channel that carries the server token (when this
  process has one) so the servers know a server role is calling: the
  development substitute for a server certificate;
* either way, the caller's ACL token when one is given.

Code that never calls `configure` (a test's event loop, a library user)
gets the settings from the environment.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import grpc

from corral.runtime import rpc_metrics, telemetry
from corral.runtime.settings import SecuritySettings, Settings
from corral.security import certs, tls
from corral.security.acl import TOKEN_METADATA_KEY

#: call metadata carrying the server token (plaintext development clusters)
SERVER_TOKEN_METADATA_KEY = "corral-server-token"
#: call metadata naming the region a request is for (Nomad's `-region`,
#: `?region=`); absent or this process's own region: served here. A state
#: server forwards a request for another region to that region's servers
#: (docs/architecture.md "Federation").
REGION_METADATA_KEY = "x-corral-region"
#: set on a request one region forwarded to another (the sender's region):
#: such a request is never forwarded again
FORWARDED_METADATA_KEY = "x-corral-forwarded"

#: the largest message between servers: gRPC's 4 MiB default is too small for
#: snapshots of thousands of nodes and 10,000-alloc plans. Users' and nodes'
#: requests are bounded apart (`corral.security.access.MAX_PUBLIC_REQUEST_BYTES`).
MAX_MESSAGE_BYTES = 256 * 1024 * 1024

ChannelOptions = Sequence[tuple[str, Any]]


__all__ = ["SecuritySettings", "configure", "current", "dial", "dial_sync"]


class _FromEnvironment(Settings):
    security: SecuritySettings = SecuritySettings()


_current: SecuritySettings | None = None


def configure(settings: SecuritySettings) -> None:
    """Make `settings` this process's (the runner calls it at start)."""
    global _current
    _current = settings


def current() -> SecuritySettings:
    global _current
    if _current is None:
        _current = _FromEnvironment().security
    return _current


class _Metadata:
    """Adds fixed metadata (the tokens) to every call of a channel, asyncio
    or blocking: grpc hands both kinds of interceptor its call details as
    a named tuple."""

    def __init__(self, pairs: list[tuple[str, str]]) -> None:
        self.pairs = pairs

    def _details(self, details: Any) -> Any:
        metadata = [*(details.metadata or ()), *self.pairs]
        return details._replace(metadata=metadata)


# grpc.aio files an interceptor under the first call type it implements
# only, so each call type needs its own class.
class _UnaryMetadata(_Metadata, grpc.aio.UnaryUnaryClientInterceptor):  # type: ignore[misc]
    async def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        return await continuation(self._details(details), request)


class _StreamMetadata(_Metadata, grpc.aio.UnaryStreamClientInterceptor):  # type: ignore[misc]
    async def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        return await continuation(self._details(details), request)


class _BidiMetadata(_Metadata, grpc.aio.StreamStreamClientInterceptor):  # type: ignore[misc]
    async def intercept_stream_stream(
        self, continuation: Any, details: Any, request_iterator: Any
    ) -> Any:
        return await continuation(self._details(details), request_iterator)


class _SyncMetadata(  # type: ignore[misc]
    _Metadata,
    grpc.UnaryUnaryClientInterceptor,
    grpc.UnaryStreamClientInterceptor,
    grpc.StreamStreamClientInterceptor,
):
    def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        return continuation(self._details(details), request)

    def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        return continuation(self._details(details), request)

    def intercept_stream_stream(
        self, continuation: Any, details: Any, request_iterator: Any
    ) -> Any:
        return continuation(self._details(details), request_iterator)


def call_metadata(
    settings: SecuritySettings,
    *,
    peer: certs.Role = "server",
    token: str = "",
    request_region: str = "",
) -> list[tuple[str, str]]:
    """The metadata every call to `peer` carries: the server token (a
    server on a plaintext cluster), the ACL token, the region the calls are
    for (none: the region of the server dialled)."""
    pairs: list[tuple[str, str]] = []
    server_token = settings.server_token.get_secret_value()
    if peer == "server" and server_token and not settings.tls:
        pairs.append((SERVER_TOKEN_METADATA_KEY, server_token))
    if token:
        pairs.append((TOKEN_METADATA_KEY, token))
    if request_region:
        pairs.append((REGION_METADATA_KEY, request_region))
    return pairs


def _options(
    settings: SecuritySettings, peer: certs.Role, options: ChannelOptions, region: str = ""
) -> list[Any]:
    """With TLS, the name the peer's certificate must carry: `peer`'s role
    in `region` (default this process's own; a server of another region
    of the federation is `server.<its region>.corral`)."""
    opts = list(options)
    if settings.tls:
        name = certs.role_name(peer, region or settings.region)
        opts.append(("grpc.ssl_target_name_override", name))
    return opts


#: The retry policy every channel carries (gRPC service config): a call
#: that ends UNAVAILABLE is tried again, up to 5 attempts over about 7.5 s
#: (0.5 s, 1 s, 2 s, 4 s apart, +-20% jitter; Nomad's RPC hold timeout is
#: 5 s), within the call's own deadline. See `dial` for why that is safe.
#: The services a leader serves (Eval and Periodic on the broker, Plan on
#: the planner) are left out: a standby's UNAVAILABLE carries the leader's
#: address, and their callers (`corral.runtime.rpc.LeaderChannel`) follow it at
#: once instead of asking the standby again.
RETRY_SERVICE_CONFIG = json.dumps(
    {
        "methodConfig": [
            {
                "name": [{}],
                "retryPolicy": {
                    "maxAttempts": 5,
                    "initialBackoff": "0.5s",
                    "maxBackoff": "4s",
                    "backoffMultiplier": 2,
                    "retryableStatusCodes": ["UNAVAILABLE"],
                },
            },
            {
                "name": [
                    {"service": "corral.v1.Eval"},
                    {"service": "corral.v1.Periodic"},
                    {"service": "corral.v1.Plan"},
                ],
            },
        ]
    }
)
#: with the retries: a channel whose server went away tries to reconnect
#: 0.1 s after, then at most 1 s apart (gRPC's default grows to 120 s), so a
#: restarted server is found within the retry window, and a follower waiting
#: for it (`corral.runtime.replica`, `wait_for_ready`) resumes within 1 s of it
#: listening again: the bulk of a state restart's recovery time was these
#: waits (2 s apart here before, docs/operations.md "Chaos"). A refused
#: connection to a local port costs next to nothing, so the short cap is
#: cheap.
RETRY_CHANNEL_OPTIONS: list[tuple[str, Any]] = [
    ("grpc.enable_retries", 1),
    ("grpc.service_config", RETRY_SERVICE_CONFIG),
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
]


def dial(
    address: str,
    *,
    peer: certs.Role = "server",
    token: str = "",
    options: ChannelOptions = (),
    settings: SecuritySettings | None = None,
    region: str = "",
) -> grpc.aio.Channel:
    """An asyncio channel to `address`, where a `peer` role serves (server
    roles, or `client` for an agent) of `region` (default: ours).

    Calls that end UNAVAILABLE are retried with backoff
    (`RETRY_SERVICE_CONFIG`; a caller's own `options` come first and win,
    e.g. `("grpc.enable_retries", 0)` to see the first failure). Retrying is
    safe because UNAVAILABLE means the call did not take effect:

    * the connection could not be made, or broke before the server answered
      (gRPC retries only a call that has no response yet);
    * a standby refused it before doing anything (not the leader; those
      services are not retried here, see above);
    * the state's database failed (`services/state/db/database.py`
      translates it): the write's transaction rolled back, index counter
      and change-log row included, so nothing of it is stored;
    * the planner flushed or could not write a plan: it was not applied.

    The one call that may have run is a write whose server died, or whose
    database connection broke, in the middle of its COMMIT. Repeating it is
    harmless: plans, alloc and node updates and eval upserts are keyed by
    their ids and store the same rows again; a repeated job registration
    adds one more evaluation of the same job version, which schedules
    nothing new (Nomad clients resend in the same case)."""
    settings = settings or current()
    pairs = call_metadata(settings, peer=peer, token=token)
    # tracing outermost (its client span covers the whole call), per-RPC
    # metrics innermost (where grpc's own call object is seen)
    interceptors: list[grpc.aio.ClientInterceptor] | None = [
        *telemetry.client_interceptors(),
        *((_UnaryMetadata(pairs), _StreamMetadata(pairs), _BidiMetadata(pairs)) if pairs else ()),
        *rpc_metrics.client_interceptors(),
    ] or None
    opts = _options(settings, peer, [*options, *RETRY_CHANNEL_OPTIONS], region)
    if not settings.tls:
        return grpc.aio.insecure_channel(address, options=opts, interceptors=interceptors)
    return tls.ReloadingChannel(
        settings.files,
        lambda creds: grpc.aio.secure_channel(
            address, creds, options=opts, interceptors=interceptors
        ),
    )


def dial_sync(
    address: str,
    *,
    peer: certs.Role = "server",
    token: str = "",
    options: ChannelOptions = (),
    settings: SecuritySettings | None = None,
    region: str = "",
    request_region: str = "",
) -> grpc.Channel:
    """A blocking channel (the CLI's), otherwise as `dial` (retries
    included, unless `options` turn them off); every call on it is for
    `request_region` (none: the region of the server dialled)."""
    settings = settings or current()
    opts = _options(settings, peer, [*options, *RETRY_CHANNEL_OPTIONS], region)
    if settings.tls:
        channel = grpc.secure_channel(address, tls.channel_credentials(settings.files), opts)
    else:
        channel = grpc.insecure_channel(address, options=opts)
    pairs = call_metadata(settings, peer=peer, token=token, request_region=request_region)
    if pairs:
        channel = grpc.intercept_channel(channel, _SyncMetadata(pairs))
    traced: grpc.Channel = telemetry.traced_sync_channel(channel)  # tracing outermost
    return traced
