"""Mutual TLS with real processes (issue 15): a whole cluster, agent
included, places and runs a job over mTLS; plaintext is refused; a client
(agent) or CLI certificate cannot call what only servers may; an expired
certificate and one from another CA are refused; a server picks up a
rotated CA bundle without a restart."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest

from corral.runtime.settings import SecuritySettings
from corral.security import certs, transport
from corral.testing import mock
from corral.v1 import job_pb2, job_pb2_grpc, state_pb2, state_pb2_grpc
from corral.v1 import structs_pb2 as pb
from tests.cluster import Cluster
from tests.wait import until


@dataclass
class Pki:
    """A CA and certificates for every role, as files."""

    dir: Path
    ca: tuple[bytes, bytes]

    def issue(
        self,
        role: certs.Role,
        name: str,
        *,
        ca: tuple[bytes, bytes] | None = None,
        not_before: dt.datetime | None = None,
        days: float = 30,
    ) -> SecuritySettings:
        ca = ca or self.ca
        cert, key = certs.make_cert(ca[0], ca[1], role, days=days, not_before=not_before)
        (self.dir / f"{name}.pem").write_bytes(cert)
        (self.dir / f"{name}-key.pem").write_bytes(key)
        return SecuritySettings(
            ca_file=str(self.dir / "ca.pem"),
            cert_file=str(self.dir / f"{name}.pem"),
            key_file=str(self.dir / f"{name}-key.pem"),
        )

    @staticmethod
    def env(s: SecuritySettings) -> dict[str, str]:
        return {
            "CORRAL_CA_FILE": s.ca_file,
            "CORRAL_CERT_FILE": s.cert_file,
            "CORRAL_KEY_FILE": s.key_file,
            # with TLS the certificate, not the token, proves a server
            "CORRAL_SERVER_TOKEN": "",
        }


@pytest.fixture
def pki(tmp_path: Path) -> Iterator[Pki]:
    d = tmp_path / "tls"
    d.mkdir()
    ca = certs.make_ca(days=30)
    (d / "ca.pem").write_bytes(ca[0])
    yield Pki(d, ca)


def _tls_cluster(make_cluster: Callable[..., Cluster], pki: Pki, tmp: Path) -> Cluster:
    server = pki.issue("server", "server")
    client = pki.issue("client", "client")
    c = make_cluster(**Pki.env(server))
    c.start("state")
    c.start("broker")
    c.start("planner")
    c.start("worker", "--num-schedulers", "1")
    c.start("agent", "--data-dir", str(tmp / "agent"), env=Pki.env(client))
    return c


async def test_a_cluster_runs_a_job_over_mutual_tls(
    make_cluster: Callable[..., Cluster], pki: Pki, tmp_path: Path
) -> None:
    c = _tls_cluster(make_cluster, pki, tmp_path)
    cli = pki.issue("cli", "cli")
    async with transport.dial(c.state_addr, settings=cli) as ch:
        jobs = job_pb2_grpc.JobStub(ch)
        task = pb.Task(name="main", driver="mock", resources=pb.Resources(cpu=50, memory_mb=32))
        job = pb.Job(
            id="tls-web",
            type="service",
            datacenters=["dc1"],
            task_groups=[pb.TaskGroup(name="g", count=1, tasks=[task])],
        )
        await jobs.Register(job_pb2.JobRegisterRequest(job=job))

        async def running() -> bool:
            resp = await jobs.Allocations(job_pb2.JobGetRequest(job_id="tls-web"))
            return any(a.client_status == "running" for a in resp.allocs)

        await until(running)

    # plaintext is refused outright: the handshake fails
    async with grpc.aio.insecure_channel(c.state_addr) as plain:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await job_pb2_grpc.JobStub(plain).List(job_pb2.JobListRequest(), timeout=5)
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    assert "mutual TLS" in c.log("state")


async def test_client_and_cli_certificates_cannot_call_server_only_rpcs(
    make_cluster: Callable[..., Cluster], pki: Pki
) -> None:
    c = make_cluster(**Pki.env(pki.issue("server", "server")))
    c.start("state")
    for role in ("client", "cli"):
        settings = pki.issue(role, role)
        async with transport.dial(c.state_addr, settings=settings) as ch:
            state = state_pb2_grpc.StateStub(ch)
            job = mock.job()
            plan = state_pb2.AppliedPlan(job_id=job.id, allocs=[mock.alloc(job, mock.node())])
            for call in (
                state.GetIndex(state_pb2.GetIndexRequest()),
                state.ApplyPlans(state_pb2.ApplyPlansRequest(plans=[plan])),
            ):
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await call
                assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED, role
                assert f"certificate role '{role}'" in (err.value.details() or "")
            # the public API answers them (ACLs off)
            await job_pb2_grpc.JobStub(ch).List(job_pb2.JobListRequest())
    server = pki.issue("server", "server2")
    async with transport.dial(c.state_addr, settings=server) as ch:
        await state_pb2_grpc.StateStub(ch).GetIndex(state_pb2.GetIndexRequest())


async def _refused(address: str, settings: SecuritySettings) -> grpc.StatusCode:
    # retries off: the handshake's refusal itself is the answer under test
    async with transport.dial(
        address, settings=settings, options=[("grpc.enable_retries", 0)]
    ) as ch:
        try:
            await job_pb2_grpc.JobStub(ch).List(job_pb2.JobListRequest(), timeout=5)
        except grpc.aio.AioRpcError as exc:
            return exc.code()
    return grpc.StatusCode.OK


async def test_expired_and_foreign_certificates_are_refused(
    make_cluster: Callable[..., Cluster], pki: Pki
) -> None:
    c = make_cluster(**Pki.env(pki.issue("server", "server")))
    c.start("state")
    long_ago = dt.datetime.now(dt.UTC) - dt.timedelta(days=10)
    expired = pki.issue("cli", "expired", not_before=long_ago, days=1)
    assert await _refused(c.state_addr, expired) == grpc.StatusCode.UNAVAILABLE
    foreign_ca = certs.make_ca(days=30)
    foreign = pki.issue("cli", "foreign", ca=foreign_ca)
    assert await _refused(c.state_addr, foreign) == grpc.StatusCode.UNAVAILABLE
    assert await _refused(c.state_addr, pki.issue("cli", "good")) == grpc.StatusCode.OK


async def test_a_rotated_ca_bundle_is_picked_up_without_a_restart(
    make_cluster: Callable[..., Cluster], pki: Pki
) -> None:
    """The server trusts CA 1; a CLI certificate of CA 2 is refused until the
    server's CA file (as cert-manager would) is replaced by a bundle of both."""
    c = make_cluster(**Pki.env(pki.issue("server", "server")))
    c.start("state")
    pid = c.procs["state"].popen.pid  # type: ignore[union-attr]
    ca2 = certs.make_ca(days=30)
    newcomer = pki.issue("cli", "newcomer", ca=ca2)
    # the client trusts CA 1 (the server's issuer) but presents a CA 2 cert
    assert await _refused(c.state_addr, newcomer) == grpc.StatusCode.UNAVAILABLE
    bundle = pki.dir / "ca.pem.new"
    bundle.write_bytes(pki.ca[0] + ca2[0])
    bundle.replace(pki.dir / "ca.pem")
    assert await _refused(c.state_addr, newcomer) == grpc.StatusCode.OK
    assert c.procs["state"].popen.pid == pid and c.procs["state"].alive  # type: ignore[union-attr]


