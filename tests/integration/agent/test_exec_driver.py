"""The exec and raw_exec drivers on the real kernel, without a cluster: the
executor process, namespaces, the task's root, its user and capabilities,
signals through the task's init, the kill escalation, cgroups (v1 here)
and their removal, reserved cores."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from corral.domain import driver_config
from services.agent.allocdir import AllocDir
from services.agent.cgroups import CgroupManager, detect
from services.agent.cpuset import Compute, parse_cpus
from services.agent.drivers.base import DriverError, TaskConfig, TaskResources
from services.agent.drivers.exec import ExecDriver, ExecSettings
from services.agent.drivers.executor_handle import ExecutorHandle
from services.agent.drivers.rawexec import RawExecDriver
from tests.cgroup_parent import V1_ROOT, new_parent, remove_parent, v1_available
from tests.wait import until

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="the exec driver needs root"),
    pytest.mark.skipif(not v1_available(), reason="cgroup v1 hierarchies (as here and in CI)"),
]

ALLOC = "5e3c0d1a-7f7e-4f8e-9d2a-1b1c0e6a0001"
PATH = "/usr/local/bin:/usr/bin:/bin"


@pytest.fixture(scope="module")
def parent() -> Iterator[str]:
    name = new_parent("driver")
    try:
        yield name
    finally:
        remove_parent(name)


@pytest.fixture(scope="module")
def cgroups(parent: str) -> CgroupManager:
    manager = CgroupManager(detect(), Compute(4000, 2), parent)
    manager.init()
    return manager


def cgroup(parent: str, controller: str, task: str) -> Path:
    return V1_ROOT / controller / parent / f"{ALLOC}.{task}"


def task(tmp_path: Path, name: str, config: dict[str, object], **kw: object) -> TaskConfig:
    alloc_dir = AllocDir.of(tmp_path, ALLOC)
    alloc_dir.build()
    td = alloc_dir.task(name)
    td.build()
    return TaskConfig(
        alloc_id=ALLOC,
        name=name,
        driver_config=config,
        env={"PATH": PATH, "NOMAD_TASK_DIR": "/local"},
        task_dir=td,
        state_dir=tmp_path / "executor" / name,
        resources=kw.pop("resources", TaskResources(cpu_mhz=100, memory_mb=64)),  # type: ignore[arg-type]
        **kw,  # type: ignore[arg-type]
    )


def sh(script: str, **extra: object) -> dict[str, object]:
    return {"command": "/bin/sh", "args": ["-c", script], **extra}


async def run(driver: ExecDriver | RawExecDriver, cfg: TaskConfig) -> tuple[int, str]:
    handle = await driver.start(cfg)
    result = await handle.wait()
    await handle.destroy()
    return result.exit_code, cfg.task_dir.log_path("stdout").read_text()


def capability_mask(names: list[str] | tuple[str, ...]) -> int:
    numbers = {n: i for i, n in enumerate(driver_config.CAPABILITIES)}
    return sum(1 << numbers[n] for n in names)


def caps(output: str, which: str) -> int:
    line = next(x for x in output.splitlines() if x.startswith(f"Cap{which}:"))
    return int(line.split()[1], 16)


async def test_user_capabilities_and_root(tmp_path: Path, cgroups: CgroupManager) -> None:
    driver = ExecDriver(ExecSettings(), cgroups)
    script = "id -un; grep ^Cap /proc/self/status; ls /"
    code, out = await run(driver, task(tmp_path, "plain", sh(script)))
    assert code == 0 and out.splitlines()[0] == "nobody", out
    defaults = capability_mask(driver_config.DEFAULT_CAPABILITIES)
    assert caps(out, "Eff") == caps(out, "Bnd") == caps(out, "Amb") == defaults
    assert "executor" not in out  # the executor's state is outside the task's root

    cfg = task(tmp_path, "narrow", sh(script, cap_drop=["all"], cap_add=["CAP_CHOWN"]))
    code, out = await run(driver, cfg)
    assert caps(out, "Eff") == caps(out, "Bnd") == 1  # chown is capability 0

    code, out = await run(driver, task(tmp_path, "root", sh(script), user="root"))
    assert out.splitlines()[0] == "root"
    # Nomad's set for root, within what this process may hold at all
    ours = caps(Path("/proc/self/status").read_text(), "Bnd")
    assert caps(out, "Bnd") == capability_mask(driver_config.ROOT_CAPABILITIES) & ours

    with pytest.raises(DriverError, match="does not allow the following capabilities: net_raw"):
        await driver.start(task(tmp_path, "raw", sh("true", cap_add=["net_raw"])))
    with pytest.raises(DriverError, match="user 'no-such-user' not found"):
        await driver.start(task(tmp_path, "who", sh("true"), user="no-such-user"))


async def test_pid_mode_host_and_work_dir(tmp_path: Path, cgroups: CgroupManager) -> None:
    driver = ExecDriver(ExecSettings(), cgroups)
    cfg = task(tmp_path, "hostpid", sh("echo $PPID; pwd", pid_mode="host", work_dir="/local"))
    code, out = await run(driver, cfg)
    ppid, cwd = out.split()
    assert int(ppid) > 1 and cwd == "/local"  # init's host pid: the host's PID namespace


async def test_a_missing_command_fails_the_start_and_leaves_no_cgroup(
    tmp_path: Path, cgroups: CgroupManager, parent: str
) -> None:
    driver = ExecDriver(ExecSettings(), cgroups)
    with pytest.raises(DriverError, match="failed to execute '/no/such': No such file"):
        await driver.start(task(tmp_path, "missing", {"command": "/no/such"}))
    assert not cgroup(parent, "memory", "missing").exists()


async def test_signals_reach_the_task_through_its_init(
    tmp_path: Path, cgroups: CgroupManager
) -> None:
    driver = ExecDriver(ExecSettings(), cgroups)
    cfg = task(
        tmp_path,
        "trapper",
        sh('trap "echo got TERM; exit 7" TERM; echo ready; while :; do sleep 0.1; done'),
    )
    handle = await driver.start(cfg)
    await until(lambda: cfg.task_dir.log_path("stdout").read_text() == "ready\n")
    await handle.stop(signal.SIGTERM, 10)
    result = await handle.wait()
    await handle.destroy()
    assert (result.exit_code, result.signal, result.killed) == (7, 0, True)
    assert cfg.task_dir.log_path("stdout").read_text() == "ready\ngot TERM\n"


async def test_a_task_ignoring_its_signal_is_killed_with_everything_it_started(
    tmp_path: Path, cgroups: CgroupManager
) -> None:
    driver = ExecDriver(ExecSettings(), cgroups)
    cfg = task(tmp_path, "stubborn", sh("trap '' TERM; sleep 1000 & echo ready; wait"))
    handle = await driver.start(cfg)
    assert isinstance(handle, ExecutorHandle) and handle.cgroup is not None
    await until(lambda: cfg.task_dir.log_path("stdout").read_text() == "ready\n")
    group = handle.cgroup
    procs = await until(lambda: len(group.pids()) >= 2 and group.pids())
    await handle.stop(signal.SIGTERM, 0.5)
    result = await handle.wait()
    await handle.destroy()
    assert (result.exit_code, result.signal) == (137, 9)
    # the shell and its sleep: the whole PID namespace is gone
    await until(lambda: not any(Path(f"/proc/{pid}").exists() for pid in procs), timeout=10)


async def test_reserved_cores_are_the_tasks_alone(
    tmp_path: Path, cgroups: CgroupManager, parent: str
) -> None:
    driver = ExecDriver(ExecSettings(), cgroups)
    cfg = task(
        tmp_path,
        "pinned",
        sh("grep Cpus_allowed_list /proc/self/status; sleep 1000"),
        resources=TaskResources(cores=1, memory_mb=32),
    )
    handle = await driver.start(cfg)
    try:
        await until(lambda: "Cpus_allowed_list" in cfg.task_dir.log_path("stdout").read_text())
        allowed = parse_cpus(cfg.task_dir.log_path("stdout").read_text().split()[-1])
        assert allowed == [cgroups.partition.usable[0]]
        share = V1_ROOT / "cpuset" / parent / "share" / "cpuset.cpus"
        assert parse_cpus(share.read_text()) == cgroups.partition.usable[1:]
        # as Nomad: shares for the reserved core's MHz
        assert (cgroup(parent, "cpu", "pinned") / "cpu.shares").read_text().strip() == "2000"
    finally:
        await handle.stop(signal.SIGTERM, 1)
        await handle.destroy()
    assert parse_cpus(share.read_text()) == cgroups.partition.usable


async def test_raw_exec_in_a_cgroup_leaves_no_process_behind(
    tmp_path: Path, cgroups: CgroupManager, parent: str
) -> None:
    driver = RawExecDriver(cgroups)
    cfg = task(tmp_path, "raw", sh("setsid sleep 1000 & echo $!"))
    handle = await driver.start(cfg)
    result = await handle.wait()
    escaped = int(await until(lambda: cfg.task_dir.log_path("stdout").read_text().strip()))
    assert result.exit_code == 0 and Path(f"/proc/{escaped}").exists()  # outside its group
    await handle.destroy()
    await until(lambda: not Path(f"/proc/{escaped}").exists(), timeout=10)
    assert not cgroup(parent, "memory", "raw").exists()


async def test_memory_max_is_the_hard_limit_and_memory_the_soft_one(
    tmp_path: Path, cgroups: CgroupManager, parent: str
) -> None:
    cfg = task(
        tmp_path,
        "oversub",
        sh("sleep 1000"),
        resources=TaskResources(cpu_mhz=100, memory_mb=32, memory_max_mb=96),
    )
    handle = await RawExecDriver(cgroups).start(cfg)
    try:
        mem = cgroup(parent, "memory", "oversub")
        assert int((mem / "memory.limit_in_bytes").read_text()) == 96 << 20
        assert int((mem / "memory.soft_limit_in_bytes").read_text()) == 32 << 20
    finally:
        await handle.stop(signal.SIGTERM, 1)
        await handle.destroy()
