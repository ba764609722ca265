"""`exec`: the command isolated as Nomad's exec driver runs it — in PID,
mount, IPC and UTS namespaces of its own, with the task directory as its
root (the host's system directories bound read-only into it, Nomad's
`chroot_env`), as `nobody` unless the task's `user` says otherwise, with
Nomad's default capability set, and held to its resources by a cgroup.

The driver is offered only where it works: the agent runs as root, the
cgroups are usable and the namespaces can be made (a probe at start-up).
"""

from __future__ import annotations

import logging
import os
import platform
import pwd
import re
import subprocess
import sys
from dataclasses import dataclass, field
from typing import Any

from corral.domain import driver_config
from corral.domain.driver_config import CapabilityError
from corral.v1 import structs_pb2 as pb
from services.agent import allocdir
from services.agent.cgroups import CgroupManager
from services.agent.drivers.base import (
    FS_CHROOT,
    Capabilities,
    DriverError,
    ExitResult,
    TaskConfig,
    TaskHandle,
)
from services.agent.drivers.executor_handle import ExecutorHandle, executor_env, recover_executor
from services.agent.drivers.limits import create_cgroup
from services.agent.drivers.rawexec import check_config
from services.agent.execsession import HelperSession
from services.agent.executor.session import ExecSpec
from services.agent.executor.spec import Bind, Isolation, LaunchSpec

log = logging.getLogger(__name__)

#: Nomad's default chroot_env: host path -> path inside the task's root
DEFAULT_CHROOT_ENV = {
    "/bin": "/bin",
    "/etc": "/etc",
    "/lib": "/lib",
    "/lib32": "/lib32",
    "/lib64": "/lib64",
    "/run/resolvconf": "/run/resolvconf",
    "/run/systemd/resolve": "/run/systemd/resolve",
    "/sbin": "/sbin",
    "/usr": "/usr",
}
DEFAULT_USER = "nobody"
_HOSTNAME = re.compile(r"[^a-z0-9-]+")


@dataclass(frozen=True)
class ExecSettings:
    """The driver's agent configuration (Nomad's exec plugin config and
    the client's chroot_env)."""

    chroot_env: dict[str, str] = field(default_factory=lambda: dict(DEFAULT_CHROOT_ENV))
    default_pid_mode: str = "private"
    default_ipc_mode: str = "private"
    allow_caps: tuple[str, ...] = driver_config.DEFAULT_CAPABILITIES
    no_pivot_root: bool = False


def hostname(task: str, alloc_id: str) -> str:
    """The task's own host name: `<task>-<short alloc id>`, as DNS allows."""
    name = _HOSTNAME.sub("-", f"{task}-{alloc_id[:8]}".lower()).strip("-")
    return name[:63].rstrip("-") or alloc_id[:8]


