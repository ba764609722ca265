"""The client agent's task runner on the real agent and the real drivers
(issue 29, part B), one `corral dev -acl` cluster for the module (its
supervisor restarts a killed agent with the same data dir):

* `kill -9` of the agent with three running exec allocs: the restarted
  agent adopts the same processes (their executor and task identities),
  their logs go on, their usage is read again, and a stop stops them;
* a task that exits while the agent is down gets its exit recorded, with
  the time it happened, and is not started again;
* prestart / prestart sidecar / main / poststart / poststop in Nomad's
  order, from the files the tasks write and their task events' times;
* the leader task's death stops the others;
* shutdown_delay: the task gets its kill signal only after the delay;
* signal and restart through the CLI and through the HTTP API
  (python-nomad), and both refused to a token without alloc-lifecycle;
* log rotation by max_files and max_file_size, and `alloc logs -f` (and
  the HTTP log stream) following the log across the rotations.
"""

from __future__ import annotations

import base64
import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import nomad
import psutil
import pytest

from corral.security import transport
from corral.v1 import alloc_pb2, alloc_pb2_grpc, job_pb2, job_pb2_grpc, node_pb2, node_pb2_grpc
from corral.v1 import structs_pb2 as pb
from services.agent.executor.identity import ProcessIdentity
from services.agent.executor.spec import read_identity
from tests.cgroup_parent import new_parent, remove_parent, v1_available
from tests.devprocess import DevProcess, start_dev, stop_dev
from tests.wait import wait_for

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(os.geteuid() != 0, reason="the exec driver needs root"),
    pytest.mark.skipif(
        not v1_available(), reason="these tests read cgroup v1 hierarchies (as here and in CI)"
    ),
]

READERS = """
namespace "default" {
  capabilities = ["list-jobs", "read-job", "read-logs"]
}
node {
  policy = "read"
}
"""


class Dev:
    def __init__(self, dev: DevProcess, parent: str) -> None:
        self.dev = dev
        self.parent = parent
        self.address = str(dev.info["address"])
        self.token = dev.token
        self.agent_dir = dev.data_dir / "agent"

    def corral(
        self, *args: str, stdin: str | None = None, token: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, "CORRAL_TOKEN": self.token if token is None else token}
        return subprocess.run(
            [sys.executable, "-m", "cli", *args, "-address", self.address],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=180,
            input=stdin,
            env=env,
            check=False,
        )

    def ok(self, *args: str, stdin: str | None = None) -> str:
        done = self.corral(*args, stdin=stdin)
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stdout

    def run(self, hcl: str) -> None:
        self.ok("job", "run", "-detach", "-", stdin=hcl)

    def allocs(self, job_id: str) -> list[pb.Allocation]:
        with transport.dial_sync(self.address, token=self.token) as ch:
            resp = job_pb2_grpc.JobStub(ch).Allocations(
                job_pb2.JobGetRequest(job_id=job_id, all=True), timeout=30
            )
        return list(resp.allocs)

    def nomad(self, token: str | None = None) -> nomad.Nomad:
        url = urlparse(self.dev.http_addr)
        return nomad.Nomad(
            host=url.hostname,
            port=url.port,
            token=self.token if token is None else token,
            timeout=60,
        )

    def agent(self) -> psutil.Process:
        """The agent process corral dev runs now (its supervisor restarts it)."""
        for child in psutil.Process(self.dev.proc.pid).children():
            try:
                cmd = child.cmdline()
            except psutil.NoSuchProcess:
                continue
            if cmd[1:3] == ["-m", "services.agent"] and child.status() != psutil.STATUS_ZOMBIE:
                return child
        raise AssertionError("corral dev runs no agent")

    def agent_stub(self) -> alloc_pb2_grpc.ClientAllocStub:
        with transport.dial_sync(self.address, token=self.token) as ch:
            node = node_pb2_grpc.NodeStub(ch).List(node_pb2.NodeListRequest(), timeout=30).nodes[0]
            addr = (
                node_pb2_grpc.NodeStub(ch)
                .Get(node_pb2.NodeGetRequest(node_id=node.id), timeout=30)
                .node.http_addr
            )
        channel = transport.dial_sync(addr, peer="client", token=self.token)
        return alloc_pb2_grpc.ClientAllocStub(channel)

    def executor_dir(self, alloc: pb.Allocation, task: str) -> Path:
        return self.agent_dir / "executor" / f"{alloc.id}.{task}"

    def logs_dir(self, alloc: pb.Allocation) -> Path:
        return self.agent_dir / "allocs" / alloc.id / "alloc" / "logs"

    def data(self, alloc: pb.Allocation, name: str) -> str:
        path = self.agent_dir / "allocs" / alloc.id / "alloc" / "data" / name
        return path.read_text() if path.exists() else ""

    def log(self, alloc: pb.Allocation, task: str, index: int = 0) -> str:
        path = self.logs_dir(alloc) / f"{task}.stdout.{index}"
        return path.read_text() if path.exists() else ""

    def kill_agent(self, alloc_id: str) -> psutil.Process:
        """SIGKILL the agent; its successor, once it has restored `alloc_id`."""
        old = self.agent()
        old.kill()
        old.wait(30)

        def back() -> psutil.Process | None:
            try:
                new = self.agent()
            except AssertionError:
                return None
            if new.pid == old.pid:
                return None
            try:
                self.agent_stub().Stats(alloc_pb2.AllocStatsRequest(alloc_id=alloc_id), timeout=5)
            except Exception:
                return None  # not serving yet, or not restored yet
            return new

        found: psutil.Process = wait_for("the agent to be back", back, timeout=120, interval=0.2)
        return found


