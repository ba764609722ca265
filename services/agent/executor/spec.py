"""What the agent asks an executor to run (`LaunchSpec`, sent as JSON on the
executor's stdin so the task's environment never touches the disk), what the
executor answers once the task started (one JSON line on its stdout), and
the files in its state directory:

    handle.json     whether the run is isolated, its cgroup and cores,
                    written by the agent before it starts the executor
    executor.json   the executor's identity (pid, start time, boot), written
                    by the agent before it sends the spec
    task.json       the identity of the process to signal, written by the
                    executor once the task started, before it answers
    exit.json       how the task ended, written when it did

They are files, not messages, so that whoever watches the executor later
(this agent, or the same agent after a restart, even one killed halfway
through a launch) finds the run and learns how it ended even if nobody
was listening at the time."""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from services.agent.executor.identity import ProcessIdentity
from services.agent.executor.logmon import LogSpec

EXIT_FILE = "exit.json"
LOG_FILE = "executor.log"
EXECUTOR_FILE = "executor.json"
TASK_FILE = "task.json"
HANDLE_FILE = "handle.json"
#: what a launch leaves in the state directory (cleared before the next one)
RUN_FILES = (EXIT_FILE, EXECUTOR_FILE, TASK_FILE, HANDLE_FILE)


@dataclass
class Bind:
    """A host path made visible at `target` inside the task's root: a bind
    mount of a directory or file, or the same symlink when the host path is
    one (merged-/usr systems link /bin to usr/bin)."""

    source: str
    target: str
    readonly: bool = True


@dataclass
class Isolation:
    """The exec driver's: the task directory becomes the root of a private
    mount namespace (pivot_root, or chroot with `pivot_root` false), with
    /dev, /proc, /sys and the binds; its own UTS namespace with `hostname`;
    its own PID and IPC namespaces unless the task shares the host's."""

    root: str
    hostname: str
    binds: list[Bind] = field(default_factory=list)
    pid_namespace: bool = True
    ipc_namespace: bool = True
    pivot_root: bool = True


@dataclass
class LaunchSpec:
    command: str
    args: list[str]
    env: dict[str, str]
    cwd: str
    #: where the task's stdout and stderr go (None: nowhere, Nomad's
    #: `logs { disabled = true }`)
    logs: LogSpec | None
    #: the executor's own directory (exit record, its log), outside the task's reach
    state_dir: str
    #: run as this user ("" = as the executor, root)
    user: str = ""
    #: the task's capability set (names without CAP_), None = left as inherited
    capabilities: list[str] | None = None
    #: cgroup.procs files the task joins before it executes
    cgroup_procs: list[str] = field(default_factory=list)
    #: memory.oom_control (v1) / memory.events (v2): their oom_kill counters
    #: tell whether the kernel's OOM killer struck
    oom_counters: list[str] = field(default_factory=list)
    isolation: Isolation | None = None

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> LaunchSpec:
        data = json.loads(text)
        iso = data.pop("isolation", None)
        logs = data.pop("logs", None)
        spec = cls(logs=LogSpec(**logs) if logs is not None else None, **data)
        if iso is not None:
            binds = [Bind(**b) for b in iso.pop("binds", [])]
            spec.isolation = Isolation(binds=binds, **iso)
        return spec


@dataclass
class ExitRecord:
    """How the task ended: Nomad's exit code (128 + signal for a signal
    death), the signal, and whether the kernel's OOM killer was involved."""

    exit_code: int
    signal: int = 0
    oom_killed: bool = False
    error: str = ""
    finished_at: int = 0  # Unix ns

    @classmethod
    def from_wait_status(cls, status: int, *, oom_killed: bool, finished_at: int) -> ExitRecord:
        if os.WIFSIGNALED(status):
            sig = os.WTERMSIG(status)
            return cls(128 + sig, sig, oom_killed, finished_at=finished_at)
        return cls(os.waitstatus_to_exitcode(status), 0, oom_killed, finished_at=finished_at)

    def write(self, state_dir: Path) -> None:
        write_json(state_dir / EXIT_FILE, asdict(self))

    @classmethod
    def read(cls, state_dir: Path) -> ExitRecord | None:
        try:
            data: dict[str, Any] = json.loads((state_dir / EXIT_FILE).read_text())
        except FileNotFoundError:
            return None
        return cls(**data)


def write_json(path: Path, data: Any) -> None:
    """Atomically (a reader sees the whole file or none), 0600."""
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(json.dumps(data))
    os.replace(tmp, path)


def write_identity(path: Path, pid: int) -> ProcessIdentity | None:
    """The identity of `pid` into `path` (None, and no file, if it is gone)."""
    ident = ProcessIdentity.of(pid)
    if ident is not None:
        write_json(path, ident.dump())
    return ident


def read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def read_identity(path: Path) -> ProcessIdentity | None:
    return ProcessIdentity.load(read_json(path))
