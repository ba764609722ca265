"""Task drivers (Nomad's plugins/drivers): `exec` isolates a command in
namespaces and a root of its own, `raw_exec` runs it as a plain process,
`mock` pretends. `exec` and `raw_exec` start every run through an executor
process (services/agent/executor) and hold it to its resources with a
cgroup where the agent has them (services/agent/cgroups.py)."""

from __future__ import annotations

from services.agent.cgroups import CgroupManager
from services.agent.drivers.base import (
    Driver,
    DriverError,
    ExitResult,
    TaskConfig,
    TaskHandle,
    TaskResources,
    parse_duration,
    parse_signal,
    task_config,
)
from services.agent.drivers.exec import ExecDriver, ExecSettings
from services.agent.drivers.mock import MockDriver
from services.agent.drivers.rawexec import RawExecDriver

__all__ = [
    "KNOWN",
    "Driver",
    "DriverError",
    "ExecDriver",
    "ExecSettings",
    "ExitResult",
    "MockDriver",
    "RawExecDriver",
    "TaskConfig",
    "TaskHandle",
    "TaskResources",
    "build",
    "parse_duration",
    "parse_signal",
    "task_config",
]

KNOWN = ("exec", "raw_exec", "mock")


def build(
    names: list[str], cgroups: CgroupManager, exec_settings: ExecSettings
) -> dict[str, Driver]:
    """The enabled drivers; unknown names are left out (the settings check them)."""
    out: dict[str, Driver] = {}
    for name in names:
        if name == "exec":
            out[name] = ExecDriver(exec_settings, cgroups)
        elif name == "raw_exec":
            out[name] = RawExecDriver(cgroups)
        elif name == "mock":
            out[name] = MockDriver()
    return out
