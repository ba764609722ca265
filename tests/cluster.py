"""A real Corral cluster of processes: the one way integration and
end-to-end tests start roles.

Each role runs as `python -m services.<role>` on port 0 with a ready file;
the cluster waits for the file, reads the bound address and passes it on.
Processes can be killed (SIGKILL) and restarted to test failures. Tests
whose state service runs in-process (on the test's event loop) pass its
address as `state_address` and use the `*_async` methods, which wait
without blocking that loop.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.keyring import session_kek_file

ROOT = Path(__file__).resolve().parents[1]


@dataclass
class Proc:
    role: str
    name: str
    args: list[str]
    env: dict[str, str]
    ready_file: Path
    log_file: Path
    popen: subprocess.Popen[bytes] | None = None
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def address(self) -> str:
        return str(self.info.get("address", ""))

    @property
    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None


class Cluster:
    """Start roles in dependency order; every address is discovered."""

    def __init__(
        self,
        dsn: str,
        workdir: Path,
        *,
        env: dict[str, str] | None = None,
        state_address: str = "",
    ) -> None:
        self.dsn = dsn
        self.state_address = state_address  # an in-process state service, if any
        self.workdir = workdir
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.env = {**os.environ, "CORRAL_LOG_FORMAT": "text", **(env or {})}
        self.procs: dict[str, Proc] = {}

    # ------------------------------------------------------------ addresses

    @property
    def state_addr(self) -> str:
        return self.state_address or self.procs["state"].address

    @property
    def broker_addr(self) -> str:
        return ",".join(p.address for n, p in self.procs.items() if p.role == "broker" and p.alive)

    @property
    def planner_addr(self) -> str:
        return ",".join(p.address for n, p in self.procs.items() if p.role == "planner" and p.alive)

    # ------------------------------------------------------------ lifecycle

    def start(
        self,
        role: str,
        *extra: str,
        name: str | None = None,
        module: str | None = None,
        env: dict[str, str] | None = None,
        timeout: float = 60.0,
    ) -> Proc:
        proc = self._prepare(role, extra, name, module, env)
        self._spawn(proc, timeout)
        return proc

    async def start_async(
        self,
        role: str,
        *extra: str,
        name: str | None = None,
        module: str | None = None,
        env: dict[str, str] | None = None,
        timeout: float = 60.0,
    ) -> Proc:
        """`start`, waiting for readiness without blocking the event loop."""
        proc = self._prepare(role, extra, name, module, env)
        self._launch(proc)
        deadline = time.monotonic() + timeout
        while not self._ready(proc) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        self._check_ready(proc)
        return proc

    def _prepare(
        self,
        role: str,
        extra: tuple[str, ...],
        name: str | None,
        module: str | None,
        env: dict[str, str] | None,
    ) -> Proc:
        name = name or role
        ready = self.workdir / f"{name}.ready.json"
        args = [sys.executable, "-m", module or f"services.{role}", "--ready-file", str(ready)]
        if role in ("state", "broker", "planner"):
            args += ["--dsn", self.dsn]
        if role == "state":  # Variables and workload identities need a keyring
            args += ["--keyring-kek-file", str(session_kek_file())]
        if role != "state":
            args += ["--state-addr", self.state_addr]
        if role in ("planner", "worker"):
            args += ["--broker-addr", self.broker_addr]
        if role == "worker":
            args += ["--planner-addr", self.planner_addr]
        args += list(extra)
        # a test's agent stops its tasks when it stops (nothing outlives the
        # test); a test of adoption after a graceful restart says otherwise
        defaults = {"CORRAL_AGENT_STOP_TASKS_ON_SHUTDOWN": "true"} if role == "agent" else {}
        proc = Proc(
            role=role,
            name=name,
            args=args,
            env={**self.env, **defaults, **(env or {})},
            ready_file=ready,
            log_file=self.workdir / f"{name}.log",
        )
        self.procs[name] = proc
        return proc

    def _launch(self, proc: Proc) -> None:
        proc.info = {}
        proc.ready_file.unlink(missing_ok=True)
        log = proc.log_file.open("ab")
        proc.popen = subprocess.Popen(
            proc.args,
            cwd=ROOT,
            env=proc.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def _ready(self, proc: Proc) -> bool:
        """Ready (its ready file read), or exited: either way, stop waiting."""
        if proc.ready_file.exists():
            proc.info = json.loads(proc.ready_file.read_text())
            return True
        return proc.popen is None or proc.popen.poll() is not None

    def _check_ready(self, proc: Proc) -> None:
        if proc.info and proc.alive:
            return
        tail = proc.log_file.read_text(errors="replace")[-3000:]
        code = proc.popen.poll() if proc.popen is not None else None
        raise RuntimeError(f"{proc.name} did not become ready (exit {code}):\n{tail}")

    def _spawn(self, proc: Proc, timeout: float) -> None:
        self._launch(proc)
        deadline = time.monotonic() + timeout
        while not self._ready(proc) and time.monotonic() < deadline:
            time.sleep(0.05)
        self._check_ready(proc)

    def restart(self, name: str, timeout: float = 60.0) -> Proc:
        proc = self.procs[name]
        if proc.alive:
            self.stop(name)
        self._spawn(proc, timeout)
        return proc

    def kill(self, name: str) -> None:
        """SIGKILL: the process gets no chance to clean up."""
        proc = self.procs[name]
        if proc.popen is not None and proc.alive:
            os.killpg(proc.popen.pid, signal.SIGKILL)
            proc.popen.wait(10)

    def stop(self, name: str, timeout: float = 15.0) -> int | None:
        """SIGTERM, then SIGKILL after timeout; returns the exit code."""
        proc = self.procs[name]
        if proc.popen is None:
            return None
        if proc.alive:
            os.killpg(proc.popen.pid, signal.SIGTERM)
            try:
                proc.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(proc.popen.pid, signal.SIGKILL)
                proc.popen.wait(10)
        return proc.popen.returncode

    async def wait_exit(self, name: str, timeout: float) -> int | None:
        """The exit status once the process ends (None if still running after
        `timeout`), without blocking the event loop."""
        proc = self.procs[name]
        deadline = time.monotonic() + timeout
        while proc.alive and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        return proc.popen.poll() if proc.popen is not None else None

    async def stop_async(self, name: str, timeout: float = 15.0) -> int | None:
        """`stop` without blocking the event loop (for an in-process state)."""
        proc = self.procs[name]
        if proc.popen is None:
            return None
        if proc.alive:
            os.killpg(proc.popen.pid, signal.SIGTERM)
            if await self.wait_exit(name, timeout) is None:
                os.killpg(proc.popen.pid, signal.SIGKILL)
                proc.popen.wait(10)
        return proc.popen.returncode

    def stop_all(self) -> None:
        for name in reversed(list(self.procs)):
            self.stop(name)

    def log(self, name: str) -> str:
        return self.procs[name].log_file.read_text(errors="replace")
