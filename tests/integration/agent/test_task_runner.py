"""The alloc and task runners with real raw_exec processes and a real
client state (issue 29, part B): Nomad's task lifecycle order, a failed
prestart task failing the alloc, the leader, shutdown_delay and the kill
timeout capped by max_kill_timeout, signals and restarts asked for, and
adopting running tasks from the client state after the agent went away
(and recording the exit of one that ended meanwhile)."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

from corral.domain import structs
from corral.testing import mock
from corral.v1 import structs_pb2 as pb
from services.agent.drivers.rawexec import RawExecDriver
from services.agent.runner import AllocRunner, TaskNotRunning
from services.agent.state_db import StateDB
from tests.wait import until

S = structs.SECOND


def sh(name: str, script: str, *, hook: str = "", sidecar: bool = False) -> pb.Task:
    t = pb.Task(name=name, driver="raw_exec", resources=pb.Resources(cpu=50, memory_mb=32))
    t.config.update({"command": "/bin/sh", "args": ["-c", script]})
    if hook:
        t.lifecycle.CopyFrom(pb.TaskLifecycleConfig(hook=hook, sidecar=sidecar))
    return t


def job(*tasks: pb.Task, kind: str = "batch", attempts: int = 0) -> pb.Job:
    j = mock.job(job_type=kind, count=1)
    tg = j.task_groups[0]
    del tg.tasks[:]
    tg.tasks.extend(tasks)
    tg.restart_policy.CopyFrom(
        pb.RestartPolicy(attempts=attempts, interval=60 * S, delay=S // 10, mode="fail")
    )
    return j


class Run:
    """An alloc runner over a client state, as the agent drives it."""

    def __init__(self, tmp: Path, j: pb.Job, *, max_kill_timeout: float = 30.0) -> None:
        self.tmp = tmp
        self.job = j
        self.db = StateDB(tmp)
        self.alloc = mock.alloc(j, mock.node(), client_status="pending")
        self.db.put_alloc(self.alloc, j)
        self.max_kill_timeout = max_kill_timeout
        self.runner = self._runner()

    def _runner(self, **kw: object) -> AllocRunner:
        return AllocRunner(
            self.alloc,
            self.job,
            {"raw_exec": RawExecDriver()},
            self.tmp,
            lambda r: None,
            db=self.db,
            max_kill_timeout=self.max_kill_timeout,
            **kw,  # type: ignore[arg-type]
        )

    def state(self, task: str) -> pb.TaskState:
        found = self.runner.task(task)
        assert found is not None
        return found.state

    def events(self, task: str) -> list[str]:
        return [e.type for e in self.state(task).events]

    def event(self, task: str, kind: str) -> pb.TaskEvent:
        return next(e for e in self.state(task).events if e.type == kind)

    def out(self, name: str) -> str:
        path = self.tmp / name
        return path.read_text() if path.exists() else ""

    async def finished(self, timeout: float = 30) -> None:
        assert self.runner._task is not None
        await asyncio.wait_for(asyncio.shield(self.runner._task), timeout)

    async def reopen(self) -> None:
        """What a restarted agent does: rebuild the runner from the client
        state and adopt its tasks."""
        self.db.close()
        self.db = StateDB(self.tmp)
        (stored,) = self.db.load()
        self.alloc = stored.alloc
        self.runner = self._runner(stored=stored)
        await self.runner.restore()
        self.runner.start()


async def test_lifecycle_order_prestart_sidecar_poststart_poststop(tmp_path: Path) -> None:
    log = tmp_path / "order"
    stamp = f"echo $NOMAD_TASK_NAME $(date +%s.%N) >> {log}"
    run = Run(
        tmp_path,
        job(
            sh("init", f"{stamp}; sleep 0.3", hook="prestart"),
            sh("proxy", f"{stamp}; exec sleep 600", hook="prestart", sidecar=True),
            sh("main", f"{stamp}; sleep 1"),
            sh("warm", stamp, hook="poststart"),
            sh("cleanup", stamp, hook="poststop"),
        ),
    )
    run.runner.start()
    await run.finished()
    order = [line.split()[0] for line in log.read_text().splitlines()]
    assert order.index("init") < order.index("main")
    assert order.index("proxy") < order.index("main")
    assert order.index("main") < order.index("warm")
    assert order[-1] == "cleanup"
    main = run.state("main")
    cleanup = run.state("cleanup")
    assert run.event("main", "Started").time >= run.state("init").finished_at
    assert cleanup.started_at >= main.finished_at >= main.started_at
    # the sidecar goes once the main tasks are done
    assert "Main Tasks Dead" in run.events("proxy")
    assert run.state("proxy").finished_at <= cleanup.started_at
    assert run.runner.client_status() == ("complete", "All tasks have completed")
    assert not any(run.state(t).failed for t in ("init", "proxy", "main", "warm", "cleanup"))


async def test_a_failed_prestart_task_fails_the_alloc(tmp_path: Path) -> None:
    run = Run(tmp_path, job(sh("init", "exit 3", hook="prestart"), sh("main", "echo ran")))
    run.runner.start()
    await run.finished()
    assert run.state("init").failed
    assert "Started" not in run.events("main")  # the main task never ran
    assert run.event("main", "Sibling Task Failed").failed_sibling == "init"
    assert run.runner.client_status()[0] == "failed"


async def test_the_leader_dying_stops_the_others(tmp_path: Path) -> None:
    leader = sh("leader", "sleep 0.5")
    leader.leader = True
    run = Run(tmp_path, job(leader, sh("helper", "exec sleep 600")))
    run.runner.start()
    await run.finished()
    assert "Leader Task Dead" in run.events("helper")
    assert run.events("helper")[-3:] == ["Killing", "Terminated", "Killed"]
    assert run.runner.client_status()[0] == "complete"


async def test_kill_timeout_is_capped_by_max_kill_timeout(tmp_path: Path) -> None:
    stubborn = sh("stubborn", "trap '' TERM; echo ready; while :; do sleep 0.1; done")
    stubborn.kill_timeout = 600 * S
    run = Run(tmp_path, job(stubborn, kind="service"), max_kill_timeout=1.0)
    run.runner.start()
    await until(lambda: run.state("stubborn").state == "running")
    await asyncio.wait_for(run.runner.stop(), 20)  # not the task's 10 minutes
    killing = run.event("stubborn", "Killing")
    assert killing.kill_timeout == S
    assert killing.display_message == "Sent interrupt. Waiting 1s before force killing"
    terminated = run.event("stubborn", "Terminated")
    assert terminated.signal == 9


async def test_shutdown_delay_waits_before_the_kill_signal(tmp_path: Path) -> None:
    got_term = tmp_path / "term"
    t = sh("web", f"trap 'date +%s.%N > {got_term}; exit 0' TERM; while :; do sleep 0.05; done")
    t.shutdown_delay = S
    j = job(t, kind="service")
    j.task_groups[0].shutdown_delay = S // 2
    run = Run(tmp_path, j)
    run.runner.start()
    await until(lambda: run.state("web").state == "running")
    asked = time.time()
    await asyncio.wait_for(run.runner.stop(), 20)
    # the group's delay, then the task's, then the signal
    assert float(got_term.read_text()) - asked >= 1.5
    waiting = run.event("web", "Waiting for shutdown delay")
    assert waiting.display_message == "Waiting for shutdown_delay of 1s before killing the task."
    kinds = run.events("web")
    assert kinds.index("Killing") < kinds.index("Waiting for shutdown delay")
    assert kinds.index("Waiting for shutdown delay") < kinds.index("Terminated")


async def test_no_shutdown_delay_skips_it(tmp_path: Path) -> None:
    t = sh("web", "exec sleep 600")
    t.shutdown_delay = 600 * S
    run = Run(tmp_path, job(t, kind="service"))
    run.alloc.desired_transition.no_shutdown_delay = True
    run.runner = run._runner()
    run.runner.start()
    await until(lambda: run.state("web").state == "running")
    await asyncio.wait_for(run.runner.stop(), 20)
    assert "Skipping shutdown delay" in run.events("web")


async def test_signal_and_restart_asked_for(tmp_path: Path) -> None:
    script = "trap 'echo got USR1' USR1; echo start $$; while :; do sleep 0.05; done"
    run = Run(tmp_path, job(sh("web", script), kind="service", attempts=0))
    run.runner.start()
    stdout = tmp_path / "allocs" / run.alloc.id / "alloc" / "logs" / "web.stdout.0"
    # the task is running once its runner holds the handle, which can be
    # after the process printed (the executor answers the start after it)
    await until(lambda: stdout.exists() and "start" in stdout.read_text())
    await until(lambda: run.state("web").state == "running")
    await run.runner.signal("web", "SIGUSR1")
    await until(lambda: "got USR1" in stdout.read_text())
    assert run.event("web", "Signaling").display_message == "Task being sent signal SIGUSR1"
    first = stdout.read_text().split()[1]
    # a restart asked for is not counted: the policy allows no restarts at all
    await asyncio.wait_for(run.runner.restart("web"), 20)
    await until(lambda: stdout.read_text().count("start") == 2)
    await until(lambda: run.state("web").state == "running")
    assert stdout.read_text().split("start ")[2].split()[0] != first
    restart = run.event("web", "Restart Signaled")
    assert restart.display_message == "User requested task to restart"
    assert run.state("web").restarts == 1 and run.state("web").state == "running"
    await asyncio.wait_for(run.runner.stop(), 20)
    try:
        await run.runner.signal("web", "SIGUSR1")
    except TaskNotRunning:
        pass
    else:
        raise AssertionError("a dead task took a signal")


async def test_restart_all_tasks_runs_the_prestart_task_again(tmp_path: Path) -> None:
    count = tmp_path / "inits"
    run = Run(
        tmp_path,
        job(
            sh("init", f"echo x >> {count}", hook="prestart"),
            sh("main", "exec sleep 600"),
            kind="service",
        ),
    )
    run.runner.start()
    await until(lambda: run.state("main").state == "running")
    await asyncio.wait_for(run.runner.restart(all_tasks=True), 20)
    await until(lambda: count.read_text().count("x") == 2)
    await until(lambda: run.state("main").state == "running")
    assert run.event("init", "Restart Signaled").display_message == (
        "User requested all tasks to restart"
    )
    await asyncio.wait_for(run.runner.stop(), 20)


async def test_a_restarted_agent_adopts_the_running_tasks(tmp_path: Path) -> None:
    script = "echo start $$; i=0; while :; do i=$((i+1)); echo tick $i; sleep 0.1; done"
    run = Run(tmp_path, job(sh("web", script), kind="service"))
    run.runner.start()
    stdout = tmp_path / "allocs" / run.alloc.id / "alloc" / "logs" / "web.stdout.0"
    await until(lambda: stdout.exists() and "tick 2" in stdout.read_text())
    pid = int(stdout.read_text().split()[1])
    await run.runner.detach()  # the agent goes away; the task does not
    ticks = stdout.read_text().count("tick")
    await until(lambda: stdout.read_text().count("tick") > ticks + 2)  # still writing
    await run.reopen()
    web = run.runner.task("web")
    assert web is not None and web.running and web._handle is not None
    assert web._handle.pid == pid and run.state("web").state == "running"
    assert run.events("web").count("Started") == 1  # nothing started twice
    assert stdout.read_text().count("start") == 1
    await asyncio.wait_for(run.runner.stop(), 20)
    assert run.events("web")[-3:] == ["Killing", "Terminated", "Killed"]
    await until(lambda: not os.path.exists(f"/proc/{pid}"))


async def test_an_exit_while_the_agent_was_away_is_recorded(tmp_path: Path) -> None:
    go = tmp_path / "go"
    run = Run(tmp_path, job(sh("web", f"while [ ! -e {go} ]; do sleep 0.05; done; exit 3")))
    run.runner.start()
    await until(lambda: run.state("web").state == "running")
    await run.runner.detach()
    go.touch()
    executor = tmp_path / "executor" / f"{run.alloc.id}.web" / "exit.json"
    await until(executor.exists)
    await run.reopen()
    await run.finished()
    terminated = run.event("web", "Terminated")
    assert terminated.exit_code == 3
    assert run.state("web").failed and run.runner.client_status()[0] == "failed"
    assert run.events("web").count("Started") == 1
    assert run.events("web")[-1] == "Not Restarting"


async def test_the_client_state_is_private(tmp_path: Path) -> None:
    StateDB(tmp_path).close()
    assert (tmp_path / "client").stat().st_mode & 0o777 == 0o700
    assert (tmp_path / "client" / "state.db").stat().st_mode & 0o777 == 0o600
