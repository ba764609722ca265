"""The agent's side of an executor (services/agent/executor): start one for
a task run, learn the pid to signal, wait for it, read the exit record —
or, after an agent restart, find a run again from its state directory.

The handle watches the executor process, not the task: the executor is
the task's parent and writes how the task ended before it exits. Every
process is known by its identity (pid, start time, boot), never by a bare
pid: an executor found again after a restart is the same process, or it
is not taken at all. `state` is what the client state keeps to find the
run again (Nomad's driver TaskHandle): the state directory, whether the
run is isolated, its cgroup scope and cores; the identities themselves
are in the directory's files (services/agent/executor/spec.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal as signals
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from services.agent.cgroups import CgroupManager, TaskCgroup, Usage
from services.agent.drivers.base import DriverError, ExitResult
from services.agent.executor.identity import ProcessIdentity
from services.agent.executor.spec import (
    EXECUTOR_FILE,
    HANDLE_FILE,
    LOG_FILE,
    RUN_FILES,
    TASK_FILE,
    ExitRecord,
    LaunchSpec,
    read_identity,
    read_json,
    write_identity,
    write_json,
)
from services.agent.stats import process_tree_usage

log = logging.getLogger(__name__)

#: the package root, so `python -m services.agent.executor` imports this code
_ROOT = str(Path(__file__).resolve().parents[3])
#: how long an executor may take to start its task
START_TIMEOUT = 30.0
#: how often an adopted executor is looked at where pidfds cannot be polled
_POLL_S = 0.2


def executor_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (_ROOT, env.get("PYTHONPATH", "")) if p)
    return env


class ExecutorHandle:
    def __init__(
        self,
        executor: ProcessIdentity,
        task: ProcessIdentity,
        state_dir: Path,
        *,
        isolated: bool,
        cgroup: TaskCgroup | None,
        cgroups: CgroupManager | None,
        proc: subprocess.Popen[bytes] | None = None,
    ) -> None:
        """`proc` is the executor when this agent started it (its child, to
        reap); an executor found again is watched through a pidfd."""
        self.executor = executor
        self.task = task
        self.pid = task.pid
        self.state_dir = state_dir
        self.isolated = isolated
        self.cgroup = cgroup
        self.cgroups = cgroups
        self.proc = proc
        self._killed = False
        self._pidfd = task.open()
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
        for name in RUN_FILES:  # what an earlier run left is not this one's
            (state_dir / name).unlink(missing_ok=True)
        write_json(
            state_dir / HANDLE_FILE,
            {
                "isolated": spec.isolation is not None,
                "cgroup": cgroup.scope if cgroup is not None else "",
                "cores": list(cgroup.cores) if cgroup is not None else [],
            },
        )
        log_fd = os.open(state_dir / LOG_FILE, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            # not asyncio's subprocesses: those are killed when their
            # transport closes, and an executor must outlive the agent
            proc = subprocess.Popen(
                [sys.executable, "-m", "services.agent.executor"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log_fd,
                env=executor_env(),
                start_new_session=True,
            )
        finally:
            os.close(log_fd)
        assert proc.stdin is not None and proc.stdout is not None
        # who the executor is, before it is told what to run: an agent killed
        # from here on finds it again (it cannot start anything without the spec)
        executor = write_identity(state_dir / EXECUTOR_FILE, proc.pid)
        try:
            line = await asyncio.wait_for(
                asyncio.to_thread(_converse, proc, spec.to_json().encode()), START_TIMEOUT
            )
        except TimeoutError:
            proc.kill()
            await asyncio.to_thread(proc.wait)
            raise DriverError("the executor did not start the task in time") from None
        try:
            reply: dict[str, Any] = json.loads(line) if line else {}
        except ValueError:
            reply = {}
        task = read_identity(state_dir / TASK_FILE)
        if "pid" not in reply or task is None or executor is None:
            await asyncio.to_thread(proc.wait)
            problem = reply.get("error") or _tail(state_dir / LOG_FILE) or "the executor failed"
            raise DriverError(str(problem))
        return cls(
            executor,
            task,
            state_dir,
            isolated=spec.isolation is not None,
            cgroup=cgroup,
            cgroups=cgroups,
            proc=proc,
        )

    @classmethod
    async def reattach(
        cls,
        state_dir: Path,
        *,
        isolated: bool,
        cgroup: TaskCgroup | None,
        cgroups: CgroupManager | None,
    ) -> ExecutorHandle | ExitResult | None:
        """The run recorded in `state_dir`, after an agent restart: a handle
        on its executor when that still runs; how the task ended when it
        ended meanwhile; None when no task was ever started there (the
        agent died before the executor got its spec)."""
        executor = read_identity(state_dir / EXECUTOR_FILE)
        task = read_identity(state_dir / TASK_FILE)
        if executor is not None and executor.alive() and task is None:
            # killed halfway through a launch: the executor may still be
            # starting the task (or failing for want of a whole spec)
            deadline = time.monotonic() + START_TIMEOUT
            while executor.alive() and task is None and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
                task = read_identity(state_dir / TASK_FILE)
        if executor is not None and task is not None and executor.alive():
            return cls(executor, task, state_dir, isolated=isolated, cgroup=cgroup, cgroups=cgroups)
        if task is None:
            if executor is not None and executor.alive():
                with contextlib.suppress(ProcessLookupError, OSError):
                    os.kill(executor.pid, signals.SIGKILL)  # stuck before starting anything
            return None
        return _exit_result(state_dir, killed=False)

    @property
    def state(self) -> dict[str, Any]:
        return {
            "state_dir": str(self.state_dir),
            "isolated": self.isolated,
            "cgroup": self.cgroup.scope if self.cgroup is not None else "",
            "cores": list(self.cgroup.cores) if self.cgroup is not None else [],
            "executor": self.executor.dump(),
            "task": self.task.dump(),
        }

    async def _watch(self) -> ExitResult:
        await _exited(self.executor)
        if self.proc is not None:
            await asyncio.to_thread(self.proc.wait)  # our child: reap it
        return _exit_result(self.state_dir, killed=self._killed)

    async def wait(self) -> ExitResult:
        result = await asyncio.shield(self._result)
        result.killed = result.killed or self._killed
        return result

    def _send(self, sig: int) -> None:
        """To the task: raw_exec's process group; the exec task through its
        init, which passes it on (SIGKILL ends the init and with it the
        task's whole PID namespace). Only while it is the same process."""
        if self._result.done() or not self.task.alive():
            return
        with contextlib.suppress(ProcessLookupError, OSError):
            if not self.isolated:
                os.killpg(self.pid, sig)
            elif self._pidfd is not None:
                signals.pidfd_send_signal(self._pidfd, sig)

    def open_pidfd(self) -> int | None:
        """A new pidfd of the process to signal (the exec task's init), for
        an exec session to enter its namespaces; None once it is gone."""
        if self._pidfd is None or self._result.done():
            return None
        return os.dup(self._pidfd)

    async def signal(self, sig: int) -> None:
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


async def recover_executor(
    state: dict[str, Any], cgroups: CgroupManager | None
) -> ExecutorHandle | ExitResult | None:
    """exec's and raw_exec's RecoverTask: the run of a handle's `state`,
    with its cgroup (and reserved cores) taken back by the cgroup manager."""
    try:
        state_dir = Path(str(state["state_dir"]))
    except KeyError:
        return None
    # what the launch recorded beside the executor (a launch the agent did
    # not live to record in its own state still has it)
    state = {**state, **(read_json(state_dir / HANDLE_FILE) or {})}
    scope = str(state.get("cgroup") or "")
    cores = [int(c) for c in state.get("cores") or []]
    cgroup = (
        cgroups.adopt(scope, cores) if scope and cgroups is not None and cgroups.enabled else None
    )
    found = await ExecutorHandle.reattach(
        state_dir, isolated=bool(state.get("isolated")), cgroup=cgroup, cgroups=cgroups
    )
    if not isinstance(found, ExecutorHandle) and cgroup is not None and cgroups is not None:
        await asyncio.to_thread(cgroups.remove, cgroup)  # the run is over: clean up after it
    return found


async def _exited(process: ProcessIdentity) -> None:
    """Until a process that is not our child has exited."""
    fd = process.open()
    if fd is None:
        return
    loop = asyncio.get_running_loop()
    done = loop.create_future()

    def exited() -> None:
        if not done.done():
            done.set_result(None)

    try:
        loop.add_reader(fd, exited)
    except (OSError, ValueError, NotImplementedError):
        os.close(fd)
        while process.alive():
            await asyncio.sleep(_POLL_S)
        return
    try:
        await done
    finally:
        loop.remove_reader(fd)
        os.close(fd)


def _converse(proc: subprocess.Popen[bytes], spec: bytes) -> bytes:
    """Send the spec, read the one-line answer (in a thread: both block)."""
    assert proc.stdin is not None and proc.stdout is not None
    try:
        proc.stdin.write(spec)
        proc.stdin.close()
    except BrokenPipeError:
        pass  # it died at once; its log says why
    answer = proc.stdout.readline()
    proc.stdout.close()
    return answer


def _exit_result(state_dir: Path, *, killed: bool) -> ExitResult:
    record = ExitRecord.read(state_dir)
    if record is None:
        return ExitResult(
            exit_code=-1,
            error=_tail(state_dir / LOG_FILE) or "the executor died without an exit record",
            killed=killed,
        )
    return ExitResult(
        exit_code=record.exit_code,
        signal=record.signal,
        killed=killed,
        oom_killed=record.oom_killed,
        finished_at=record.finished_at,
    )


def _tail(path: Path, limit: int = 2000) -> str:
    try:
        return path.read_text(errors="replace")[-limit:].strip()
    except OSError:
        return ""
