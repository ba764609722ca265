"""`raw_exec`: the command as a process of the agent's own machine, no
isolation (Nomad's raw_exec). When the agent runs as root with cgroups the
task still gets its own cgroup — memory limit, CPU shares, cores and usage
— as Nomad's raw_exec does. It mounts nothing (Nomad's raw_exec has no
mount support: a task with a volume_mount fails to set up), and `alloc
exec` runs on the host, in the task's directory, cgroup and environment,
as its user — which is why Nomad asks alloc-node-exec for it."""

from __future__ import annotations

import shutil
from typing import Any

from corral.domain import driver_config
from corral.v1 import structs_pb2 as pb
from services.agent.cgroups import CgroupManager
from services.agent.drivers.base import (
    Capabilities,
    DriverError,
    ExitResult,
    TaskConfig,
    TaskHandle,
)
from services.agent.drivers.executor_handle import ExecutorHandle, recover_executor
from services.agent.drivers.limits import create_cgroup
from services.agent.execsession import HelperSession
from services.agent.executor.session import ExecSpec
from services.agent.executor.spec import LaunchSpec


def check_config(driver: str, cfg: TaskConfig) -> None:
    """The driver config as the job parser checks it, now with `${...}` resolved."""
    problems = driver_config.problems(driver, cfg.driver_config)
    if problems:
        raise DriverError(
            "invalid driver config: " + "; ".join(f"{key}: {problem}" for key, problem in problems)
        )


class RawExecDriver:
    name = "raw_exec"
    capabilities = Capabilities(exec=True)

    def __init__(self, cgroups: CgroupManager | None = None) -> None:
        self.cgroups = cgroups

    def fingerprint(self) -> pb.DriverInfo:
        return pb.DriverInfo(detected=True, healthy=True, health_description="Healthy")

    async def start(self, cfg: TaskConfig) -> ExecutorHandle:
        check_config(self.name, cfg)
        config = cfg.driver_config
        command = str(config["command"])
        resolved = shutil.which(command, path=cfg.env.get("PATH")) or command
        cgroup = create_cgroup(self.cgroups, cfg) if self.cgroups and self.cgroups.enabled else None
        spec = LaunchSpec(
            command=resolved,
            args=[str(a) for a in config.get("args", [])],
            env=cfg.env,
            cwd=str(config.get("work_dir") or cfg.task_dir.local),
            logs=cfg.log_spec(),
            state_dir=str(cfg.state_dir),
            user=cfg.user,
            cgroup_procs=cgroup.procs_files if cgroup else [],
            oom_counters=cgroup.oom_counters if cgroup else [],
        )
        try:
            return await ExecutorHandle.launch(spec, cgroup=cgroup, cgroups=self.cgroups)
        except BaseException:
            if cgroup is not None and self.cgroups is not None:
                self.cgroups.remove(cgroup)
            raise

    async def recover(self, state: dict[str, Any]) -> ExecutorHandle | ExitResult | None:
        return await recover_executor(state, self.cgroups)

    async def exec_task(
        self, handle: TaskHandle, cfg: TaskConfig, command: list[str], tty: bool
    ) -> HelperSession:
        if not isinstance(handle, ExecutorHandle):
            raise DriverError("the task is not running under an executor")
        spec = ExecSpec(
            command=command,
            env=cfg.env,
            cwd=str(cfg.driver_config.get("work_dir") or cfg.task_dir.local),
            user=cfg.user,
            cgroup_procs=handle.cgroup.procs_files if handle.cgroup is not None else [],
            tty=tty,
        )
        return await HelperSession.start(spec, None)
