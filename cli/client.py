"""The connection to a Corral cluster: one synchronous gRPC channel to the
state service's public API (`-address`, else `$CORRAL_ADDR`, else
127.0.0.1:4646), with a stub per public service. Worker admin and alloc logs,
files and exec live on other processes; `worker()`, `client_alloc()` and
`client_fs()`, `client_node()` dial those.

Every channel carries the ACL token (`-token`, else `$CORRAL_TOKEN`) as
`x-corral-token` metadata on every call, and uses TLS when the TLS flags or
variables are set (`corral.security.transport.dial_sync`)."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

import grpc

from corral.security.certs import Role
from corral.security.transport import SecuritySettings, current, dial_sync
from corral.v1 import (
    acl_pb2_grpc,
    alloc_pb2_grpc,
    deployment_pb2_grpc,
    eval_pb2_grpc,
    event_pb2_grpc,
    federation_pb2_grpc,
    job_pb2_grpc,
    keyring_pb2_grpc,
    namespace_pb2_grpc,
    node_pb2_grpc,
    node_pool_pb2_grpc,
    operator_pb2_grpc,
    scaling_pb2_grpc,
    service_pb2_grpc,
    variables_pb2_grpc,
    worker_pb2_grpc,
)

DEFAULT_ADDR = "127.0.0.1:4646"
#: the gateway's HTTP port under `corral dev` (Nomad's /v1 API and the web UI),
#: the public gRPC port's neighbour
DEFAULT_HTTP_PORT = 4647
ENV_ADDR = "CORRAL_ADDR"
#: the gateway's HTTP address (Nomad's NOMAD_ADDR): the CLI speaks gRPC to the
#: state, so the web UI's address is a setting of its own
ENV_HTTP_ADDR = "CORRAL_HTTP_ADDR"
ENV_TOKEN = "CORRAL_TOKEN"
ENV_REGION = "CORRAL_REGION"
# Unary calls fail after this long rather than hang (blocking queries pass
# their own, longer deadline).
DEFAULT_TIMEOUT = 30.0


def normalize_address(address: str) -> str:
    """Accept Nomad-style `http://host:port` too: gRPC wants `host:port`."""
    for scheme in ("http://", "https://", "grpc://"):
        if address.startswith(scheme):
            address = address[len(scheme) :]
    return address.rstrip("/")


def resolve_address(flag: str | None) -> str:
    return normalize_address(flag or os.environ.get(ENV_ADDR) or DEFAULT_ADDR)


def resolve_token(flag: str | None) -> str:
    return (flag or os.environ.get(ENV_TOKEN) or "").strip()


S = TypeVar("S")


class _Stub(Generic[S]):
    """A client attribute: the stub of one public service on the client's
    channel to the state service."""

    def __init__(self, stub: Callable[[grpc.Channel], S]) -> None:
        self.stub = stub

    def __get__(self, client: Client, owner: object = None) -> S:
        return self.stub(client.channel())


@dataclass
class Client:
    address: str
    security: SecuritySettings = field(default_factory=current)
    token: str = ""
    #: the region every call is for ('' = the region of the server at `address`)
    region: str = ""
    _channels: dict[tuple[str, str], grpc.Channel] = field(default_factory=dict)

    def channel(self, address: str | None = None, *, peer: Role = "server") -> grpc.Channel:
        """A channel to a server role (default) or to an agent (peer 'client').
        The state at `address` is of the CLI's own region and forwards calls
        for `region`; a worker or an agent dialled directly (found through
        such calls) is of `region` itself."""
        addr = normalize_address(address or self.address)
        key = (addr, peer)
        if key not in self._channels:
            direct = address is not None and addr != normalize_address(self.address)
            self._channels[key] = dial_sync(
                addr,
                peer=peer,
                token=self.token,
                settings=self.security,
                region=self.region if direct else "",
                request_region=self.region,
                options=[
                    ("grpc.max_receive_message_length", 64 * 1024 * 1024),
                    ("grpc.enable_retries", 0),
                ],
            )
        return self._channels[key]

    acl = _Stub(acl_pb2_grpc.ACLStub)
    jobs = _Stub(job_pb2_grpc.JobStub)
    nodes = _Stub(node_pb2_grpc.NodeStub)
    allocs = _Stub(alloc_pb2_grpc.AllocStub)
    evals = _Stub(eval_pb2_grpc.EvalsStub)
    deployments = _Stub(deployment_pb2_grpc.DeploymentStub)
    events = _Stub(event_pb2_grpc.EventStub)
    federation = _Stub(federation_pb2_grpc.FederationStub)
    operator = _Stub(operator_pb2_grpc.OperatorStub)

    @property
    def services(self) -> service_pb2_grpc.ServiceRegistrationStub:
        return service_pb2_grpc.ServiceRegistrationStub(self.channel())

    @property
    def namespaces(self) -> namespace_pb2_grpc.NamespaceStub:
        return namespace_pb2_grpc.NamespaceStub(self.channel())

    @property
    def node_pools(self) -> node_pool_pb2_grpc.NodePoolStub:
        return node_pool_pb2_grpc.NodePoolStub(self.channel())

    @property
    def scaling(self) -> scaling_pb2_grpc.ScalingStub:
        return scaling_pb2_grpc.ScalingStub(self.channel())

    @property
    def variables(self) -> variables_pb2_grpc.VariablesStub:
        return variables_pb2_grpc.VariablesStub(self.channel())

    @property
    def keyring(self) -> keyring_pb2_grpc.KeyringStub:
        return keyring_pb2_grpc.KeyringStub(self.channel())

    def worker(self, address: str) -> worker_pb2_grpc.WorkerStub:
        return worker_pb2_grpc.WorkerStub(self.channel(address))

    def client_alloc(self, address: str) -> alloc_pb2_grpc.ClientAllocStub:
        return alloc_pb2_grpc.ClientAllocStub(self.channel(address, peer="client"))

    def client_fs(self, address: str) -> alloc_pb2_grpc.ClientFSStub:
        return alloc_pb2_grpc.ClientFSStub(self.channel(address, peer="client"))

    def client_node(self, address: str) -> node_pb2_grpc.ClientNodeStub:
        """The ClientNode service (dynamic metadata, GC) of the agent at `address`."""
        return node_pb2_grpc.ClientNodeStub(self.channel(address, peer="client"))

    def close(self) -> None:
        for ch in self._channels.values():
            ch.close()
        self._channels.clear()
