"""`corral dev -tls -acl` as a user runs it (issue 15): the whole cluster,
agent and CLI included, over mutual TLS with ACLs on. With the exports it
prints, the operator runs a job and reads its logs; without the token, or
without the certificate, the CLI is refused; a read-only token reads but
cannot submit; no secret reaches a role's log."""

from __future__ import annotations

import json
import os
import pwd
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import pytest

from corral.devtools.pgserver import PGSERVER_USER
from tests.devprocess import start_dev, stop_dev
from tests.wait import wait_for

ROOT = Path(__file__).resolve().parents[2]
HELLO = ROOT / "examples" / "hello.nomad.hcl"
START_TIMEOUT = 180.0

pytestmark = [pytest.mark.slow]


@dataclass
class SecureDev:
    proc: subprocess.Popen[str]
    data_dir: Path
    info: dict[str, Any]
    output: list[str]

    @property
    def exports(self) -> dict[str, str]:
        lines = [line.removeprefix("export ") for line in self.info["exports"]]
        return dict(line.split("=", 1) for line in lines)

    def env(self, *, drop: tuple[str, ...] = (), **extra: str) -> dict[str, str]:
        e = {k: v for k, v in os.environ.items() if not k.startswith("CORRAL_")}
        e.update(self.exports)
        e["CORRAL_ADDR"] = self.info["address"]
        for key in drop:
            e.pop(key, None)
        e.update(extra)
        return e


def corral(
    dev: SecureDev, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "cli", *args],
        cwd=ROOT,
        env=env if env is not None else dev.env(),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.fixture(scope="module")
def dev(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecureDev]:
    # a directory `corral dev` makes itself (pytest's own are 0700 already)
    started = start_dev(
        tmp_path_factory.mktemp("corral-dev-secure") / "data",
        "-tls",
        "-acl",
        env={k: v for k, v in os.environ.items() if k != "CORRAL_SERVER_TOKEN"},
    )
    d = SecureDev(started.proc, started.data_dir, started.info, started.output)

    def node_ready() -> bool:
        out = corral(d, "node", "status", "-json")
        return out.returncode == 0 and any(n["status"] == "ready" for n in json.loads(out.stdout))

    wait_for("the dev client node", node_ready)
    yield d
    stop_dev(started)


def test_the_operator_runs_a_job_and_reads_its_logs(dev: SecureDev) -> None:
    assert dev.info["tls"] and dev.info["acl"]
    printed = "".join(dev.output)
    assert f"export CORRAL_TOKEN={dev.exports['CORRAL_TOKEN']}" in printed
    run = corral(dev, "job", "run", "-detach", str(HELLO))
    assert run.returncode == 0, run.stdout + run.stderr

    def running() -> list[dict[str, Any]]:
        out = corral(dev, "job", "status", "-json", "hello")
        allocs = json.loads(out.stdout)["allocations"] if out.returncode == 0 else []
        return [a for a in allocs if a["client_status"] == "running"]

    alloc = wait_for("a running hello alloc", running)[0]

    def logs() -> bool:
        out = corral(dev, "alloc", "logs", alloc["id"])
        return out.returncode == 0 and "hello from" in out.stdout

    wait_for("hello's output through the agent, over mutual TLS", logs)


def test_without_the_token_or_the_certificate_the_cli_is_refused(dev: SecureDev) -> None:
    anonymous = corral(
        dev, "job", "run", "-detach", str(HELLO), env=dev.env(drop=("CORRAL_TOKEN",))
    )
    assert anonymous.returncode == 1
    assert anonymous.stderr.startswith("Error: ") and "Permission denied" in anonymous.stderr
    plaintext = corral(
        dev,
        "job",
        "status",
        env=dev.env(drop=("CORRAL_CA_FILE", "CORRAL_CERT_FILE", "CORRAL_KEY_FILE")),
    )
    assert plaintext.returncode == 1 and plaintext.stderr.startswith("Error: ")
    assert "Traceback" not in anonymous.stderr + plaintext.stderr


