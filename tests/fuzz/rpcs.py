"""Every RPC the cluster serves, found rather than listed: each process is
asked which services it serves (server reflection), each service's methods
come from the protobuf descriptors, and `corral.security.access.RULES` says who may
call each one. A role, service or RPC added later is fuzzed without a line
here; one served without a rule is reported (the server refuses it).

Calls are generic (serialized by the descriptors) over blocking channels,
as five kinds of caller: anonymous, a stale or random ACL token, a forged
server token, a user dialling with `corral.security.transport.dial_sync` (the
cluster's ACL token when it has ACLs on) and a server (the same with the
server token, as Corral's own roles call each other).
"""

from __future__ import annotations

import enum
import importlib
import pkgutil
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import grpc
from google.protobuf import descriptor_pool
from google.protobuf.descriptor import Descriptor, MethodDescriptor
from google.protobuf.message import Message
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from pydantic import SecretStr

from corral.security import transport
from corral.security.access import RULES, Caller, Rule
from corral.security.acl import TOKEN_METADATA_KEY
from corral.security.transport import SERVER_TOKEN_METADATA_KEY
from tests.fuzz.messages import message_class

#: services every server adds and no rule governs
INFRASTRUCTURE = ("grpc.health.v1.Health", "grpc.reflection.v1alpha.ServerReflection")


class As(enum.Enum):
    """Who calls."""

    ANONYMOUS = "anonymous"  # plaintext, no metadata at all
    STALE_TOKEN = "stale-token"  # an ACL token that is unknown, deleted or garbage
    FORGED_SERVER = "forged-server-token"  # a wrong server token
    USER = "user"  # transport.dial without the server token, with the cluster's ACL token
    SERVER = "server"  # transport.dial as Corral's own roles do (the server token)


@dataclass(frozen=True)
class Rpc:
    method: str  # /corral.v1.Job/Register
    role: str  # the process serving it (a service may be served by several)
    address: str
    rule: Rule
    descriptor: MethodDescriptor

    @property
    def name(self) -> str:
        return f"{self.role}:{self.method.removeprefix('/corral.v1.')}"

    @property
    def internal(self) -> bool:
        return self.rule.caller is Caller.SERVER

    @property
    def streaming(self) -> bool:
        return bool(self.descriptor.server_streaming)

    @property
    def input(self) -> Descriptor:
        return self.descriptor.input_type

    @property
    def output(self) -> Descriptor:
        return self.descriptor.output_type


def load_schema() -> None:
    """Import every generated module of `corral.v1`, so the descriptor pool
    knows every service (a new proto file is picked up by its presence)."""
    import corral.v1

    for info in pkgutil.iter_modules(corral.v1.__path__):
        if info.name.endswith("_pb2"):
            importlib.import_module(f"corral.v1.{info.name}")


def served_services(address: str) -> list[str]:
    """The services a server says it serves (gRPC server reflection)."""
    with grpc.insecure_channel(address) as channel:
        stub = reflection_pb2_grpc.ServerReflectionStub(channel)
        request = reflection_pb2.ServerReflectionRequest(list_services="")
        answers = stub.ServerReflectionInfo(iter([request]), timeout=10)
        names: list[str] = []
        for answer in answers:
            names.extend(s.name for s in answer.list_services_response.service)
        return names


def discover(addresses: dict[str, str]) -> tuple[list[Rpc], list[str], list[str]]:
    """(the RPCs served by the processes `addresses` names (role -> address)
    that have an access rule, the served methods without one, the served
    methods that take a request stream: ruled, but not fuzzed here — the
    snapshot restore's archive upload and the planner's plan fence have
    tests of their own)."""
    load_schema()
    pool = descriptor_pool.Default()
    found: list[Rpc] = []
    unruled: list[str] = []
    request_streams: list[str] = []
    for role, address in addresses.items():
        for service in served_services(address):
            if service in INFRASTRUCTURE:
                continue
            for m in pool.FindServiceByName(service).methods:
                method = f"/{service}/{m.name}"
                rule = RULES.get(method)
                if rule is None:
                    unruled.append(f"{role}:{method}")
                    continue
                if m.client_streaming:
                    request_streams.append(method)
                    continue
                found.append(Rpc(method, role, address, rule, m))
    return found, unruled, request_streams


