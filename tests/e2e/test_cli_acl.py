"""`corral acl ...` against a real state service process: bootstrap once,
policy apply/list/info/delete, role create/list/info/update/delete, token
create/list/info/self/delete with `-token` and CORRAL_TOKEN (and roles),
clean errors, and no secret in the state's log."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.cluster import Cluster

ROOT = Path(__file__).resolve().parents[2]
POLICY = 'namespace "default" {\n  policy = "read"\n}\nnode {\n  policy = "read"\n}\n'


def corral(
    addr: str, *args: str, token: str = "", stdin: str = ""
) -> subprocess.CompletedProcess[str]:
    # a user: its ACL token only, never the servers' token the suite exports
    env = {k: v for k, v in os.environ.items() if k not in ("CORRAL_TOKEN", "CORRAL_SERVER_TOKEN")}
    env["CORRAL_ADDR"] = addr
    if token:
        env["CORRAL_TOKEN"] = token
    return subprocess.run(
        [sys.executable, "-m", "cli", *args], cwd=ROOT, env=env, input=stdin,
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def ok(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def as_json(proc: subprocess.CompletedProcess[str]) -> Any:
    return json.loads(ok(proc))


def refused(proc: subprocess.CompletedProcess[str], message: str) -> None:
    assert proc.returncode == 1, proc.stdout
    assert proc.stderr.startswith("Error: ") and message in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr


def test_acl_commands(make_cluster: Callable[..., Cluster], tmp_path: Path) -> None:
    c = make_cluster(CORRAL_ACL_ENABLED="true")
    c.start("state")
    addr = c.state_addr

    boot = as_json(corral(addr, "acl", "bootstrap", "-json"))
    mgmt = boot["secret_id"]
    assert boot["type"] == "management" and boot["name"] == "Bootstrap Token" and mgmt
    refused(corral(addr, "acl", "bootstrap"), "ACL bootstrap already done")

    policy_file = tmp_path / "readers.hcl"
    policy_file.write_text(POLICY)
    out = ok(
        corral(addr, "acl", "policy", "apply", "-description", "read only", "readers",
               str(policy_file), token=mgmt)
    )  # fmt: skip
    assert out == 'Successfully wrote "readers" ACL policy!\n'
    ok(
        corral(
            addr,
            "acl",
            "policy",
            "apply",
            "ops",
            "-",
            token=mgmt,
            stdin='operator { policy = "write" }',
        )
    )
    listed = as_json(corral(addr, "acl", "policy", "list", "-json", token=mgmt))
    assert [(p["name"], p["description"]) for p in listed] == [
        ("ops", ""),
        ("readers", "read only"),
    ]
    assert "readers  read only" in ok(corral(addr, "acl", "policy", "list", token=mgmt))
    info = ok(corral(addr, "acl", "policy", "info", "readers", token=mgmt))
    assert "Description  = read only" in info and POLICY in info

    bad = tmp_path / "bad.hcl"
    bad.write_text('namespace "default" { capabilities = ["root"] }\n')
    refused(
        corral(addr, "acl", "policy", "apply", "bad", str(bad), token=mgmt),
        "policies[0].rules: namespace \"default\".capabilities[0]: unknown capability 'root'",
    )
    refused(corral(addr, "acl", "policy", "apply", "x", str(tmp_path / "nope.hcl")), "cannot read")

    created = as_json(
        corral(addr, "acl", "token", "create", "-name", "ci", "-policy", "readers", "-ttl", "1h",
               "-json", token=mgmt)
    )  # fmt: skip
    secret, accessor = created["secret_id"], created["accessor_id"]
    assert created["type"] == "client" and created["policies"] == ["readers"]
    hour_ns = 3600 * 10**9
    assert abs(int(created["expiration_time"]) - int(created["create_time"]) - hour_ns) < 10**6
    refused(
        corral(addr, "acl", "token", "create", "-policy", "ghost", token=mgmt),
        "no such ACL policy: ghost",
    )
    refused(corral(addr, "acl", "token", "create", "-policy", "readers", "-ttl", "soon"), "-ttl")

    text = ok(
        corral(addr, "acl", "token", "create", "-type", "management", "-name", "ops", token=mgmt)
    )
    assert "Type         = management" in text and "Policies     = n/a" in text

    me = as_json(corral(addr, "acl", "token", "self", "-json", token=secret))
    assert me["accessor_id"] == accessor and me["name"] == "ci" and not me["secret_id"]
    flagged = ok(corral(addr, "acl", "token", "self", "-token", secret))
    assert f"Accessor ID  = {accessor}" in flagged and "Secret ID    = <hidden>" in flagged
    assert "Policies     = [readers]" in flagged
    refused(corral(addr, "acl", "token", "self", token="not-a-token"), "ACL token not found")

    tokens = as_json(corral(addr, "acl", "token", "list", "-json", token=mgmt))
    assert {t["accessor_id"] for t in tokens} >= {accessor, boot["accessor_id"]}
    assert all(not t["secret_id"] for t in tokens)
    table = ok(corral(addr, "acl", "token", "list", token=mgmt))
    assert table.splitlines()[0].split() == ["Name", "Type", "Global", "Accessor", "ID", "Expired"]
    info = as_json(corral(addr, "acl", "token", "info", accessor, "-json", token=mgmt))
    assert info["name"] == "ci" and not info["secret_id"]

    assert ok(corral(addr, "acl", "token", "delete", accessor, token=mgmt)) == (
        f"Token {accessor} successfully deleted\n"
    )
    refused(corral(addr, "acl", "token", "info", accessor, token=mgmt), "not found")

    _roles(addr, mgmt)

    assert ok(corral(addr, "acl", "policy", "delete", "ops", token=mgmt)) == (
        'Successfully deleted "ops" ACL policy!\n'
    )

    log = c.log("state")
    for s in (mgmt, secret):
        assert s not in log


def _roles(addr: str, mgmt: str) -> None:
    """`acl role ...` and tokens linking roles (policies `ops` and
    `readers` exist; `readers` grants node:read). Each CLI call costs a
    process start: the refusals and the rights a role gives are the
    integration and HTTP tests' (tests/integration/state_api/test_acl_roles.py)."""
    role = ("acl", "role")
    ops = as_json(
        corral(addr, *role, "create", "-name", "ops-role", "-description", "ops people",
               "-policy", "ops", "-json", token=mgmt)
    )  # fmt: skip
    assert ops["name"] == "ops-role" and ops["policies"] == ["ops"] and ops["id"]
    text = ok(corral(addr, *role, "create", "-name", "read-role", "-policy", "readers", token=mgmt))
    assert "= read-role" in text and "Policies     = readers" in text
    read_id = next(line.split("= ")[1] for line in text.splitlines() if line.startswith("ID "))
    listed = ok(corral(addr, *role, "list", token=mgmt))
    assert listed.splitlines()[0].split() == ["ID", "Name", "Description", "Policies"]
    assert ops["id"] in listed and read_id in listed
    by_name = ok(corral(addr, *role, "info", "-by-name", "read-role", token=mgmt))
    assert f"ID           = {read_id}" in by_name

    merged = as_json(
        corral(addr, *role, "update", ops["id"], "-policy", "readers", "-json", token=mgmt)
    )
    assert merged["policies"] == ["ops", "readers"] and merged["description"] == "ops people"
    replaced = as_json(
        corral(addr, *role, "update", ops["id"], "-no-merge", "-name", "ops2", "-policy", "ops",
               "-json", token=mgmt)
    )  # fmt: skip
    assert (replaced["name"], replaced["policies"]) == ("ops2", ["ops"])
    assert not replaced.get("description")

    text = ok(
        corral(addr, "acl", "token", "create", "-name", "by-role", "-role-name", "ops2",
               "-role-id", read_id, token=mgmt)
    )  # fmt: skip
    assert "Policies     = []" in text and "\nRoles\n" in text
    assert f"{read_id}  read-role" in text and f"{ops['id']}  ops2" in text
    secret = next(line.split("= ")[1] for line in text.splitlines() if line.startswith("Secret"))
    assert ok(corral(addr, *role, "delete", read_id, token=mgmt)) == (
        f"ACL role {read_id} successfully deleted\n"
    )
    # read-role gave the token node:read; deleted, it no longer does
    refused(corral(addr, "node", "status", token=secret), "Permission denied")
    me = as_json(corral(addr, "acl", "token", "self", "-json", token=secret))
    assert [r["name"] for r in me["roles"]] == ["ops2"]
    ok(corral(addr, *role, "delete", ops["id"], token=mgmt))
    assert ok(corral(addr, *role, "list", token=mgmt)) == "No ACL roles found\n"
