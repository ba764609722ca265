"""Resource usage as Nomad's client reports it: per task (from the task's
cgroup, or its process tree where the agent has no cgroups), per alloc
(the sum of its tasks) and for the host (psutil), in the shapes of
Nomad's TaskResourceUsage, AllocResourceUsage and HostStats.

CPU percentages need two readings: each run of a task keeps a `TaskStats`
that turns counters into the percentage since the previous reading (the
first reading says 0, as Nomad's cpustats.Tracker). The agent samples
every running task and the host once per `--stats-interval` (Nomad's
collection_interval); the RPCs and the Prometheus gauges serve the latest
sample.
"""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path

import psutil

from corral.v1 import structs_pb2 as pb
from services.agent.cgroups import Usage
from services.agent.cpuset import Compute

#: what a process-tree reading measures (no cgroup: no cache, swap, throttling)
TREE_MEMORY_MEASURED = ["RSS"]
TREE_CPU_MEASURED = ["System Mode", "User Mode", "Percent"]


class CpuTracker:
    """Percent of one core used between two readings of a CPU-time counter."""

    def __init__(self) -> None:
        self._prev: tuple[float, float] | None = None

    def percent(self, cpu_ns: float, now: float) -> float:
        prev, self._prev = self._prev, (cpu_ns, now)
        if prev is None:
            return 0.0
        d_cpu, d_wall = cpu_ns - prev[0], (now - prev[1]) * 1e9
        if d_wall <= 0 or d_cpu <= 0:
            return 0.0
        return d_cpu / d_wall * 100.0


class TaskStats:
    """One run of a task: its readings turned into TaskResourceUsage."""

    def __init__(self, compute: Compute) -> None:
        self.compute = compute
        self._total, self._user, self._system = CpuTracker(), CpuTracker(), CpuTracker()
        self.latest: pb.TaskResourceUsage | None = None

    def sample(self, usage: Usage, now: float | None = None) -> pb.TaskResourceUsage:
        now = time.monotonic() if now is None else now
        percent = self._total.percent(usage.cpu_total_ns, now)
        self.latest = pb.TaskResourceUsage(
            resource_usage=pb.ResourceUsage(
                memory_stats=pb.MemoryStats(
                    rss=usage.rss,
                    cache=usage.cache,
                    swap=usage.swap,
                    mapped_file=usage.mapped_file,
                    usage=usage.usage,
                    max_usage=usage.max_usage,
                    kernel_usage=usage.kernel_usage,
                    kernel_max_usage=usage.kernel_max_usage,
                    measured=usage.memory_measured,
                ),
                cpu_stats=pb.CpuStats(
                    system_mode=self._system.percent(usage.cpu_system_ns, now),
                    user_mode=self._user.percent(usage.cpu_user_ns, now),
                    percent=percent,
                    total_ticks=self.compute.ticks(percent),
                    throttled_periods=usage.throttled_periods,
                    throttled_time=usage.throttled_ns,
                    measured=usage.cpu_measured,
                ),
            ),
            timestamp=time.time_ns(),
        )
        return self.latest


def process_tree_usage(pid: int) -> Usage | None:
    """A task without a cgroup: its process and every descendant, from the
    process table (None once the process is gone)."""
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.Error:
        return None
    user = system = 0.0
    rss = 0
    for p in procs:
        with contextlib.suppress(psutil.Error):
            times = p.cpu_times()
            user += times.user + times.children_user
            system += times.system + times.children_system
            rss += p.memory_info().rss
    return Usage(
        cpu_total_ns=(user + system) * 1e9,
        cpu_user_ns=user * 1e9,
        cpu_system_ns=system * 1e9,
        rss=rss,
        usage=rss,
        memory_measured=list(TREE_MEMORY_MEASURED),
        cpu_measured=list(TREE_CPU_MEASURED),
    )


