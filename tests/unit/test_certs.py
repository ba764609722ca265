"""corral/security/certs.py: a CA and identity certificates that parse, verify against
their CA only (cryptography's verifier, and `openssl verify` where present),
carry the role's SAN names and usages, and work for gRPC mutual TLS; keys
written 0600, no file overwritten, bad input refused with a clear message."""

from __future__ import annotations

import datetime as dt
import os
import shutil
import subprocess
from concurrent import futures
from pathlib import Path

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID
from cryptography.x509.verification import PolicyBuilder, Store, VerificationError
from grpc_health.v1 import health_pb2, health_pb2_grpc

from corral.security import certs


@pytest.fixture(scope="module")
def ca() -> tuple[bytes, bytes]:
    return certs.make_ca()


def _cert(pem: bytes) -> x509.Certificate:
    return x509.load_pem_x509_certificate(pem)


def _san(cert: x509.Certificate) -> tuple[list[str], list[str]]:
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    return (
        san.get_values_for_type(x509.DNSName),
        [str(a) for a in san.get_values_for_type(x509.IPAddress)],
    )


def _verifier(ca_pem: bytes, when: dt.datetime | None = None) -> PolicyBuilder:
    builder = PolicyBuilder().store(Store([_cert(ca_pem)]))
    return builder.time(when) if when is not None else builder


def test_ca_is_a_self_signed_p256_ca_with_ca_extensions(ca) -> None:
    ca_pem, key_pem = ca
    cert = _cert(ca_pem)
    key = serialization.load_pem_private_key(key_pem, password=None)
    assert isinstance(key, ec.EllipticCurvePrivateKey) and key.curve.name == "secp256r1"
    assert cert.issuer == cert.subject
    cert.verify_directly_issued_by(cert)  # self-signed
    constraints = cert.extensions.get_extension_for_class(x509.BasicConstraints)
    assert constraints.critical and constraints.value.ca and constraints.value.path_length == 0
    usage = cert.extensions.get_extension_for_class(x509.KeyUsage).value
    assert usage.key_cert_sign and usage.crl_sign
    cn = cert.subject.get_attributes_for_oid(x509.NameOID.COMMON_NAME)[0].value
    assert cn == f"Corral Agent CA {cert.serial_number}"
    lifetime = cert.not_valid_after_utc - cert.not_valid_before_utc
    assert lifetime == dt.timedelta(days=certs.CA_DAYS)
    named = _cert(certs.make_ca(common_name="Acme CA", days=10)[0])
    assert named.subject.get_attributes_for_oid(x509.NameOID.COMMON_NAME)[0].value == "Acme CA"


