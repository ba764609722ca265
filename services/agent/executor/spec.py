"""What the agent asks an executor to run (`LaunchSpec`, sent as JSON on the
executor's stdin so the task's environment never touches the disk), what the
executor answers once the task started (one JSON line on its stdout), and
the exit record it leaves in its state directory when the task ends.

The exit record is a file, not a message, so that whoever watches the
executor later (this agent, or the same agent after a restart) learns how
the task ended even if nobody was listening at the time."""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

EXIT_FILE = "exit.json"
LOG_FILE = "executor.log"


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
    stdout: str
    stderr: str
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
        spec = cls(**data)
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
        """Atomically: a reader sees the whole record or none."""
        tmp = state_dir / (EXIT_FILE + ".tmp")
        tmp.write_text(json.dumps(asdict(self)))
        os.replace(tmp, state_dir / EXIT_FILE)

    @classmethod
    def read(cls, state_dir: Path) -> ExitRecord | None:
        try:
            data: dict[str, Any] = json.loads((state_dir / EXIT_FILE).read_text())
        except FileNotFoundError:
            return None
        return cls(**data)
