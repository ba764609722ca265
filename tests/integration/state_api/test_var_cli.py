"""`corral var ...` and `corral operator root keyring ...` against a real
state (issue 28): Nomad's arguments, check-and-set behaviour, output
formats and the lock command running a child while it holds the lock."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from cli.main import main
from corral.security import transport
from corral.v1 import query_pb2, variables_pb2, variables_pb2_grpc
from services.state.app import StateApp


class Cli:
    def __init__(self, address: str, capsys: pytest.CaptureFixture[str]) -> None:
        self.address = address
        self.capsys = capsys

    async def __call__(self, *argv: str) -> tuple[int, str, str]:
        self.capsys.readouterr()
        local = argv[:2] == ("var", "init")  # talks to no cluster
        address = [] if local else ["-address", self.address]
        words = 4 if argv[0] == "operator" else 2  # the (sub)command's words
        code = await asyncio.to_thread(main, [*argv[:words], *address, *argv[words:]])
        out, err = self.capsys.readouterr()
        return code, out, err


@pytest.fixture
def cli(state_app: StateApp, capsys: pytest.CaptureFixture[str]) -> Cli:
    return Cli(state_app.server.bound_address, capsys)


async def test_put_get_purge(cli: Cli) -> None:
    code, out, err = await cli("var", "put", "app/db", "user=admin", "password=s3cret")
    assert code == 0, err
    made = json.loads(out)  # redirected: JSON, as Nomad
    assert made["Path"] == "app/db" and made["Items"] == {"password": "s3cret", "user": "admin"}
    # again without -force: the variable exists, a check-and-set conflict
    code, out, err = await cli("var", "put", "app/db", "user=other")
    assert code == 1 and "Check-and-Set conflict" in err
    assert f"-check-index={made['ModifyIndex']}" in err
    code, out, _ = await cli(
        "var", "put", "-check-index", str(made["ModifyIndex"]), "-out", "none", "app/db", "user=b"
    )
    assert code == 0 and out.startswith('Created variable "app/db" with modify index ')
    assert int(out.split()[-1]) > made["ModifyIndex"]
    code, out, _ = await cli("var", "put", "-force", "-out", "json", "app/db", "user=c", "x=")
    assert code == 0 and json.loads(out)["Items"] == {"user": "c"}  # x= is not stored

    code, out, _ = await cli("var", "get", "-item", "user", "app/db")
    assert (code, out) == (0, "c")
    code, out, _ = await cli("var", "get", "-out", "table", "app/db")
    assert code == 0 and "Namespace   = default" in out and "Path        = app/db" in out
    assert "Items" in out and "user = c" in out
    code, out, _ = await cli("var", "get", "-out", "hcl", "app/db")
    assert code == 0 and 'path         = "app/db"' in out and 'user = "c"' in out
    code, out, _ = await cli(
        "var", "get", "-out", "go-template", "-template", "{{.Path}}={{.Items.user}}", "app/db"
    )
    assert (code, out) == (0, "app/db=c\n")
    code, _, err = await cli("var", "get", "-item", "nope", "app/db")
    assert code == 1 and 'does not contain "nope" item' in err
    code, _, err = await cli("var", "get", "-template", "x", "app/db")
    assert code == 1 and "only valid when using 'go-template'" in err
    code, _, err = await cli("var", "get", "-namespace", "*", "app/db")
    assert code == 1 and "wildcard namespace" in err

    code, out, err = await cli("var", "purge", "-check-index", "1", "app/db")
    assert code == 1 and "Check-and-Set conflict" in err
    code, out, _ = await cli("var", "purge", "app/db")
    assert (code, out) == (0, 'Successfully purged variable "app/db"!\n')
    code, _, err = await cli("var", "get", "app/db")
    assert code == 1 and "Variable not found" in err


async def test_specs_and_values_from_files(cli: Cli, tmp_path: Path) -> None:
    spec = tmp_path / "spec.nv.hcl"
    code, out, _ = await cli("var", "init", str(spec))
    assert code == 0 and "written to" in out and spec.exists()
    code, _, err = await cli("var", "init", str(spec))
    assert code == 1 and "already exists" in err
    code, out, err = await cli("var", "put", "-out", "json", "files/hcl", f"@{spec}")
    assert code == 0, err
    assert json.loads(out)["Items"] == {"key1": "value 1", "key2": "value 2"}
    as_json = tmp_path / "v.json"
    as_json.write_text(json.dumps({"Path": "files/json", "Items": {"a": "b"}}))
    code, out, err = await cli("var", "put", "-out", "json", f"@{as_json}")
    assert code == 0 and json.loads(out)["Path"] == "files/json", err
    secret = tmp_path / "cert.pem"
    secret.write_text("-----BEGIN-----\n")
    code, out, _ = await cli(
        "var", "put", "-out", "json", "files/kv", f"cert=@{secret}", "at=\\@literal", "dotted.key=v"
    )
    assert code == 0
    assert json.loads(out)["Items"] == {
        "at": "@literal",
        "cert": "-----BEGIN-----\n",
        "dotted.key": "v",
    }
    code, _, err = await cli("var", "put", "files/bad", "novalue")
    assert code == 1 and "format must be key=value" in err
    code, _, err = await cli("var", "put", "files/bad")
    assert code == 1 and "Must supply data" in err


async def test_list(cli: Cli) -> None:
    for path in ("list/a", "list/b", "list/c"):
        assert (await cli("var", "put", "-out", "none", path, "k=v"))[0] == 0
    code, out, _ = await cli("var", "list", "-out", "table", "list/")
    lines = out.splitlines()
    assert lines[0].split() == ["Namespace", "Path", "Last", "Updated"]
    assert [line.split()[1] for line in lines[1:]] == ["list/a", "list/b", "list/c"]
    code, out, _ = await cli("var", "list", "-out", "terse", "list/")
    assert out == "list/a\nlist/b\nlist/c\n"
    code, out, err = await cli("var", "list", "-per-page", "2", "list/")
    data = json.loads(out)
    assert [v["Path"] for v in data["Data"]] == ["list/a", "list/b"]
    assert data["QueryMeta"]["NextToken"] == "default.list/c"
    code, out, _ = await cli("var", "list", "-page-token", "default.list/c", "list/")
    assert [v["Path"] for v in json.loads(out)] == ["list/c"]
    code, out, _ = await cli(
        "var", "list", "-out", "go-template", "-template", "{{range .}}{{.Path}};{{end}}", "list/"
    )
    assert out == "list/a;list/b;list/c;\n"
    code, out, _ = await cli("var", "list", "-out", "table", "nothing/")
    assert out == "No matching variables found\n"


async def test_lock_runs_the_child_while_held(
    cli: Cli, state_app: StateApp, tmp_path: Path
) -> None:
    marker = tmp_path / "ran"
    code, _, err = await cli(
        "var",
        "lock",
        "-ttl",
        "10s",
        "-delay",
        "1s",
        "locks/job",
        f"echo held > {marker}",  # one line for $SHELL -c, as Nomad's
    )
    assert code == 0, err
    assert marker.read_text() == "held\n"
    async with transport.dial(state_app.server.bound_address) as ch:
        got = await variables_pb2_grpc.VariablesStub(ch).Read(
            variables_pb2.VariablesReadRequest(
                path="locks/job", query=query_pb2.QueryOptions(namespace="default")
            )
        )
    assert got.found and not got.variable.metadata.lock.id  # released afterwards
    code, _, err = await cli(
        "var", "lock", "-shell=false", "locks/job", "sh", "-c", f"echo again >> {marker}"
    )
    assert code == 0 and marker.read_text() == "held\nagain\n", err
    code, _, err = await cli("var", "lock", "-shell=false", "locks/job", "false")
    assert code == 1 and "exited with code 1" in err
    code, _, err = await cli("var", "lock", "locks/job")
    assert code == 1 and "Not enough arguments" in err


async def test_keyring_commands(cli: Cli) -> None:
    code, out, _ = await cli("operator", "root", "keyring", "list", "-verbose")
    assert code == 0 and out.splitlines()[0].split()[:2] == ["Key", "State"]
    assert "active" in out
    code, _, err = await cli("operator", "root", "keyring", "rotate")
    assert code == 1 and '"-now" or "-prepublish"' in err
    code, out, _ = await cli("operator", "root", "keyring", "rotate", "-now", "-verbose")
    assert code == 0 and "active" in out
    new_key = out.splitlines()[1].split()[0]
    code, out, _ = await cli("operator", "root", "keyring", "rotate", "-prepublish", "1h")
    assert code == 0 and "prepublished" in out
    code, out, _ = await cli("operator", "root", "keyring", "list", "-json")
    states = {k["key_id"]: k["state"] for k in json.loads(out)}
    assert states[new_key] == "active" and "prepublished" in states.values()
    inactive = next(k for k, s in states.items() if s == "inactive")
    code, out, err = await cli("operator", "root", "keyring", "remove", "-force", inactive)
    assert code == 0 and inactive in out, err
    code, _, err = await cli("operator", "root", "keyring", "remove", new_key)
    assert code == 1 and "cannot be deleted" in err
