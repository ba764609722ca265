"""Variables, the keyring and workload identities on a real `corral dev
-acl` (issue 28), through Nomad's HTTP API (python-nomad and plain HTTP),
the CLI and a real raw_exec task: put/get/check-and-set, a token without
variable rights refused, a task's own identity reading its job's
variables and not another job's, the identity verified with the published
JWKS and refused once its alloc is done, items as ciphertext in
PostgreSQL, a rotation keeping old variables readable."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import jwt
import nomad
import nomad.api.exceptions
import psycopg
import pytest

from tests.devprocess import DevProcess, start_dev, stop_dev
from tests.wait import wait_for

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.slow]

#: what the task runs: read its own job's variable and another job's
#: through the gateway with its NOMAD_TOKEN, and report what it got
TASK = r"""
import json, os, urllib.error, urllib.request
def get(path):
    req = urllib.request.Request(
        os.environ["GATEWAY"] + "/v1/var/" + path,
        headers={"X-Nomad-Token": os.environ["NOMAD_TOKEN"]},
    )
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return {"status": r.status, "items": json.loads(r.read()).get("Items")}
    except urllib.error.HTTPError as e:
        return {"status": e.code}
token_file = os.path.join(os.environ["NOMAD_SECRETS_DIR"], "nomad_token")
out = {
    "own": get("nomad/jobs/web"),
    "other": get("nomad/jobs/db"),
    "file_is_env": open(token_file).read() == os.environ["NOMAD_TOKEN"],
    "file_mode": oct(os.stat(token_file).st_mode & 0o777),
}
with open(os.path.join(os.environ["NOMAD_TASK_DIR"], "result.json"), "w") as f:
    json.dump(out, f)