@pytest.fixture(scope="module")
def dev(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Dev]:
    parent = new_parent("e2e-tr")
    env = {**os.environ, "CORRAL_AGENT_CGROUP_PARENT": parent}
    started = start_dev(tmp_path_factory.mktemp("corral-taskrunner"), "-acl", env=env)
    try:
        d = Dev(started, parent)
        wait_for("the dev node to be ready", lambda: _node_ready(d), timeout=60)
        yield d
    finally:
        stop_dev(started)
        remove_parent(parent)


def _node_ready(d: Dev) -> bool:
    with transport.dial_sync(d.address, token=d.token) as ch:
        nodes = node_pb2_grpc.NodeStub(ch).List(node_pb2.NodeListRequest(), timeout=30).nodes
    return bool(nodes) and nodes[0].status == "ready"


def _running(d: Dev, job_id: str, n: int, *tasks: str) -> list[pb.Allocation] | None:
    """n allocs with every task named running."""
    allocs = [
        a
        for a in d.allocs(job_id)
        if a.desired_status == "run"
        and a.client_status == "running"
        and all(a.task_states[t].state == "running" for t in tasks if t in a.task_states)
        and all(t in a.task_states for t in tasks)
    ]
    return allocs if len(allocs) >= n else None


def _finished(d: Dev, job_id: str, n: int = 1) -> list[pb.Allocation] | None:
    allocs = [a for a in d.allocs(job_id) if a.client_status in ("complete", "failed")]
    return allocs if len(allocs) >= n else None


def _events(a: pb.Allocation, task: str) -> list[str]:
    return [e.type for e in a.task_states[task].events]


def _event(a: pb.Allocation, task: str, kind: str) -> pb.TaskEvent:
    return next(e for e in a.task_states[task].events if e.type == kind)


# ---------------------------------------------------------------- reattach

TICKER = """
job "ticker" {
  datacenters = ["dc1"]

  group "g" {
    count = 3

    task "tick" {
      driver = "exec"

      config {
        command = "/bin/sh"
        args    = ["-c", "i=0; while :; do i=$((i+1)); echo tick $i; sleep 0.2; done"]
      }

      resources {
        cpu    = 50
        memory = 32
      }
    }
  }
}
"""


def _ticks(text: str) -> int:
    lines = [line for line in text.splitlines() if line.startswith("tick ")]
    return int(lines[-1].split()[1]) if lines else 0


