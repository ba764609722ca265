"""Two federated regions on one machine (issue 32), as an operator runs
them: real processes (state, broker, planner, worker, agent and gateway in
each region), two databases, one CA, mutual TLS and ACLs on. `west` is the
authoritative region; `east` is configured with west's state address.

Through west's API (the CLI at west's state, west's HTTP gateway): a job
for east runs in east and is read back (its task's NOMAD_REGION and logs
included); a blocking query and the event stream of east; a global token
and policy made in west work in east within 10 s, a local token does not;
east's state killed makes west's requests for east fail naming it while
west schedules its own; east back, forwarding resumes. Also /v1/regions,
/v1/agent/members, a job routed by its HTTP `Region`, and bad regions.

One pair of regions for the whole module (12 processes): each test builds
on what the ones before left (the order is the file's)."""

from __future__ import annotations

import json
import os
import socket
import ssl
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from email.message import Message
from pathlib import Path
from typing import Any

import pytest

from corral.devtools.pgserver import with_database
from corral.security import certs
from tests.cluster import ROOT, Cluster
from tests.conftest import drop_database, new_database
from tests.wait import wait_for

WEST, EAST = "west", "east"
SERVER_ROLES = ("state", "broker", "planner", "worker")

JOB = """
job "%(id)s" {
  region      = "%(region)s"
  datacenters = ["dc1"]

  group "g" {
    task "main" {
      driver = "raw_exec"
      config {
        command = "/bin/sh"
        args    = ["-c", "echo region=$NOMAD_REGION; exec sleep 600"]
      }
      resources {
        cpu    = 50
        memory = 32
      }
    }
  }
}
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Region:
    name: str
    cluster: Cluster
    tls: dict[str, dict[str, str]]  # role -> CORRAL_* TLS variables
    dsn: str
    http: str = ""

    @property
    def state(self) -> str:
        return self.cluster.state_addr


@dataclass
class Federation:
    west: Region
    east: Region
    ca_file: str
    token: str = ""
    jobs: dict[str, str] = field(default_factory=dict)

    def cli(
        self, *args: str, token: str | None = None, at: Region | None = None
    ) -> subprocess.CompletedProcess[str]:
        """`corral ARGS` at west's state (or `at`'s) with that region's cli
        certificate, and the management token by default."""
        at = at or self.west
        env = {
            **os.environ,
            **at.tls["cli"],
            "CORRAL_ADDR": at.state,
            "CORRAL_TOKEN": self.token if token is None else token,
            "CORRAL_REGION": "",
        }
        return subprocess.run(
            [sys.executable, "-m", "cli", *args],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
            env=env,
            check=False,
        )

    def http(
        self, path: str, *, method: str = "GET", body: Any = None, token: str | None = None
    ) -> tuple[int, str, Message]:
        """An HTTPS request to west's gateway, verified with the CA."""
        context = ssl.create_default_context(cafile=self.ca_file)
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(
            self.west.http + path,
            data=data,
            method=method,
            headers={"X-Nomad-Token": self.token if token is None else token},
        )
        try:
            with urllib.request.urlopen(req, context=context, timeout=60) as resp:
                return resp.status, resp.read().decode(), resp.headers
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode(), exc.headers


def _tls_env(directory: Path, ca: tuple[bytes, bytes], region: str) -> dict[str, dict[str, str]]:
    (directory / "ca.pem").write_bytes(ca[0])
    out: dict[str, dict[str, str]] = {}
    for role in certs.ROLES:
        cert, key = certs.make_cert(ca[0], ca[1], role, region, days=1)
        (directory / f"{region}-{role}.pem").write_bytes(cert)
        (directory / f"{region}-{role}-key.pem").write_bytes(key)
        out[role] = {
            "CORRAL_CA_FILE": str(directory / "ca.pem"),
            "CORRAL_CERT_FILE": str(directory / f"{region}-{role}.pem"),
            "CORRAL_KEY_FILE": str(directory / f"{region}-{role}-key.pem"),
        }
    return out


