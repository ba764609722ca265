"""Operator access to allocations on the real agent and drivers (issue 29,
part C), in one `corral dev -acl` cluster whose node offers two host volumes
and whose artifacts come from an HTTP server in the test:

* `alloc exec` runs a command in an exec task's namespaces, root and user
  and returns its output and exit code — through the CLI (on a pipe, and
  with -t on a real pseudo-terminal whose size reaches the command) and
  through the HTTP API's WebSocket with the `websockets` client; raw_exec
  runs it on the host; mock refuses it;
* `alloc fs` lists, stats, reads and follows files, through the CLI, the
  HTTP API (python-nomad for ls/stat/cat/readat) and the stream's frames;
  paths out of the alloc and secrets are refused;
* a host volume is mounted read-only (a write fails); a job asking for a
  volume no node has is not placed, with Nomad's reason;
* an artifact is fetched with its checksum before the task starts; a bad
  checksum fails the task with "Failed Artifact Download";
* a job's `action` runs in the task through `corral action` and the HTTP
  API's /v1/job/:id/action WebSocket, and is listed by /v1/job/:id/actions;
* without alloc-exec, alloc-node-exec (raw_exec) or read-fs the calls are
  refused.
"""

from __future__ import annotations

import asyncio
import base64
import fcntl
import hashlib
import http.client
import json
import os
import pty
import select
import struct
import subprocess
import sys
import termios
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import nomad
import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from corral.security import transport
from corral.v1 import job_pb2, job_pb2_grpc
from corral.v1 import structs_pb2 as pb
from tests.cgroup_parent import new_parent, remove_parent, v1_available
from tests.devprocess import DevProcess, start_dev, stop_dev
from tests.wait import wait_for

ROOT = Path(__file__).resolve().parents[2]
TOOL = b"#!/bin/sh\necho tool says hi\n"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(os.geteuid() != 0, reason="the exec driver needs root"),
    pytest.mark.skipif(not v1_available(), reason="cgroup v1 hierarchies (as here and in CI)"),
]


class Dev:
    def __init__(self, dev: DevProcess, artifacts: str, shared: Path, scratch: Path) -> None:
        self.dev = dev
        self.address = str(dev.info["address"])
        self.token = dev.token
        self.artifacts = artifacts
        self.shared = shared
        self.scratch = scratch

    def corral(
        self, *args: str, token: str | None = None, stdin: str = "", timeout: float = 120
    ) -> subprocess.CompletedProcess[str]:
        env = {k: v for k, v in os.environ.items() if k not in ("CORRAL_TOKEN", "CORRAL_ADDR")}
        env["CORRAL_ADDR"] = self.address
        env["CORRAL_TOKEN"] = self.token if token is None else token
        return subprocess.run(
            [sys.executable, "-m", "cli", *args],
            cwd=ROOT,
            env=env,
            input=stdin,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def ok(self, *args: str, **kw: Any) -> str:
        done = self.corral(*args, **kw)
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stdout

    def allocs(self, job_id: str) -> list[pb.Allocation]:
        with transport.dial_sync(self.address, token=self.token) as ch:
            resp = job_pb2_grpc.JobStub(ch).Allocations(
                job_pb2.JobGetRequest(job_id=job_id, all=True), timeout=30
            )
        return list(resp.allocs)

    def running(self, job_id: str) -> pb.Allocation:
        def one() -> pb.Allocation | None:
            for a in self.allocs(job_id):
                if a.client_status == "running" and all(
                    t.state == "running" for t in a.task_states.values()
                ):
                    return a
            return None

        found: pb.Allocation = wait_for(f"a running alloc of {job_id}", one, timeout=90)
        return found

    def http(self, path: str, token: str | None = None) -> tuple[int, bytes]:
        req = urllib.request.Request(self.dev.http_addr + path)
        req.add_header("X-Nomad-Token", self.token if token is None else token)
        try:
            with urllib.request.urlopen(req, timeout=30) as resp:
                return resp.status, resp.read()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read()

    def nomad(self, token: str | None = None) -> nomad.Nomad:
        url = urllib.parse.urlparse(self.dev.http_addr)
        return nomad.Nomad(host=url.hostname, port=url.port, token=token or self.token, timeout=30)

    def token_with(self, name: str, capabilities: list[str]) -> str:
        policy = 'namespace "default" {\n  capabilities = %s\n}\nnode {\n  policy = "read"\n}\n'
        self.ok("acl", "policy", "apply", name, "-", stdin=policy % json.dumps(capabilities))
        made = json.loads(
            self.ok("acl", "token", "create", "-name", name, "-policy", name, "-json")
        )
        return str(made["secret_id"])


@pytest.fixture(scope="module")
def artifacts() -> Iterator[tuple[str, dict[str, bytes]]]:
    files: dict[str, bytes] = {"/tool.sh": TOOL}

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = files.get(self.path.split("?")[0])
            self.send_response(200 if body is not None else 404)
            self.send_header("Content-Length", str(len(body or b"")))
            self.end_headers()
            self.wfile.write(body or b"")

        def log_message(self, *args: object) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}", files
    finally:
        httpd.shutdown()
        httpd.server_close()