def test_a_killed_agent_adopts_its_running_tasks(dev: Dev) -> None:
    dev.run(TICKER)
    allocs = wait_for("three tickers", lambda: _running(dev, "ticker", 3, "tick"), timeout=90)
    before: dict[str, tuple[ProcessIdentity, ProcessIdentity]] = {}
    for a in allocs:
        executor = read_identity(dev.executor_dir(a, "tick") / "executor.json")
        task = read_identity(dev.executor_dir(a, "tick") / "task.json")
        assert executor is not None and task is not None and task.alive()
        before[a.id] = (executor, task)
    wait_for("ticks", lambda: all(_ticks(dev.log(a, "tick")) >= 3 for a in allocs))

    dev.kill_agent(allocs[0].id)
    counted = {a.id: _ticks(dev.log(a, "tick")) for a in allocs}
    for a in allocs:
        executor, task = before[a.id]
        # the same processes: never started again, still running
        assert executor.alive() and task.alive(), a.id
        assert read_identity(dev.executor_dir(a, "tick") / "task.json") == task
    # their logs go on, and the new agent serves them
    wait_for(
        "the logs to go on",
        lambda: all(_ticks(dev.log(a, "tick")) > counted[a.id] + 3 for a in allocs),
    )
    tail = dev.ok("alloc", "logs", "-tail", "-n", "2", allocs[0].id)
    assert _ticks(tail) > counted[allocs[0].id], tail
    # still tracked: running, started once, measured from their cgroups again
    stub = dev.agent_stub()
    for a in dev.allocs("ticker"):
        state = a.task_states["tick"]
        assert (a.client_status, state.state) == ("running", "running")
        assert _events(a, "tick").count("Started") == 1
        usage = stub.Stats(alloc_pb2.AllocStatsRequest(alloc_id=a.id), timeout=30).usage
        assert usage.tasks["tick"].resource_usage.memory_stats.rss > 0

    dev.ok("job", "stop", "-detach", "ticker")
    wait_for(
        "the adopted tasks to be stopped",
        lambda: not any(t.alive() for _, t in before.values()),
        timeout=60,
    )
    stopped = wait_for("the allocs to finish", lambda: _finished(dev, "ticker", 3), timeout=60)
    for a in stopped:
        assert _events(a, "tick")[-3:] == ["Killing", "Terminated", "Killed"]


RENDERED = """
job "rendered" {
  datacenters = ["dc1"]

  group "g" {
    task "t" {
      driver = "raw_exec"

      config {
        command = "/bin/sh"
        args    = ["-c", "while :; do sleep 1; done"]
      }

      template {
        destination = "local/out.txt"
        change_mode = "noop"
        data        = <<EOT
colour={{ with nomadVar "nomad/jobs/rendered" }}{{ .colour }}{{ end }}
EOT
      }

      resources {
        cpu    = 20
        memory = 16
      }
    }
  }
}
"""


def test_an_adopted_tasks_templates_and_task_api_go_on(dev: Dev) -> None:
    """After a kill -9 of the agent, the adopted task's templates are
    watched again (a changed variable re-renders its file) and its Task
    API socket is listened on again (the old agent's went with it)."""
    dev.ok("var", "put", "-force", "nomad/jobs/rendered", "colour=red")
    dev.run(RENDERED)
    (alloc,) = wait_for("the rendered task", lambda: _running(dev, "rendered", 1, "t"), timeout=90)
    task_dir = dev.agent_dir / "allocs" / alloc.id / "t"
    out = task_dir / "local" / "out.txt"
    wait_for("the first render", lambda: out.exists() and out.read_text() == "colour=red\n")
    pid = read_identity(dev.executor_dir(alloc, "t") / "task.json")
    assert pid is not None

    dev.kill_agent(alloc.id)

    def answers() -> bool:
        # through the directory's descriptor: the socket's path is longer
        # than an AF_UNIX address may be
        fd = os.open(task_dir / "secrets", os.O_RDONLY | os.O_DIRECTORY)
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
                try:
                    sock.connect(f"/proc/self/fd/{fd}/api.sock")
                except OSError:
                    return False
            return True
        finally:
            os.close(fd)

    wait_for("the Task API socket to be listened on again", answers, timeout=60)
    dev.ok("var", "put", "-force", "nomad/jobs/rendered", "colour=blue")
    wait_for("the re-render", lambda: out.read_text() == "colour=blue\n", timeout=60)
    # the same process all along (change_mode noop)
    assert read_identity(dev.executor_dir(alloc, "t") / "task.json") == pid
    dev.ok("job", "stop", "-purge", "-detach", "rendered")


