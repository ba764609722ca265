"""X.509 material for Corral's mutual TLS: a cluster CA and certificates that
carry an identity, as Nomad's `nomad tls` makes them.

The identity is a SAN DNS name `<role>.<region>.<domain>`: `server.global.corral`
for the state, broker, planner and worker, `client.global.corral` for client
agents, `cli.global.corral` for people. A server checks the name as well as
the chain, so a client agent's certificate (same CA) cannot call server-only
RPCs; `role_of` reads the identity back from a peer's SAN names.

One module for every maker: `corral tls ca create` / `tls cert create` write
what `make_ca` / `make_cert` return, `corral dev -tls` and the tests make
throwaway CAs with them (`not_before` in the past gives an expired
certificate; a second CA gives a wrong-CA one). Keys are EC P-256 (small,
fast handshakes, supported by every gRPC TLS stack); serial numbers are
random; files holding a key are written with mode 0600 and no file is ever
overwritten.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, get_args

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from corral.security.private_files import private_dir

Role = Literal["server", "client", "cli"]
ROLES: tuple[Role, ...] = get_args(Role)

DEFAULT_REGION = "global"
DEFAULT_DOMAIN = "corral"
CA_DAYS = 1825  # five years, as Nomad's CA
CERT_DAYS = 365  # one year, as Nomad's certificates
MAX_DAYS = 36500  # a hundred years: past that a date overflows X.509's range soon
# a fresh certificate is valid from a minute ago: a peer whose clock runs a
# little behind must not see it as "not yet valid"
CLOCK_SKEW = dt.timedelta(minutes=1)

# what a role's certificate may be used for: servers and client agents both
# serve (the state's API, an agent's logs API) and call others; the CLI only calls
_USAGES: dict[Role, tuple[x509.ObjectIdentifier, ...]] = {
    "server": (ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH),
    "client": (ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH),
    "cli": (ExtendedKeyUsageOID.CLIENT_AUTH,),
}

_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
_REGION_RE = re.compile(rf"^{_LABEL}$")
_DOMAIN_RE = re.compile(rf"^{_LABEL}(?:\.{_LABEL})*$")
_DNS_NAME_RE = re.compile(rf"^(?:\*\.)?{_LABEL}(?:\.{_LABEL})*$")


class CertError(ValueError):
    """Input that cannot make a certificate (bad name, bad address, a CA key
    that does not match its certificate, a file that already exists); the
    message says which and is fit to show as is."""


# -- names ----------------------------------------------------------------


def role_name(role: Role, region: str = DEFAULT_REGION, domain: str = DEFAULT_DOMAIN) -> str:
    """The identity name of `role`: `server.global.corral`."""
    _check_role(role)
    _check_region(region)
    _check_domain(domain)
    return f"{role}.{region}.{domain}"


def role_names(
    role: Role, region: str = DEFAULT_REGION, domain: str = DEFAULT_DOMAIN
) -> tuple[str, ...]:
    """The SAN DNS names a role's certificate carries by default: its identity
    name first, then `localhost` (as Nomad's do), so a process can be
    reached at 127.0.0.1 / localhost with hostname verification on."""
    return (role_name(role, region, domain), "localhost")


def default_ips(role: Role) -> tuple[str, ...]:
    """The SAN IP addresses a role's certificate carries by default (Nomad's
    127.0.0.1, for the same reason as `localhost`)."""
    _check_role(role)
    return ("127.0.0.1",)


def role_of(
    names: Iterable[str | bytes], region: str = DEFAULT_REGION, domain: str = DEFAULT_DOMAIN
) -> Role | None:
    """The role whose identity name is among `names` (a peer certificate's
    SAN DNS names, e.g. gRPC's `x509_subject_alternative_name` auth
    property), or None when there is none — or more than one: a certificate
    claiming two identities is not trusted with either."""
    wanted = {role_name(r, region, domain): r for r in ROLES}
    found: set[Role] = set()
    for name in names:
        text = name.decode("ascii", "replace") if isinstance(name, bytes) else name
        role = wanted.get(text.lower())
        if role is not None:
            found.add(role)
    return found.pop() if len(found) == 1 else None


def identity_of(
    names: Iterable[str | bytes], domain: str = DEFAULT_DOMAIN
) -> tuple[Role, str] | None:
    """The (role, region) a certificate's SAN DNS names claim, whatever the
    region: how a server of one region recognises a server of another
    (federation, docs/architecture.md). None when the names claim no
    identity, or more than one."""
    suffix = "." + domain.lower()
    found: set[tuple[Role, str]] = set()
    for name in names:
        text = (name.decode("ascii", "replace") if isinstance(name, bytes) else name).lower()
        if not text.endswith(suffix):
            continue
        role, _, region = text[: -len(suffix)].partition(".")
        if role in ROLES and _REGION_RE.match(region):
            found.add((role, region))  # type: ignore[arg-type]
    return found.pop() if len(found) == 1 else None


def cert_identity(cert_pem: bytes, domain: str = DEFAULT_DOMAIN) -> tuple[Role, str] | None:
    """The (role, region) a PEM certificate (the first of a chain) names."""
    try:
        cert = x509.load_pem_x509_certificate(cert_pem)
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except (ValueError, x509.ExtensionNotFound):
        return None
    return identity_of(san.get_values_for_type(x509.DNSName), domain)


def ca_file_name(domain: str = DEFAULT_DOMAIN) -> tuple[str, str]:
    """The CA's certificate and key file names: `corral-agent-ca.pem`,
    `corral-agent-ca-key.pem` (Nomad's `<domain>-agent-ca.pem`)."""
    _check_domain(domain)
    return f"{domain}-agent-ca.pem", f"{domain}-agent-ca-key.pem"


def cert_file_name(
    role: Role, region: str = DEFAULT_REGION, domain: str = DEFAULT_DOMAIN
) -> tuple[str, str]:
    """A role's certificate and key file names: `global-server-corral.pem`,
    `global-server-corral-key.pem` (Nomad's pattern)."""
    _check_role(role)
    _check_region(region)
    _check_domain(domain)
    stem = f"{region}-{role}-{domain}"
    return f"{stem}.pem", f"{stem}-key.pem"


# -- making ---------------------------------------------------------------


def _key_usage(*, ca: bool) -> x509.KeyUsage:
    """Signatures, and for a CA signing certificates and CRLs: nothing else."""
    return x509.KeyUsage(
        digital_signature=True,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=ca,
        crl_sign=ca,
        encipher_only=False,
        decipher_only=False,
    )


def make_ca(
    *,
    common_name: str | None = None,
    days: float = CA_DAYS,
    not_before: dt.datetime | None = None,
) -> tuple[bytes, bytes]:
    """A self-signed CA: (certificate PEM, key PEM). It may sign end-entity
    certificates only (path length 0). The default common name is
    `Corral Agent CA <serial>`, so two CAs are told apart in errors."""
    _check_days(days)
    key = ec.generate_private_key(ec.SECP256R1())
    serial = x509.random_serial_number()
    if common_name is not None and not common_name.strip():
        raise CertError("the CA's common name must not be empty")
    name = x509.Name(
        [
            x509.NameAttribute(NameOID.COMMON_NAME, common_name or f"Corral Agent CA {serial}"),
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "Corral"),
        ]
    )
    start, end = _window(days, not_before)
    public = key.public_key()
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(public)
        .serial_number(serial)
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_key_usage(ca=True), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(public), critical=False)
        .sign(key, hashes.SHA256())
    )
    return _cert_pem(cert), _key_pem(key)


