"""The CLI names TLS when the trouble is TLS: a plaintext call to a cluster
that only speaks TLS says so and how to set it up (it used to ask whether
`corral dev` was running), and a TLS call to a plaintext server says the
handshake failed."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from cli.main import main
from corral.security import certs, tls


@pytest.fixture
def bundle(tmp_path: Path) -> certs.Bundle:
    return certs.write_bundle(tmp_path / "tls")


async def _server(credentials: grpc.ServerCredentials | None) -> tuple[grpc.aio.Server, str]:
    server = grpc.aio.server()
    if credentials is None:
        port = server.add_insecure_port("127.0.0.1:0")
    else:
        port = server.add_secure_port("127.0.0.1:0", credentials)
    await server.start()
    return server, f"127.0.0.1:{port}"


@pytest.fixture
async def tls_server(bundle: certs.Bundle) -> AsyncIterator[str]:
    files = tls.CertificateFiles(
        str(bundle.ca_file), str(bundle.cert_file("server")), str(bundle.key_file("server"))
    )
    server, address = await _server(tls.server_credentials(files))
    yield address
    await server.stop(0)


@pytest.fixture
async def plain_server() -> AsyncIterator[str]:
    server, address = await _server(None)
    yield address
    await server.stop(0)


async def test_a_plaintext_call_to_a_tls_cluster_names_tls(
    tls_server: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code = await asyncio.to_thread(main, ["job", "status", "-address", tls_server])
    err = capsys.readouterr().err
    assert code == 1
    assert f"the Corral at {tls_server} requires TLS" in err and "CORRAL_CA_FILE" in err
    assert "is `corral dev` running" not in err


async def test_a_tls_call_to_a_plaintext_server_names_the_handshake(
    plain_server: str, bundle: certs.Bundle, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["job", "status", "-address", plain_server, "-ca-file", str(bundle.ca_file)]
    argv += ["-cert-file", str(bundle.cert_file("cli")), "-key-file", str(bundle.key_file("cli"))]
    code = await asyncio.to_thread(main, argv)
    err = capsys.readouterr().err
    assert code == 1 and f"the TLS handshake with {plain_server} failed" in err