@pytest.fixture(scope="module")
def dev(
    tmp_path_factory: pytest.TempPathFactory, artifacts: tuple[str, dict[str, bytes]]
) -> Iterator[Dev]:
    parent = new_parent("access")
    volumes = tmp_path_factory.mktemp("host-volumes")
    shared, scratch = volumes / "shared", volumes / "scratch"
    shared.mkdir()
    scratch.mkdir()
    (shared / "motd").write_text("welcome from the host\n")
    env = {
        **os.environ,
        "CORRAL_AGENT_CGROUP_PARENT": parent,
        "CORRAL_AGENT_HOST_VOLUME": f"shared={shared}:ro,scratch={scratch}",
    }
    env.pop("CORRAL_SERVER_TOKEN", None)
    started = start_dev(tmp_path_factory.mktemp("corral-access"), "-acl", env=env)
    try:
        d = Dev(started, artifacts[0], shared, scratch)

        def ready() -> bool:
            out = d.corral("node", "status", "-json")
            return out.returncode == 0 and any(
                n["status"] == "ready" for n in json.loads(out.stdout)
            )

        wait_for("the dev node to be ready", ready, timeout=90)
        yield d
    finally:
        stop_dev(started)
        remove_parent(parent)


def exec_job(d: Dev) -> str:
    checksum = "sha256:" + hashlib.sha256(TOOL).hexdigest()
    return f"""
job "access" {{
  group "g" {{
    volume "shared" {{
      type      = "host"
      source    = "shared"
      read_only = true
    }}
    task "web" {{
      driver = "exec"
      config {{
        command = "/bin/sh"
        args    = ["-c", "echo started; cat /srv/shared/motd; exec sleep 100000"]
      }}
      env {{
        GREETING = "hello from ${{NOMAD_TASK_NAME}}"
      }}
      volume_mount {{
        volume      = "shared"
        destination = "/srv/shared"
      }}
      action "greet" {{
        command = "/bin/sh"
        args    = ["-c", "echo $GREETING; cat /srv/shared/motd; cat; exit 3"]
      }}
      artifact {{
        source  = "{d.artifacts}/tool.sh"
        options {{
          checksum = "{checksum}"
        }}
      }}
      resources {{
        cpu    = 100
        memory = 64
      }}
    }}
  }}
}}
"""


@pytest.fixture(scope="module")
def web(dev: Dev) -> pb.Allocation:
    dev.ok("job", "run", "-detach", "-", stdin=exec_job(dev))
    return dev.running("access")


@pytest.fixture(scope="module")
def raw(dev: Dev) -> pb.Allocation:
    job = """
job "raw" {
  group "g" {
    task "host" {
      driver = "raw_exec"
      config {
        command = "/bin/sh"
        args    = ["-c", "exec sleep 100000"]
      }
      resources {
        memory = 32
      }
    }
  }
}
"""
    dev.ok("job", "run", "-detach", "-", stdin=job)
    return dev.running("raw")


# ------------------------------------------------------------ artifacts and volumes


def test_the_artifact_was_fetched_and_the_volume_mounted(dev: Dev, web: pb.Allocation) -> None:
    events = [e.type for e in web.task_states["web"].events]
    assert "Downloading Artifacts" in events and events.index(
        "Downloading Artifacts"
    ) < events.index("Started")
    out = dev.ok(
        "alloc", "exec", web.id, "/bin/sh", "-c", "cat /local/tool.sh; cat /srv/shared/motd"
    )
    assert out == TOOL.decode() + "welcome from the host\n"
    # the node offers its volumes: in its status, and in the HTTP API as Nomad's HostVolumes
    status = dev.ok("node", "status", "-verbose", web.node_id)
    rows = [line.split() for line in status.splitlines()]
    assert ["shared", "true", str(dev.shared)] in rows
    assert ["scratch", "false", str(dev.scratch)] in rows
    code, body = dev.http(f"/v1/node/{web.node_id}")
    volumes = json.loads(body)["HostVolumes"]
    assert volumes["shared"] == {"Name": "shared", "Path": str(dev.shared), "ReadOnly": True}


