"""The one HTTP bootstrap (`corral.runtime.http_server`) and the runner's
HTTP flavour (`corral.runtime.runner.HttpRole`) the gateway starts through:
a real uvicorn in this event loop, real sockets, real certificates."""

from __future__ import annotations

import asyncio
import socket
import ssl
from pathlib import Path

import pytest
from cryptography import x509
from pydantic import SecretStr
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from corral.domain.errors import ConfigError
from corral.runtime import runner
from corral.runtime.http_server import Https, HttpServer
from corral.runtime.settings import SecuritySettings
from corral.security import certs
from services.gateway.__main__ import GatewayProcess
from services.gateway.config import GatewaySettings
from tests.wait import until


async def hello(request: Request) -> PlainTextResponse:
    return PlainTextResponse("hello")


APP = Starlette(routes=[Route("/", hello)])


async def _get(address: str, context: ssl.SSLContext | None = None) -> tuple[str, bytes]:
    """(the body of GET /, the peer certificate in DER, if any)."""
    host, port = address.rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port), ssl=context)
    try:
        writer.write(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        data = await reader.read()
        der = b""
        if context is not None:
            der = writer.get_extra_info("ssl_object").getpeercert(binary_form=True) or b""
        return data.partition(b"\r\n\r\n")[2].decode(), der
    finally:
        writer.close()


async def test_serves_on_a_free_port_and_stops() -> None:
    server = HttpServer("127.0.0.1:0", APP, name="test")
    await server.start()
    assert server.url.startswith("http://127.0.0.1:")
    assert (await _get(server.bound_address))[0] == "hello"
    await server.stop()
    with pytest.raises(OSError):
        await _get(server.bound_address)


async def test_a_port_in_use_is_a_clear_start_up_error() -> None:
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    port = taken.getsockname()[1]
    try:
        with pytest.raises(ConfigError, match=f"cannot listen on 127.0.0.1:{port}"):
            await HttpServer(f"127.0.0.1:{port}", APP, name="test").start()
        with pytest.raises(ConfigError, match="host:port"):
            HttpServer("no-port", APP, name="test")
    finally:
        taken.close()


def _pair(d: Path, ca: tuple[bytes, bytes]) -> None:
    cert, key = certs.make_cert(ca[0], ca[1], "client", days=30)
    (d / "http.pem").write_bytes(cert)
    (d / "http-key.pem").write_bytes(key)


async def test_https_picks_up_renewed_certificate_files(tmp_path: Path) -> None:
    ca = certs.make_ca(days=30)
    (tmp_path / "ca.pem").write_bytes(ca[0])
    _pair(tmp_path, ca)
    https = Https(
        cert_file=str(tmp_path / "http.pem"),
        key_file=str(tmp_path / "http-key.pem"),
        ca_file=str(tmp_path / "ca.pem"),
    )
    server = HttpServer("127.0.0.1:0", APP, name="test", https=https, check_interval=0.05)
    await server.start()
    client = ssl.create_default_context(cafile=str(tmp_path / "ca.pem"))
    client.check_hostname = False
    try:
        assert server.url.startswith("https://")
        body, first = await _get(server.bound_address, client)
        assert body == "hello"
        _pair(tmp_path, ca)  # renewed in place, as cert-manager does

        async def renewed() -> bool:
            _, der = await _get(server.bound_address, client)
            return der != first

        await until(renewed, 10, what="the renewed certificate on new connections")
        _, der = await _get(server.bound_address, client)
        assert x509.load_der_x509_certificate(der).serial_number != (
            x509.load_der_x509_certificate(first).serial_number
        )
    finally:
        await server.stop()


async def test_the_gateway_starts_and_stops_through_the_runner(tmp_path: Path) -> None:
    """An HttpRole: ready with its HTTP address (the state it calls need not
    answer yet: it says 503/500 meanwhile), then a clean stop."""
    settings = GatewaySettings(listen="127.0.0.1:0", state_addr="127.0.0.1:1")
    gateway = GatewayProcess(settings)
    assert isinstance(gateway, runner.HttpRole)
    ready = await gateway.start()
    try:
        assert ready.info["http_addr"] == f"http://{ready.address}"
        reader, writer = await asyncio.open_connection(*ready.address.rsplit(":", 1))
        writer.write(b"GET /v1/agent/health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        status = (await reader.read()).split(b" ", 2)[1]
        writer.close()
        assert status == b"500"  # the state service does not answer
    finally:
        await gateway.stop()
    with pytest.raises(OSError):
        await asyncio.open_connection(*ready.address.rsplit(":", 1))


def test_the_gateway_holds_no_server_token() -> None:
    security = SecuritySettings(server_token=SecretStr("s3cret"))
    settings = GatewaySettings(state_addr="127.0.0.1:1", security=security)
    assert settings.security.server_token.get_secret_value() == ""