WATCHER = """
job "watcher" {
  type        = "batch"
  datacenters = ["dc1"]

  group "g" {
    restart {
      attempts = 0
      mode     = "fail"
    }

    task "w" {
      driver = "raw_exec"

      config {
        command = "/bin/sh"
        args    = ["-c", "echo watching; while kill -0 %d 2>/dev/null; do sleep 0.05; done; exit 0"]
      }

      resources {
        cpu    = 20
        memory = 16
      }
    }
  }
}
"""


def test_a_task_that_exits_while_the_agent_is_down_gets_its_exit_recorded(dev: Dev) -> None:
    """The task ends the moment the agent dies (it watches the agent's pid),
    long before corral dev's supervisor has the next agent up."""
    dev.run(WATCHER % dev.agent().pid)
    (a,) = wait_for("the watcher", lambda: _running(dev, "watcher", 1, "w"), timeout=90)
    new = dev.kill_agent(a.id)
    (done,) = wait_for("its exit to be reported", lambda: _finished(dev, "watcher"), timeout=60)
    assert done.client_status == "complete"
    state = done.task_states["w"]
    terminated = _event(done, "w", "Terminated")
    assert terminated.exit_code == 0
    # the exit's own time, from the executor's record: before the new agent was
    assert terminated.time < new.create_time() * 1e9
    assert _events(done, "w").count("Started") == 1
    assert not state.failed


# ---------------------------------------------------------------- lifecycle

LIFECYCLE = """
job "lc" {
  type        = "batch"
  datacenters = ["dc1"]

  group "g" {
    restart {
      attempts = 0
      mode     = "fail"
    }

    task "init" {
      driver = "exec"
      lifecycle { hook = "prestart" }
      config {
        command = "/bin/sh"
        args    = ["-c", "echo init $(date +%s.%N) >> /alloc/data/order; sleep 0.5"]
      }
      resources {
        cpu    = 20
        memory = 16
      }
    }

    task "proxy" {
      driver = "exec"
      lifecycle {
        hook    = "prestart"
        sidecar = true
      }
      config {
        command = "/bin/sh"
        args    = ["-c", "echo proxy $(date +%s.%N) >> /alloc/data/order; exec sleep 600"]
      }
      resources {
        cpu    = 20
        memory = 16
      }
    }

    task "main" {
      driver = "exec"
      config {
        command = "/bin/sh"
        args    = ["-c", "echo main $(date +%s.%N) >> /alloc/data/order; sleep 1"]
      }
      resources {
        cpu    = 20
        memory = 16
      }
    }

    task "warm" {
      driver = "exec"
      lifecycle { hook = "poststart" }
      config {
        command = "/bin/sh"
        args    = ["-c", "echo warm $(date +%s.%N) >> /alloc/data/order"]
      }
      resources {
        cpu    = 20
        memory = 16
      }
    }

    task "cleanup" {
      driver = "exec"
      lifecycle { hook = "poststop" }
      config {
        command = "/bin/sh"
        args    = ["-c", "echo cleanup $(date +%s.%N) >> /alloc/data/order"]
      }
      resources {
        cpu    = 20
        memory = 16
      }
    }
  }
}
"""