def _start_region(
    name: str, dsn: str, workdir: Path, tls: dict[str, dict[str, str]], *state_flags: str
) -> Region:
    env = {
        **tls["server"],
        "CORRAL_SERVER_TOKEN": "",  # with TLS the certificate proves a server
        "CORRAL_REGION": name,
        "CORRAL_ACL_ENABLED": "true",
    }
    c = Cluster(dsn, workdir, env=env)
    region = Region(name, c, tls, dsn)
    c.start(
        "state",
        "--listen",
        f"127.0.0.1:{free_port()}",
        "--federation-probe-interval",
        "0.5",
        "--acl-replication-backoff",
        "0.5",
        *state_flags,
    )
    c.start("broker")
    c.start("planner")
    c.start("worker", "--num-schedulers", "1")
    user = {**tls["client"], "CORRAL_SERVER_TOKEN": ""}
    c.start(
        "agent",
        "--data-dir",
        str(workdir / "agent"),
        "--name",
        f"{name}-node",
        "--drivers",
        "raw_exec,mock",  # raw_exec is off unless named
        env=user,
    )
    gateway = c.start("gateway", "--listen", "127.0.0.1:0", env=user)
    region.http = str(gateway.info["http_addr"])
    return region


@pytest.fixture(scope="module")
def fed(
    tmp_path_factory: pytest.TempPathFactory, pg_admin_dsn: str, pg_template: str
) -> Iterator[Federation]:
    tmp = tmp_path_factory.mktemp("federation")
    pki = tmp / "tls"
    pki.mkdir()
    ca = certs.make_ca(days=1)
    names = {r: new_database(pg_admin_dsn, pg_template, f"fed_{r}") for r in (WEST, EAST)}
    regions: list[Region] = []
    try:
        west = _start_region(
            WEST, with_database(pg_admin_dsn, names[WEST]), tmp / WEST, _tls_env(pki, ca, WEST)
        )
        regions.append(west)
        east = _start_region(
            EAST,
            with_database(pg_admin_dsn, names[EAST]),
            tmp / EAST,
            _tls_env(pki, ca, EAST),
            "--federation-peer",
            f"{WEST}={west.state}",
            "--authoritative-region",
            WEST,
        )
        regions.append(east)
        fed = Federation(west, east, str(pki / "ca.pem"))
        made = fed.cli("acl", "bootstrap", "-json", token="")
        assert made.returncode == 0, made.stderr
        fed.token = json.loads(made.stdout)["secret_id"]
        yield fed
    finally:
        for r in reversed(regions):
            r.cluster.stop_all()
        for name in names.values():
            drop_database(pg_admin_dsn, name)


def test_each_region_knows_the_other_and_the_management_token_reaches_east(
    fed: Federation,
) -> None:
    def known() -> bool:
        out = fed.cli("server", "members", "-json")
        if out.returncode:
            return False
        status = json.loads(out.stdout)
        return {(s["region"], s["status"]) for s in status["servers"]} == {
            (WEST, "alive"),
            (EAST, "alive"),
        }

    wait_for("west listing east's state server alive", known, timeout=30)
    # the bootstrap token (global) works in east once replicated
    wait_for(
        "the bootstrap token working in east",
        lambda: fed.cli("job", "status", at=fed.east).returncode == 0,
        timeout=10,
    )
    status, body, _ = fed.http("/v1/regions")
    assert (status, json.loads(body)) == (200, [EAST, WEST])
    members = fed.cli("server", "members")
    assert members.returncode == 0, members.stderr
    assert "Links from region west" in members.stdout and "alive" in members.stdout
    # joining a region already known is a join all the same (Nomad's too)
    joined = fed.cli("server", "join", fed.east.state)
    assert joined.returncode == 0, joined.stderr
    assert joined.stdout.strip() == "Joined 1 servers successfully (region east)"
    # every process of both regions, east's asked through west
    everyone = fed.cli("operator", "members", "-all-regions", "-json")
    assert everyone.returncode == 0, everyone.stderr
    roles = {(m["region"], m["role"]) for m in json.loads(everyone.stdout)}
    assert {(r, role) for r in (WEST, EAST) for role in SERVER_ROLES} <= roles
    # Nomad's /v1/agent/members: the state servers of both regions
    status, body, _ = fed.http("/v1/agent/members")
    assert status == 200, body
    members_json = json.loads(body)
    assert members_json["ServerRegion"] == WEST
    assert {(m["Tags"]["region"], m["Status"]) for m in members_json["Members"]} == {
        (WEST, "alive"),
        (EAST, "alive"),
    }
    # a region nobody knows, a name that is none
    status, body, _ = fed.http("/v1/jobs?region=mars")
    assert status == 400 and body.startswith("No path to region 'mars'"), body
    assert fed.http("/v1/jobs?region=no%20such")[0] == 400


