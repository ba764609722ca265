"""Resource usage in Nomad's JSON: AllocResourceUsage for
/v1/client/allocation/:id/stats and HostStats for /v1/client/stats (the
shapes of Nomad's client/structs). Corral does not break a task's usage
down per process (`Pids` is null) and has no device statistics."""

from __future__ import annotations

from typing import Any

from corral.v1 import structs_pb2 as pb


def _memory(m: pb.MemoryStats) -> dict[str, Any]:
    return {
        "RSS": m.rss,
        "Cache": m.cache,
        "Swap": m.swap,
        "MappedFile": m.mapped_file,
        "Usage": m.usage,
        "MaxUsage": m.max_usage,
        "KernelUsage": m.kernel_usage,
        "KernelMaxUsage": m.kernel_max_usage,
        "Measured": list(m.measured) or None,
    }


def _cpu(c: pb.CpuStats) -> dict[str, Any]:
    return {
        "SystemMode": c.system_mode,
        "UserMode": c.user_mode,
        "TotalTicks": c.total_ticks,
        "ThrottledPeriods": c.throttled_periods,
        "ThrottledTime": c.throttled_time,
        "Percent": c.percent,
        "Measured": list(c.measured) or None,
    }


def resource_usage(r: pb.ResourceUsage) -> dict[str, Any]:
    return {
        "MemoryStats": _memory(r.memory_stats),
        "CpuStats": _cpu(r.cpu_stats),
        "DeviceStats": None,
    }


def alloc_usage(u: pb.AllocResourceUsage) -> dict[str, Any]:
    """client/structs.AllocResourceUsage."""
    return {
        "ResourceUsage": resource_usage(u.resource_usage),
        "Tasks": {
            name: {
                "ResourceUsage": resource_usage(t.resource_usage),
                "Timestamp": t.timestamp,
                "Pids": None,
            }
            for name, t in sorted(u.tasks.items())
        },
        "Timestamp": u.timestamp,
    }


def _disk(d: pb.HostDiskStats) -> dict[str, Any]:
    return {
        "Device": d.device,
        "Mountpoint": d.mountpoint,
        "Size": d.size,
        "Used": d.used,
        "Available": d.available,
        "UsedPercent": d.used_percent,
        "InodesUsedPercent": d.inodes_used_percent,
    }


def host_stats(h: pb.HostStats) -> dict[str, Any]:
    """client/hoststats.HostStats."""
    return {
        "Memory": {
            "Total": h.memory.total,
            "Available": h.memory.available,
            "Used": h.memory.used,
            "Free": h.memory.free,
        },
        "CPU": [{"CPU": c.cpu, "User": c.user, "System": c.system, "Idle": c.idle} for c in h.cpu],
        "DiskStats": [_disk(d) for d in h.disk_stats],
        "AllocDirStats": _disk(h.alloc_dir_stats) if h.HasField("alloc_dir_stats") else None,
        "DeviceStats": None,
        "Uptime": h.uptime,
        "Timestamp": h.timestamp,
        "CPUTicksConsumed": h.cpu_ticks_consumed,
    }