def test_lifecycle_order(dev: Dev) -> None:
    dev.run(LIFECYCLE)
    (a,) = wait_for("the lifecycle alloc to finish", lambda: _finished(dev, "lc"), timeout=120)
    assert a.client_status == "complete", {t: _events(a, t) for t in a.task_states}
    written = {}
    for line in dev.data(a, "order").splitlines():
        name, at = line.split()
        written[name] = float(at)
    assert set(written) == {"init", "proxy", "main", "warm", "cleanup"}
    assert written["init"] < written["main"] and written["proxy"] < written["main"]
    assert written["main"] < written["warm"] < written["cleanup"]
    s = a.task_states
    # main started once init had succeeded; cleanup once all others were dead
    assert _event(a, "main", "Started").time >= s["init"].finished_at
    assert not s["init"].failed
    assert _event(a, "warm", "Started").time >= _event(a, "main", "Started").time
    others = ("init", "proxy", "main", "warm")
    assert _event(a, "cleanup", "Started").time >= max(s[t].finished_at for t in others)
    # the sidecar ran beside main and was stopped once main was done
    assert "Main Tasks Dead" in _events(a, "proxy")
    assert s["proxy"].finished_at >= s["main"].finished_at


LEADER = """
job "lead" {
  type        = "batch"
  datacenters = ["dc1"]

  group "g" {
    restart {
      attempts = 0
      mode     = "fail"
    }

    task "leader" {
      driver = "raw_exec"
      leader = true
      config {
        command = "/bin/sh"
        args    = ["-c", "sleep 1"]
      }
      resources {
        cpu    = 20
        memory = 16
      }
    }

    task "follower" {
      driver = "raw_exec"
      config {
        command = "/bin/sh"
        args    = ["-c", "exec sleep 600"]
      }
      resources {
        cpu    = 20
        memory = 16
      }
    }
  }
}
"""


def test_the_leader_dying_stops_the_others(dev: Dev) -> None:
    dev.run(LEADER)
    (a,) = wait_for("the leader's alloc to finish", lambda: _finished(dev, "lead"), timeout=90)
    assert a.client_status == "complete"
    events = _events(a, "follower")
    assert "Leader Task Dead" in events and events[-3:] == ["Killing", "Terminated", "Killed"]
    assert a.task_states["follower"].finished_at >= a.task_states["leader"].finished_at


DELAYED = """
job "delayed" {
  datacenters = ["dc1"]

  group "g" {
    shutdown_delay = "1s"

    task "web" {
      driver         = "raw_exec"
      shutdown_delay = "2s"
      config {
        command = "/bin/sh"
        args    = ["-c", "trap 'date +%%s.%%N > %s; exit 0' TERM; while :; do sleep 0.05; done"]
      }
      resources {
        cpu    = 20
        memory = 16
      }
    }
  }
}
"""


def test_shutdown_delay_comes_before_the_kill_signal(dev: Dev, tmp_path: Path) -> None:
    got_term = tmp_path / "term"
    dev.run(DELAYED % got_term)
    (a,) = wait_for("the delayed task", lambda: _running(dev, "delayed", 1, "web"), timeout=90)
    asked = time.time()
    dev.ok("job", "stop", "-detach", "delayed")
    wait_for("the kill signal", got_term.exists, timeout=60)
    assert float(got_term.read_text()) - asked >= 3.0  # the group's 1s, then the task's 2s
    (done,) = wait_for("the alloc to finish", lambda: _finished(dev, "delayed"), timeout=60)
    events = _events(done, "web")
    assert events.index("Killing") < events.index("Waiting for shutdown delay")
    assert events.index("Waiting for shutdown delay") < events.index("Terminated")
    waiting = _event(done, "web", "Waiting for shutdown delay")
    assert waiting.display_message == "Waiting for shutdown_delay of 2s before killing the task."


# ---------------------------------------------------------------- signal and restart

TRAPS = (
    "trap 'echo got USR1' USR1; trap 'echo got HUP' HUP; echo start; while :; do sleep 0.1; done"
)
SIGNALS = """
job "sig" {
  datacenters = ["dc1"]

  group "g" {
    restart {
      attempts = 0
      mode     = "fail"
    }

    task "web" {
      driver = "exec"
      config {
        command = "/bin/sh"
        args    = ["-c", "%s"]
      }
      resources {
        cpu    = 20
        memory = 16
      }
    }
  }
}
"""


