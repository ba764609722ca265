"""`corral tls ca create` / `corral tls cert create`: Nomad's file names in
the current directory, keys 0600, certificates that verify against the CA
with the role's names, `-json`, and clear refusals (existing files, no CA,
no role, bad names) that leave every file as it was."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.x509.verification import PolicyBuilder, Store

from cli.main import main


@pytest.fixture
def here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _files(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir())}


def _verify(ca: Path, leaf: Path) -> list[str]:
    """The leaf's SAN DNS names, once it verifies against the CA."""
    store = Store([x509.load_pem_x509_certificate(ca.read_bytes())])
    cert = x509.load_pem_x509_certificate(leaf.read_bytes())
    PolicyBuilder().store(store).build_client_verifier().verify(cert, [])
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    return san.get_values_for_type(x509.DNSName)


def test_ca_create_writes_the_ca_and_refuses_to_overwrite_it(here: Path, capsys) -> None:
    assert main(["tls", "ca", "create"]) == 0
    out = capsys.readouterr().out
    assert "==> CA certificate saved to: corral-agent-ca.pem" in out
    assert "==> CA certificate key saved to: corral-agent-ca-key.pem" in out
    assert (here / "corral-agent-ca-key.pem").stat().st_mode & 0o777 == 0o600
    before = _files(here)

    assert main(["tls", "ca", "create"]) == 1
    err = capsys.readouterr().err
    assert err == "Error: corral-agent-ca.pem already exists; refusing to overwrite it\n"
    assert _files(here) == before


def test_ca_create_flags_and_json(here: Path, capsys) -> None:
    assert main(["tls", "ca", "create", "-domain", "acme", "-days", "30", "-json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["ca_file"] == "acme-agent-ca.pem" and data["key_file"] == "acme-agent-ca-key.pem"
    assert data["not_after"] - data["not_before"] == 30 * 86400 * 10**9
    assert main(["tls", "ca", "create", "-common-name", "Ops CA", "-domain", "ops"]) == 0
    ca = x509.load_pem_x509_certificate((here / "ops-agent-ca.pem").read_bytes())
    assert ca.subject.rfc4514_string() == "O=Corral,CN=Ops CA"


@pytest.mark.parametrize(
    ("flag", "files", "identity"),
    [
        ("-server", ("global-server-corral.pem", "global-server-corral-key.pem"), "server"),
        ("-client", ("global-client-corral.pem", "global-client-corral-key.pem"), "client"),
        ("-cli", ("global-cli-corral.pem", "global-cli-corral-key.pem"), "cli"),
    ],
)
def test_cert_create_per_role(here: Path, capsys, flag, files, identity) -> None:
    assert main(["tls", "ca", "create"]) == 0
    assert main(["tls", "cert", "create", flag]) == 0
    out = capsys.readouterr().out
    cert_name, key_name = files
    assert f"saved to: {cert_name}" in out and f"key saved to: {key_name}" in out
    assert ("WARNING" in out) == (flag == "-server")
    assert (here / key_name).stat().st_mode & 0o777 == 0o600
    names = _verify(here / "corral-agent-ca.pem", here / cert_name)
    assert names == [f"{identity}.global.corral", "localhost"]

    before = _files(here)
    assert main(["tls", "cert", "create", flag]) == 1
    assert "already exists; refusing to overwrite it" in capsys.readouterr().err
    assert _files(here) == before


def test_cert_create_names_region_domain_and_extra_sans(here: Path, capsys) -> None:
    assert main(["tls", "ca", "create", "-domain", "acme"]) == 0
    args = ["tls", "cert", "create", "-server", "-region", "eu", "-domain", "acme", "-json"]
    args += ["-additional-dnsname", "corral-state.corral.svc"]
    args += ["-additional-dnsname", "corral-state"]
    args += ["-additional-ipaddress", "10.0.0.9", "-days", "7"]
    capsys.readouterr()
    assert main(args) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["cert_file"] == "eu-server-acme.pem"
    assert data["key_file"] == "eu-server-acme-key.pem"
    assert data["subject"] == "CN=server.eu.acme"
    assert data["dns_names"] == [
        "server.eu.acme",
        "localhost",
        "corral-state.corral.svc",
        "corral-state",
    ]
    assert data["ip_addresses"] == ["127.0.0.1", "10.0.0.9"]
    assert data["not_after"] - data["not_before"] == 7 * 86400 * 10**9
    _verify(here / "acme-agent-ca.pem", here / "eu-server-acme.pem")


def test_cert_create_with_a_ca_elsewhere(here: Path, capsys) -> None:
    (here / "ca").mkdir()
    assert main(["tls", "ca", "create"]) == 0
    for name in ("corral-agent-ca.pem", "corral-agent-ca-key.pem"):
        (here / name).rename(here / "ca" / name)
    ca_args = ["-ca", "ca/corral-agent-ca.pem", "-key", "ca/corral-agent-ca-key.pem"]
    assert main(["tls", "cert", "create", "-client", *ca_args]) == 0
    assert "Using CA file ca/corral-agent-ca.pem" in capsys.readouterr().out
    _verify(here / "ca" / "corral-agent-ca.pem", here / "global-client-corral.pem")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([], "Error: give one of -server, -client or -cli"),
        (["-server", "-client"], "not allowed with argument"),
        (["-server", "-region", "eu west"], "region 'eu west' is not a DNS label"),
        (["-server", "-additional-ipaddress", "nope"], "'nope' is not an IP address"),
        (["-server", "-additional-dnsname", "a_b"], "'a_b' is not a DNS name"),
        (["-server", "-days", "0"], "days must be more than 0"),
        (["-server", "-domain", "acme"], "CA certificate acme-agent-ca.pem not found"),
        (["-cli", "-key", "corral-agent-ca.pem"], "not an unencrypted PEM private key"),
    ],
)
def test_cert_create_refusals_write_nothing(here: Path, capsys, args, message) -> None:
    assert main(["tls", "ca", "create"]) == 0
    before = _files(here)
    capsys.readouterr()
    assert main(["tls", "cert", "create", *args]) == 1
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert _files(here) == before


def test_cert_create_without_any_ca(here: Path, capsys) -> None:
    assert main(["tls", "cert", "create", "-server"]) == 1
    assert capsys.readouterr().err == (
        "Error: CA certificate corral-agent-ca.pem not found; create one with "
        "`corral tls ca create` or name it with -ca/-key\n"
    )
    assert _files(here) == {}


@pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl is not installed")
def test_openssl_accepts_what_the_cli_writes(here: Path) -> None:
    assert main(["tls", "ca", "create"]) == 0
    assert main(["tls", "cert", "create", "-server"]) == 0
    done = subprocess.run(
        ["openssl", "verify", "-CAfile", "corral-agent-ca.pem", "-purpose", "sslserver"]
        + ["global-server-corral.pem"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 0, done.stderr
    key = subprocess.run(
        ["openssl", "pkey", "-in", "global-server-corral-key.pem", "-noout", "-text"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert "prime256v1" in key.stdout or "P-256" in key.stdout
