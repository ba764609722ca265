"""`python -m services.agent.executor`: one per task run, Nomad's executor.

The agent starts it in a session of its own and writes a `LaunchSpec` on
its stdin. It starts the task (services/agent/executor/launch.py), records
the identity of the process to signal (the task itself for raw_exec, the
task's init for exec) in `task.json`, answers one JSON line on stdout —
`{"pid": N}` or `{"error": "..."}` — then waits for the task and writes the
exit record into its state directory. The task's stdout and stderr are
pipes the executor's logmon threads copy into rotated files
(services/agent/executor/logmon.py), so log rotation goes on while the
agent is away. An agent that died meanwhile misses the answer: the
executor carries on regardless.

A separate process rather than the agent's own child because it is the
task's parent: it outlives an agent restart, so the task keeps running and
its exit is still recorded, and the agent may be multi-threaded where a
fork must not be. With `--probe` it only checks that this node can build
the exec driver's namespaces (the driver's fingerprint).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from services.agent.executor import launch, linux, logmon
from services.agent.executor.spec import TASK_FILE, ExitRecord, LaunchSpec, write_identity

#: how long the logmon threads may take to drain the pipes once the task
#: ended (a daemonised child of a raw_exec task may hold them open forever)
DRAIN_TIMEOUT = 2.0


def _answer(**reply: object) -> None:
    try:
        sys.stdout.write(json.dumps(reply) + "\n")
        sys.stdout.flush()
    except (BrokenPipeError, OSError):
        pass  # the agent is gone; a restarted one finds us through our files


def _oom_kills(paths: list[str]) -> int:
    """The oom_kill counters of the task's memory cgroup (v1
    memory.oom_control, v2 memory.events)."""
    total = 0
    for path in paths:
        try:
            text = Path(path).read_text()
        except OSError:
            continue
        for line in text.splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill" and value.strip().isdigit():
                total += int(value)
    return total


def _outputs(spec: LaunchSpec) -> tuple[int, int, list[tuple[str, int]]]:
    """The task's stdout and stderr: pipes into logmon, or /dev/null when
    its logs are disabled; and the read ends to pump."""
    if spec.logs is None:
        null = os.open(os.devnull, os.O_WRONLY | os.O_CLOEXEC)
        return null, os.dup(null), []
    out_r, out_w = os.pipe2(os.O_CLOEXEC)
    err_r, err_w = os.pipe2(os.O_CLOEXEC)
    return out_w, err_w, [("stdout", out_r), ("stderr", err_r)]


def run(spec: LaunchSpec) -> int:
    state_dir = Path(spec.state_dir)
    stdout, stderr, reads = _outputs(spec)
    errors_r, errors_w = os.pipe2(os.O_CLOEXEC)
    results_r, results_w = os.pipe2(os.O_CLOEXEC)
    # never written: its read end turns readable (EOF) when we are gone
    lifeline_r, _lifeline_w = os.pipe2(os.O_CLOEXEC)
    oom_before = _oom_kills(spec.oom_counters)
    # the log threads start before the PID namespace is unshared: no thread
    # can be made after that
    pumps = [logmon.start(spec.logs, name, fd) for name, fd in reads if spec.logs is not None]
    if spec.isolation is not None and spec.isolation.pid_namespace:
        linux.unshare(linux.CLONE_NEWPID)  # our next child is PID 1 there
    sys.stdout.flush()
    child = os.fork()
    if child == 0:
        os.close(errors_r)
        os.close(results_r)
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.dup2(stdout, 1)
        os.dup2(stderr, 2)
        os.close(_lifeline_w)
        if spec.isolation is not None:
            launch.init_child(spec, errors_w, results_w, lifeline_r)
        else:
            launch.raw_child(spec, errors_w)
        os._exit(127)  # not reached
    os.close(errors_w)
    os.close(results_w)
    os.close(lifeline_r)
    os.close(stdout)
    os.close(stderr)
    problem = launch.read_all(errors_r).decode(errors="replace")
    os.close(errors_r)
    if problem:
        os.waitpid(child, 0)
        _answer(error=problem)
        return 0
    write_identity(state_dir / TASK_FILE, child)
    _answer(pid=child)
    _, status = os.waitpid(child, 0)
    deadline = time.monotonic() + DRAIN_TIMEOUT
    for pump in pumps:
        pump.join(max(0.0, deadline - time.monotonic()))
    reported = launch.read_all(results_r).strip()
    os.close(results_r)
    if reported.isdigit():
        status = int(reported)  # the task's own status, relayed by its init
    record = ExitRecord.from_wait_status(
        status,
        oom_killed=_oom_kills(spec.oom_counters) > oom_before,
        finished_at=time.time_ns(),
    )
    record.write(state_dir)
    return 0


def probe() -> int:
    """Whether new PID, mount, UTS and IPC namespaces can be made here."""
    pid = os.fork()
    if pid == 0:
        try:
            linux.unshare(
                linux.CLONE_NEWPID | linux.CLONE_NEWNS | linux.CLONE_NEWUTS | linux.CLONE_NEWIPC
            )
        except OSError as exc:
            sys.stderr.write(f"{exc}\n")
            os._exit(1)
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def main() -> int:
    if sys.argv[1:] == ["--probe"]:
        return probe()
    spec = LaunchSpec.from_json(sys.stdin.read())
    try:
        return run(spec)
    except OSError as exc:
        _answer(error=f"executor: {exc}")
        return 1


if __name__ == "__main__":
    sys.exit(main())
