"""The trust set-up of `corral dev`: who the roles are to each other, and
the operator's credentials.

Without flags the servers share a random server token (plaintext, on
loopback by default) and ACLs are off: nothing to set up. `-tls` makes a
throwaway CA in the data directory (new on every start) and gives each role
its certificate: server roles `server.global.corral`, the agent
`client.global.corral`, the operator's CLI `cli.global.corral`. `-acl`
turns ACLs on in every role and bootstraps them once per data directory;
the management token is kept in the data directory (mode 0600) so a
restarted dev cluster prints the same one.
"""

from __future__ import annotations

import os
import secrets
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from corral.runtime.settings import SecuritySettings
from corral.security import certs, transport
from corral.security.private_files import write_private
from corral.v1 import acl_pb2, acl_pb2_grpc

TOKEN_FILE = "acl-bootstrap-token"


@dataclass
class DevTrust:
    tls: certs.Bundle | None = None
    acl: bool = False
    #: environment for every role, and the server roles' and agent's own
    env: dict[str, str] = field(default_factory=dict)
    server_env: dict[str, str] = field(default_factory=dict)
    agent_env: dict[str, str] = field(default_factory=dict)
    token: str = ""

    def role_env(self, role: str) -> dict[str, str]:
        # the gateway is a user of the cluster, like the agent no server: it
        # gets no server token, and the agent's `client` certificate (one
        # that may serve, for its HTTPS listener, but is no server's)
        users = ("agent", "gateway")
        return {**self.env, **(self.agent_env if role in users else self.server_env)}

    region: str = "global"

    def cli_settings(self) -> SecuritySettings:
        """What this command uses to talk to the cluster it started."""
        if self.tls is None:
            return transport.current()
        return SecuritySettings(
            ca_file=str(self.tls.ca_file),
            cert_file=str(self.tls.cert_file("cli")),
            key_file=str(self.tls.key_file("cli")),
            region=self.region,
        )

    def exports(self) -> list[str]:
        """Shell lines for the operator's terminal."""
        lines = []
        if self.tls is not None:
            lines += [
                f"export CORRAL_CA_FILE={self.tls.ca_file}",
                f"export CORRAL_CERT_FILE={self.tls.cert_file('cli')}",
                f"export CORRAL_KEY_FILE={self.tls.key_file('cli')}",
            ]
        if self.token:
            lines.append(f"export CORRAL_TOKEN={self.token}")
        return lines


def prepare(
    data_dir: Path,
    *,
    tls: bool,
    acl: bool,
    region: str = certs.DEFAULT_REGION,
    ca_dir: Path | None = None,
) -> DevTrust:
    """The roles' environment for the chosen set-up (before they start).
    With `ca_dir` (another dev region's `tls` directory) its CA signs this
    region's certificates: the regions of a federation share one CA."""
    trust = DevTrust(acl=acl, region=region)
    trust.env["CORRAL_REGION"] = region
    if acl:
        trust.env["CORRAL_ACL_ENABLED"] = "true"
    if not tls:
        # the servers' shared secret for their internal RPCs; the agent and
        # the operator never get it
        token = os.environ.get("CORRAL_SERVER_TOKEN") or secrets.token_urlsafe(32)
        trust.server_env["CORRAL_SERVER_TOKEN"] = token
        trust.agent_env["CORRAL_SERVER_TOKEN"] = ""
        return trust
    directory = data_dir / "tls"
    ca = _read_ca(ca_dir) if ca_dir is not None else None
    shutil.rmtree(directory, ignore_errors=True)
    trust.tls = certs.write_bundle(directory, region=region, ca=ca)
    trust.env.update({"CORRAL_CA_FILE": str(trust.tls.ca_file), "CORRAL_SERVER_TOKEN": ""})
    for role, target in (("server", trust.server_env), ("client", trust.agent_env)):
        target["CORRAL_CERT_FILE"] = str(trust.tls.cert_file(role))  # type: ignore[arg-type]
        target["CORRAL_KEY_FILE"] = str(trust.tls.key_file(role))  # type: ignore[arg-type]
    return trust


def _read_ca(directory: Path) -> tuple[bytes, bytes]:
    """The CA certificate and key in `directory` (a dev data dir's `tls`)."""
    cert_name, key_name = certs.ca_file_name()
    try:
        return (directory / cert_name).read_bytes(), (directory / key_name).read_bytes()
    except OSError as exc:
        raise RuntimeError(
            f"-tls-ca {directory}: cannot read the CA there ({exc.strerror}); give the `tls` "
            "directory of the other region's data directory"
        ) from None


def bootstrap(trust: DevTrust, data_dir: Path, address: str) -> None:
    """Bootstrap ACLs on the running state, or reuse this data directory's
    earlier bootstrap token."""
    saved = data_dir / TOKEN_FILE
    if saved.exists():
        trust.token = saved.read_text().strip()
        return
    channel = transport.dial_sync(address, settings=trust.cli_settings())
    try:
        resp = acl_pb2_grpc.ACLStub(channel).Bootstrap(acl_pb2.ACLBootstrapRequest(), timeout=30)
    except grpc.RpcError as exc:
        raise RuntimeError(f"ACL bootstrap failed: {exc.details()}") from None
    finally:
        channel.close()
    trust.token = resp.token.secret_id
    write_private(saved, trust.token + "\n")
