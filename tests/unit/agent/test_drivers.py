"""Drivers with real processes, the restart policy and alloc status."""

from __future__ import annotations

import asyncio
import signal
import time
from pathlib import Path

import pytest

from corral.testing import mock
from corral.v1 import structs_pb2 as pb
from services.agent.drivers import ExitResult, MockDriver, RawExecDriver, parse_duration
from services.agent.runner import AllocRunner, RestartTracker


def raw_task(command: str, *args: str, kill_timeout_s: float = 1.0) -> pb.Task:
    t = pb.Task(name="t", driver="raw_exec", kill_timeout=int(kill_timeout_s * 1e9))
    t.config.update({"command": command, "args": list(args)})
    return t


def task_dir(tmp_path: Path) -> Path:
    (tmp_path / "local").mkdir(parents=True, exist_ok=True)
    return tmp_path


def test_parse_duration() -> None:
    assert parse_duration("1m30s") == 90
    assert parse_duration("250ms") == 0.25
    assert parse_duration(2_000_000_000) == 2
    with pytest.raises(ValueError):
        parse_duration("soon")


async def test_raw_exec_runs_a_process_with_env_and_captures_output(tmp_path: Path) -> None:
    handle = await RawExecDriver().start(
        raw_task("/bin/sh", "-c", 'echo "$GREETING"; echo oops >&2; exit 3'),
        {"PATH": "/usr/bin:/bin", "GREETING": "hi from corral"},
        task_dir(tmp_path),
    )
    result = await handle.wait()
    assert result.exit_code == 3 and not result.killed
    assert (tmp_path / "stdout.log").read_text() == "hi from corral\n"
    assert (tmp_path / "stderr.log").read_text() == "oops\n"


async def test_raw_exec_kill_with_signal_then_sigkill_after_timeout(tmp_path: Path) -> None:
    # a child that ignores SIGTERM: the driver escalates after kill_timeout
    handle = await RawExecDriver().start(
        raw_task("/bin/sh", "-c", "trap '' TERM; sleep 30"),
        {"PATH": "/usr/bin:/bin"},
        task_dir(tmp_path),
    )
    await asyncio.sleep(0.2)
    t0 = time.monotonic()
    await handle.stop(signal.SIGTERM, 0.5)
    result = await handle.wait()
    assert result.killed and result.signal == signal.SIGKILL
    assert 0.4 < time.monotonic() - t0 < 5


async def test_mock_driver_runs_for_and_exits_with_code(tmp_path: Path) -> None:
    t = pb.Task(name="m", driver="mock")
    t.config.update({"run_for": "100ms", "exit_code": 2})
    result = await (await MockDriver().start(t, {}, task_dir(tmp_path))).wait()
    assert result.exit_code == 2


def test_restart_tracker_attempts_within_interval_then_fail() -> None:
    policy = pb.RestartPolicy(attempts=2, interval=60 * 10**9, delay=10**9, mode="fail")
    tracker = RestartTracker(policy, batch=False)
    failed = ExitResult(exit_code=1)
    assert tracker.next(failed) == 1.0
    assert tracker.next(failed) == 1.0
    assert tracker.next(failed) is None
    assert RestartTracker(policy, batch=True).next(ExitResult()) is None  # batch success is final
    delay = RestartTracker(
        pb.RestartPolicy(attempts=0, interval=5 * 10**9, mode="delay"), batch=False
    )
    assert delay.next(failed) == 5.0


async def test_alloc_runner_reports_complete_and_failed(tmp_path: Path) -> None:
    job = mock.batch_job(job_id="b", count=1)
    tg = job.task_groups[0]
    tg.restart_policy.CopyFrom(pb.RestartPolicy(attempts=0, mode="fail"))
    tg.tasks[0].config.Clear()
    tg.tasks[0].config.update({"run_for": "50ms", "exit_code": 0})
    alloc = mock.alloc(job, mock.node(), client_status="pending")
    changes: list[str] = []
    runner = AllocRunner(
        alloc, job, {"mock": MockDriver()}, tmp_path, lambda r: changes.append(r.client_status()[0])
    )
    runner.start()
    await asyncio.wait_for(runner._task, 5)  # type: ignore[arg-type]
    assert runner.client_status()[0] == "complete"
    assert "running" in changes
    update = runner.update()
    assert update.task_states["web"].state == "dead" and not update.task_states["web"].failed

    tg.tasks[0].config.update({"exit_code": 1})
    failing = AllocRunner(
        mock.alloc(job, mock.node()), job, {"mock": MockDriver()}, tmp_path, lambda r: None
    )
    failing.start()
    await asyncio.wait_for(failing._task, 5)  # type: ignore[arg-type]
    assert failing.client_status()[0] == "failed"

    missing = AllocRunner(mock.alloc(job, mock.node()), job, {}, tmp_path, lambda r: None)
    assert missing.client_status() == ("failed", "driver 'mock' is not available on this node")
