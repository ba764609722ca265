"""Namespaces as objects (Nomad's `Namespace`): what a name may be, and what a
namespace allows its jobs: node pools (`node_pool_config`, Nomad 1.6) and
task drivers and network modes (`capabilities`).

Pure rules over the protobuf messages: the state's writes decide with them on
rows read inside their transaction, the CLI and the gateway only parse.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterable

from corral.domain import node_pools
from corral.domain.structs import DEFAULT_NAMESPACE, DEFAULT_NODE_POOL
from corral.v1 import structs_pb2 as pb

#: Nomad's rule for namespace names
NAME = re.compile(r"^[a-zA-Z0-9-]{1,128}$")
#: a node pool pattern in node_pool_config (a name, or `*` globs)
POOL_PATTERN = re.compile(r"^[a-zA-Z0-9-_*]{1,128}$")
MAX_DESCRIPTION = 256
MAX_PATTERNS = 100
DEFAULT_DESCRIPTION = "Default shared namespace"


def name_problem(name: str) -> str | None:
    """Why `name` cannot name a namespace, or None."""
    if not NAME.match(name):
        return "must be 1 to 128 letters, digits or '-'"
    return None


def default_namespace() -> pb.Namespace:
    """The namespace that always exists."""
    return pb.Namespace(name=DEFAULT_NAMESPACE, description=DEFAULT_DESCRIPTION)


def default_pool(ns: pb.Namespace | None) -> str:
    """The pool of a job in `ns` that names none."""
    if ns is not None and ns.node_pool_config.default:
        return ns.node_pool_config.default
    return DEFAULT_NODE_POOL


def _matches(pool: str, patterns: Iterable[str]) -> bool:
    return any(fnmatch.fnmatchcase(pool, p) for p in patterns)


def pool_allowed(ns: pb.Namespace, pool: str) -> bool:
    """Whether a job of `ns` may use `pool`: the namespace's default always;
    with `allowed`, only pools matching it; with `denied`, any pool but
    those matching it (Nomad Enterprise's node pool governance)."""
    if pool == default_pool(ns):
        return True
    cfg = ns.node_pool_config
    if cfg.HasField("allowed"):
        return _matches(pool, cfg.allowed.values)
    if cfg.HasField("denied"):
        return not _matches(pool, cfg.denied.values)
    return True


def driver_allowed(ns: pb.Namespace, driver: str) -> bool:
    """Nomad's capabilities check: an enabled list admits only its drivers;
    otherwise a disabled list refuses its drivers."""
    caps = ns.capabilities
    if caps.enabled_task_drivers:
        return driver in caps.enabled_task_drivers
    return driver not in caps.disabled_task_drivers


def network_mode_allowed(ns: pb.Namespace, mode: str) -> bool:
    """As `driver_allowed`, for a group network's mode ("host" when unset;
    a CNI mode `cni/<name>` may also be listed as `cni/*`)."""
    caps = ns.capabilities
    mode = mode or "host"
    names = {mode, "cni/*"} if mode.startswith("cni/") else {mode}
    if caps.enabled_network_modes:
        return bool(names & set(caps.enabled_network_modes))
    return not names & set(caps.disabled_network_modes)


def admission_problem(
    job: pb.Job, ns: pb.Namespace | None, pool_exists: bool
) -> tuple[str, str] | None:
    """(field, problem) when `ns` does not admit `job` (Nomad's admission
    hooks), else None. Call with the job's pool already resolved
    (`default_pool`) and whether that pool exists."""
    what = f"job {job.id!r}"
    if ns is None:
        return "job.namespace", f"{what} is in nonexistent namespace {job.namespace!r}"
    if not pool_exists:
        return "job.node_pool", f"{what} is in nonexistent node pool {job.node_pool!r}"
    if not pool_allowed(ns, job.node_pool):
        return (
            "job.node_pool",
            f"node pool {job.node_pool!r} is not allowed in namespace {ns.name!r}",
        )
    drivers = sorted(
        {t.driver for tg in job.task_groups for t in tg.tasks if not driver_allowed(ns, t.driver)}
    )
    if drivers:
        return (
            "job.task_groups",
            f"task driver(s) {', '.join(map(repr, drivers))} not allowed in namespace {ns.name!r}",
        )
    modes = sorted(
        {
            n.mode or "host"
            for tg in job.task_groups
            for n in tg.networks
            if not network_mode_allowed(ns, n.mode)
        }
    )
    if modes:
        return (
            "job.task_groups",
            f"network mode(s) {', '.join(map(repr, modes))} not allowed in namespace {ns.name!r}",
        )
    return None


def config_problem(ns: pb.Namespace) -> tuple[str, str] | None:
    """(field, problem) of the first thing wrong in a namespace's own
    settings, or None. Whether its default pool exists is the write's
    question (it reads the pool in its transaction)."""
    problem = name_problem(ns.name)
    if problem is not None:
        return "name", problem
    if len(ns.description) > MAX_DESCRIPTION:
        return "description", f"is longer than {MAX_DESCRIPTION} characters"
    cfg = ns.node_pool_config
    if cfg.HasField("allowed") and cfg.HasField("denied"):
        return "node_pool_config", "use either allowed or denied, not both"
    for which in ("allowed", "denied"):
        values = getattr(cfg, which).values
        if len(values) > MAX_PATTERNS:
            return f"node_pool_config.{which}", f"has more than {MAX_PATTERNS} entries"
        for i, pattern in enumerate(values):
            if not POOL_PATTERN.match(pattern):
                return (
                    f"node_pool_config.{which}[{i}]",
                    f"{pattern!r} is not a node pool name or pattern "
                    "(letters, digits, '-', '_' and '*')",
                )
    if cfg.default:
        problem = node_pools.name_problem(cfg.default)
        if problem is not None:
            return "node_pool_config.default", problem
        if cfg.HasField("denied") and _matches(cfg.default, cfg.denied.values):
            return "node_pool_config.denied", f"denies the default pool {cfg.default!r}"
    caps = ns.capabilities
    for which in (
        "enabled_task_drivers",
        "disabled_task_drivers",
        "enabled_network_modes",
        "disabled_network_modes",
    ):
        values = getattr(caps, which)
        if len(values) > MAX_PATTERNS:
            return f"capabilities.{which}", f"has more than {MAX_PATTERNS} entries"
        for i, value in enumerate(values):
            if not value or len(value) > 128:
                return f"capabilities.{which}[{i}]", "must be 1 to 128 characters"
    return None
