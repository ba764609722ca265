"""Drivers with real processes, the restart policy and alloc status."""

from __future__ import annotations

import asyncio
import signal
import time
from pathlib import Path

import pytest

from corral.testing import mock
from corral.v1 import structs_pb2 as pb
from services.agent.allocdir import AllocDir
from services.agent.cgroups import CgroupManager, Detected, Mounts, Version
from services.agent.cpuset import Compute
from services.agent.drivers.base import DriverError, TaskConfig, parse_duration
from services.agent.drivers.exec import ExecDriver, ExecSettings
from services.agent.drivers.mock import MockDriver
from services.agent.drivers.rawexec import RawExecDriver
from services.agent.runner import AllocRunner
from tests.wait import until


def config(tmp_path: Path, driver_config: dict[str, object], env: dict[str, str]) -> TaskConfig:
    """One run of task "t" of an alloc whose directory is under tmp_path
    (no cgroups: the drivers are built without a cgroup manager)."""
    alloc_dir = AllocDir.of(tmp_path, "a1")
    alloc_dir.build()
    task_dir = alloc_dir.task("t")
    task_dir.build()
    return TaskConfig(
        alloc_id="a1",
        name="t",
        driver_config=driver_config,
        env=env,
        task_dir=task_dir,
        state_dir=tmp_path / "executor" / "a1.t",
    )


def raw(command: str, *args: str) -> dict[str, object]:
    return {"command": command, "args": list(args)}


def test_parse_duration() -> None:
    assert parse_duration("1m30s") == 90
    assert parse_duration("250ms") == 0.25
    assert parse_duration(2_000_000_000) == 2
    with pytest.raises(ValueError):
        parse_duration("soon")


async def test_raw_exec_runs_a_process_with_env_and_captures_output(tmp_path: Path) -> None:
    cfg = config(
        tmp_path,
        raw("/bin/sh", "-c", 'echo "$GREETING"; echo oops >&2; exit 3'),
        {"PATH": "/usr/bin:/bin", "GREETING": "hi from corral"},
    )
    handle = await RawExecDriver().start(cfg)
    result = await handle.wait()
    await handle.destroy()
    assert result.exit_code == 3 and not result.killed and not result.oom_killed
    # Nomad's layout: alloc/logs/<task>.<stream>.0
    assert cfg.task_dir.log_path("stdout").read_text() == "hi from corral\n"
    assert cfg.task_dir.log_path("stderr").read_text() == "oops\n"
    assert cfg.task_dir.log_path("stdout") == tmp_path / "allocs/a1/alloc/logs/t.stdout.0"


async def test_raw_exec_kill_with_signal_then_sigkill_after_timeout(tmp_path: Path) -> None:
    # a child that ignores SIGTERM: the driver escalates after kill_timeout
    cfg = config(
        tmp_path,
        raw("/bin/sh", "-c", "trap '' TERM; echo ready; sleep 30"),
        {"PATH": "/usr/bin:/bin"},
    )
    handle = await RawExecDriver().start(cfg)
    await until(lambda: cfg.task_dir.log_path("stdout").read_text() == "ready\n")
    t0 = time.monotonic()
    await handle.stop(signal.SIGTERM, 0.5)
    result = await handle.wait()
    assert result.killed and result.signal == signal.SIGKILL
    assert result.exit_code == 128 + signal.SIGKILL  # as Nomad encodes a signal death
    assert 0.4 < time.monotonic() - t0 < 5


async def test_raw_exec_start_failures_are_reported(tmp_path: Path) -> None:
    with pytest.raises(DriverError, match="failed to execute '/no/such/binary'"):
        await RawExecDriver().start(config(tmp_path, raw("/no/such/binary"), {}))
    with pytest.raises(DriverError, match="oom_score_adj is not supported by Corral"):
        await RawExecDriver().start(
            config(tmp_path, {**raw("/bin/true"), "oom_score_adj": "5"}, {})
        )


async def test_mock_driver_runs_for_and_exits_with_code(tmp_path: Path) -> None:
    cfg = config(tmp_path, {"run_for": "100ms", "exit_code": 2}, {})
    result = await (await MockDriver().start(cfg)).wait()
    assert result.exit_code == 2


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


def test_exec_is_offered_only_where_it_works() -> None:
    off = CgroupManager(
        Detected(Version.OFF, Mounts(), reason="the agent is not root"), Compute(2000, 1)
    )
    not_root = ExecDriver(ExecSettings(), off, is_root=False).fingerprint()
    assert (not_root.detected, not_root.healthy) == (False, False)
    assert not_root.health_description == "Driver must run as root"
    no_cgroups = ExecDriver(ExecSettings(), off, is_root=True).fingerprint()
    assert (no_cgroups.detected, no_cgroups.healthy) == (True, False)
    assert "Failed to discover cgroup mount point" in no_cgroups.health_description
    assert "driver.exec" not in no_cgroups.attributes