def add_usage(total: pb.ResourceUsage, other: pb.ResourceUsage) -> None:
    """Nomad's ResourceUsage.Add: counters summed, `measured` joined."""
    m, o = total.memory_stats, other.memory_stats
    for f in ("rss", "cache", "swap", "mapped_file", "usage", "max_usage"):
        setattr(m, f, getattr(m, f) + getattr(o, f))
    m.kernel_usage += o.kernel_usage
    m.kernel_max_usage += o.kernel_max_usage
    m.measured.extend(x for x in o.measured if x not in m.measured)
    c, d = total.cpu_stats, other.cpu_stats
    for f in ("system_mode", "user_mode", "total_ticks", "percent"):
        setattr(c, f, getattr(c, f) + getattr(d, f))
    c.throttled_periods += d.throttled_periods
    c.throttled_time += d.throttled_time
    c.measured.extend(x for x in d.measured if x not in c.measured)


def alloc_usage(tasks: dict[str, pb.TaskResourceUsage]) -> pb.AllocResourceUsage:
    out = pb.AllocResourceUsage(
        resource_usage=pb.ResourceUsage(memory_stats=pb.MemoryStats(), cpu_stats=pb.CpuStats())
    )
    for name, usage in sorted(tasks.items()):
        out.tasks[name].CopyFrom(usage)
        add_usage(out.resource_usage, usage.resource_usage)
        out.timestamp = max(out.timestamp, usage.timestamp)
    return out


# ---------------------------------------------------------------- the host


def _disk(device: str, mountpoint: str) -> pb.HostDiskStats | None:
    try:
        usage = psutil.disk_usage(mountpoint)
    except OSError:
        return None
    inodes = 0.0
    with contextlib.suppress(OSError):
        st = os.statvfs(mountpoint)
        if st.f_files:
            inodes = (st.f_files - st.f_ffree) / st.f_files * 100
    return pb.HostDiskStats(
        device=device,
        mountpoint=mountpoint,
        size=usage.total,
        used=usage.used,
        available=usage.free,
        used_percent=usage.percent,
        inodes_used_percent=inodes,
    )


def _mount_of(path: Path) -> tuple[str, str]:
    """The device and mount point holding `path`."""
    best = ("", "/")
    for part in psutil.disk_partitions(all=True):
        mp = part.mountpoint
        if (str(path) == mp or str(path).startswith(mp.rstrip("/") + "/")) and len(mp) >= len(
            best[1]
        ):
            best = (part.device, mp)
    return best


class HostStats:
    """The host's memory, per-core CPU and disks (Nomad's client/hoststats).
    CPU percentages are since the previous sample, so sample regularly."""

    def __init__(self, data_dir: Path, compute: Compute) -> None:
        self.data_dir = data_dir
        self.compute = compute
        psutil.cpu_times_percent(percpu=True)  # the first call sets the baseline
        self.latest: pb.HostStats | None = None

    def sample(self) -> pb.HostStats:
        vm = psutil.virtual_memory()
        out = pb.HostStats(
            memory=pb.HostMemoryStats(
                total=vm.total, available=vm.available, used=vm.used, free=vm.free
            ),
            uptime=max(0, int(time.time() - psutil.boot_time())),
            timestamp=time.time_ns(),
        )
        busy = 0.0
        for i, t in enumerate(psutil.cpu_times_percent(percpu=True)):
            out.cpu.add(cpu=f"cpu{i}", user=t.user, system=t.system, idle=t.idle)
            busy += max(0.0, 100.0 - t.idle)
        out.cpu_ticks_consumed = self.compute.ticks(busy)
        for part in psutil.disk_partitions(all=False):
            disk = _disk(part.device, part.mountpoint)
            if disk is not None:
                out.disk_stats.append(disk)
        device, mountpoint = _mount_of(self.data_dir)
        alloc_dir = _disk(device, str(self.data_dir))
        if alloc_dir is not None:
            alloc_dir.mountpoint = mountpoint
            out.alloc_dir_stats.CopyFrom(alloc_dir)
        self.latest = out
        return out