def make_cert(
    ca_pem: bytes,
    ca_key_pem: bytes,
    role: Role,
    region: str = DEFAULT_REGION,
    domain: str = DEFAULT_DOMAIN,
    days: float = CERT_DAYS,
    not_before: dt.datetime | None = None,
    dns_names: Sequence[str] = (),
    ips: Sequence[str] = (),
) -> tuple[bytes, bytes]:
    """A certificate for `role` signed by the CA: (certificate PEM, key PEM).

    SAN DNS names: `role_names(role, region, domain)` then `dns_names`; SAN
    IPs: `default_ips(role)` then `ips`. The subject's common name is the
    identity name. `not_before` (default: now, less a minute of clock skew)
    may lie in the past, so a test can make a certificate that has already
    expired."""
    _check_days(days)
    ca_cert, ca_key = load_ca(ca_pem, ca_key_pem)
    identity = role_name(role, region, domain)
    names = _unique([*role_names(role, region, domain), *(_dns_name(n) for n in dns_names)])
    addresses = _unique([*(_ip(a) for a in default_ips(role)), *(_ip(a) for a in ips)])
    key = ec.generate_private_key(ec.SECP256R1())
    start, end = _window(days, not_before)
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, identity)]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_key_usage(ca=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage(list(_USAGES[role])), critical=False)
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName(n) for n in names]
                + [x509.IPAddress(ipaddress.ip_address(a)) for a in addresses]
            ),
            critical=False,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
            critical=False,
        )
    )
    return _cert_pem(builder.sign(ca_key, hashes.SHA256())), _key_pem(key)


CaKey = ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey


def load_ca(ca_pem: bytes, ca_key_pem: bytes) -> tuple[x509.Certificate, CaKey]:
    """The CA certificate and key, checked to belong together and to be a CA
    (a mismatched pair would sign certificates nobody can verify)."""
    try:
        cert = x509.load_pem_x509_certificate(ca_pem)
    except ValueError as exc:
        raise CertError(f"the CA certificate is not a PEM certificate ({exc})") from None
    try:
        key = serialization.load_pem_private_key(ca_key_pem, password=None)
    except (ValueError, TypeError) as exc:
        raise CertError(f"the CA key is not an unencrypted PEM private key ({exc})") from None
    if not isinstance(key, ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey):
        raise CertError(f"the CA key is a {type(key).__name__}; EC or RSA keys are supported")
    try:
        constraints = cert.extensions.get_extension_for_class(x509.BasicConstraints).value
    except x509.ExtensionNotFound:
        constraints = None
    if constraints is None or not constraints.ca:
        raise CertError("the CA certificate is not a CA (basicConstraints CA:TRUE is missing)")
    if key.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    ) != cert.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    ):
        raise CertError("the CA key does not belong to the CA certificate")
    return cert, key


