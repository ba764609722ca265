"""`corral tls ca create` and `corral tls cert create -server|-client|-cli`:
a private CA and identity certificates for mutual TLS, as `nomad tls` makes
them (file names, defaults and SAN names follow Nomad's). The certificates
come from corral/security/certs.py; this module only reads flags and files, writes
files into the current directory and reports."""

from __future__ import annotations

import argparse
import datetime as dt
from pathlib import Path
from typing import Any

from cryptography import x509

from cli.commands import group
from cli.context import CliError, Context, add_json
from cli.output import print_json
from corral.security import certs

SERVER_WARNING = (
    "==> WARNING: a server certificate lets its holder act as a Corral server and\n"
    "    call every internal RPC (plan commits, eval writes, snapshots of all state).\n"
    "    Give it only to server processes (state, broker, planner, worker) and keep\n"
    "    it as safe as the CA key.\n"
)


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    tls = group(sub, "tls", "Create a private CA and certificates for mutual TLS")

    ca = tls.add_parser("ca", help="Certificate authority").add_subparsers(
        dest="ca_command", metavar="<subcommand>"
    )
    p = ca.add_parser(
        "create",
        help="Create a self-signed CA in the current directory",
        description="Write <domain>-agent-ca.pem and <domain>-agent-ca-key.pem "
        "(mode 0600) into the current directory; existing files are never overwritten.",
    )
    p.add_argument(
        "-days", "--days", dest="days", type=int, default=certs.CA_DAYS, help="validity in days"
    )
    p.add_argument(
        "-domain",
        "--domain",
        dest="domain",
        default=certs.DEFAULT_DOMAIN,
        help="the cluster's domain; names the files",
    )
    p.add_argument(
        "-common-name",
        "--common-name",
        dest="common_name",
        default=None,
        help="the CA's common name (default: Corral Agent CA <serial>)",
    )
    add_json(p)
    p.set_defaults(func=cmd_ca_create)

    cert = tls.add_parser("cert", help="Certificates signed by the CA").add_subparsers(
        dest="cert_command", metavar="<subcommand>"
    )
    p = cert.add_parser(
        "create",
        help="Create a server, client or cli certificate in the current directory",
        description="Write <region>-<role>-<domain>.pem and its -key.pem (mode 0600) "
        "into the current directory, signed by the CA; existing files are never overwritten.",
    )
    roles = p.add_mutually_exclusive_group()
    for role, help_text in (
        ("server", "a server certificate (state, broker, planner, worker)"),
        ("client", "a client agent certificate"),
        ("cli", "a certificate for the command line"),
    ):
        roles.add_argument(
            f"-{role}",
            f"--{role}",
            dest="role",
            action="store_const",
            const=role,
            help=help_text,
        )
    p.add_argument("-region", "--region", dest="region", default=certs.DEFAULT_REGION)
    p.add_argument("-domain", "--domain", dest="domain", default=certs.DEFAULT_DOMAIN)
    p.add_argument(
        "-days",
        "--days",
        dest="days",
        type=int,
        default=certs.CERT_DAYS,
        help="validity in days",
    )
    p.add_argument(
        "-ca",
        "--ca",
        dest="ca",
        default=None,
        help="CA certificate (default <domain>-agent-ca.pem)",
    )
    p.add_argument(
        "-key",
        "--key",
        dest="key",
        default=None,
        help="CA key (default <domain>-agent-ca-key.pem)",
    )
    p.add_argument(
        "-additional-dnsname",
        "--additional-dnsname",
        dest="dns_names",
        action="append",
        default=[],
        metavar="NAME",
        help="one more SAN DNS name (repeatable)",
    )
    p.add_argument(
        "-additional-ipaddress",
        "--additional-ipaddress",
        dest="ips",
        action="append",
        default=[],
        metavar="IP",
        help="one more SAN IP address (repeatable)",
    )
    add_json(p)
    p.set_defaults(func=cmd_cert_create)


def cmd_ca_create(args: argparse.Namespace, ctx: Context) -> int:
    try:
        cert_name, key_name = certs.ca_file_name(args.domain)
        cert_pem, key_pem = certs.make_ca(common_name=args.common_name, days=args.days)
        certs.save_pair(Path(cert_name), Path(key_name), cert_pem, key_pem)
    except certs.CertError as exc:
        raise CliError(str(exc)) from None
    except OSError as exc:
        raise CliError(f"cannot write the CA: {exc.strerror}: {exc.filename}") from None
    if args.json:
        print_json({"ca_file": cert_name, "key_file": key_name, **_describe(cert_pem)}, ctx.out)
        return 0
    ctx.out.write(f"==> CA certificate saved to: {cert_name}\n")
    ctx.out.write(f"==> CA certificate key saved to: {key_name}\n")
    return 0


def cmd_cert_create(args: argparse.Namespace, ctx: Context) -> int:
    if args.role is None:
        raise CliError("give one of -server, -client or -cli")
    try:
        default_ca, default_key = certs.ca_file_name(args.domain)
        ca_file = Path(args.ca or default_ca)
        key_file = Path(args.key or default_key)
        ca_pem = _read(ca_file, "CA certificate")
        ca_key_pem = _read(key_file, "CA key")
        cert_name, key_name = certs.cert_file_name(args.role, args.region, args.domain)
        cert_pem, key_pem = certs.make_cert(
            ca_pem,
            ca_key_pem,
            args.role,
            args.region,
            args.domain,
            days=args.days,
            dns_names=args.dns_names,
            ips=args.ips,
        )
        certs.save_pair(Path(cert_name), Path(key_name), cert_pem, key_pem)
    except certs.CertError as exc:
        raise CliError(str(exc)) from None
    except OSError as exc:
        raise CliError(f"cannot write the certificate: {exc.strerror}: {exc.filename}") from None
    if args.json:
        print_json({"cert_file": cert_name, "key_file": key_name, **_describe(cert_pem)}, ctx.out)
        return 0
    what = {"server": "Server", "client": "Client", "cli": "Cli"}[args.role]
    if args.role == "server":
        ctx.out.write(SERVER_WARNING)
    ctx.out.write(f"==> Using CA file {ca_file} and CA key {key_file}\n")
    ctx.out.write(f"==> {what} certificate saved to: {cert_name}\n")
    ctx.out.write(f"==> {what} certificate key saved to: {key_name}\n")
    return 0


def _read(path: Path, what: str) -> bytes:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        raise certs.CertError(
            f"{what} {path} not found; create one with `corral tls ca create` "
            "or name it with -ca/-key"
        ) from None
    except OSError as exc:
        raise certs.CertError(f"cannot read the {what} {path}: {exc.strerror}") from None


def _describe(cert_pem: bytes) -> dict[str, Any]:
    """What `-json` reports of a certificate (times as Unix ns, as elsewhere)."""
    cert = x509.load_pem_x509_certificate(cert_pem)
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        dns = san.get_values_for_type(x509.DNSName)
        ips = [str(a) for a in san.get_values_for_type(x509.IPAddress)]
    except x509.ExtensionNotFound:
        dns, ips = [], []
    return {
        "subject": cert.subject.rfc4514_string(),
        "serial": format(cert.serial_number, "x"),
        "dns_names": dns,
        "ip_addresses": ips,
        "not_before": _ns(cert.not_valid_before_utc),
        "not_after": _ns(cert.not_valid_after_utc),
    }


def _ns(when: dt.datetime) -> int:
    return int(when.timestamp()) * 1_000_000_000
