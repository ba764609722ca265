"""What a task's `config` block may hold for the drivers Corral runs
(Nomad's task config specs of `exec` and `raw_exec`), checked in one
place: by the job parser, so a wrong key is reported at its line before
anything is sent, and by the agent's drivers when a task starts (a job
registered through the API directly, and values only known after `${...}`
interpolation). Keys Nomad has and Corral does not honour are refused as
"not supported by Corral", never accepted and ignored. Other drivers'
configs (mock, drivers no node runs) are not checked here.

Also the Linux capability names tasks may add or drop, and the sets the
exec driver starts from (Nomad's `allow_caps` default and the set a task
running as root keeps).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

#: every capability the Linux kernel defines, in its numbering order
#: (include/uapi/linux/capability.h), without the CAP_ prefix
CAPABILITIES = (
    "chown", "dac_override", "dac_read_search", "fowner", "fsetid", "kill", "setgid",
    "setuid", "setpcap", "linux_immutable", "net_bind_service", "net_broadcast",
    "net_admin", "net_raw", "ipc_lock", "ipc_owner", "sys_module", "sys_rawio",
    "sys_chroot", "sys_ptrace", "sys_pacct", "sys_admin", "sys_boot", "sys_nice",
    "sys_resource", "sys_time", "sys_tty_config", "mknod", "lease", "audit_write",
    "audit_control", "setfcap", "mac_override", "mac_admin", "syslog", "wake_alarm",
    "block_suspend", "audit_read", "perfmon", "bpf", "checkpoint_restore",
)  # fmt: skip

#: what an exec task gets unless it adds or drops some (Nomad's default
#: `allow_caps`, Docker's defaults without NET_RAW)
DEFAULT_CAPABILITIES = (
    "audit_write", "chown", "dac_override", "fowner", "fsetid", "kill", "mknod",
    "net_bind_service", "setfcap", "setgid", "setpcap", "setuid", "sys_chroot",
)  # fmt: skip

#: what an exec task running as root keeps, whatever it asks (Nomad's
#: legacy set: everything up to audit_read)
ROOT_CAPABILITIES = CAPABILITIES[: CAPABILITIES.index("audit_read") + 1]

ISOLATION_MODES = ("private", "host")


def normalize_capability(name: str) -> str:
    """Nomad's spelling rules: any case, with or without CAP_."""
    lower = name.strip().lower()
    return lower[4:] if lower.startswith("cap_") else lower


def capability_set(names: Iterable[str]) -> set[str]:
    """Names as a set; "all" stands for every capability."""
    out: set[str] = set()
    for name in names:
        n = normalize_capability(name)
        if n == "all":
            out.update(CAPABILITIES)
        elif n:
            out.add(n)
    return out


class CapabilityError(ValueError):
    pass


def task_capabilities(allowed: Iterable[str], add: Iterable[str], drop: Iterable[str]) -> list[str]:
    """Nomad's capabilities.Calculate: the defaults the node allows, minus
    `drop`, plus `add` — which the node must allow."""
    allow, adds = capability_set(allowed), capability_set(add)
    missing = adds - allow
    if missing:
        raise CapabilityError(
            f"driver does not allow the following capabilities: {', '.join(sorted(missing))}"
        )
    result = (set(DEFAULT_CAPABILITIES) & allow) - capability_set(drop)
    return sorted(result | adds)


@dataclass(frozen=True)
class Option:
    kind: str  # "string" or "list(string)"
    required: bool = False


EXEC = {
    "command": Option("string", required=True),
    "args": Option("list(string)"),
    "pid_mode": Option("string"),
    "ipc_mode": Option("string"),
    "cap_add": Option("list(string)"),
    "cap_drop": Option("list(string)"),
    "work_dir": Option("string"),
}
RAW_EXEC = {
    "command": Option("string", required=True),
    "args": Option("list(string)"),
    "work_dir": Option("string"),
}
SCHEMAS: dict[str, dict[str, Option]] = {"exec": EXEC, "raw_exec": RAW_EXEC}

#: Nomad's options of these drivers that Corral does not implement
UNSUPPORTED = {
    "exec": (),
    "raw_exec": ("cgroup_v1_override", "cgroup_v2_override", "oom_score_adj", "denied_envvars"),
}


def _deferred(value: Any) -> bool:
    """A value still holding `${...}`: checked on the client, once resolved."""
    return isinstance(value, str) and "${" in value


def problems(driver: str, config: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(key, problem) for everything wrong in a driver's config; [] when fine
    or when the driver's config is not Corral's to check."""
    schema = SCHEMAS.get(driver)
    if schema is None:
        return []
    out: list[tuple[str, str]] = []
    for key, option in schema.items():
        if option.required and not config.get(key):
            out.append((key, f"the {driver} driver needs a {key}"))
    for key, value in config.items():
        given = schema.get(key)
        if given is None:
            if key in UNSUPPORTED.get(driver, ()):
                out.append((key, f"the {driver} driver option {key} is not supported by Corral"))
            else:
                expected = ", ".join(schema)
                out.append((key, f"is not an option of the {driver} driver (expected: {expected})"))
            continue
        if given.kind == "string" and not isinstance(value, str):
            out.append((key, "must be a string"))
            continue
        if given.kind == "list(string)" and not (
            isinstance(value, list) and all(isinstance(v, str) for v in value)
        ):
            out.append((key, "must be a list of strings"))
            continue
        out.extend((key, p) for p in _value_problems(key, value))
    return out


def _value_problems(key: str, value: Any) -> list[str]:
    enum = key in ("pid_mode", "ipc_mode") and value and not _deferred(value)
    if enum and value not in ISOLATION_MODES:
        return [f'must be "private" or "host", got {value!r}']
    if key in ("cap_add", "cap_drop"):
        unknown = [
            v
            for v in value
            if not _deferred(v) and normalize_capability(v) not in (*CAPABILITIES, "all")
        ]
        if unknown:
            return [f"unknown capabilities: {', '.join(unknown)}"]
    if key == "work_dir" and value and not _deferred(value) and not value.startswith("/"):
        return [f"must be absolute but got relative path {value!r}"]
    return []
