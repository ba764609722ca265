"""A client picks up replaced certificate files for its next calls without
being rebuilt (cert-manager renews in place): `corral.security.tls.ReloadingChannel`
behind `corral.security.transport.dial`, against a real mutual-TLS server."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from corral.runtime.server import GrpcServer
from corral.runtime.settings import SecuritySettings
from corral.security import certs, tls, transport
from corral.v1 import operator_pb2, operator_pb2_grpc
from tests.wait import until


class Operator(operator_pb2_grpc.OperatorServicer):
    async def Members(
        self, request: operator_pb2.MembersRequest, context: object
    ) -> operator_pb2.MembersResponse:
        return operator_pb2.MembersResponse()


def _files(d: Path, name: str, ca: tuple[bytes, bytes], role: certs.Role) -> SecuritySettings:
    cert, key = certs.make_cert(ca[0], ca[1], role, days=30)
    (d / f"{name}.pem").write_bytes(cert)
    (d / f"{name}-key.pem").write_bytes(key)
    return SecuritySettings(
        ca_file=str(d / "ca.pem"),
        cert_file=str(d / f"{name}.pem"),
        key_file=str(d / f"{name}-key.pem"),
    )


@pytest.fixture
async def server(tmp_path: Path) -> AsyncIterator[tuple[str, Path, tuple[bytes, bytes]]]:
    ca = certs.make_ca(days=30)
    (tmp_path / "ca.pem").write_bytes(ca[0])
    srv = GrpcServer("127.0.0.1:0", name="test", settings=_files(tmp_path, "server", ca, "server"))
    srv.add(
        operator_pb2_grpc.add_OperatorServicer_to_server,
        Operator(),  # type: ignore[abstract]  # the test calls Members only
        operator_pb2.DESCRIPTOR.services_by_name["Operator"].full_name,
    )
    await srv.start()
    try:
        yield srv.bound_address, tmp_path, ca
    finally:
        await srv.stop(0)


async def _answers(stub: operator_pb2_grpc.OperatorAsyncStub) -> bool:
    try:
        await stub.Members(operator_pb2.MembersRequest(), timeout=5)
    except grpc.aio.AioRpcError as exc:
        # refused handshakes, retried by the channel until the deadline
        refused = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
        assert exc.code() in refused, exc.details()
        return False
    return True


async def test_a_client_uses_replaced_certificate_files(
    server: tuple[str, Path, tuple[bytes, bytes]],
) -> None:
    address, d, ca = server
    client = _files(d, "cli", ca, "cli")
    channel = transport.dial(address, settings=client)
    assert isinstance(channel, tls.ReloadingChannel)
    stub = operator_pb2_grpc.OperatorStub(channel)  # built once, as roles do
    try:
        assert await _answers(stub)
        # a certificate from a CA the server does not trust replaces ours:
        # the next connection presents it and is refused
        foreign = certs.make_ca(days=30)
        cert, key = certs.make_cert(foreign[0], foreign[1], "cli", days=30)
        Path(client.key_file).write_bytes(key)
        Path(client.cert_file).write_bytes(cert)
        await until(lambda: _refused_now(stub), timeout=30)
        # and a good one again: the same stub answers
        _files(d, "cli", ca, "cli")
        await until(lambda: _answers(stub), timeout=30)
    finally:
        await channel.close()


async def _refused_now(stub: operator_pb2_grpc.OperatorAsyncStub) -> bool:
    return not await _answers(stub)
