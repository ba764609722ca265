"""The exec driver on the real agent and the real kernel (issue 29, part A):
a `corral dev` cluster whose agent runs as root with cgroup v1.

* two exec tasks each see themselves as PID 1's child in a PID namespace of
  their own, their own host name, their own root (the task directory with
  the host's system directories read-only), as `nobody`;
* a task allocating past its memory limit is killed by the kernel's OOM
  killer and reported as Nomad reports it ("OOM Killed");
* CPU shares split one busy core 3:1 between two tasks by their `cpu`, read
  from the tasks' cpuacct counters (a third task reserves the other core
  with `cores`, so the two share one);
* resource usage through the agent's gRPC, the gateway's HTTP API, the CLI
  and the agent's Prometheus metrics;
* raw_exec tasks get the same cgroup, and memory_max is the hard limit once
  the scheduler configuration enables oversubscription.

The cluster is shared by the module; its agent's cgroups live under a
parent of their own, removed at the end.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from corral.security import transport
from corral.v1 import alloc_pb2, alloc_pb2_grpc, job_pb2, job_pb2_grpc, node_pb2, node_pb2_grpc
from corral.v1 import structs_pb2 as pb
from tests.cgroup_parent import new_parent, remove_parent, v1_available
from tests.devprocess import DevProcess, cli, start_dev, stop_dev
from tests.wait import wait_for

ROOT = Path(__file__).resolve().parents[2]
CGROUP = Path("/sys/fs/cgroup")

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(os.geteuid() != 0, reason="the exec driver needs root"),
    pytest.mark.skipif(
        not v1_available(), reason="these tests read cgroup v1 hierarchies (as here and in CI)"
    ),
]


class Dev:
    def __init__(self, dev: DevProcess, parent: str) -> None:
        self.dev = dev
        self.parent = parent
        self.address = str(dev.info["address"])
        self.agent_dir = dev.data_dir / "agent"
        self.metrics = f"http://{dev.info['roles']['agent']['metrics']}/metrics"

    def corral(self, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        return cli(self.address, *args, stdin=stdin)

    def run(self, hcl: str) -> None:
        done = self.corral("job", "run", "-detach", "-", stdin=hcl)
        assert done.returncode == 0, done.stdout + done.stderr

    def allocs(self, job_id: str) -> list[pb.Allocation]:
        with transport.dial_sync(self.address) as ch:
            resp = job_pb2_grpc.JobStub(ch).Allocations(
                job_pb2.JobGetRequest(job_id=job_id, all=True), timeout=30
            )
        return list(resp.allocs)

    def http(self, path: str) -> tuple[int, Any]:
        try:
            with urllib.request.urlopen(self.dev.http_addr + path, timeout=30) as resp:
                return resp.status, json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()

    def cgroup(self, controller: str, alloc: pb.Allocation, task: str) -> Path:
        return CGROUP / controller / self.parent / f"{alloc.id}.{task}"

    def log(self, alloc: pb.Allocation, task: str) -> str:
        path = self.agent_dir / "allocs" / alloc.id / "alloc" / "logs" / f"{task}.stdout.0"
        return path.read_text() if path.exists() else ""


@pytest.fixture(scope="module")
def dev(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Dev]:
    parent = new_parent("e2e")
    env = {
        **os.environ,
        "CORRAL_AGENT_CGROUP_PARENT": parent,
        "CORRAL_AGENT_STATS_INTERVAL": "0.5",
    }
    started = start_dev(tmp_path_factory.mktemp("corral-exec"), env=env)
    try:
        d = Dev(started, parent)
        wait_for("the dev node to be ready", lambda: _node(d) is not None, timeout=60)
        yield d
    finally:
        stop_dev(started)
        remove_parent(parent)


def _node(d: Dev) -> pb.Node | None:
    with transport.dial_sync(d.address) as ch:
        nodes = node_pb2_grpc.NodeStub(ch).List(node_pb2.NodeListRequest(), timeout=30).nodes
        if not nodes or nodes[0].status != "ready":
            return None
        return (
            node_pb2_grpc.NodeStub(ch)
            .Get(node_pb2.NodeGetRequest(node_id=nodes[0].id), timeout=30)
            .node
        )


def _complete(d: Dev, job_id: str, n: int) -> list[pb.Allocation] | None:
    allocs = [a for a in d.allocs(job_id) if a.client_status in ("complete", "failed")]
    return allocs if len(allocs) >= n else None


def _running(d: Dev, job_id: str, n: int) -> list[pb.Allocation] | None:
    """n allocs with every task running (an alloc is "running" from its first)."""
    allocs = [
        a
        for a in d.allocs(job_id)
        if a.client_status == "running"
        and all(t.state == "running" for t in a.task_states.values())
    ]
    return allocs if len(allocs) >= n else None


def test_the_node_offers_the_exec_driver(dev: Dev) -> None:
    node = _node(dev)
    assert node is not None
    info = node.drivers["exec"]
    assert (info.detected, info.healthy) == (True, True), info.health_description
    assert node.attributes["driver.exec"] == "1"
    assert info.attributes["driver.exec"] == "true"


PROBE = """
echo "ids=$(cut -d' ' -f4 /proc/self/stat) $PPID host=$(hostname) user=$(id -un)"
echo "procs=$(ls /proc | grep -c '^[0-9]')"
echo "root=$(ls / | tr '\\n' ' ')"
echo "dirs=$NOMAD_ALLOC_DIR,$NOMAD_TASK_DIR,$NOMAD_SECRETS_DIR"
if touch /usr/corral-probe 2>/dev/null; then echo usr=rw; else echo usr=ro; fi
echo "written by $NOMAD_ALLOC_ID" > "$NOMAD_TASK_DIR/out" && echo local=rw
"""


def probe_job() -> pb.Job:
    """Two allocs of an exec task reporting what it sees (the job as the
    API takes it: no HCL between the script and the task)."""
    task = pb.Task(name="probe", driver="exec", resources=pb.Resources(cpu=50, memory_mb=32))
    task.config.update({"command": "/bin/sh", "args": ["-c", PROBE]})
    return pb.Job(
        id="iso",
        type="batch",
        datacenters=["dc1"],
        task_groups=[
            pb.TaskGroup(
                name="g",
                count=2,
                tasks=[task],
                restart_policy=pb.RestartPolicy(attempts=0, mode="fail"),
            )
        ],
    )


def test_two_tasks_have_their_own_pids_hostnames_and_roots(dev: Dev) -> None:
    with transport.dial_sync(dev.address) as ch:
        job_pb2_grpc.JobStub(ch).Register(job_pb2.JobRegisterRequest(job=probe_job()), timeout=30)
    allocs = wait_for("both probes to finish", lambda: _complete(dev, "iso", 2), timeout=90)
    assert all(a.client_status == "complete" for a in allocs), [
        a.task_states["probe"].events for a in allocs
    ]
    hosts = set()
    for a in allocs:
        lines = dev.log(a, "probe").splitlines()
        # `cut` is the shell's child: the shell is PID 2, the child of the
        # namespace's init, PID 1
        first = re.fullmatch(r"ids=(\d+) (\d+) host=(\S+) user=(\S+)", lines[0])
        assert first is not None, lines
        assert first.groups() == ("2", "1", f"probe-{a.id[:8]}", "nobody"), lines
        hosts.add(first.group(3))
        out = dict(line.split("=", 1) for line in lines[1:] if "=" in line)
        assert int(out["procs"]) < 10, out  # init, the shell, ls, grep: not the host's
        root = set(out["root"].split())
        assert {"alloc", "local", "secrets", "tmp", "usr", "etc", "proc", "dev"} <= root
        assert "work" not in root and "root" not in root, root  # nothing else of the host
        assert out["dirs"] == "/alloc,/local,/secrets"
        assert out["usr"] == "ro" and out["local"] == "rw"
        written = dev.agent_dir / "allocs" / a.id / "probe" / "local" / "out"
        assert written.read_text() == f"written by {a.id}\n"
    assert len(hosts) == 2  # each its own host name


OOM = """
job "oom" {
  type        = "batch"
  datacenters = ["dc1"]

  group "g" {
    restart {
      attempts = 0
      mode     = "fail"
    }

    reschedule {
      attempts  = 0
      unlimited = false
    }

    task "hog" {
      driver = "exec"

      config {
        command = "/bin/sh"
        args    = ["-c", "echo allocating; exec tail /dev/zero"]
      }

      resources {
        cpu    = 50
        memory = 32
      }
    }
  }
}
"""


def test_a_task_past_its_memory_limit_is_oom_killed(dev: Dev) -> None:
    dev.run(OOM)
    (alloc,) = wait_for("the hog to die", lambda: _complete(dev, "oom", 1), timeout=90)
    assert alloc.client_status == "failed"
    state = alloc.task_states["hog"]
    assert state.failed
    terminated = [e for e in state.events if e.type == "Terminated"]
    assert terminated, state.events
    event = terminated[-1]
    assert (event.exit_code, event.signal) == (137, 9)
    assert event.message == "OOM Killed" and event.details["oom_killed"] == "true"
    assert event.display_message == 'Exit Code: 137, Signal: 9, Exit Message: "OOM Killed"'

    # the same through Nomad's HTTP API
    status, body = dev.http(f"/v1/allocation/{alloc.id}")
    assert status == 200, body
    nomad_event = next(e for e in body["TaskStates"]["hog"]["Events"] if e["Type"] == "Terminated")
    assert nomad_event["Details"]["oom_killed"] == "true"
    assert nomad_event["ExitCode"] == 137 and nomad_event["Signal"] == 9

    metrics = urllib.request.urlopen(dev.metrics, timeout=30).read().decode()
    assert re.search(
        r'corral_client_allocs_oom_killed_total\{[^}]*job="oom"[^}]*task="hog"[^}]*\} 1\.0',
        metrics,
    ), [line for line in metrics.splitlines() if "oom" in line]
    # the run's cgroup is gone once the task ended
    assert not dev.cgroup("memory", alloc, "hog").exists()


BUSY = """
job "busy" {
  datacenters = ["dc1"]

  group "pin" {
    task "pin" {
      driver = "exec"

      config {
        command = "/bin/sleep"
        args    = ["3600"]
      }

      resources {
        cores  = 1
        memory = 16
      }
    }
  }

  group "spin" {
    task "heavy" {
      driver = "exec"

      config {
        command = "/bin/sh"
        args    = ["-c", "while :; do :; done"]
      }

      resources {
        cpu    = 300
        memory = 16
      }
    }

    task "light" {
      driver = "exec"

      config {
        command = "/bin/sh"
        args    = ["-c", "while :; do :; done"]
      }

      resources {
        cpu    = 100
        memory = 16
      }
    }
  }
}
"""


@pytest.fixture(scope="module")
def busy(dev: Dev) -> Iterator[dict[str, pb.Allocation]]:
    """Two spinning tasks sharing one core, a third holding the other; the
    job is stopped at the end (it burns a core)."""
    dev.run(BUSY)
    try:
        allocs = wait_for("the busy job to run", lambda: _running(dev, "busy", 2), timeout=90)
        yield {a.task_group: a for a in allocs}
    finally:
        stopped = dev.corral("job", "stop", "-purge", "-detach", "busy")
        assert stopped.returncode == 0, stopped.stderr


def _usage_ns(dev: Dev, alloc: pb.Allocation, task: str) -> int:
    return int((dev.cgroup("cpuacct", alloc, task) / "cpuacct.usage").read_text())


def test_cpu_shares_split_a_busy_core_by_cpu(dev: Dev, busy: dict[str, pb.Allocation]) -> None:
    spin, pin = busy["spin"], busy["pin"]
    reserved = CGROUP / "cpuset" / dev.parent / "reserve" / f"{pin.id}.pin" / "cpuset.cpus"
    shared = CGROUP / "cpuset" / dev.parent / "share" / "cpuset.cpus"
    assert reserved.read_text().strip() != shared.read_text().strip()
    # both spinners are confined to the one core nobody reserved
    for task in ("heavy", "light"):
        pids = (dev.cgroup("memory", spin, task) / "cgroup.procs").read_text().split()
        assert pids, task
        status = Path(f"/proc/{pids[0]}/status").read_text()
        allowed = re.search(r"Cpus_allowed_list:\s*(\S+)", status)
        assert allowed is not None and allowed.group(1) == shared.read_text().strip()
    assert (dev.cgroup("cpu", spin, "heavy") / "cpu.shares").read_text().strip() == "300"
    assert (dev.cgroup("cpu", spin, "light") / "cpu.shares").read_text().strip() == "100"

    start = {t: _usage_ns(dev, spin, t) for t in ("heavy", "light")}

    def spent() -> dict[str, int] | None:
        now = {t: _usage_ns(dev, spin, t) - start[t] for t in start}
        return now if sum(now.values()) >= 3 * 10**9 else None  # 3 CPU-seconds between them

    delta = wait_for("three CPU-seconds of spinning", spent, timeout=180, interval=0.5)
    ratio = delta["heavy"] / max(1, delta["light"])
    print(f"cpu.shares 300:100 split the core {delta} (ratio {ratio:.2f})")
    # shares 300:100 -> 3:1; loosely: the heavier task clearly gets more
    assert ratio > 2.0, delta


def test_usage_through_grpc_http_cli_and_metrics(dev: Dev, busy: dict[str, pb.Allocation]) -> None:
    spin = busy["spin"]
    node = _node(dev)
    assert node is not None and node.http_addr

    def grpc_usage() -> pb.AllocResourceUsage | None:
        with transport.dial_sync(node.http_addr) as ch:
            usage = (
                alloc_pb2_grpc.ClientAllocStub(ch)
                .Stats(alloc_pb2.AllocStatsRequest(alloc_id=spin.id), timeout=30)
                .usage
            )
        heavy = usage.tasks["heavy"].resource_usage if "heavy" in usage.tasks else None
        return usage if heavy is not None and heavy.cpu_stats.percent > 10 else None

    usage = wait_for("a CPU reading of the spinners", grpc_usage, timeout=60)
    heavy = usage.tasks["heavy"].resource_usage
    assert set(usage.tasks) == {"heavy", "light"}
    assert list(heavy.memory_stats.measured) == [
        "RSS", "Cache", "Swap", "Usage", "Max Usage", "Kernel Usage", "Kernel Max Usage",
    ]  # fmt: skip
    assert heavy.memory_stats.usage > 0 and heavy.cpu_stats.total_ticks > 0
    total = usage.resource_usage
    assert total.memory_stats.usage == sum(
        t.resource_usage.memory_stats.usage for t in usage.tasks.values()
    )

    status, body = dev.http(f"/v1/client/allocation/{spin.id}/stats")
    assert status == 200, body
    assert set(body) == {"ResourceUsage", "Tasks", "Timestamp"}
    task = body["Tasks"]["heavy"]
    assert set(task) == {"ResourceUsage", "Timestamp", "Pids"}
    assert set(task["ResourceUsage"]["MemoryStats"]) >= {"RSS", "Cache", "Usage", "Measured"}
    assert task["ResourceUsage"]["CpuStats"]["Percent"] > 0
    status, body = dev.http(f"/v1/client/allocation/{spin.id}/stats?task=light")
    assert status == 200 and set(body["Tasks"]) == {"light"}, body
    status, body = dev.http(f"/v1/client/allocation/{spin.id}/stats?task=nope")
    assert status == 404, body

    status, host = dev.http(f"/v1/client/stats?node_id={node.id}")
    assert status == 200, host
    assert host["Memory"]["Total"] > 0 and len(host["CPU"]) == node.node_resources.total_cores
    assert host["AllocDirStats"]["Size"] > 0 and host["Uptime"] > 0
    status, body = dev.http("/v1/client/stats")
    assert status == 400 and "node_id" in body, body

    shown = dev.corral("alloc", "status", "-stats", spin.id)
    assert shown.returncode == 0, shown.stderr
    for part in ("Task Resources:", "Memory Stats", "CPU Stats", "Kernel Max Usage", "/300 MHz"):
        assert part in shown.stdout, shown.stdout

    metrics = urllib.request.urlopen(dev.metrics, timeout=30).read().decode()
    percent = re.search(
        rf'corral_client_allocs_cpu_total_percent\{{[^}}]*alloc_id="{spin.id}"[^}}]*'
        r'task="heavy"[^}]*\} (\S+)',
        metrics,
    )
    assert percent is not None and float(percent.group(1)) > 0, metrics[-2000:]
    assert re.search(r"corral_client_host_memory_total_bytes \d", metrics)
    assert "corral_client_allocs_memory_rss_bytes{" in metrics


RAW = """
job "raw" {
  datacenters = ["dc1"]

  group "g" {
    task "sleeper" {
      driver = "raw_exec"

      config {
        command = "/bin/sh"
        args    = ["-c", "echo max=$NOMAD_MEMORY_MAX_LIMIT; exec sleep 3600"]
      }

      resources {
        cpu        = 50
        memory     = 32
        memory_max = 64
      }
    }
  }
}
"""


def test_raw_exec_gets_a_cgroup_and_memory_max_with_oversubscription(dev: Dev) -> None:
    enabled = dev.corral("operator", "scheduler", "set-config", "-memory-oversubscription=true")
    assert enabled.returncode == 0, enabled.stderr
    try:
        dev.run(RAW)
        (alloc,) = wait_for("the sleeper to run", lambda: _running(dev, "raw", 1), timeout=90)
        mem = dev.cgroup("memory", alloc, "sleeper")
        assert int((mem / "memory.limit_in_bytes").read_text()) == 64 * 1024 * 1024
        assert int((mem / "memory.soft_limit_in_bytes").read_text()) == 32 * 1024 * 1024
        assert (dev.cgroup("cpu", alloc, "sleeper") / "cpu.shares").read_text().strip() == "50"
        wait_for("the task's output", lambda: dev.log(alloc, "sleeper") == "max=64\n")
        pids = (mem / "cgroup.procs").read_text().split()
        assert pids and "sleep" in Path(f"/proc/{pids[0]}/cmdline").read_text()
    finally:
        dev.corral("job", "stop", "-purge", "-detach", "raw")
        dev.corral("operator", "scheduler", "set-config", "-memory-oversubscription=false")


def test_exec_driver_options_are_checked_by_the_parser(dev: Dev) -> None:
    bad = OOM.replace('command = "/bin/sh"', 'command = "/bin/sh"\n        pid_mode = "shared"')
    done = dev.corral("job", "run", "-detach", "-", stdin=bad)
    assert done.returncode == 1
    assert 'pid_mode: must be "private" or "host"' in done.stderr, done.stderr
    unsupported = RAW.replace(
        'command = "/bin/sh"', 'command = "/bin/sh"\n        oom_score_adj = 5'
    )
    done = dev.corral("job", "run", "-detach", "-", stdin=unsupported)
    assert done.returncode == 1 and "not supported by Corral" in done.stderr, done.stderr