def test_the_read_only_volume_refuses_writes(dev: Dev, web: pb.Allocation) -> None:
    done = dev.corral("alloc", "exec", web.id, "/bin/sh", "-c", "echo x > /srv/shared/new")
    assert done.returncode != 0
    assert "Read-only file system" in done.stderr
    assert not (dev.shared / "new").exists()


def test_a_job_needing_a_missing_volume_is_not_placed(dev: Dev) -> None:
    job = """
job "novolume" {
  group "g" {
    volume "data" {
      type   = "host"
      source = "nope"
    }
    task "t" {
      driver = "mock"
      config {
        run_for = "1h"
      }
    }
  }
}
"""
    done = dev.corral("job", "run", "-", stdin=job)
    out = done.stdout + done.stderr
    assert 'Constraint "missing compatible host volumes": 1 nodes excluded by filter' in out, out
    assert not dev.allocs("novolume")
    # a writable request of a read-only volume is no better
    done = dev.corral(
        "job",
        "run",
        "-",
        stdin=job.replace('"novolume"', '"writable"').replace('"nope"', '"shared"'),
    )
    assert "missing compatible host volumes" in done.stdout + done.stderr


def test_a_bad_checksum_fails_the_task(dev: Dev) -> None:
    job = f"""
job "badsum" {{
  type = "batch"
  group "g" {{
    restart {{
      attempts = 0
      mode     = "fail"
    }}
    reschedule {{
      attempts  = 0
      unlimited = false
    }}
    task "t" {{
      driver = "exec"
      config {{
        command = "/bin/true"
      }}
      artifact {{
        source = "{dev.artifacts}/tool.sh"
        options {{
          checksum = "sha256:{"0" * 64}"
        }}
      }}
    }}
  }}
}}
"""
    dev.ok("job", "run", "-detach", "-", stdin=job)

    def failed() -> pb.Allocation | None:
        allocs = [a for a in dev.allocs("badsum") if a.client_status == "failed"]
        return allocs[0] if allocs else None

    alloc = wait_for("the alloc to fail", failed, timeout=90)
    events = alloc.task_states["t"].events
    failure = next(e for e in events if e.type == "Failed Artifact Download")
    assert "checksums did not match" in failure.display_message
    assert "Started" not in [e.type for e in events]
    status = dev.ok("alloc", "status", alloc.id)
    assert "Failed Artifact Download" in status


# ------------------------------------------------------------ exec


def test_exec_runs_in_the_tasks_namespaces_and_returns_its_exit_code(
    dev: Dev, web: pb.Allocation
) -> None:
    script = 'id -un; hostname; echo "$GREETING"; ls /; echo to-stderr >&2; exit 4'
    done = dev.corral("alloc", "exec", "-task", "web", web.id[:8], "/bin/sh", "-c", script)
    assert done.returncode == 4, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "nobody"
    assert lines[1] == f"web-{web.id[:8]}"
    assert lines[2] == "hello from web"
    assert {"local", "secrets", "alloc", "srv"} <= set(lines[3:])
    assert "to-stderr" in done.stderr
    # stdin reaches the command
    assert dev.ok("alloc", "exec", web.id, "/bin/cat", stdin="piped in\n") == "piped in\n"
    # -job picks a running alloc of the job
    assert dev.ok("alloc", "exec", "-job", "access", "/bin/hostname").strip() == (
        f"web-{web.id[:8]}"
    )


def test_exec_with_a_terminal(dev: Dev, web: pb.Allocation) -> None:
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 123, 0, 0))
    env = {k: v for k, v in os.environ.items() if k != "CORRAL_ADDR"}
    env.update(CORRAL_ADDR=dev.address, CORRAL_TOKEN=dev.token)
    script = "tty; stty size; read answer; echo got-$answer; exit 3"
    proc = subprocess.Popen(
        [sys.executable, "-m", "cli", "alloc", "exec", "-t", web.id, "/bin/sh", "-c", script],
        cwd=ROOT,
        env=env,
        stdin=slave,
        stdout=slave,
        stderr=slave,
        start_new_session=True,
    )
    os.close(slave)
    seen = b""
    deadline = time.monotonic() + 60
    answered = False
    try:
        while time.monotonic() < deadline:
            if not answered and b"40 123" in seen:
                os.write(master, b"yes\r")
                answered = True
            ready, _, _ = select.select([master], [], [], 1)
            if ready:
                try:
                    chunk = os.read(master, 4096)
                except OSError:
                    break  # the CLI exited: the terminal closed
                if not chunk:
                    break
                seen += chunk
            elif proc.poll() is not None:
                break
        assert proc.wait(30) == 3, seen
    finally:
        os.close(master)
        if proc.poll() is None:
            proc.kill()
    text = seen.decode(errors="replace")
    assert "/dev/pts/" in text and "40 123" in text and "got-yes" in text, text