def _https_status(base: str, pki: Pki, client: SecuritySettings | None) -> int:
    """GET /v1/status/leader over HTTPS, verifying the gateway against the
    cluster's CA; with `client`, presenting that certificate."""
    import ssl
    import urllib.request

    context = ssl.create_default_context(cafile=str(pki.dir / "ca.pem"))
    context.check_hostname = False  # the certificate names its role, not 127.0.0.1
    if client is not None:
        context.load_cert_chain(client.cert_file, client.key_file)
    with urllib.request.urlopen(f"{base}/v1/status/leader", context=context, timeout=30) as r:
        return int(r.status)


def test_the_https_gateway_requires_client_certificates_when_told(
    make_cluster: Callable[..., Cluster], pki: Pki
) -> None:
    """Issue 26, finding 6 (docs/security.md, docs/http-api.md): the HTTPS
    gateway accepts callers without a client certificate by default (the ACL
    token decides, as Nomad's `verify_https_client = false`);
    `--http-verify-clients` requires one the cluster's CA signed."""
    c = make_cluster(**Pki.env(pki.issue("server", "server")))
    c.start("state")
    gateway_env = Pki.env(pki.issue("client", "gateway"))
    optional = c.start("gateway", "--listen", "127.0.0.1:0", name="gw", env=gateway_env)
    required = c.start(
        "gateway",
        "--listen",
        "127.0.0.1:0",
        "--http-verify-clients",
        "true",
        name="gw-verify",
        env=gateway_env,
    )
    cli = pki.issue("cli", "cli")
    foreign_ca = certs.make_ca(days=30)
    foreign = pki.issue("cli", "foreign", ca=foreign_ca)

    assert _https_status(optional.info["http_addr"], pki, None) == 200
    assert _https_status(required.info["http_addr"], pki, cli) == 200
    for caller in (None, foreign):
        # refused in the TLS handshake: the connection closes with no HTTP answer
        # (TLS 1.3 reports the alert to the client as a closed connection)
        with pytest.raises(OSError):
            _https_status(required.info["http_addr"], pki, caller)