def test_a_job_for_east_run_through_west_runs_in_east_and_reads_back(fed: Federation) -> None:
    # the documented example (docs/operations.md, Federation)
    run = fed.cli("job", "run", "-detach", str(ROOT / "examples" / "hello-east.nomad.hcl"))
    assert run.returncode == 0, run.stderr

    def running() -> str:
        code, body, _ = fed.http("/v1/job/hello-east/allocations?region=east")
        allocs = json.loads(body) if code == 200 else []
        return next((a["ID"] for a in allocs if a["ClientStatus"] == "running"), "")

    alloc_id = wait_for("the job running in east", running, timeout=60)
    code, body, _ = fed.http("/v1/job/hello-east?region=east")
    assert code == 200 and json.loads(body)["Region"] == EAST
    # it is east's, not west's
    assert fed.http("/v1/job/hello-east")[0] == 404
    assert fed.cli("job", "status", "hello-east", at=fed.east).returncode == 0
    # its node is east's agent, and its task saw the real region
    code, body, _ = fed.http(f"/v1/allocation/{alloc_id}?region=east")
    assert code == 200
    node = fed.cli("node", "status", "-region", EAST, "-json")
    assert node.returncode == 0, node.stderr
    assert [n["name"] for n in json.loads(node.stdout)] == ["east-node"]

    def logged() -> bool:
        out = fed.cli("alloc", "logs", "-region", EAST, alloc_id, "hello")
        return out.returncode == 0 and f"{alloc_id} in east" in out.stdout

    wait_for("the task's log read through west", logged, timeout=30)
    fed.jobs["east"] = alloc_id


def test_a_blocking_query_of_east_through_west(fed: Federation) -> None:
    """On a variable of east that nothing else touches, so that only the
    write below can end the wait."""
    path = "/v1/var/fed/blocking?region=east"
    status, body, _ = fed.http(path, method="PUT", body={"Items": {"n": "1"}})
    assert status == 200, body
    code, _, headers = fed.http(path)
    assert code == 200
    index = int(headers.get("X-Nomad-Index", "0"))
    answer: dict[str, Any] = {}

    def block() -> None:
        answer["reply"] = fed.http(f"{path}&index={index}&wait=30s")

    waiter = threading.Thread(target=block)
    started = time.monotonic()
    waiter.start()
    # not a settling wait: the proof that the query is parked on east's index
    time.sleep(1)
    assert waiter.is_alive()
    status, body, _ = fed.http(path, method="PUT", body={"Items": {"n": "2"}})
    assert status == 200, body
    waiter.join(30)
    code, body, headers = answer["reply"]
    assert code == 200 and time.monotonic() - started < 30
    assert int(headers.get("X-Nomad-Index", "0")) > index
    assert json.loads(body)["Items"] == {"n": "2"}
    # it is east's variable, not west's
    assert fed.http("/v1/var/fed/blocking")[0] == 404


def _mock_job(job_id: str) -> dict[str, Any]:
    return {
        "ID": job_id,
        "Datacenters": ["dc1"],
        "TaskGroups": [
            {
                "Name": "g",
                "Count": 1,
                "Tasks": [
                    {
                        "Name": "t",
                        "Driver": "mock",
                        "Config": {"run_for": "10m"},
                        "Resources": {"CPU": 20, "MemoryMB": 16},
                    }
                ],
            }
        ],
    }


def test_the_event_stream_of_east_through_west(fed: Federation) -> None:
    _, _, headers = fed.http("/v1/jobs?region=east")
    index = int(headers.get("X-Nomad-Index", "0"))
    context = ssl.create_default_context(cafile=fed.ca_file)
    req = urllib.request.Request(
        f"{fed.west.http}/v1/event/stream?region=east&topic=Job:streamed&index={index + 1}",
        headers={"X-Nomad-Token": fed.token},
    )
    with urllib.request.urlopen(req, context=context, timeout=60) as stream:
        status, _, _ = fed.http(
            "/v1/jobs?region=east", method="PUT", body={"Job": _mock_job("streamed")}
        )
        assert status == 200
        deadline = time.monotonic() + 30
        seen = []
        while time.monotonic() < deadline:
            line = stream.readline().decode().strip()
            if not line or line == "{}":
                continue
            seen += [e for e in json.loads(line).get("Events", []) if e["Key"] == "streamed"]
            if seen:
                break
    assert seen and seen[0]["Topic"] == "Job"