"""

JOB = """
job "web" {
  type        = "batch"
  datacenters = ["dc1"]

  group "app" {
    restart {
      attempts = 0
      mode     = "fail"
    }

    task "reader" {
      driver = "raw_exec"

      config {
        command = "%(python)s"
        args    = ["%(script)s"]
      }

      env {
        GATEWAY = "%(gateway)s"
      }

      identity {
        env  = true
        file = true
      }

      resources {
        cpu    = 50
        memory = 64
      }
    }
  }
}
"""


@pytest.fixture(scope="module")
def dev() -> Iterator[DevProcess]:
    # not under pytest's own temp root: concurrent pytest runs on this machine
    # reset its mode to 0700, and the embedded PostgreSQL's user must pass
    data_dir = Path(tempfile.mkdtemp(prefix="corral-vars-"))
    started = start_dev(data_dir, "-acl")
    try:
        yield started
    finally:
        stop_dev(started)
        shutil.rmtree(data_dir, ignore_errors=True)


def client(dev: DevProcess, token: str | None = None) -> nomad.Nomad:
    url = urlparse(dev.http_addr)
    return nomad.Nomad(
        host=url.hostname, port=url.port, token=dev.token if token is None else token, timeout=15
    )


def http(
    dev: DevProcess, method: str, path: str, token: str = "", body: Any = None
) -> tuple[int, Any]:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(dev.http_addr + path, data=data, method=method)
    if token:
        req.add_header("X-Nomad-Token", token)
    try:
        with urllib.request.urlopen(req, timeout=15) as resp:
            raw, status = resp.read(), resp.status
    except urllib.error.HTTPError as exc:
        raw, status = exc.read(), exc.code
    try:
        return status, json.loads(raw) if raw else None
    except json.JSONDecodeError:
        return status, raw.decode()


def corral(
    dev: DevProcess, *args: str, token: str | None = None
) -> subprocess.CompletedProcess[str]:
    # a user: no server token (this test process holds the session's)
    env = {k: v for k, v in os.environ.items() if k != "CORRAL_SERVER_TOKEN"}
    env["CORRAL_TOKEN"] = dev.token if token is None else token
    return subprocess.run(
        [sys.executable, "-m", "cli", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={**env, "CORRAL_ADDR": dev.info["address"]},
        check=False,
    )


@pytest.fixture(scope="module")
def no_rights(dev: DevProcess) -> str:
    """A token that may read jobs but holds no variables rule."""
    n = client(dev)
    n.acl.create_policy(
        "jobs-reader",
        {"Name": "jobs-reader", "Rules": 'namespace "default" { policy = "read" }'},
    )
    return str(
        n.acl.create_token({"Name": "reader", "Type": "client", "Policies": ["jobs-reader"]})[
            "SecretID"
        ]
    )


def test_put_get_and_check_and_set_over_http(dev: DevProcess) -> None:
    n = client(dev)
    made = n.variable.create_variable("nomad/jobs/web", {"Items": {"password": "web-secret"}})
    assert made["Items"] == {"password": "web-secret"}
    n.variable.create_variable("nomad/jobs/db", {"Items": {"password": "db-secret"}})
    assert n.variable.get_variable("nomad/jobs/web")["Items"]["password"] == "web-secret"
    with pytest.raises(nomad.api.exceptions.VariableConflict):
        n.variable.create_variable(
            "nomad/jobs/web", {"Items": {"password": "x"}}, cas=made["ModifyIndex"] - 1
        )
    status, current = http(
        dev, "PUT", "/v1/var/nomad/jobs/web?cas=1", dev.token, {"Items": {"a": "b"}}
    )
    assert status == 409 and current["Items"] == {"password": "web-secret"}
    paths = [v["Path"] for v in n.variables.get_variables(prefix="nomad/jobs")]
    assert paths == ["nomad/jobs/db", "nomad/jobs/web"]


def test_a_token_without_variable_rights_is_refused(dev: DevProcess, no_rights: str) -> None:
    assert http(dev, "GET", "/v1/var/nomad/jobs/web", no_rights) == (403, "Permission denied")
    assert http(dev, "PUT", "/v1/var/x", no_rights, {"Items": {"a": "b"}})[0] == 403
    assert http(dev, "GET", "/v1/vars", no_rights) == (200, [])
    denied = corral(dev, "var", "get", "nomad/jobs/web", token=no_rights)
    assert denied.returncode == 1 and "Permission denied" in denied.stderr
    ok = corral(dev, "var", "get", "-item", "password", "nomad/jobs/web")
    assert (ok.returncode, ok.stdout) == (0, "web-secret"), ok.stderr


def test_a_task_reads_its_own_jobs_variables_only(dev: DevProcess, tmp_path: Path) -> None:
    script = tmp_path / "task.py"
    script.write_text(TASK)
    jobfile = tmp_path / "web.nomad.hcl"
    jobfile.write_text(JOB % {"python": sys.executable, "script": script, "gateway": dev.http_addr})
    run = corral(dev, "job", "run", "-detach", str(jobfile))
    assert run.returncode == 0, run.stderr
    n = client(dev)

    def finished() -> list[dict[str, Any]]:
        allocs = n.job.get_allocations("web")
        return [a for a in allocs if a["ClientStatus"] in ("complete", "failed")]

    done = wait_for("the web task finished", finished, timeout=180)
    alloc_id = done[0]["ID"]
    alloc_dir = Path(dev.info["data_dir"]) / "agent" / "allocs" / alloc_id
    stderr = alloc_dir / "alloc" / "logs" / "reader.stderr.0"
    assert done[0]["ClientStatus"] == "complete", (
        done[0]["TaskStates"],
        stderr.read_text() if stderr.exists() else "",
    )
    task_dir = alloc_dir / "reader"
    result = json.loads((task_dir / "local" / "result.json").read_text())
    assert result["own"] == {"status": 200, "items": {"password": "web-secret"}}
    assert result["other"] == {"status": 403}
    assert result["file_is_env"] and result["file_mode"] == "0o600"

    # the identity verifies with the keys the gateway publishes
    token = (task_dir / "secrets" / "nomad_token").read_text()
    status, jwks = http(dev, "GET", "/.well-known/jwks.json")
    assert status == 200
    key = jwt.PyJWKSet.from_dict(jwks)[jwt.get_unverified_header(token)["kid"]]
    claims = jwt.decode(token, key.key, algorithms=["RS256"], audience="nomadproject.io")
    assert claims["nomad_job_id"] == "web" and claims["nomad_allocation_id"] == alloc_id
    assert claims["nomad_task"] == "reader" and claims["nomad_namespace"] == "default"
    # its alloc is done: the identity no longer works
    assert http(dev, "GET", "/v1/var/nomad/jobs/web", token)[0] == 403
    # -port 0: no fixed gateway address, so no issuer and no discovery document
    assert http(dev, "GET", "/.well-known/openid-configuration") == (
        404,
        "OIDC Discovery endpoint disabled",
    )


def test_items_are_ciphertext_in_postgresql_and_survive_rotation(dev: DevProcess) -> None:
    with psycopg.connect(dev.info["dsn"], autocommit=True) as conn:
        rows = conn.execute("SELECT path, key_id, data FROM variables").fetchall()
        old_keys = {r[1] for r in rows}
        assert rows and not any(b"-secret" in bytes(r[2]) for r in rows)
        dump = b"".join(bytes(r[0]) for r in conn.execute("SELECT payload FROM change_log"))
        assert b"web-secret" not in dump and b"db-secret" not in dump
    rotated = corral(dev, "operator", "root", "keyring", "rotate", "-now", "-verbose")
    assert rotated.returncode == 0 and "active" in rotated.stdout, rotated.stderr
    listed = corral(dev, "operator", "root", "keyring", "list", "-verbose")
    states = dict(line.split()[:2] for line in listed.stdout.splitlines()[1:])
    assert {states[k] for k in old_keys} == {"inactive"}
    got = corral(dev, "var", "get", "-item", "password", "nomad/jobs/web")
    assert got.stdout == "web-secret", got.stderr
    put = corral(dev, "var", "put", "-out", "json", "app/after-rotation", "k=v")
    assert put.returncode == 0, put.stderr
    with psycopg.connect(dev.info["dsn"], autocommit=True) as conn:
        new_key = conn.execute(
            "SELECT key_id FROM variables WHERE path = 'app/after-rotation'"
        ).fetchone()
    assert new_key is not None and new_key[0] not in old_keys and states[new_key[0]] == "active"


#: a quick batch job for the restored cluster, on its own node
AFTER_RESTORE = """
job "after-restore" {
  type        = "batch"
  datacenters = ["dc1"]
  constraint {
    attribute = "${node.unique.id}"
    value     = "%(node)s"
  }
  group "g" {
    task "t" {
      driver = "raw_exec"
      config {
        command = "%(python)s"
        args    = ["-c", "print('restored')"]
      }
      resources {
        cpu    = 50
        memory = 64
      }
    }
  }
}
"""


def test_operator_snapshot_restores_into_a_fresh_cluster(
    dev: DevProcess, no_rights: str, tmp_path: Path
) -> None:
    """Issue 31: this cluster (jobs, variables, tokens) saved with the CLI,
    restored into a fresh `corral dev -acl`, which then holds them, honours
    this cluster's tokens and keeps scheduling."""
    # only a management token saves, over HTTP as through the CLI
    assert http(dev, "GET", "/v1/operator/snapshot", no_rights)[0] == 403
    denied = corral(dev, "operator", "snapshot", "save", str(tmp_path / "x.snap"), token=no_rights)
    assert denied.returncode == 1 and "management token" in denied.stderr
    req = urllib.request.Request(
        dev.http_addr + "/v1/operator/snapshot", headers={"X-Nomad-Token": dev.token}
    )
    with urllib.request.urlopen(req, timeout=60) as resp:
        body, digest, index = resp.read(), resp.headers["Digest"], resp.headers["X-Nomad-Index"]
    assert digest.startswith("sha-256=") and int(index) > 0 and body[:2] == b"\x1f\x8b"

    path = tmp_path / "a.snap"
    saved = corral(dev, "operator", "snapshot", "save", str(path))
    assert saved.returncode == 0 and "State file written" in saved.stdout, saved.stderr
    assert path.stat().st_mode & 0o777 == 0o600
    inspected = corral(dev, "operator", "snapshot", "inspect", "-json", str(path))
    assert inspected.returncode == 0, inspected.stderr
    summary = json.loads(inspected.stdout)
    rows = {t["Name"]: t["Count"] for t in summary["Tables"]}
    assert rows["jobs"] >= 1 and rows["variables"] >= 2 and rows["acl_tokens"] >= 2
    assert summary["Keyring"] is True

    data_dir = Path(tempfile.mkdtemp(prefix="corral-restored-"))
    fresh = start_dev(data_dir, "-acl")
    try:
        nodes = http(fresh, "GET", "/v1/nodes", fresh.token)[1]
        assert len(nodes) == 1
        node_id = nodes[0]["ID"]
        restored = corral(fresh, "operator", "snapshot", "restore", str(path), token=fresh.token)
        assert restored.returncode == 0 and "Snapshot Restored" in restored.stdout, restored.stderr
        # the fresh cluster's own token went with its state; this cluster's works
        assert http(fresh, "GET", "/v1/jobs", fresh.token)[0] == 403
        status, jobs = http(fresh, "GET", "/v1/jobs", dev.token)
        assert status == 200 and "web" in {j["ID"] for j in jobs}
        got = corral(fresh, "var", "get", "-item", "password", "nomad/jobs/web", token=dev.token)
        assert (got.returncode, got.stdout) == (0, "web-secret"), got.stderr
        assert http(fresh, "GET", "/v1/acl/token/self", no_rights)[0] == 200

        # again over HTTP, as Nomad's api client does: the index only goes up
        first = int(restored.stdout.rsplit("index ", 1)[1].rstrip(")\n"))
        put = urllib.request.Request(
            fresh.http_addr + "/v1/operator/snapshot",
            data=path.read_bytes(),
            method="PUT",
            headers={"X-Nomad-Token": dev.token},
        )
        with urllib.request.urlopen(put, timeout=120) as resp:
            assert resp.status == 200 and int(resp.headers["X-Nomad-Index"]) > first
        put.data = b"not a snapshot"
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(put, timeout=60)
        assert refused.value.code == 400 and b"not a readable snapshot" in refused.value.read()

        def node_ready() -> bool:
            status, node = http(fresh, "GET", f"/v1/node/{node_id}", dev.token)
            return status == 200 and node.get("Status") == "ready"

        # its agent, dropped with the old state, registers again and runs a new job
        wait_for("the fresh cluster's node registered again", node_ready, timeout=120)
        jobfile = tmp_path / "after.nomad.hcl"
        jobfile.write_text(AFTER_RESTORE % {"python": sys.executable, "node": node_id})
        run = corral(fresh, "job", "run", "-detach", str(jobfile), token=dev.token)
        assert run.returncode == 0, run.stderr
        wait_for(
            "the new job completed on the restored cluster",
            lambda: [
                a
                for a in http(fresh, "GET", "/v1/job/after-restore/allocations", dev.token)[1]
                if a["ClientStatus"] == "complete"
            ],
            timeout=180,
        )
    finally:
        stop_dev(fresh)
        shutil.rmtree(data_dir, ignore_errors=True)