def unserved(rpcs: list[Rpc]) -> list[str]:
    """Methods of RULES that no process of the cluster serves."""
    served = {r.method for r in rpcs}
    return sorted(m for m in RULES if m not in served)


def _serialize(request: Message | bytes) -> bytes:
    """A message, or bytes sent as they are (a request no message class
    would produce, such as one padded with an unknown field)."""
    return request if isinstance(request, bytes) else request.SerializeToString()


@dataclass
class Answer:
    """What a call came back with (OK or a status), and its text."""

    code: grpc.StatusCode
    details: str
    trailers: list[tuple[str, Any]]
    responses: list[Message]

    @property
    def ok(self) -> bool:
        return self.code == grpc.StatusCode.OK

    def texts(self) -> Iterator[str]:
        yield self.details
        for key, value in self.trailers:
            yield key
            yield value.decode(errors="replace") if isinstance(value, bytes) else str(value)


class Callers:
    """Channels to each process, per kind of caller; call any RPC."""

    def __init__(self, acl_token: str = "") -> None:
        self.acl_token = acl_token
        unknown = str(uuid.uuid4())  # what a deleted or expired token looks like too
        #: the metadata of a caller with a token the cluster does not honour
        self.stale_tokens: tuple[tuple[tuple[str, str | bytes], ...], ...] = (
            ((TOKEN_METADATA_KEY, unknown),),
            ((TOKEN_METADATA_KEY, "not-a-token"),),
            ((TOKEN_METADATA_KEY, "x" * 4000),),
            (("authorization", f"Bearer {unknown}"),),
            (("authorization", "Basic Zm9vOmJhcg=="),),
            ((TOKEN_METADATA_KEY, ""), ("authorization", "Bearer ")),
        )
        self._plain: dict[str, grpc.Channel] = {}
        self._dialled: dict[str, grpc.Channel] = {}

    def channel(self, address: str, caller: As) -> grpc.Channel:
        if caller in (As.USER, As.SERVER):
            key = f"{caller.value}:{address}"
            if key not in self._dialled:
                settings = transport.current()
                if caller is As.USER:
                    settings = settings.model_copy(update={"server_token": SecretStr("")})
                self._dialled[key] = transport.dial_sync(
                    address, token=self.acl_token, settings=settings
                )
            return self._dialled[key]
        if address not in self._plain:
            self._plain[address] = grpc.insecure_channel(address)
        return self._plain[address]

    def metadata(self, caller: As, pick: int = 0) -> tuple[tuple[str, str | bytes], ...]:
        if caller is As.STALE_TOKEN:
            return self.stale_tokens[pick % len(self.stale_tokens)]
        if caller is As.FORGED_SERVER:
            return ((SERVER_TOKEN_METADATA_KEY, "forged-server-token"),)
        return ()

    def call(
        self,
        rpc: Rpc,
        request: Message | bytes,
        caller: As,
        *,
        timeout: float,
        pick: int = 0,
        max_responses: int = 3,
    ) -> Answer:
        channel: Any = self.channel(rpc.address, caller)  # requests typed by descriptor
        out_cls = message_class(rpc.output)
        metadata = self.metadata(caller, pick)
        try:
            if rpc.streaming:
                stream = channel.unary_stream(
                    rpc.method,
                    request_serializer=_serialize,
                    response_deserializer=out_cls.FromString,
                )(request, timeout=timeout, metadata=metadata)
                got: list[Message] = []
                for item in stream:
                    got.append(item)
                    if len(got) >= max_responses:
                        stream.cancel()
                        break
                trailers = list(stream.trailing_metadata() or ()) if not got else []
                return Answer(grpc.StatusCode.OK, "", trailers, got)
            response, call = channel.unary_unary(
                rpc.method,
                request_serializer=_serialize,
                response_deserializer=out_cls.FromString,
            ).with_call(request, timeout=timeout, metadata=metadata)
            return Answer(grpc.StatusCode.OK, "", list(call.trailing_metadata() or ()), [response])
        except grpc.RpcError as err:
            failed: Any = err  # a grpc.Call as well as the error
            return Answer(
                failed.code(), failed.details() or "", list(failed.trailing_metadata() or ()), []
            )

    def close(self) -> None:
        for ch in [*self._plain.values(), *self._dialled.values()]:
            ch.close()
        self._plain.clear()
        self._dialled.clear()
