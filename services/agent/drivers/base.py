"""The driver interface, after Nomad's plugins/drivers: a driver
fingerprints itself and starts a task from a `TaskConfig`; the `TaskHandle`
it returns waits, stops, signals and measures that one run and carries the
`state` the agent keeps to find the run again; `recover` takes that state
after an agent restart (Nomad's RecoverTask). A driver says what it can do
(`Capabilities`: exec, file system isolation, mounts) and runs `alloc exec`
commands in a running task (`exec_task`, Nomad's ExecTaskStreaming). The
task runner (services/agent/runner.py) owns everything above one run:
restarts, events, the alloc's status."""

from __future__ import annotations

import re
import signal as signals
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from google.protobuf.json_format import MessageToDict

from corral.v1 import structs_pb2 as pb
from services.agent.allocdir import TaskDir
from services.agent.cgroups import Usage
from services.agent.executor.logmon import LogSpec

_UNITS = {
    "ns": 1,
    "us": 1_000,
    "µs": 1_000,
    "ms": 1_000_000,
    "s": 10**9,
    "m": 60 * 10**9,
    "h": 3600 * 10**9,
}
_PART = re.compile(r"(\d+(?:\.\d+)?)(ns|us|µs|ms|s|m|h)")


def parse_duration(value: Any) -> float:
    """Seconds from a Go-style duration ("1m30s", "500ms") or nanoseconds."""
    if value is None or value == "":
        return 0.0
    if isinstance(value, int | float):
        return float(value) / 1e9
    text = str(value).strip()
    if text.isdigit():
        return int(text) / 1e9
    parts = _PART.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text:
        raise ValueError(f"invalid duration {value!r}")
    return sum(float(n) * _UNITS[u] for n, u in parts) / 1e9


def parse_signal(name: str) -> int:
    """A signal by name ("SIGUSR1", "USR1", any case) or number; ValueError
    for one this node does not know."""
    text = name.strip().upper()
    if text.isdigit() and 0 < int(text) < signals.NSIG:
        return int(text)
    if text and not text.startswith("SIG"):
        text = "SIG" + text
    sig = getattr(signals, text, None)
    if not isinstance(sig, signals.Signals) or text.startswith("SIG_"):
        raise ValueError(f"invalid signal {name!r}")
    return int(sig)


def task_config(task: pb.Task) -> dict[str, Any]:
    return MessageToDict(task.config) if task.HasField("config") else {}


class DriverError(Exception):
    """A task could not be started; the message becomes the task event's."""


#: Nomad's fsisolation: none (the host's file system) or chroot (a root of
#: the task's own)
FS_NONE, FS_CHROOT = "none", "chroot"


@dataclass(frozen=True)
class Capabilities:
    """What a driver offers beyond running a task (Nomad's drivers.Capabilities)."""

    #: `alloc exec` into its tasks
    exec: bool = False
    fs_isolation: str = FS_NONE
    #: host volumes mounted into its tasks (Nomad's MountConfigs)
    mounts: bool = False


@dataclass(frozen=True)
class Mount:
    """A host path at `task_path` inside the task's root (Nomad's
    drivers.MountConfig, from a host volume and a volume_mount)."""

    host_path: str
    task_path: str
    read_only: bool = False


@dataclass
class ExitResult:
    exit_code: int = 0
    signal: int = 0
    error: str = ""
    killed: bool = False  # we stopped it
    oom_killed: bool = False  # the kernel's OOM killer struck
    finished_at: int = 0  # Unix ns, when known (an exit recorded while the agent was away)

    @property
    def successful(self) -> bool:
        return self.exit_code == 0 and self.signal == 0 and not self.error


@dataclass(frozen=True)
class TaskResources:
    """What the scheduler allocated to the task (its alloc's task
    resources): `memory_max_mb` is set only where the scheduler
    configuration enables memory oversubscription."""

    cpu_mhz: int = 0
    cores: int = 0
    memory_mb: int = 0
    memory_max_mb: int = 0


@dataclass
class TaskConfig:
    """One run of a task, as the driver needs it (Nomad's drivers.TaskConfig)."""

    alloc_id: str
    name: str
    driver_config: dict[str, Any]
    env: dict[str, str]
    task_dir: TaskDir
    #: the executor's directory for this task (outside the task's reach)
    state_dir: Path
    resources: TaskResources = field(default_factory=TaskResources)
    user: str = ""
    #: host volumes to mount (drivers whose Capabilities.mounts is set)
    mounts: list[Mount] = field(default_factory=list)
    #: the logs block: how many files of how many MB per stream, or none
    log_max_files: int = 10
    log_max_file_size_mb: int = 10
    logs_disabled: bool = False

    @property
    def scope(self) -> str:
        """The run's name on the node (its cgroup): `<alloc id>.<task>`."""
        return f"{self.alloc_id}.{self.name}"

    def log_spec(self) -> LogSpec | None:
        """Where the run's stdout and stderr go (None: nowhere)."""
        if self.logs_disabled:
            return None
        return LogSpec(
            dir=str(self.task_dir.log_dir),
            task=self.name,
            max_files=self.log_max_files,
            max_bytes=self.log_max_file_size_mb * 1024 * 1024,
        )


class TaskHandle(Protocol):
    pid: int

    @property
    def state(self) -> dict[str, Any]:
        """What finds this run again after an agent restart (JSON)."""
        ...

    async def wait(self) -> ExitResult: ...

    async def stop(self, sig: int, timeout: float) -> None:
        """The signal, then SIGKILL for everything left after `timeout`."""
        ...

    async def signal(self, sig: int) -> None: ...

    def usage(self) -> Usage | None:
        """The run's raw resource counters now (None: not measurable)."""
        ...

    async def destroy(self) -> None:
        """After the run ended: release what it held (cgroups, cores)."""
        ...


class ExecSession(Protocol):
    """One command run by `alloc exec` (services/agent/execsession.py)."""

    async def write(self, data: bytes) -> None: ...

    async def close_stdin(self) -> None: ...

    def resize(self, height: int, width: int) -> None: ...

    def output(self) -> AsyncIterator[tuple[str, bytes]]:
        """("stdout" | "stderr", data) until the command's output ends."""
        ...

    async def wait(self) -> int:
        """The exit code (128 + signal for a signal death)."""
        ...

    async def close(self) -> None:
        """Kill the command if it still runs, and release everything."""
        ...


class Driver(Protocol):
    name: str
    capabilities: Capabilities

    def fingerprint(self) -> pb.DriverInfo: ...

    async def start(self, cfg: TaskConfig) -> TaskHandle: ...

    async def recover(self, state: dict[str, Any]) -> TaskHandle | ExitResult | None:
        """The run a handle's `state` names, after an agent restart: a handle
        when it still runs, how it ended when it ended meanwhile, None when
        it never started."""
        ...

    async def exec_task(
        self, handle: TaskHandle, cfg: TaskConfig, command: list[str], tty: bool
    ) -> ExecSession:
        """Run `command` in the task `handle` runs (as `cfg` started it);
        DriverError when the driver cannot."""
        ...
