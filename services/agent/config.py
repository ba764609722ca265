"""The client agent's settings (`python -m services.agent`)."""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, ClassVar, Literal

from pydantic import AfterValidator, Field

from corral.domain import driver_config
from corral.runtime.settings import CommaList, KeyValues, Option, ServerSettings, StateAddr
from services.agent.drivers.exec import DEFAULT_CHROOT_ENV, ExecSettings
from services.agent.template_data import Retry

DRIVERS = ("exec", "raw_exec", "mock")


def _known_drivers(names: list[str]) -> list[str]:
    unknown = [n for n in names if n not in DRIVERS]
    if unknown:
        raise ValueError(f"unknown drivers {', '.join(unknown)} (known: {', '.join(DRIVERS)})")
    return names


def _known_capabilities(names: list[str]) -> list[str]:
    unknown = [
        n
        for n in names
        if driver_config.normalize_capability(n) not in (*driver_config.CAPABILITIES, "all")
    ]
    if unknown:
        raise ValueError(f"unknown capabilities {', '.join(unknown)}")
    return names


def _host_volumes(volumes: dict[str, str]) -> dict[str, str]:
    for name, spec in volumes.items():
        volume = HostVolume.parse(name, spec)
        if not os.path.exists(volume.path):
            raise ValueError(f"host volume {name!r}: {volume.path} does not exist")
    return volumes


def _absolute_dirs(paths: list[str]) -> list[str]:
    for path in paths:
        if not path.startswith("/"):
            raise ValueError(f"{path}: must be an absolute path")
    return paths


@dataclass(frozen=True)
class HostVolume:
    """One `--host-volume name=path[:ro]` (Nomad's client `host_volume
    "name" { path, read_only }`)."""

    name: str
    path: str
    read_only: bool = False

    @classmethod
    def parse(cls, name: str, spec: str) -> HostVolume:
        path, read_only = spec, False
        for suffix, ro in ((":ro", True), (":rw", False)):
            if spec.endswith(suffix):
                path, read_only = spec[: -len(suffix)], ro
                break
        if not name or "/" in name:
            raise ValueError(f"host volume name {name!r} must be non-empty without '/'")
        if not path.startswith("/"):
            raise ValueError(f"host volume {name!r}: {path!r} must be an absolute path")
        return cls(name, os.path.normpath(path), read_only)


def _absolute_paths(paths: dict[str, str]) -> dict[str, str]:
    for host, inside in paths.items():
        if not host.startswith("/") or not inside.startswith("/"):
            raise ValueError(f"{host}={inside}: both paths must be absolute")
    return paths