def test_signal_and_restart_through_the_cli_and_the_http_api(dev: Dev) -> None:
    dev.run(SIGNALS % TRAPS)
    (a,) = wait_for("the task", lambda: _running(dev, "sig", 1, "web"), timeout=90)
    wait_for("it to start", lambda: "start" in dev.log(a, "web"))

    dev.ok("alloc", "signal", "-s", "SIGUSR1", a.id[:8], "web")
    wait_for("the CLI's signal", lambda: "got USR1" in dev.log(a, "web"))
    n = dev.nomad()
    n.client.allocation.signal_allocation(a.id, "SIGHUP", "web")
    wait_for("the HTTP API's signal", lambda: "got HUP" in dev.log(a, "web"))

    def signaled() -> list[str]:
        events = _get(dev, a.id).task_states["web"].events
        return [e.display_message for e in events if e.type == "Signaling"]

    wait_for(
        "both Signaling events reported",
        lambda: signaled() == ["Task being sent signal SIGUSR1", "Task being sent signal SIGHUP"],
    )

    # restarts asked for are not counted: the policy allows none
    dev.ok("alloc", "restart", a.id, "web")
    wait_for("the CLI's restart", lambda: dev.log(a, "web").count("start") == 2)
    n.client.allocation.restart_allocation(a.id)
    wait_for("the HTTP API's restart", lambda: dev.log(a, "web").count("start") == 3)
    now = wait_for(
        "the restarts reported, running again",
        lambda: (
            (x := _get(dev, a.id)).task_states["web"].restarts == 2
            and x.client_status == "running"
            and x
        ),
    )
    assert not now.task_states["web"].failed
    reasons = [
        e.display_message for e in now.task_states["web"].events if e.type == "Restart Signaled"
    ]
    assert reasons == ["User requested task to restart", "User requested running tasks to restart"]

    # without alloc-lifecycle: refused, and nothing happens
    policy = dev.agent_dir.parent / "readers.hcl"
    policy.write_text(READERS)
    dev.ok("acl", "policy", "apply", "readers", str(policy))
    token = json.loads(
        dev.ok("acl", "token", "create", "-name", "r", "-policy", "readers", "-json")
    )
    reader = str(token["secret_id"])
    refused = dev.corral("alloc", "signal", "-s", "SIGUSR1", a.id, "web", token=reader)
    assert refused.returncode != 0
    assert "Permission denied: alloc-lifecycle" in refused.stderr, refused.stderr
    refused = dev.corral("alloc", "restart", a.id, token=reader)
    assert refused.returncode != 0 and "Permission denied" in refused.stderr, refused.stderr
    status, body = _http(
        dev, "POST", f"/v1/client/allocation/{a.id}/signal", reader, {"Signal": "SIGUSR1"}
    )
    assert status == 403, body
    status, body = _http(dev, "POST", f"/v1/client/allocation/{a.id}/restart", reader, {})
    assert status == 403, body
    assert dev.log(a, "web").count("got USR1") == 1 and dev.log(a, "web").count("start") == 3
    # the same token may read the logs
    assert "start" in dev.corral("alloc", "logs", a.id, token=reader).stdout
    dev.ok("job", "stop", "-detach", "sig")


def _get(d: Dev, alloc_id: str) -> pb.Allocation:
    return next(a for a in d.allocs("sig") if a.id == alloc_id)


def _http(d: Dev, method: str, path: str, token: str, body: Any) -> tuple[int, str]:
    req = urllib.request.Request(
        d.dev.http_addr + path, data=json.dumps(body).encode(), method=method
    )
    req.add_header("X-Nomad-Token", token)
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


# ---------------------------------------------------------------- log rotation