def probe_namespaces() -> str:
    """'' when this node can make the exec driver's namespaces, else why not."""
    try:
        done = subprocess.run(
            [sys.executable, "-m", "services.agent.executor", "--probe"],
            capture_output=True,
            text=True,
            timeout=30,
            env=executor_env(),
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"namespace probe failed: {exc}"
    if done.returncode != 0:
        return f"cannot create namespaces: {done.stderr.strip() or done.returncode}"
    return ""


class ExecDriver:
    name = "exec"
    capabilities = Capabilities(exec=True, fs_isolation=FS_CHROOT, mounts=True)

    def __init__(
        self, settings: ExecSettings, cgroups: CgroupManager, *, is_root: bool | None = None
    ) -> None:
        self.settings = settings
        self.cgroups = cgroups
        self._info = self._detect(os.geteuid() == 0 if is_root is None else is_root)

    def _detect(self, is_root: bool) -> pb.DriverInfo:
        if platform.system() != "Linux":
            return pb.DriverInfo(
                detected=False, health_description="exec driver unsupported on client OS"
            )
        if not is_root:
            return pb.DriverInfo(detected=False, health_description="Driver must run as root")
        if not self.cgroups.enabled:
            why = self.cgroups.detected.reason
            return pb.DriverInfo(
                detected=True,
                healthy=False,
                health_description=f"Failed to discover cgroup mount point ({why})",
            )
        problem = probe_namespaces()
        if problem:
            return pb.DriverInfo(detected=True, healthy=False, health_description=problem)
        return pb.DriverInfo(
            detected=True,
            healthy=True,
            health_description="Healthy",
            attributes={"driver.exec": "true"},
        )

    def fingerprint(self) -> pb.DriverInfo:
        return self._info

    def _capabilities(self, user: str, config: dict[str, object]) -> list[str]:
        if user == "root":
            return list(driver_config.ROOT_CAPABILITIES)
        try:
            return driver_config.task_capabilities(
                self.settings.allow_caps,
                _strings(config.get("cap_add")),
                _strings(config.get("cap_drop")),
            )
        except CapabilityError as exc:
            raise DriverError(str(exc)) from None

    async def start(self, cfg: TaskConfig) -> ExecutorHandle:
        if not self._info.healthy:
            raise DriverError(
                f"the exec driver is not usable here: {self._info.health_description}"
            )
        check_config(self.name, cfg)
        config = cfg.driver_config
        user, env = _user_env(cfg)
        td = cfg.task_dir
        binds = [Bind(src, dst) for src, dst in sorted(self.settings.chroot_env.items())]
        binds.append(Bind(str(td.alloc_dir), allocdir.CHROOT_ALLOC_DIR, readonly=False))
        binds.append(Bind(str(td.alloc_dir / allocdir.LOGS), f"{allocdir.CHROOT_ALLOC_DIR}/logs"))
        # host volumes last: a volume may be mounted under /alloc too
        binds.extend(Bind(m.host_path, m.task_path, readonly=m.read_only) for m in cfg.mounts)
        isolation = Isolation(
            root=str(td.dir),
            hostname=hostname(cfg.name, cfg.alloc_id),
            binds=binds,
            pid_namespace=(config.get("pid_mode") or self.settings.default_pid_mode) == "private",
            ipc_namespace=(config.get("ipc_mode") or self.settings.default_ipc_mode) == "private",
            pivot_root=not self.settings.no_pivot_root,
        )
        capabilities = self._capabilities(user, config)
        cgroup = create_cgroup(self.cgroups, cfg)
        spec = LaunchSpec(
            command=str(config["command"]),
            args=[str(a) for a in _strings(config.get("args"))],
            env=env,
            cwd=str(config.get("work_dir") or "/"),
            logs=cfg.log_spec(),
            state_dir=str(cfg.state_dir),
            user=user,
            capabilities=capabilities,
            cgroup_procs=cgroup.procs_files,
            oom_counters=cgroup.oom_counters,
            isolation=isolation,
        )
        try:
            return await ExecutorHandle.launch(spec, cgroup=cgroup, cgroups=self.cgroups)
        except BaseException:
            self.cgroups.remove(cgroup)
            raise

    async def recover(self, state: dict[str, Any]) -> ExecutorHandle | ExitResult | None:
        return await recover_executor(state, self.cgroups)

    async def exec_task(
        self, handle: TaskHandle, cfg: TaskConfig, command: list[str], tty: bool
    ) -> HelperSession:
        """The command inside the task's namespaces and root, as its user,
        with its capabilities, environment and cgroups (Nomad's exec driver
        runs it in the task's container the same way)."""
        if not isinstance(handle, ExecutorHandle) or not handle.isolated:
            raise DriverError("the task is not running in an isolated executor")
        user, env = _user_env(cfg)
        spec = ExecSpec(
            command=command,
            env=env,
            cwd=str(cfg.driver_config.get("work_dir") or "/"),
            user=user,
            capabilities=self._capabilities(user, cfg.driver_config),
            cgroup_procs=handle.cgroup.procs_files if handle.cgroup is not None else [],
            tty=tty,
            isolated=True,
            target_pid=handle.pid,
        )
        pidfd = handle.open_pidfd()
        if pidfd is None:
            raise DriverError("the task is not running")
        try:
            return await HelperSession.start(spec, pidfd)
        finally:
            os.close(pidfd)


def _user_env(cfg: TaskConfig) -> tuple[str, dict[str, str]]:
    """The task's user and its environment: USER, LOGNAME and HOME from the
    user's passwd entry."""
    user = cfg.user or DEFAULT_USER
    try:
        entry = pwd.getpwnam(user)
    except KeyError:
        raise DriverError(f"user {user!r} not found on this node") from None
    return user, {
        **cfg.env,
        "USER": entry.pw_name,
        "LOGNAME": entry.pw_name,
        "HOME": entry.pw_dir,
    }


def _strings(value: object) -> list[str]:
    return [str(v) for v in value] if isinstance(value, list) else []