class AgentSettings(ServerSettings):
    """A client node: what it offers the cluster and where it keeps its allocations."""

    ROLE: ClassVar[str] = "agent"

    state_addr: StateAddr
    data_dir: Annotated[Path, AfterValidator(Path.resolve)] = Field(
        Path(".corral/agent"),
        validate_default=True,
        description="alloc directories, the node's identity (client.json) and the client "
        "state the tasks are adopted from after a restart (client/state.db)",
    )
    datacenter: str = Field("dc1", min_length=1, description="the node's datacenter")
    node_class: str = Field("", description="the node's class")
    node_pool: str = Field("default", min_length=1, description="the node's pool")
    name: Annotated[str, Option(env="CORRAL_AGENT_NODE_NAME", shown_default="the host name")] = (
        Field(default_factory=socket.gethostname, min_length=1, description="node name")
    )
    meta: KeyValues = Field(
        default_factory=dict, description="node meta key=value (repeat the flag for more)"
    )
    drivers: Annotated[CommaList, AfterValidator(_known_drivers)] = Field(
        default_factory=lambda: [d for d in DRIVERS if d != "raw_exec"],
        description="enabled task drivers (exec, raw_exec, mock); raw_exec only when named "
        "(it runs tasks as the agent's own user, without isolation: off unless configured, "
        "as in Nomad; `corral dev` turns it on); a driver that cannot work on this node "
        "(exec without root, cgroups or namespaces) is reported unhealthy and gets nothing "
        "placed",
    )
    update_interval: float = Field(
        0.2, gt=0, description="seconds alloc status updates are batched (Nomad's allocSyncIntv)"
    )
    gc_max_allocs: int = Field(
        50,
        ge=1,
        description="allocs the agent keeps before it destroys finished ones (their directories "
        "and client state), oldest first, once the servers know they finished "
        "(Nomad's gc_max_allocs)",
    )
    gc_interval: float = Field(
        60.0,
        gt=0,
        description="seconds between the agent's garbage collections of finished allocs "
        "(Nomad's gc_interval)",
    )
    gc_disk_usage_threshold: float = Field(
        80.0,
        ge=0,
        le=100,
        description="disk usage (percent) of the data dir's file system above which the agent "
        "destroys finished allocs, oldest first, until it is below (Nomad's "
        "gc_disk_usage_threshold)",
    )
    gc_inode_usage_threshold: float = Field(
        70.0,
        ge=0,
        le=100,
        description="inode usage (percent) of the data dir's file system above which the agent "
        "destroys finished allocs, oldest first (Nomad's gc_inode_usage_threshold)",
    )
    max_kill_timeout: float = Field(
        30.0,
        gt=0,
        description="seconds: the longest a task's kill_timeout may make the agent wait before "
        "it force kills the task (Nomad's max_kill_timeout)",
    )
    stop_tasks_on_shutdown: bool = Field(
        False,
        description="stop every task when the agent stops (corral dev does); otherwise they keep "
        "running and the next agent with this data dir adopts them, as Nomad's client does",
    )
    reserved_memory_mb: int = Field(256, ge=0, description="memory (MB) kept from allocations")
    reserved_cpu: int = Field(100, ge=0, description="CPU (MHz) kept from allocations")
    stats_interval: float = Field(
        1.0,
        gt=0,
        description="seconds between resource usage samples of the host and the running tasks "
        "(Nomad's telemetry collection_interval)",
    )
    cgroup_version: Literal["auto", "v1", "v2", "off"] = Field(
        "auto",
        description="cgroup version for task limits: auto detects it at start-up (v2 where "
        "/sys/fs/cgroup is cgroup2 with the cpu, cpuset and memory controllers, else v1); off "
        "runs tasks without limits (and without the exec driver)",
    )
    cgroup_parent: Annotated[str, Option(shown_default="corral (v1), corral.slice (v2)")] = Field(
        "",
        description="the cgroup under which task cgroups are made (Nomad's cgroup_parent); one "
        "agent per parent",
    )
    chroot_env: Annotated[KeyValues, AfterValidator(_absolute_paths)] = Field(
        default_factory=lambda: dict(DEFAULT_CHROOT_ENV),
        description="host path=path in the task's root: bound read-only into every exec task "
        "(Nomad's chroot_env; giving the flag replaces the whole default)",
    )
    exec_default_pid_mode: Literal["private", "host"] = Field(
        "private", description="exec tasks' PID namespace unless their pid_mode says otherwise"
    )
    exec_default_ipc_mode: Literal["private", "host"] = Field(
        "private", description="exec tasks' IPC namespace unless their ipc_mode says otherwise"
    )
    exec_allow_caps: Annotated[CommaList, AfterValidator(_known_capabilities)] = Field(
        default_factory=lambda: list(driver_config.DEFAULT_CAPABILITIES),
        description="capabilities exec tasks may have (Nomad's allow_caps): their default set "
        "within it, and the only ones cap_add may ask for",
    )
    exec_no_pivot_root: bool = Field(
        False, description="enter exec tasks' roots with chroot instead of pivot_root"
    )
    host_volume: Annotated[KeyValues, AfterValidator(_host_volumes)] = Field(
        default_factory=dict,
        description="a host directory offered to jobs as a host volume: name=path, or "
        "name=path:ro for a read-only one (Nomad's client host_volume block; repeat the flag "
        "for more). The path must exist",
    )
    disable_remote_exec: bool = Field(
        False, description="refuse alloc exec into this node's tasks (Nomad's disable_remote_exec)"
    )
    artifact_http_read_timeout: float = Field(
        1800.0,
        gt=0,
        description="seconds an artifact download may wait for data before it fails "
        "(Nomad's artifact http_read_timeout)",
    )
    artifact_http_max_size_mb: int = Field(
        100 * 1024,
        gt=0,
        description="the largest artifact download, in MB (Nomad's http_max_size)",
    )
    artifact_decompression_size_limit_mb: int = Field(
        100 * 1024,
        gt=0,
        description="the most an artifact archive may unpack to, in MB (Nomad's "
        "decompression_size_limit)",
    )
    artifact_decompression_file_count_limit: int = Field(
        4096,
        gt=0,
        description="the most files an artifact archive may hold (Nomad's "
        "decompression_file_count_limit)",
    )
    artifact_file_dirs: Annotated[CommaList, AfterValidator(_absolute_dirs)] = Field(
        default_factory=list,
        description="host directories file:: artifact sources may be read from (none by "
        "default: Nomad fetches no local files, a job could otherwise copy any file of the "
        "node)",
    )

    def host_volumes(self) -> list[HostVolume]:
        return [HostVolume.parse(n, spec) for n, spec in sorted(self.host_volume.items())]

    gateway_addr: str = Field(
        "",
        pattern=r"^(https?://\S+)?$",
        description="the HTTP API (a gateway's http(s)://host:port) each task's Task API socket "
        "(secrets/api.sock) proxies to; empty: tasks get no Task API socket",
    )
    template_retry_attempts: int = Field(
        12,
        ge=0,
        description="times a template's failing query is retried before its task fails (0: "
        "forever; Nomad's template nomad_retry attempts)",
    )
    template_retry_backoff: float = Field(
        0.25, gt=0, description="seconds before the first retry of a template's query, doubling"
    )
    template_retry_max_backoff: float = Field(
        60.0, gt=0, description="the longest wait between retries of a template's query"
    )

    def template_retry(self) -> Retry:
        return Retry(
            attempts=self.template_retry_attempts,
            backoff=self.template_retry_backoff,
            max_backoff=self.template_retry_max_backoff,
        )

    def exec_settings(self) -> ExecSettings:
        return ExecSettings(
            chroot_env=dict(self.chroot_env),
            default_pid_mode=self.exec_default_pid_mode,
            default_ipc_mode=self.exec_default_ipc_mode,
            allow_caps=tuple(self.exec_allow_caps),
            no_pivot_root=self.exec_no_pivot_root,
        )