def test_a_job_put_to_west_with_region_east_goes_to_east(fed: Federation) -> None:
    """Through west's HTTP API, the job's own `Region` routes it (Nomad's
    regionForJob), with no ?region=."""
    body = {"Job": {**_mock_job("by-region-field"), "Region": EAST}}
    status, answer, _ = fed.http("/v1/jobs", method="PUT", body=body)
    assert status == 200, answer
    code, answer, _ = fed.http("/v1/job/by-region-field?region=east")
    assert code == 200 and json.loads(answer)["Region"] == EAST
    assert fed.http("/v1/job/by-region-field")[0] == 404


def test_a_global_token_works_in_east_within_10s_a_local_one_does_not(
    fed: Federation, tmp_path: Path
) -> None:
    policy = tmp_path / "readers.hcl"
    policy.write_text('namespace "default" { policy = "read" }\nnode { policy = "read" }\n')
    assert fed.cli("acl", "policy", "apply", "readers", str(policy)).returncode == 0
    made = fed.cli("acl", "token", "create", "-name", "g", "-policy", "readers", "-global", "-json")
    assert made.returncode == 0, made.stderr
    global_token = json.loads(made.stdout)["secret_id"]
    # within 10 s of its creation (each check is a CLI process of its own)
    wait_for(
        "the global token working in east",
        lambda: fed.cli("job", "status", token=global_token, at=fed.east).returncode == 0,
        timeout=10,
        interval=0.2,
    )
    made = fed.cli("acl", "token", "create", "-name", "l", "-policy", "readers", "-json")
    assert made.returncode == 0, made.stderr
    local_token = json.loads(made.stdout)["secret_id"]
    assert fed.cli("job", "status", token=local_token).returncode == 0
    refused = fed.cli("job", "status", token=local_token, at=fed.east)
    assert refused.returncode == 1 and "ACL token not found" in refused.stderr
    # forwarded from west, the local token is judged by east: unknown there
    refused = fed.cli("job", "status", "-region", EAST, token=local_token)
    assert refused.returncode == 1 and "ACL token not found" in refused.stderr
    # what the readers policy does not grant, east refuses too
    refused = fed.cli("job", "stop", "-region", EAST, "hello-east", token=global_token)
    assert refused.returncode == 1 and "Permission denied" in refused.stderr
    members = fed.cli("operator", "members", at=fed.east)
    assert members.returncode == 0, members.stderr
    assert "ACL replication from region west: replicating" in members.stdout


def test_east_gone_fails_west_requests_for_it_west_schedules_its_own_then_resumes(
    fed: Federation, tmp_path: Path
) -> None:
    fed.east.cluster.kill("state")
    status, body, _ = fed.http("/v1/jobs?region=east")
    assert status == 503 and body.startswith("No path to region 'east'"), body
    out = fed.cli("job", "status", "-region", EAST)
    assert out.returncode == 1 and "No path to region 'east'" in out.stderr, out.stderr

    # west schedules its own all the while
    jobfile = tmp_path / "west.nomad.hcl"
    jobfile.write_text(JOB % {"id": "stays-west", "region": WEST})
    run = fed.cli("job", "run", "-detach", str(jobfile))
    assert run.returncode == 0, run.stderr

    def west_running() -> bool:
        code, body, _ = fed.http("/v1/job/stays-west/allocations")
        return code == 200 and any(a["ClientStatus"] == "running" for a in json.loads(body))

    wait_for("west's job running", west_running, timeout=60)

    def east_failed() -> bool:
        out = fed.cli("server", "members", "-json")
        servers = json.loads(out.stdout)["servers"] if out.returncode == 0 else []
        return any(s["region"] == EAST and s["status"] == "failed" for s in servers)

    wait_for("west seeing east's link failed", east_failed, timeout=30)

    fed.east.cluster.restart("state")
    wait_for(
        "forwarding to east again",
        lambda: fed.http("/v1/job/hello-east?region=east")[0] == 200,
        timeout=30,
    )
    out = fed.cli("job", "status", "-region", EAST, "hello-east")
    assert out.returncode == 0, out.stderr
