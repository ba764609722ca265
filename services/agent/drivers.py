"""Task drivers: `raw_exec` runs a real process, `mock` pretends to (for
tests and simulation), as Nomad's drivers of the same names."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shutil
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from google.protobuf.json_format import MessageToDict

from corral.v1 import structs_pb2 as pb

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


@dataclass
class ExitResult:
    exit_code: int = 0
    signal: int = 0
    error: str = ""
    killed: bool = False  # we stopped it

    @property
    def successful(self) -> bool:
        return self.exit_code == 0 and self.signal == 0 and not self.error


class TaskHandle(Protocol):
    pid: int

    async def wait(self) -> ExitResult: ...

    async def stop(self, sig: int, timeout: float) -> None: ...


class Driver(Protocol):
    name: str

    def fingerprint(self) -> pb.DriverInfo: ...

    async def start(self, task: pb.Task, env: dict[str, str], task_dir: Path) -> TaskHandle: ...


def task_config(task: pb.Task) -> dict[str, Any]:
    return MessageToDict(task.config) if task.HasField("config") else {}


# ---------------------------------------------------------------- raw_exec


class _ProcessHandle:
    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self.pid = proc.pid
        self._killed = False

    async def wait(self) -> ExitResult:
        code = await self.proc.wait()
        if code < 0:
            return ExitResult(exit_code=0, signal=-code, killed=self._killed)
        return ExitResult(exit_code=code, killed=self._killed)

    async def stop(self, sig: int, timeout: float) -> None:
        """The kill signal to the task's process group, SIGKILL after timeout."""
        if self.proc.returncode is not None:
            return
        self._killed = True
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, sig)
        try:
            await asyncio.wait_for(self.proc.wait(), timeout)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            await self.proc.wait()


class RawExecDriver:
    name = "raw_exec"

    def fingerprint(self) -> pb.DriverInfo:
        return pb.DriverInfo(detected=True, healthy=True, health_description="Healthy")

    async def start(self, task: pb.Task, env: dict[str, str], task_dir: Path) -> TaskHandle:
        cfg = task_config(task)
        command = cfg.get("command")
        if not command:
            raise ValueError(f"task {task.name!r}: raw_exec needs config.command")
        args = [str(a) for a in cfg.get("args", [])]
        resolved = shutil.which(command, path=env.get("PATH")) or command
        stdout = open(task_dir / "stdout.log", "ab")  # noqa: SIM115 - owned by the child
        stderr = open(task_dir / "stderr.log", "ab")  # noqa: SIM115
        try:
            proc = await asyncio.create_subprocess_exec(
                resolved,
                *args,
                cwd=str(task_dir / "local"),
                env=env,
                stdout=stdout,
                stderr=stderr,
                stdin=asyncio.subprocess.DEVNULL,
                start_new_session=True,  # its own process group: we kill the whole tree
            )
        finally:
            stdout.close()
            stderr.close()
        return _ProcessHandle(proc)


# ---------------------------------------------------------------- mock


class _MockHandle:
    def __init__(self, run_for: float, exit_code: int, pid: int) -> None:
        self.pid = pid
        self._exit_code = exit_code
        self._stopped = asyncio.Event()
        self._run_for = run_for
        self._killed = False

    async def wait(self) -> ExitResult:
        if self._run_for > 0:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopped.wait(), self._run_for)
        else:
            await self._stopped.wait()
        if self._killed:
            return ExitResult(signal=signal.SIGTERM, killed=True)
        return ExitResult(exit_code=self._exit_code)

    async def stop(self, sig: int, timeout: float) -> None:
        self._killed = True
        self._stopped.set()


class MockDriver:
    """Runs for `run_for` (forever when 0/absent) and exits with `exit_code`;
    `start_error` fails the start."""

    name = "mock"
    _next_pid = 1_000_000

    def fingerprint(self) -> pb.DriverInfo:
        return pb.DriverInfo(detected=True, healthy=True, health_description="Healthy")

    async def start(self, task: pb.Task, env: dict[str, str], task_dir: Path) -> TaskHandle:
        cfg = task_config(task)
        if cfg.get("start_error"):
            raise RuntimeError(str(cfg["start_error"]))
        MockDriver._next_pid += 1
        (task_dir / "stdout.log").open("a").write(
            f"mock task {task.name} started at {time.time():.3f}\n"
        )
        return _MockHandle(
            parse_duration(cfg.get("run_for")), int(cfg.get("exit_code", 0)), MockDriver._next_pid
        )


ALL_DRIVERS: dict[str, type[RawExecDriver] | type[MockDriver]] = {
    "raw_exec": RawExecDriver,
    "mock": MockDriver,
}