CHATTY = (
    "echo ready; while [ ! -e /alloc/data/go ]; do sleep 0.05; done; "
    "for b in $(seq 0 39); do "
    "seq -f 'line %08g PAD' $((b * 1000 + 1)) $((b * 1000 + 1000)); sleep 0.1; "
    "done; echo done; exec sleep 600"
).replace("PAD", "x" * 80)
ROTATING = """
job "chatty" {
  datacenters = ["dc1"]

  group "g" {
    ephemeral_disk { size = 100 }

    task "talk" {
      driver = "exec"
      config {
        command = "/bin/sh"
        args    = ["-c", "%s"]
      }
      logs {
        max_files     = 2
        max_file_size = 1
      }
      resources {
        cpu    = 100
        memory = 32
      }
    }
  }
}
"""
LINES = 40_000


def test_logs_rotate_and_are_followed_across_rotations(dev: Dev) -> None:
    dev.run(ROTATING % CHATTY)  # 100-byte lines: 4 MB, four rotations
    (a,) = wait_for("the chatty task", lambda: _running(dev, "chatty", 1, "talk"), timeout=90)
    env = {**os.environ, "CORRAL_TOKEN": dev.token}
    follower = subprocess.Popen(
        [sys.executable, "-m", "cli", "alloc", "logs", "-f", a.id, "talk", "-address", dev.address],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
    )
    lines: list[bytes] = []
    reader = threading.Thread(target=lambda: lines.extend(iter(follower.stdout.readline, b"")))  # type: ignore[union-attr]
    reader.start()
    frames: list[dict[str, Any]] = []
    http_reader = threading.Thread(target=_http_follow, args=(dev, a.id, frames), daemon=True)
    http_reader.start()
    try:
        go = dev.agent_dir / "allocs" / a.id / "alloc" / "data" / "go"
        # both readers are there before the log starts to rotate
        wait_for("the CLI to be following", lambda: b"ready\n" in lines[:1])
        wait_for("the HTTP stream to be following", lambda: b"ready" in _joined(frames))
        go.touch()
        wait_for("the whole log through -f", lambda: b"done\n" in lines[-1:], timeout=120)
    finally:
        follower.terminate()
        follower.wait(10)
        reader.join(10)
    numbers = [int(line.split()[1]) for line in lines if line.startswith(b"line ")]
    assert numbers == list(range(1, LINES + 1))  # nothing lost, nothing twice, in order
    # on disk: at most two files per stream, none past 1 MB, rotated past .0
    kept = sorted(p.name for p in dev.logs_dir(a).glob("talk.stdout.*"))
    indexes = sorted(int(name.rsplit(".", 1)[1]) for name in kept)
    assert len(indexes) <= 2 and indexes[-1] >= 3, kept
    for name in kept:
        assert (dev.logs_dir(a) / name).stat().st_size <= 1024 * 1024
    # the HTTP stream followed the same way, each frame naming its file
    wait_for("the HTTP stream to reach the end", lambda: b"done\n" in _joined(frames)[-5:])
    streamed = [
        int(line.split()[1]) for line in _joined(frames).splitlines() if line.startswith(b"line ")
    ]
    assert streamed == list(range(1, LINES + 1))
    files = {f["File"] for f in frames}
    assert {"alloc/logs/talk.stdout.0", "alloc/logs/talk.stdout.3"} <= files, files
    dev.ok("job", "stop", "-detach", "chatty")


def _joined(frames: list[dict[str, Any]]) -> bytes:
    return b"".join(base64.b64decode(f["Data"]) for f in list(frames))


def _http_follow(d: Dev, alloc_id: str, frames: list[dict[str, Any]]) -> None:
    """Nomad's /v1/client/fs/logs frames, until the end of the log."""
    req = urllib.request.Request(
        f"{d.dev.http_addr}/v1/client/fs/logs/{alloc_id}?task=talk&type=stdout&follow=true"
    )
    req.add_header("X-Nomad-Token", d.token)
    decoder = json.JSONDecoder()
    buffer = ""
    with urllib.request.urlopen(req, timeout=120) as resp:
        while True:
            chunk = resp.read1(65536).decode()
            if not chunk:
                return
            buffer += chunk
            while buffer:
                try:
                    frame, end = decoder.raw_decode(buffer)
                except ValueError:
                    break
                frames.append(frame)
                buffer = buffer[end:].lstrip()
            if b"done\n" in _joined(frames)[-5:]:
                return