# -- files ----------------------------------------------------------------


def save_pair(cert_path: Path, key_path: Path, cert_pem: bytes, key_pem: bytes) -> None:
    """Write a certificate (mode 0644) and its key (mode 0600), refusing to
    replace either file: overwriting a CA key by a slip would orphan every
    certificate it signed. Both paths are checked before either is written."""
    for path in (cert_path, key_path):
        if path.exists() or path.is_symlink():
            raise CertError(f"{path} already exists; refusing to overwrite it")
    _write_new(key_path, key_pem, 0o600)
    try:
        _write_new(cert_path, cert_pem, 0o644)
    except BaseException:
        key_path.unlink(missing_ok=True)
        raise


@dataclass(frozen=True)
class Bundle:
    """Paths of a CA and one certificate per role in one directory."""

    ca_file: Path
    ca_key_file: Path
    cert_files: dict[Role, tuple[Path, Path]]

    def cert_file(self, role: Role) -> Path:
        return self.cert_files[role][0]

    def key_file(self, role: Role) -> Path:
        return self.cert_files[role][1]


def write_bundle(
    directory: Path,
    region: str = DEFAULT_REGION,
    domain: str = DEFAULT_DOMAIN,
    days: float = CERT_DAYS,
    ca: tuple[bytes, bytes] | None = None,
) -> Bundle:
    """A throwaway CA and a server, client and cli certificate in `directory`
    (created if need be), with the file names the CLI gives them: what
    `corral dev -tls` and the tests need in one call. The directory is 0700
    (it holds the CA's key). With `ca` (certificate and key PEM) that CA
    signs them instead of a new one: the regions of a federation share one
    CA (`corral dev -tls-ca`)."""
    private_dir(directory)
    if ca is not None:
        load_ca(*ca)  # a mismatched pair would sign what nobody verifies
    ca_pem, ca_key_pem = ca or make_ca()
    ca_name, ca_key_name = ca_file_name(domain)
    save_pair(directory / ca_name, directory / ca_key_name, ca_pem, ca_key_pem)
    files: dict[Role, tuple[Path, Path]] = {}
    for role in ROLES:
        cert_pem, key_pem = make_cert(ca_pem, ca_key_pem, role, region, domain, days=days)
        cert_name, key_name = cert_file_name(role, region, domain)
        save_pair(directory / cert_name, directory / key_name, cert_pem, key_pem)
        files[role] = (directory / cert_name, directory / key_name)
    return Bundle(directory / ca_name, directory / ca_key_name, files)


# -- helpers --------------------------------------------------------------


def _write_new(path: Path, data: bytes, mode: int) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    try:
        os.fchmod(fd, mode)  # whatever the umask
        with os.fdopen(fd, "wb") as fh:
            fd = -1
            fh.write(data)
    finally:
        if fd >= 0:
            os.close(fd)


def _window(days: float, not_before: dt.datetime | None) -> tuple[dt.datetime, dt.datetime]:
    if not_before is None:
        start = dt.datetime.now(dt.UTC) - CLOCK_SKEW
    elif not_before.tzinfo is None:
        raise CertError("not_before must carry a time zone")
    else:
        start = not_before.astimezone(dt.UTC)
    return start, start + dt.timedelta(days=days)


def _cert_pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _unique(items: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(items))


def _check_role(role: str) -> None:
    if role not in ROLES:
        raise CertError(f"unknown role {role!r}; expected one of {', '.join(ROLES)}")


def _check_region(region: str) -> None:
    if not _REGION_RE.match(region):
        raise CertError(f"region {region!r} is not a DNS label (letters, digits and -)")


def _check_domain(domain: str) -> None:
    if len(domain) > 253 or not _DOMAIN_RE.match(domain):
        raise CertError(f"domain {domain!r} is not a DNS name")


def _check_days(days: float) -> None:
    if not 0 < days <= MAX_DAYS:
        raise CertError(f"days must be more than 0 and at most {MAX_DAYS}, got {days}")


def _dns_name(name: str) -> str:
    if len(name) > 253 or not _DNS_NAME_RE.match(name):
        raise CertError(f"{name!r} is not a DNS name")
    return name.lower()


def _ip(text: str) -> str:
    try:
        return str(ipaddress.ip_address(text.strip()))
    except ValueError:
        raise CertError(f"{text!r} is not an IP address") from None