@pytest.mark.parametrize("role", certs.ROLES)
def test_role_certificate_carries_its_identity_and_verifies_against_its_ca(ca, role) -> None:
    ca_pem, ca_key_pem = ca
    cert_pem, key_pem = certs.make_cert(
        ca_pem,
        ca_key_pem,
        role,
        region="eu",
        domain="example.com",
        dns_names=["corral-state.corral.svc", "Corral-State"],
        ips=["10.0.0.7", "::1"],
    )
    cert = _cert(cert_pem)
    key = serialization.load_pem_private_key(key_pem, password=None)
    assert isinstance(key, ec.EllipticCurvePrivateKey) and key.curve.name == "secp256r1"
    spki = (serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    assert key.public_key().public_bytes(*spki) == cert.public_key().public_bytes(*spki)
    identity = f"{role}.eu.example.com"
    assert certs.role_name(role, "eu", "example.com") == identity
    dns, ips = _san(cert)
    assert dns == [identity, "localhost", "corral-state.corral.svc", "corral-state"]
    assert ips == ["127.0.0.1", "10.0.0.7", "::1"]
    assert cert.subject.rfc4514_string() == f"CN={identity}"
    assert cert.issuer == _cert(ca_pem).subject
    assert cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca is False
    eku = set(cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value)
    assert ExtendedKeyUsageOID.CLIENT_AUTH in eku
    # servers and client agents serve as well as call; the CLI only calls
    assert (ExtendedKeyUsageOID.SERVER_AUTH in eku) == (role != "cli")

    chain = _verifier(ca_pem).build_client_verifier().verify(cert, [])
    assert chain.subjects is not None and x509.DNSName(identity) in chain.subjects
    if role != "cli":
        _verifier(ca_pem).build_server_verifier(x509.DNSName(identity)).verify(cert, [])
        _verifier(ca_pem).build_server_verifier(x509.DNSName("localhost")).verify(cert, [])
    assert certs.role_of(dns, "eu", "example.com") == role
    assert certs.role_of(dns) is None  # another region and domain: no identity


def test_defaults_follow_nomad(ca) -> None:
    ca_pem, ca_key_pem = ca
    cert = _cert(certs.make_cert(ca_pem, ca_key_pem, "server")[0])
    assert _san(cert) == (["server.global.corral", "localhost"], ["127.0.0.1"])
    lifetime = cert.not_valid_after_utc - cert.not_valid_before_utc
    assert lifetime == dt.timedelta(days=certs.CERT_DAYS)
    now = dt.datetime.now(dt.UTC)
    assert now - dt.timedelta(minutes=2) < cert.not_valid_before_utc <= now
    assert certs.ca_file_name() == ("corral-agent-ca.pem", "corral-agent-ca-key.pem")
    assert certs.cert_file_name("client", "eu") == (
        "eu-client-corral.pem",
        "eu-client-corral-key.pem",
    )


def test_serials_are_random_and_distinct(ca) -> None:
    ca_pem, ca_key_pem = ca
    serials = {
        _cert(certs.make_cert(ca_pem, ca_key_pem, "client")[0]).serial_number for _ in range(5)
    }
    assert len(serials) == 5
    assert all(s.bit_length() > 64 for s in serials)


def test_wrong_ca_and_expired_certificates_fail_verification(ca) -> None:
    ca_pem, ca_key_pem = ca
    other_ca = certs.make_ca()
    foreign = _cert(certs.make_cert(other_ca[0], other_ca[1], "server")[0])
    with pytest.raises(VerificationError):
        _verifier(ca_pem).build_client_verifier().verify(foreign, [])

    long_ago = dt.datetime.now(dt.UTC) - dt.timedelta(days=30)
    old_ca_pem, old_ca_key_pem = certs.make_ca(not_before=long_ago - dt.timedelta(days=1))
    expired = _cert(
        certs.make_cert(old_ca_pem, old_ca_key_pem, "client", days=1, not_before=long_ago)[0]
    )
    assert expired.not_valid_after_utc < dt.datetime.now(dt.UTC)
    with pytest.raises(VerificationError, match="not valid at validation time"):
        _verifier(old_ca_pem).build_client_verifier().verify(expired, [])
    # the same certificate was good inside its window
    inside = long_ago + dt.timedelta(hours=1)
    _verifier(old_ca_pem, inside).build_client_verifier().verify(expired, [])


@pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl is not installed")
def test_openssl_verifies_the_chain_and_purposes(ca, tmp_path: Path) -> None:
    ca_pem, ca_key_pem = ca
    (tmp_path / "ca.pem").write_bytes(ca_pem)
    (tmp_path / "other-ca.pem").write_bytes(certs.make_ca()[0])

    def verify(ca_name: str, leaf: bytes, purpose: str) -> bool:
        (tmp_path / "leaf.pem").write_bytes(leaf)
        done = subprocess.run(
            ["openssl", "verify", "-CAfile", str(tmp_path / ca_name), "-purpose", purpose]
            + [str(tmp_path / "leaf.pem")],
            capture_output=True,
            text=True,
            timeout=30,
        )
        return done.returncode == 0

    server = certs.make_cert(ca_pem, ca_key_pem, "server")[0]
    cli = certs.make_cert(ca_pem, ca_key_pem, "cli")[0]
    assert verify("ca.pem", server, "sslserver")
    assert verify("ca.pem", server, "sslclient")
    assert verify("ca.pem", cli, "sslclient")
    assert not verify("ca.pem", cli, "sslserver")
    assert not verify("other-ca.pem", server, "sslserver")


def test_role_of_reads_the_identity_from_san_names() -> None:
    assert certs.role_of([b"localhost", b"server.global.corral"]) == "server"
    assert certs.role_of(["CLIENT.global.corral"]) == "client"
    assert certs.role_of(["cli.global.corral", "127.0.0.1"]) == "cli"
    assert certs.role_of(["localhost"]) is None
    assert certs.role_of([]) is None
    assert certs.role_of(["server.global.corral.evil.com", "xserver.global.corral"]) is None
    # a certificate claiming two identities gets neither
    assert certs.role_of(["server.global.corral", "client.global.corral"]) is None
    assert certs.role_names("cli") == ("cli.global.corral", "localhost")
    assert certs.default_ips("client") == ("127.0.0.1",)


def test_bad_input_is_refused_with_the_reason(ca) -> None:
    ca_pem, ca_key_pem = ca
    cases = [
        ({"role": "admin"}, "unknown role 'admin'"),
        ({"role": "server", "region": "eu west"}, "region 'eu west' is not a DNS label"),
        ({"role": "server", "region": "eu.west"}, "region 'eu.west' is not a DNS label"),
        ({"role": "server", "domain": "-bad"}, "domain '-bad' is not a DNS name"),
        ({"role": "server", "dns_names": ["a..b"]}, "'a..b' is not a DNS name"),
        ({"role": "server", "ips": ["10.0.0.300"]}, "'10.0.0.300' is not an IP address"),
        ({"role": "server", "days": 0}, "days must be more than 0"),
        ({"role": "server", "days": 10**9}, "at most 36500"),
        (
            {"role": "server", "not_before": dt.datetime(2020, 1, 1)},
            "not_before must carry a time zone",
        ),
    ]
    for kwargs, message in cases:
        with pytest.raises(certs.CertError, match=message.replace(".", r"\.")):
            certs.make_cert(ca_pem, ca_key_pem, **kwargs)  # type: ignore[arg-type]


def test_a_ca_key_must_match_a_ca_certificate(ca) -> None:
    ca_pem, ca_key_pem = ca
    other_pem, other_key_pem = certs.make_ca()
    with pytest.raises(certs.CertError, match="does not belong to the CA certificate"):
        certs.make_cert(ca_pem, other_key_pem, "server")
    leaf_pem, leaf_key_pem = certs.make_cert(ca_pem, ca_key_pem, "server")
    with pytest.raises(certs.CertError, match="is not a CA"):
        certs.make_cert(leaf_pem, leaf_key_pem, "server")
    with pytest.raises(certs.CertError, match="not a PEM certificate"):
        certs.make_cert(b"junk", ca_key_pem, "server")
    with pytest.raises(certs.CertError, match="not an unencrypted PEM private key"):
        certs.make_cert(ca_pem, b"junk", "server")


def test_save_pair_writes_the_key_0600_and_never_overwrites(ca, tmp_path: Path) -> None:
    cert_path, key_path = tmp_path / "c.pem", tmp_path / "c-key.pem"
    old_umask = os.umask(0)  # even a permissive umask leaves the key private
    try:
        certs.save_pair(cert_path, key_path, b"CERT", b"KEY")
    finally:
        os.umask(old_umask)
    assert key_path.stat().st_mode & 0o777 == 0o600
    assert cert_path.stat().st_mode & 0o777 == 0o644
    with pytest.raises(certs.CertError, match="already exists; refusing to overwrite"):
        certs.save_pair(cert_path, key_path, b"NEW", b"NEW")
    assert (cert_path.read_bytes(), key_path.read_bytes()) == (b"CERT", b"KEY")
    # only the key exists: the certificate is not written either
    lone_key = tmp_path / "d-key.pem"
    lone_key.write_bytes(b"OLD")
    with pytest.raises(certs.CertError, match="d-key.pem already exists"):
        certs.save_pair(tmp_path / "d.pem", lone_key, b"NEW", b"NEW")
    assert not (tmp_path / "d.pem").exists() and lone_key.read_bytes() == b"OLD"


def test_write_bundle_makes_a_ca_and_every_role(tmp_path: Path) -> None:
    bundle = certs.write_bundle(tmp_path / "tls")
    assert bundle.ca_file.name == "corral-agent-ca.pem"
    ca_pem = bundle.ca_file.read_bytes()
    for role in certs.ROLES:
        assert bundle.cert_file(role).name == f"global-{role}-corral.pem"
        assert bundle.key_file(role).stat().st_mode & 0o777 == 0o600
        cert = _cert(bundle.cert_file(role).read_bytes())
        _verifier(ca_pem).build_client_verifier().verify(cert, [])
    assert bundle.ca_key_file.stat().st_mode & 0o777 == 0o600
    assert (tmp_path / "tls").stat().st_mode & 0o777 == 0o700  # it holds the CA's key


class _Whoami(health_pb2_grpc.HealthServicer):  # type: ignore[misc]
    """Health.Check that answers SERVING to a client agent and NOT_SERVING to
    anyone else: enough to show a server reading the peer's identity from
    its certificate (gRPC's auth context) with `certs.role_of`."""

    def __init__(self) -> None:
        self.roles: list[str | None] = []

    def Check(self, request, context):  # noqa: N802 - gRPC's name
        names = context.auth_context().get("x509_subject_alternative_name", [])
        role = certs.role_of(names)
        self.roles.append(role)
        status = health_pb2.HealthCheckResponse.SERVING
        if role != "client":
            status = health_pb2.HealthCheckResponse.NOT_SERVING
        return health_pb2.HealthCheckResponse(status=status)


def test_grpc_mutual_tls_with_these_certificates(ca) -> None:
    ca_pem, ca_key_pem = ca
    server_cert, server_key = certs.make_cert(ca_pem, ca_key_pem, "server")
    creds = grpc.ssl_server_credentials(
        [(server_key, server_cert)], root_certificates=ca_pem, require_client_auth=True
    )
    servicer = _Whoami()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    port = server.add_secure_port("127.0.0.1:0", creds)
    server.start()

    def check(ca_for_client: bytes, pair: tuple[bytes, bytes], target: str) -> int:
        cert_pem, key_pem = pair
        channel_creds = grpc.ssl_channel_credentials(ca_for_client, key_pem, cert_pem)
        options = [("grpc.ssl_target_name_override", "server.global.corral")]
        with grpc.secure_channel(target, channel_creds, options=options) as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            return int(stub.Check(health_pb2.HealthCheckRequest(), timeout=10).status)

    try:
        client = certs.make_cert(ca_pem, ca_key_pem, "client")
        cli = certs.make_cert(ca_pem, ca_key_pem, "cli")
        target = f"127.0.0.1:{port}"
        assert check(ca_pem, client, target) == health_pb2.HealthCheckResponse.SERVING
        assert check(ca_pem, cli, target) == health_pb2.HealthCheckResponse.NOT_SERVING
        assert servicer.roles == ["client", "cli"]
        # a certificate from another CA, or one that has expired, is refused
        # in the handshake: the handler never runs
        other_pem, other_key_pem = certs.make_ca()
        foreign = certs.make_cert(other_pem, other_key_pem, "client")
        long_ago = dt.datetime.now(dt.UTC) - dt.timedelta(days=30)
        expired = certs.make_cert(ca_pem, ca_key_pem, "client", days=1, not_before=long_ago)
        for pair in (foreign, expired):
            with pytest.raises(grpc.RpcError) as info:
                check(ca_pem, pair, target)
            assert info.value.code() == grpc.StatusCode.UNAVAILABLE
        # a client that trusts another CA refuses the server
        with pytest.raises(grpc.RpcError) as info:
            check(certs.make_ca()[0], client, target)
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE
        assert servicer.roles == ["client", "cli"]
    finally:
        server.stop(grace=None)