async def ws_session(
    dev: Dev, path: str, query: dict[str, str], token: str, stdin: bytes = b""
) -> tuple[int, str, Any]:
    """One exec-style WebSocket session (Nomad's framing, the token in the
    handshake): the exit code (-1: none), stdout, and how the socket closed."""
    url = dev.dev.http_addr.replace("http", "ws", 1)
    url += f"{path}?{urllib.parse.urlencode({**query, 'ws_handshake': 'true'})}"
    out, code, closed = "", -1, None
    async with connect(url) as ws:
        await ws.send(json.dumps({"version": 1, "auth_token": token}))
        if stdin:
            data = base64.b64encode(stdin).decode()
            await ws.send(json.dumps({"stdin": {"data": data}}))
        await ws.send(json.dumps({"stdin": {"close": True}}))
        await ws.send(json.dumps({"tty_size": {"height": 10, "width": 20}}))
        await ws.send("{}")  # a heartbeat
        try:
            async for message in ws:
                frame = json.loads(message)
                if "stdout" in frame:
                    out += base64.b64decode(frame["stdout"].get("data", "")).decode()
                if frame.get("exited"):
                    code = frame["result"]["exit_code"]
        except ConnectionClosed:
            pass
        closed = (ws.close_code, ws.close_reason)
    return code, out, closed


def test_exec_over_the_http_websocket(dev: Dev, web: pb.Allocation) -> None:
    def session(token: str, command: list[str], stdin: bytes = b"") -> Any:
        path = f"/v1/client/allocation/{web.id}/exec"
        query = {"task": "web", "command": json.dumps(command)}
        return ws_session(dev, path, query, token, stdin)

    code, out, closed = asyncio.run(
        session(dev.token, ["/bin/sh", "-c", "echo $NOMAD_ALLOC_ID; cat; exit 5"], b"typed\n")
    )
    assert (code, out, closed[0]) == (5, f"{web.id}\ntyped\n", 1000), closed
    code, _, closed = asyncio.run(session("not-a-token", ["/bin/true"]))
    assert code == -1 and closed[0] == 1008 and "Permission denied" in closed[1], closed


def test_exec_in_raw_exec_runs_on_the_host_and_mock_refuses(dev: Dev, raw: pb.Allocation) -> None:
    out = dev.ok("alloc", "exec", raw.id, "/bin/sh", "-c", "pwd; hostname")
    cwd, host = out.splitlines()
    assert cwd.endswith(f"/allocs/{raw.id}/host/local")
    assert host == os.uname().nodename
    job = """
job "pretend" {
  group "g" {
    task "m" {
      driver = "mock"
      config {
        run_for = "1h"
      }
    }
  }
}
"""
    dev.ok("job", "run", "-detach", "-", stdin=job)
    alloc = dev.running("pretend")
    done = dev.corral("alloc", "exec", alloc.id, "/bin/true")
    assert done.returncode == 1 and "not supported" in done.stderr, done.stderr


# ------------------------------------------------------------ job actions

GREETED = "hello from web\nwelcome from the host\n"


def test_a_jobs_actions_are_listed_and_shown(dev: Dev, web: pb.Allocation) -> None:
    status, body = dev.http("/v1/job/access/actions")
    assert status == 200, body
    (action,) = json.loads(body)
    assert action == {
        "Name": "greet",
        "Command": "/bin/sh",
        "Args": ["-c", "echo $GREETING; cat /srv/shared/motd; cat; exit 3"],
        "TaskName": "web",
        "TaskGroupName": "g",
    }
    job = dev.nomad().job.get_job("access")
    assert job["TaskGroups"][0]["Tasks"][0]["Actions"][0]["Name"] == "greet"
    inspected = json.loads(dev.ok("job", "inspect", "access"))
    assert inspected["job"]["task_groups"][0]["tasks"][0]["actions"][0]["name"] == "greet"
    assert dev.http("/v1/job/nope/actions")[0] == 404


