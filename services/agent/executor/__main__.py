"""`python -m services.agent.executor`: one per task run, Nomad's executor.

The agent starts it in a session of its own and writes a `LaunchSpec` on
its stdin. It starts the task (services/agent/executor/launch.py), answers
one JSON line on stdout — `{"pid": N}` (the host pid to signal: the task
itself for raw_exec, the task's init for exec) or `{"error": "..."}` — then
waits for the task and writes the exit record into its state directory.

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

from services.agent.executor import launch, linux
from services.agent.executor.spec import EXIT_FILE, ExitRecord, LaunchSpec


def _answer(**reply: object) -> None:
    sys.stdout.write(json.dumps(reply) + "\n")
    sys.stdout.flush()


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


def run(spec: LaunchSpec) -> int:
    state_dir = Path(spec.state_dir)
    (state_dir / EXIT_FILE).unlink(missing_ok=True)
    stdout = os.open(spec.stdout, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644)
    stderr = os.open(spec.stderr, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644)
    errors_r, errors_w = os.pipe2(os.O_CLOEXEC)
    results_r, results_w = os.pipe2(os.O_CLOEXEC)
    # never written: its read end turns readable (EOF) when we are gone
    lifeline_r, _lifeline_w = os.pipe2(os.O_CLOEXEC)
    oom_before = _oom_kills(spec.oom_counters)
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
    _answer(pid=child)
    _, status = os.waitpid(child, 0)
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
