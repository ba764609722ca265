"""The enabled drivers of an agent, by name."""

from __future__ import annotations

from services.agent.cgroups import CgroupManager
from services.agent.drivers.base import Driver
from services.agent.drivers.exec import ExecDriver, ExecSettings
from services.agent.drivers.mock import MockDriver
from services.agent.drivers.rawexec import RawExecDriver

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