def test_an_action_runs_in_the_task_through_the_cli(dev: Dev, web: pb.Allocation) -> None:
    # no alloc named: a running alloc of the group is picked, as Nomad does
    done = dev.corral("action", "-job", "access", "-group", "g", "-task", "web", "greet")
    assert (done.returncode, done.stdout) == (3, GREETED), done.stderr
    done = dev.corral(
        "job", "action", "-job", "access", "-alloc", web.id[:8], "greet", stdin="typed\n"
    )
    assert (done.returncode, done.stdout) == (3, GREETED + "typed\n"), done.stderr
    done = dev.corral("action", "-job", "access", "-alloc", web.id, "-task", "web", "nope")
    assert done.returncode == 1 and "action nope not found in task web" in done.stderr
    done = dev.corral("action", "-job", "access", "greet")
    assert done.returncode == 1 and "a group name is required" in done.stderr


def test_an_action_runs_over_the_http_websocket(dev: Dev, web: pb.Allocation) -> None:
    def session(query: dict[str, str], token: str | None = None) -> Any:
        return asyncio.run(
            ws_session(dev, "/v1/job/access/action", query, token or dev.token, b"typed\n")
        )

    query = {"action": "greet", "allocID": web.id, "task": "web", "group": "g"}
    code, out, closed = session(query)
    assert (code, out, closed[0]) == (3, GREETED + "typed\n", 1000), closed
    code, _, closed = session({**query, "action": "nope"})
    assert code == -1 and closed == (1008, "action nope not found in task web"), closed
    code, _, closed = session({**query, "allocID": ""})
    assert code == -1 and closed == (1008, "missing AllocID"), closed
    # the path's job must be the alloc's
    code, _, closed = asyncio.run(ws_session(dev, "/v1/job/raw/action", query, dev.token))
    assert code == -1 and closed[0] == 1008 and "does not have allocation" in closed[1], closed
    # a plain request is told to upgrade, not served as something else
    status, body = dev.http("/v1/job/access/action")
    assert status == 400 and b"WebSocket" in body


# ------------------------------------------------------------ fs


def test_fs_lists_stats_reads_and_follows(dev: Dev, web: pb.Allocation) -> None:
    listing = dev.ok("alloc", "fs", web.id, "web/local")
    assert "tool.sh" in listing and "Mode" in listing.splitlines()[0]
    assert dev.ok("alloc", "fs", web.id, "web/local/tool.sh") == TOOL.decode()
    stat = dev.ok("alloc", "fs", "-stat", "-H", web.id, "web/local/tool.sh")
    assert f"{len(TOOL)}" in stat and "tool.sh" in stat
    assert dev.ok("alloc", "fs", "-tail", "-c", "8", web.id, "web/local/tool.sh") == "says hi\n"
    refused = dev.corral("alloc", "fs", web.id, "../../client.json")
    assert refused.returncode == 1 and "escapes the alloc directory" in refused.stderr
    # python-nomad on the HTTP API
    n = dev.nomad()
    names = {f["Name"] for f in n.client.ls.list_files(web.id, "web/local")}
    assert "tool.sh" in names
    assert n.client.cat.read_file(web.id, "web/local/tool.sh") == TOOL.decode()
    assert n.client.read_at.read_file_offset(web.id, 15, 4, "web/local/tool.sh") == "tool"
    info = n.client.stat.stat_file(web.id, "web/local/tool.sh")
    assert info["Size"] == len(TOOL) and info["FileMode"] == "-rw-r--r--"
    status, body = dev.http(f"/v1/client/fs/cat/{web.id}?path=web/secrets/token")
    assert status == 403, body
    status, body = dev.http(f"/v1/client/fs/ls/{web.id}?path=../..")
    assert status == 400 and b"escapes" in body
    # a stream that follows the task's own output
    dev.ok("alloc", "exec", web.id, "/bin/sh", "-c", "echo first > /alloc/data/journal")
    frames: list[dict[str, Any]] = []
    url = f"{dev.dev.http_addr}/v1/client/fs/stream/{web.id}?path=alloc/data/journal"
    req = urllib.request.Request(url, headers={"X-Nomad-Token": dev.token})
    resp = urllib.request.urlopen(req, timeout=60)

    def read() -> None:
        decoder = json.JSONDecoder()
        buf = ""
        try:
            while chunk := resp.read1(65536).decode():
                buf += chunk
                while buf:
                    try:
                        frame, end = decoder.raw_decode(buf)
                    except ValueError:
                        break
                    frames.append(frame)
                    buf = buf[end:]
        except (OSError, ValueError, AttributeError, http.client.HTTPException):
            return  # closed by the test

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    data = lambda: "".join(  # noqa: E731
        base64.b64decode(f.get("Data", "")).decode() for f in frames
    )
    try:
        wait_for("the first line", lambda: data() == "first\n", timeout=30)
        dev.ok("alloc", "exec", web.id, "/bin/sh", "-c", "echo second >> /alloc/data/journal")
        wait_for("the appended line", lambda: data() == "first\nsecond\n", timeout=30)
    finally:
        resp.close()
        reader.join(30)
    # frames with data name the file and the offset after them; `{}` is a
    # heartbeat (one a second while nothing comes), which may come last
    with_data = [f for f in frames if f.get("Data")]
    assert with_data[0]["File"] == "alloc/data/journal"
    assert with_data[-1]["Offset"] == len("first\nsecond\n")