def test_a_read_only_token_reads_but_cannot_submit(dev: SecureDev, tmp_path: Path) -> None:
    policy = tmp_path / "readonly.hcl"
    policy.write_text('namespace "default" { policy = "read" }\nnode { policy = "read" }\n')
    assert corral(dev, "acl", "policy", "apply", "readonly", str(policy)).returncode == 0
    made = corral(dev, "acl", "token", "create", "-name", "ro", "-policy", "readonly", "-json")
    assert made.returncode == 0, made.stderr
    reader = dev.env(CORRAL_TOKEN=json.loads(made.stdout)["secret_id"])
    assert corral(dev, "job", "status", env=reader).returncode == 0
    assert corral(dev, "node", "status", env=reader).returncode == 0
    refused = corral(dev, "job", "stop", "hello", env=reader)
    assert refused.returncode == 1 and "Permission denied" in refused.stderr
    drain = corral(dev, "operator", "scheduler", "get-config", env=reader)
    assert drain.returncode == 1 and "Permission denied" in drain.stderr


def test_the_gateway_serves_https_with_the_clusters_ca(dev: SecureDev) -> None:
    """Nomad's HTTP API over TLS with the same certificates: verified
    against the cluster's CA at 127.0.0.1, the token deciding; plaintext
    HTTP gets nothing."""
    import ssl
    import urllib.error
    import urllib.request

    base = dev.info["http_addr"]
    assert base.startswith("https://127.0.0.1:")
    context = ssl.create_default_context(cafile=dev.exports["CORRAL_CA_FILE"])

    def get(path: str, token: str) -> tuple[int, str]:
        req = urllib.request.Request(base + path, headers={"X-Nomad-Token": token})
        try:
            with urllib.request.urlopen(req, context=context, timeout=30) as resp:
                return resp.status, resp.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()

    status, body = get("/v1/jobs", dev.exports["CORRAL_TOKEN"])
    assert status == 200 and "hello" in [j["ID"] for j in json.loads(body)]
    assert get("/v1/jobs", "") == (403, "Permission denied")
    with pytest.raises(OSError):
        urllib.request.urlopen(base.replace("https://", "http://") + "/v1/jobs", timeout=30)


def test_no_secret_reaches_a_log(dev: SecureDev) -> None:
    secrets = [dev.exports["CORRAL_TOKEN"]]
    key = Path(dev.exports["CORRAL_KEY_FILE"]).read_text()
    for log in (dev.data_dir / "logs").glob("*.log"):
        text = log.read_text(errors="replace")
        for secret in secrets:
            assert secret not in text, log.name
        assert "PRIVATE KEY" not in text and key not in text, log.name


def test_files_holding_secrets_are_the_owners_alone(dev: SecureDev) -> None:
    """Issue 26, finding 5: dev.json (the management token) and the agent's
    client.json (node id and secret) were 0644 in 0755 directories. Every
    file of the data directory that holds the token, the node's secret or a
    private key is 0600 in a 0700 directory, the data directory included."""
    data = dev.data_dir

    def mode(path: Path) -> int:
        return path.stat().st_mode & 0o777

    postmaster = psutil.Process(int((data / "pg" / "postmaster.pid").read_text().split()[0]))

    def closed(directory: Path) -> bool:
        if mode(directory) == 0o700:
            return True
        # as root, the embedded PostgreSQL runs as the user `pgserver`, which
        # must pass through the data directory to reach pg/ (and nobody else)
        return (
            directory == data
            and os.geteuid() == 0
            and mode(directory) == 0o710
            and directory.stat().st_gid == postmaster.gids().real
        )

    node_secret = json.loads((data / "agent" / "client.json").read_text())["secret_id"]
    secrets = (dev.exports["CORRAL_TOKEN"], node_secret, "PRIVATE KEY")
    holding = []
    for path in data.rglob("*"):
        if "pg" in path.relative_to(data).parts[:1] or not path.is_file():
            continue  # PostgreSQL's own files: initdb makes them 0700/0600
        text = path.read_text(errors="replace")
        if any(secret in text for secret in secrets):
            holding.append(path.relative_to(data).as_posix())
            assert mode(path) == 0o600, path
            assert closed(path.parent), (path.parent, oct(mode(path.parent)))
    assert closed(data)
    if os.geteuid() == 0:
        # and the server still reaches its files, as its checkpoints must
        pg = pwd.getpwnam(PGSERVER_USER)
        assert postmaster.uids().real == pg.pw_uid
        reach = subprocess.run(
            ["stat", str(data / "pg" / "global" / "pg_control")],
            user=pg.pw_uid,
            group=postmaster.gids().real,
            extra_groups=[],
            capture_output=True,
            check=False,
        )
        assert reach.returncode == 0, reach.stderr
    assert {"dev.json", "acl-bootstrap-token", "agent/client.json"} <= set(holding)
    assert any(p.startswith("tls/") and p.endswith("-key.pem") for p in holding)
