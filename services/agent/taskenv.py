"""A task's runtime environment and the `${...}` interpolation of its spec
(Nomad's taskenv): job files written for Nomad use `${NOMAD_ALLOC_INDEX}`,
`${node.unique.name}`, `${attr.kernel.name}` or `${meta.rack}` in a task's
`config` and `env`, and scripts read the same NOMAD_* values from their
environment, so the client resolves them all in one place, just before the
task starts, with what only the client knows (its node, its directories)."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from corral.domain import structs
from corral.v1 import structs_pb2 as pb

DEFAULT_REGION = "global"
_REFERENCE = re.compile(r"\$\{([^{}]+)\}")
_NOT_IN_ENV_NAME = re.compile(r"[^A-Za-z0-9_]")


def combined_meta(job: pb.Job, group: str, task: pb.Task) -> dict[str, str]:
    """Job, group and task meta merged; the most specific level wins."""
    meta = dict(job.meta)
    tg = structs.task_group(job, group)
    if tg is not None:
        meta.update(tg.meta)
    meta.update(task.meta)
    return meta


def meta_env_names(key: str) -> tuple[str, ...]:
    """The NOMAD_META_ variables of a meta key: as written and upper-cased,
    characters a shell variable cannot hold turned into `_`."""
    clean = _NOT_IN_ENV_NAME.sub("_", key)
    return (f"NOMAD_META_{clean}", f"NOMAD_META_{clean.upper()}")


def node_variables(node: pb.Node, region: str = DEFAULT_REGION) -> dict[str, str]:
    """`node.*`, `attr.*` and `meta.*` as constraints and interpolation name them."""
    out = {
        "node.unique.id": node.id,
        "node.unique.name": node.name,
        "node.datacenter": node.datacenter,
        "node.class": node.node_class,
        "node.pool": node.node_pool or structs.DEFAULT_NODE_POOL,
        "node.region": region,
    }
    out.update({f"attr.{k}": v for k, v in node.attributes.items()})
    out.update({f"meta.{k}": v for k, v in node.meta.items()})
    return out


def interpolate(text: str, variables: Mapping[str, str]) -> str:
    """Every `${name}` whose name is known replaced by its value; an unknown
    one is left as written, as Nomad does, so a typo shows in the output."""

    def one(m: re.Match[str]) -> str:
        value = variables.get(m.group(1).strip())
        return m.group(0) if value is None else value

    return _REFERENCE.sub(one, text)


def interpolate_value(value: Any, variables: Mapping[str, str]) -> Any:
    """Strings anywhere inside a driver config (lists, maps) interpolated;
    numbers and booleans untouched."""
    if isinstance(value, str):
        return interpolate(value, variables)
    if isinstance(value, list):
        return [interpolate_value(v, variables) for v in value]
    if isinstance(value, dict):
        return {k: interpolate_value(v, variables) for k, v in value.items()}
    return value


def node_address(node: pb.Node) -> str:
    """The address this node's ports are reached at (the host network's
    IP in Nomad): the fingerprinted `unique.network.ip-address`."""
    return node.attributes.get("unique.network.ip-address") or "127.0.0.1"


def task_ports(alloc: pb.Allocation, task: str) -> list[pb.Port]:
    """The ports a task sees: its group network's and its own network's
    (another task's own ports are not its)."""
    others = {
        (p.label, p.value)
        for name, res in alloc.task_resources.items()
        if name != task
        for n in res.networks
        for p in (*n.reserved_ports, *n.dynamic_ports)
    }
    return [
        p
        for n in alloc.resources.networks
        for p in (*n.reserved_ports, *n.dynamic_ports)
        if (p.label, p.value) not in others
    ]


def port_env(ports: list[pb.Port], host_ip: str) -> dict[str, str]:
    """Nomad's port variables (taskenv addPorts): NOMAD_PORT_<label> is the
    port inside the task's network (`to`, else the host port),
    NOMAD_HOST_PORT_<label> the host's, NOMAD_IP_/NOMAD_ADDR_<label> where
    it is reached."""
    out: dict[str, str] = {}
    for p in ports:
        port = str(p.value)
        inside = str(p.to) if p.to > 0 else port
        addr = f"[{host_ip}]:{port}" if ":" in host_ip else f"{host_ip}:{port}"
        out[f"NOMAD_ADDR_{p.label}"] = addr
        out[f"NOMAD_HOST_ADDR_{p.label}"] = addr
        out[f"NOMAD_IP_{p.label}"] = host_ip
        out[f"NOMAD_HOST_IP_{p.label}"] = host_ip
        out[f"NOMAD_PORT_{p.label}"] = inside
        out[f"NOMAD_ALLOC_PORT_{p.label}"] = inside
        out[f"NOMAD_HOST_PORT_{p.label}"] = port
    return out


@dataclass
class TaskEnv:
    """What one task run sees: `env` is exported to its process, `variables`
    resolve `${...}` in its config (the environment plus the node's)."""

    env: dict[str, str]
    variables: dict[str, str] = field(default_factory=dict)

    def config(self, config: Mapping[str, Any]) -> dict[str, Any]:
        return {k: interpolate_value(v, self.variables) for k, v in config.items()}


@dataclass(frozen=True)
class TaskDirs:
    """The task's directories as the task sees them: host paths, or paths
    inside its own root (the exec driver)."""

    alloc: str
    local: str
    secrets: str


def build(
    alloc: pb.Allocation,
    job: pb.Job,
    task: pb.Task,
    node: pb.Node,
    *,
    dirs: TaskDirs,
    home: str,
    resources: pb.Resources | None = None,
    region: str = DEFAULT_REGION,
) -> TaskEnv:
    """The NOMAD_* runtime values, then the task's own `env` (interpolated
    against them and the node; it may override them, as in Nomad).
    `resources` are the task's allocated ones (its ask when None):
    NOMAD_MEMORY_MAX_LIMIT appears only when the scheduler granted a
    memory_max (oversubscription enabled)."""
    r = resources if resources is not None else task.resources
    runtime = {
        "NOMAD_ALLOC_ID": alloc.id,
        "NOMAD_SHORT_ALLOC_ID": alloc.id[:8],
        "NOMAD_ALLOC_NAME": alloc.name,
        "NOMAD_ALLOC_INDEX": str(structs.alloc_name_index(alloc.name)),
        "NOMAD_ALLOC_DIR": dirs.alloc,
        "NOMAD_TASK_DIR": dirs.local,
        "NOMAD_SECRETS_DIR": dirs.secrets,
        "NOMAD_TASK_NAME": task.name,
        "NOMAD_GROUP_NAME": alloc.task_group,
        "NOMAD_JOB_ID": job.id,
        "NOMAD_JOB_NAME": job.name,
        "NOMAD_NAMESPACE": job.namespace or structs.DEFAULT_NAMESPACE,
        "NOMAD_DC": node.datacenter,
        "NOMAD_REGION": region,
        "NOMAD_CPU_LIMIT": str(r.cpu),
        "NOMAD_MEMORY_LIMIT": str(r.memory_mb),
    }
    if r.memory_max_mb > 0:
        runtime["NOMAD_MEMORY_MAX_LIMIT"] = str(r.memory_max_mb)
    if job.parent_id:
        runtime["NOMAD_JOB_PARENT_ID"] = job.parent_id
    runtime.update(port_env(task_ports(alloc, task.name), node_address(node)))
    for key, value in sorted(combined_meta(job, alloc.task_group, task).items()):
        for name in meta_env_names(key):
            runtime[name] = value
    node_vars = node_variables(node, region)
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": home}
    env.update(runtime)
    env["NOMAD_NODE_ID"] = node.id or alloc.node_id
    lookup = {**node_vars, **env}
    env.update({k: interpolate(v, lookup) for k, v in task.env.items()})
    return TaskEnv(env=env, variables={**node_vars, **env})