# ------------------------------------------------------------ ACLs


def test_without_the_capabilities_exec_and_fs_are_refused(
    dev: Dev, web: pb.Allocation, raw: pb.Allocation
) -> None:
    reader = dev.token_with("reader", ["read-job", "list-jobs", "read-logs"])
    done = dev.corral("alloc", "exec", web.id, "/bin/true", token=reader)
    assert done.returncode == 1 and "Permission denied" in done.stderr, done.stderr
    done = dev.corral("alloc", "fs", web.id, "web/local", token=reader)
    assert done.returncode == 1 and "Permission denied" in done.stderr, done.stderr
    status, _ = dev.http(f"/v1/client/fs/ls/{web.id}?path=/", token=reader)
    assert status == 403
    # a job's actions: listed with read-job, run only with alloc-exec (as alloc exec)
    assert dev.http("/v1/job/access/actions", token=reader)[0] == 200
    done = dev.corral("action", "-job", "access", "-alloc", web.id, "greet", token=reader)
    assert done.returncode == 1 and "Permission denied" in done.stderr, done.stderr
    query = {"action": "greet", "allocID": web.id, "task": "web"}
    code, _, closed = asyncio.run(ws_session(dev, "/v1/job/access/action", query, reader))
    assert code == -1 and closed[0] == 1008 and "Permission denied" in closed[1], closed
    no_read = dev.token_with("fs-only", ["read-fs"])
    assert dev.http("/v1/job/access/actions", token=no_read)[0] == 403

    execer = dev.token_with("execer", ["read-job", "list-jobs", "alloc-exec", "read-fs"])
    assert dev.ok("alloc", "exec", web.id, "/bin/echo", "ok", token=execer) == "ok\n"
    done = dev.corral("action", "-job", "access", "-alloc", web.id, "greet", token=execer)
    assert (done.returncode, done.stdout) == (3, GREETED), done.stderr
    assert "tool.sh" in dev.ok("alloc", "fs", web.id, "web/local", token=execer)
    # raw_exec runs on the node itself: Nomad asks for alloc-node-exec too
    done = dev.corral("alloc", "exec", raw.id, "/bin/true", token=execer)
    assert done.returncode == 1 and "Permission denied" in done.stderr, done.stderr
    node_exec = dev.token_with(
        "node-execer", ["read-job", "list-jobs", "alloc-exec", "alloc-node-exec"]
    )
    assert dev.ok("alloc", "exec", raw.id, "/bin/echo", "ok", token=node_exec) == "ok\n"


def test_an_action_changed_in_place_runs_its_new_command(dev: Dev, web: pb.Allocation) -> None:
    """Nomad updates allocs in place when only actions change; the agent
    then runs the action of the version the alloc runs now. Last in the
    module: it changes the job the tests above run actions of."""
    dev.ok("job", "run", "-detach", "-", stdin=exec_job(dev).replace("exit 3", "exit 6"))

    def updated() -> pb.Allocation | None:
        now = next(a for a in dev.allocs("access") if a.id == web.id)
        return now if now.job_version > web.job_version else None

    now = wait_for("the alloc updated in place", updated, timeout=60)
    assert now.client_status == "running"
    done = dev.corral("action", "-job", "access", "-alloc", web.id, "greet")
    assert (done.returncode, done.stdout) == (6, GREETED), done.stderr
