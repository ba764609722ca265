"""`mock`: pretends to run a task, for tests and simulation (Nomad's mock
driver, reduced): runs for `run_for` (forever when 0 or absent) and exits
with `exit_code`; `start_error` fails the start. A restarted agent
recovers a mock run from its state: it runs on for what is left of
`run_for`, or has ended meanwhile."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
from typing import Any

from corral.v1 import structs_pb2 as pb
from services.agent.cgroups import Usage
from services.agent.drivers.base import (
    Capabilities,
    DriverError,
    ExecSession,
    ExitResult,
    TaskConfig,
    TaskHandle,
    parse_duration,
)


class MockHandle:
    def __init__(
        self, run_for: float, exit_code: int, pid: int, started_at: float | None = None
    ) -> None:
        self.pid = pid
        self._exit_code = exit_code
        self._stopped = asyncio.Event()
        self._run_for = run_for
        self._started_at = time.time() if started_at is None else started_at
        self._killed = False

    @property
    def state(self) -> dict[str, Any]:
        return {
            "pid": self.pid,
            "run_for": self._run_for,
            "exit_code": self._exit_code,
            "started_at": self._started_at,
        }

    async def wait(self) -> ExitResult:
        if self._run_for > 0:
            left = self._started_at + self._run_for - time.time()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopped.wait(), max(0.0, left))
        else:
            await self._stopped.wait()
        if self._killed:
            return ExitResult(exit_code=128 + signal.SIGTERM, signal=signal.SIGTERM, killed=True)
        return ExitResult(exit_code=self._exit_code)

    async def stop(self, sig: int, timeout: float) -> None:
        self._killed = True
        self._stopped.set()

    async def signal(self, sig: int) -> None:
        return None

    def usage(self) -> Usage | None:
        return None  # nothing runs, nothing to measure

    async def destroy(self) -> None:
        return None


class MockDriver:
    name = "mock"
    #: nothing runs, so there is nothing to exec into; mounts are accepted
    #: (and, like everything else here, pretended)
    capabilities = Capabilities(mounts=True)
    _next_pid = 1_000_000

    def fingerprint(self) -> pb.DriverInfo:
        return pb.DriverInfo(detected=True, healthy=True, health_description="Healthy")

    async def start(self, cfg: TaskConfig) -> MockHandle:
        config = cfg.driver_config
        if config.get("start_error"):
            raise DriverError(str(config["start_error"]))
        MockDriver._next_pid += 1
        path = cfg.task_dir.log_path("stdout")
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a") as out:
            out.write(f"mock task {cfg.name} started at {time.time():.3f}\n")
        return MockHandle(
            parse_duration(config.get("run_for")),
            int(config.get("exit_code", 0)),
            MockDriver._next_pid,
        )

    async def recover(self, state: dict[str, Any]) -> MockHandle | ExitResult | None:
        try:
            run_for = float(state["run_for"])
            started_at = float(state["started_at"])
            exit_code = int(state["exit_code"])
            pid = int(state["pid"])
        except (KeyError, TypeError, ValueError):
            return None
        if run_for > 0 and time.time() >= started_at + run_for:
            return ExitResult(exit_code=exit_code, finished_at=int((started_at + run_for) * 1e9))
        return MockHandle(run_for, exit_code, pid, started_at)

    async def exec_task(
        self, handle: TaskHandle, cfg: TaskConfig, command: list[str], tty: bool
    ) -> ExecSession:
        raise DriverError("the mock driver runs no process: alloc exec is not supported for it")
