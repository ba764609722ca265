"""The agent's side of an executor (services/agent/executor): start one for
a task run, learn the pid to signal, wait for it, read the exit record.

The handle watches the executor process, not the task: the executor is
the task's parent and writes how the task ended before it exits. `state`
holds what a restarted agent needs to find the same run (the executor's
pid and state directory, the task's pid, its cgroup scope and cores).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal as signals
import sys
from pathlib import Path
from typing import Any

from services.agent.cgroups import CgroupManager, TaskCgroup, Usage
from services.agent.drivers.base import DriverError, ExitResult
from services.agent.executor.spec import LOG_FILE, ExitRecord, LaunchSpec
from services.agent.stats import process_tree_usage

log = logging.getLogger(__name__)

#: the package root, so `python -m services.agent.executor` imports this code
_ROOT = str(Path(__file__).resolve().parents[3])
#: how long an executor may take to start its task
START_TIMEOUT = 30.0


def executor_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (_ROOT, env.get("PYTHONPATH", "")) if p)
    return env


class ExecutorHandle:
    def __init__(
        self,
        proc: asyncio.subprocess.Process,
        pid: int,
        state_dir: Path,
        *,
        isolated: bool,
        cgroup: TaskCgroup | None,
        cgroups: CgroupManager | None,
    ) -> None:
        self.proc = proc
        self.pid = pid
        self.state_dir = state_dir
        self.isolated = isolated
        self.cgroup = cgroup
        self.cgroups = cgroups
        self._killed = False
        self._pidfd: int | None = None
        with contextlib.suppress(OSError, AttributeError):
            self._pidfd = os.pidfd_open(pid)
        self._result: asyncio.Future[ExitResult] = asyncio.ensure_future(self._watch())

    @classmethod
    async def launch(
        cls,
        spec: LaunchSpec,
        *,
        cgroup: TaskCgroup | None = None,
        cgroups: CgroupManager | None = None,
    ) -> ExecutorHandle:
        state_dir = Path(spec.state_dir)
        state_dir.mkdir(parents=True, exist_ok=True)
        os.chmod(state_dir, 0o700)
        log_fd = os.open(state_dir / LOG_FILE, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            proc = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "services.agent.executor",
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=log_fd,
                env=executor_env(),
                start_new_session=True,  # it outlives the agent
            )
        finally:
            os.close(log_fd)
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write(spec.to_json().encode())
        await proc.stdin.drain()
        proc.stdin.close()
        try:
            line = await asyncio.wait_for(proc.stdout.readline(), START_TIMEOUT)
        except TimeoutError:
            proc.kill()
            await proc.wait()
            raise DriverError("the executor did not start the task in time") from None
        try:
            reply: dict[str, Any] = json.loads(line) if line else {}
        except ValueError:
            reply = {}
        if "pid" not in reply:
            await proc.wait()
            problem = reply.get("error") or _tail(state_dir / LOG_FILE) or "the executor failed"
            raise DriverError(str(problem))
        return cls(
            proc,
            int(reply["pid"]),
            state_dir,
            isolated=spec.isolation is not None,
            cgroup=cgroup,
            cgroups=cgroups,
        )

    @property
    def state(self) -> dict[str, Any]:
        return {
            "executor_pid": self.proc.pid,
            "pid": self.pid,
            "state_dir": str(self.state_dir),
            "isolated": self.isolated,
            "cgroup": self.cgroup.scope if self.cgroup is not None else "",
            "cores": list(self.cgroup.cores) if self.cgroup is not None else [],
        }

    async def _watch(self) -> ExitResult:
        await self.proc.wait()
        record = ExitRecord.read(self.state_dir)
        if record is None:
            return ExitResult(
                exit_code=-1,
                error=_tail(self.state_dir / LOG_FILE)
                or "the executor died without an exit record",
                killed=self._killed,
            )
        return ExitResult(
            exit_code=record.exit_code,
            signal=record.signal,
            killed=self._killed,
            oom_killed=record.oom_killed,
        )

    async def wait(self) -> ExitResult:
        result = await asyncio.shield(self._result)
        result.killed = result.killed or self._killed
        return result

    def _send(self, sig: int) -> None:
        """To the task: raw_exec's process group; the exec task through its
        init, which passes it on (SIGKILL ends the init and with it the
        task's whole PID namespace)."""
        with contextlib.suppress(ProcessLookupError, OSError):
            if not self.isolated:
                os.killpg(self.pid, sig)
            elif self._pidfd is not None:
                signals.pidfd_send_signal(self._pidfd, sig)
            else:
                os.kill(self.pid, sig)

    def open_pidfd(self) -> int | None:
        """A new pidfd of the process to signal (the exec task's init), for
        an exec session to enter its namespaces; None once it is gone."""
        if self._pidfd is None or self._result.done():
            return None
        return os.dup(self._pidfd)

    async def signal(self, sig: int) -> None:
        if not self._result.done():
            self._send(sig)

    async def stop(self, sig: int, timeout: float) -> None:
        if self._result.done():
            return
        self._killed = True
        self._send(sig)
        try:
            await asyncio.wait_for(asyncio.shield(self._result), timeout)
            return
        except TimeoutError:
            pass
        self._send(signals.SIGKILL)
        if self.cgroup is not None:
            await asyncio.to_thread(self.cgroup.kill_all)
        await asyncio.shield(self._result)

    def usage(self) -> Usage | None:
        if self._result.done():
            return None
        if self.cgroup is not None:
            return self.cgroup.usage()
        return process_tree_usage(self.pid)

    async def destroy(self) -> None:
        if self._pidfd is not None:
            os.close(self._pidfd)
            self._pidfd = None
        if self.cgroup is not None and self.cgroups is not None:
            cgroup, self.cgroup = self.cgroup, None
            try:
                await asyncio.to_thread(self.cgroups.remove, cgroup)
            except OSError as exc:
                log.warning("removing the cgroup of %s: %s", cgroup.scope, exc)


def _tail(path: Path, limit: int = 2000) -> str:
    try:
        return path.read_text(errors="replace")[-limit:].strip()
    except OSError:
        return ""
