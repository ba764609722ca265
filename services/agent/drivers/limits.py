"""A task's allocated resources as cgroup limits (Nomad's executor): the
hard memory limit is `memory`, or `memory_max` where the scheduler
configuration enables oversubscription (then `memory` is the soft
reservation; `memory_max = -1` leaves no hard limit at all); `cpu` MHz are
the CPU shares (reserved cores count at the node's MHz per core); `cores`
become a cpuset of the task's own."""

from __future__ import annotations

from services.agent.cgroups import CgroupManager, Limits, TaskCgroup, cpu_shares
from services.agent.cpuset import Compute, NotEnoughCores
from services.agent.drivers.base import DriverError, TaskConfig, TaskResources

MIB = 1024 * 1024


#: memory_max that lifts the hard limit (Nomad's MemoryNoLimit)
MEMORY_NO_LIMIT = -1


def task_limits(res: TaskResources, compute: Compute) -> Limits:
    if res.memory_max_mb == MEMORY_NO_LIMIT:
        hard_mb, soft_mb = 0, res.memory_mb
    else:
        hard_mb = max(res.memory_max_mb, res.memory_mb)
        soft_mb = res.memory_mb if res.memory_max_mb > res.memory_mb else 0
    mhz = res.cpu_mhz + res.cores * compute.mhz_per_core
    return Limits(
        memory_bytes=hard_mb * MIB,
        memory_soft_bytes=soft_mb * MIB,
        cpu_shares=cpu_shares(mhz, compute.total_mhz),
        cores=res.cores,
    )


def create_cgroup(cgroups: CgroupManager, cfg: TaskConfig) -> TaskCgroup:
    try:
        return cgroups.create(cfg.scope, task_limits(cfg.resources, cgroups.compute))
    except NotEnoughCores as exc:
        raise DriverError(str(exc)) from None
    except OSError as exc:
        raise DriverError(f"creating the task's cgroup: {exc}") from None
