"""The connection to a Corral cluster: one synchronous gRPC channel to the
state service's public API (`-address`, else `$CORRAL_ADDR`, else
127.0.0.1:4646), with a stub per public service. Worker admin and alloc logs
live on other processes; `worker()` and `client_alloc()` dial those.

Every channel carries the ACL token (`-token`, else `$CORRAL_TOKEN`) as
`x-corral-token` metadata on every call, added by one client interceptor."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import grpc

from corral.acl import TOKEN_METADATA_KEY
from corral.v1 import (
    acl_pb2_grpc,
    alloc_pb2_grpc,
    deployment_pb2_grpc,
    eval_pb2_grpc,
    event_pb2_grpc,
    job_pb2_grpc,
    node_pb2_grpc,
    operator_pb2_grpc,
    worker_pb2_grpc,
)

DEFAULT_ADDR = "127.0.0.1:4646"
ENV_ADDR = "CORRAL_ADDR"
ENV_TOKEN = "CORRAL_TOKEN"
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


class _CallDetails(NamedTuple):
    method: str
    timeout: float | None
    metadata: Any
    credentials: Any
    wait_for_ready: bool | None
    compression: Any


class _ClientCallDetails(_CallDetails, grpc.ClientCallDetails):
    pass


class TokenInterceptor(
    grpc.UnaryUnaryClientInterceptor,  # type: ignore[type-arg]
    grpc.UnaryStreamClientInterceptor,  # type: ignore[type-arg]
    grpc.StreamUnaryClientInterceptor,  # type: ignore[type-arg]
    grpc.StreamStreamClientInterceptor,  # type: ignore[type-arg]
):
    """Adds `x-corral-token: <secret>` to every call of a channel."""

    def __init__(self, token: str) -> None:
        self._metadata = ((TOKEN_METADATA_KEY, token),)

    def _with_token(self, details: grpc.ClientCallDetails) -> grpc.ClientCallDetails:
        return _ClientCallDetails(
            details.method,
            details.timeout,
            (*(details.metadata or ()), *self._metadata),
            details.credentials,
            getattr(details, "wait_for_ready", None),
            getattr(details, "compression", None),
        )

    def intercept_unary_unary(
        self, continuation: Callable[..., Any], client_call_details: Any, request: Any
    ) -> Any:
        return continuation(self._with_token(client_call_details), request)

    def intercept_unary_stream(
        self, continuation: Callable[..., Any], client_call_details: Any, request: Any
    ) -> Any:
        return continuation(self._with_token(client_call_details), request)

    def intercept_stream_unary(
        self, continuation: Callable[..., Any], client_call_details: Any, request_iterator: Any
    ) -> Any:
        return continuation(self._with_token(client_call_details), request_iterator)

    def intercept_stream_stream(
        self,
        continuation: Callable[..., Any],
        client_call_details: Any,
        request_iterator: Iterator[Any],
    ) -> Any:
        return continuation(self._with_token(client_call_details), request_iterator)


@dataclass
class Client:
    address: str
    token: str = ""
    _channels: dict[str, grpc.Channel] = field(default_factory=dict)

    def channel(self, address: str | None = None) -> grpc.Channel:
        addr = normalize_address(address or self.address)
        if addr not in self._channels:
            channel = grpc.insecure_channel(
                addr,
                options=[
                    ("grpc.max_receive_message_length", 64 * 1024 * 1024),
                    ("grpc.enable_retries", 0),
                ],
            )
            if self.token:
                channel = grpc.intercept_channel(channel, TokenInterceptor(self.token))
            self._channels[addr] = channel
        return self._channels[addr]

    @property
    def acl(self) -> acl_pb2_grpc.ACLStub:
        return acl_pb2_grpc.ACLStub(self.channel())

    @property
    def jobs(self) -> job_pb2_grpc.JobStub:
        return job_pb2_grpc.JobStub(self.channel())

    @property
    def nodes(self) -> node_pb2_grpc.NodeStub:
        return node_pb2_grpc.NodeStub(self.channel())

    @property
    def allocs(self) -> alloc_pb2_grpc.AllocStub:
        return alloc_pb2_grpc.AllocStub(self.channel())

    @property
    def evals(self) -> eval_pb2_grpc.EvalsStub:
        return eval_pb2_grpc.EvalsStub(self.channel())

    @property
    def deployments(self) -> deployment_pb2_grpc.DeploymentStub:
        return deployment_pb2_grpc.DeploymentStub(self.channel())

    @property
    def events(self) -> event_pb2_grpc.EventStub:
        return event_pb2_grpc.EventStub(self.channel())

    @property
    def operator(self) -> operator_pb2_grpc.OperatorStub:
        return operator_pb2_grpc.OperatorStub(self.channel())

    def worker(self, address: str) -> worker_pb2_grpc.WorkerStub:
        return worker_pb2_grpc.WorkerStub(self.channel(address))

    def client_alloc(self, address: str) -> alloc_pb2_grpc.ClientAllocStub:
        return alloc_pb2_grpc.ClientAllocStub(self.channel(address))

    def close(self) -> None:
        for ch in self._channels.values():
            ch.close()
        self._channels.clear()
