"""Cgroup detection from mountinfo, the core partition, and the files each
cgroup version's backend writes and reads. The v1 backend runs against the
real kernel in tests/integration/agent and tests/e2e/test_exec_driver.py;
cgroup v2's controllers are not available on this machine or CI (they are
bound to the v1 hierarchies), so its backend is checked here on a directory
laid out as a cgroup2 mount is."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.agent import cgroups
from services.agent.cgroups import CgroupManager, Detected, Limits, Mounts, Version, detect
from services.agent.cpuset import Compute, CorePartition, NotEnoughCores, format_cpus, parse_cpus
from services.agent.drivers.base import TaskResources
from services.agent.drivers.limits import task_limits

HYBRID = """\
22 27 0:21 / /proc rw,relatime - proc proc rw
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
33 31 0:30 / /sys/fs/cgroup/cpuacct rw,relatime - cgroup cgroup rw,cpuacct
34 31 0:31 / /sys/fs/cgroup/cpuset rw,relatime - cgroup cgroup rw,cpuset
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
"""
MERGED_V1 = """\
31 23 0:28 / /sys/fs/cgroup rw - tmpfs tmpfs rw
32 31 0:29 / /sys/fs/cgroup/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct
34 31 0:31 / /sys/fs/cgroup/cpuset rw - cgroup cgroup rw,cpuset
35 31 0:32 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory
"""


def test_mounts_are_read_per_controller() -> None:
    m = cgroups.read_mounts(HYBRID)
    assert m.v1["memory"] == Path("/sys/fs/cgroup/memory")
    assert m.v2 == [Path("/sys/fs/cgroup/unified")]
    merged = cgroups.read_mounts(MERGED_V1)
    assert merged.v1["cpu"] == merged.v1["cpuacct"] == Path("/sys/fs/cgroup/cpu,cpuacct")


def test_a_hybrid_host_is_v1_and_says_why_not_v2() -> None:
    # the unified mount here offers no cpu/cpuset/memory controllers
    found = detect("auto", HYBRID, root=True)
    assert found.version == Version.V1
    assert "lack the cpu, cpuset and memory controllers" in found.reason


def test_not_root_or_nothing_mounted_is_off() -> None:
    assert detect("auto", HYBRID, root=False).version == Version.OFF
    assert detect("auto", HYBRID, root=False).reason == "the agent is not root"
    nothing = detect("auto", "22 27 0:21 / /proc rw - proc proc rw\n", root=True)
    assert nothing.version == Version.OFF
    assert detect("off", HYBRID, root=True).version == Version.OFF
    forced = detect("v2", HYBRID, root=True)
    assert forced.version == Version.OFF and "cgroup2" in forced.reason


def test_a_usable_cgroup2_mount_is_v2(tmp_path: Path) -> None:
    mount = tmp_path / "unified"
    mount.mkdir()
    (mount / "cgroup.controllers").write_text("cpuset cpu io memory hugetlb pids\n")
    info = f"41 31 0:38 / {mount} rw,relatime - cgroup2 cgroup2 rw\n"
    found = detect("auto", info, root=True)
    assert (found.version, found.v2_mount) == (Version.V2, mount)
    # v1 hierarchies win over a cgroup2 mount that is not /sys/fs/cgroup
    assert detect("auto", MERGED_V1 + info, root=True).version == Version.V1
    assert detect("v2", MERGED_V1 + info, root=True).version == Version.V2


def test_cpu_lists_and_the_core_partition() -> None:
    assert parse_cpus("0-3,8,10-11\n") == [0, 1, 2, 3, 8, 10, 11]
    assert format_cpus([11, 0, 1, 2, 3, 8, 10]) == "0-3,8,10-11"
    p = CorePartition([0, 1, 2, 3])
    assert p.reserve("a.t", 2) == [0, 1]
    assert p.reserve("a.t", 2) == [0, 1]  # the same owner keeps its cores
    assert p.shared() == [2, 3]
    with pytest.raises(NotEnoughCores, match="3 cores asked, 2 of 4 are free"):
        p.reserve("b.t", 3)
    assert p.reserve("b.t", 2) == [2, 3]
    assert p.shared() == [0, 1, 2, 3]  # a cpuset cannot be empty
    p.release("a.t")
    assert p.shared() == [0, 1]


def test_cpu_shares_and_weight() -> None:
    assert cgroups.cpu_shares(500, 4000) == 500
    assert cgroups.cpu_shares(0, 4000) == cgroups.MIN_CPU_SHARES
    # a node with more MHz than shares can express is scaled down
    assert cgroups.cpu_shares(131_072 * 2, 524_288) == 131_072
    assert cgroups.cpu_weight(2) == 1 and cgroups.cpu_weight(262_144) == 10_000
    assert cgroups.cpu_weight(1024) == 39  # runc's conversion of the default


def _cgroup2_dir(d: Path) -> Path:
    """A directory as the kernel shows a cgroup2 directory (the interface
    files the backend reads; the kernel makes them on mkdir)."""
    d.mkdir(parents=True, exist_ok=True)
    (d / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    (d / "cgroup.subtree_control").write_text("")
    (d / "cgroup.procs").write_text("")
    return d


def _empty(d: Path) -> None:
    """A real cgroup directory is removable with its interface files in it."""
    for f in d.iterdir():
        f.unlink()


def test_v2_backend_writes_limits_and_reads_usage(tmp_path: Path) -> None:
    mount = _cgroup2_dir(tmp_path / "cg2")
    parent = mount / "corral.slice"
    for d in (parent, parent / "share", parent / "reserve"):
        _cgroup2_dir(d)
    d = _cgroup2_dir(parent / "share" / "alloc1.web")
    _cgroup2_dir(parent / "reserve" / "alloc2.db")
    detected = Detected(Version.V2, Mounts(), mount)
    manager = CgroupManager(detected, Compute(4000, 4), "corral.slice", usable_cpus=[0, 1, 2, 3])
    manager.init()
    assert (mount / "cgroup.subtree_control").read_text() == "+cpu +cpuset +memory +pids"
    assert (parent / "cpuset.cpus").read_text() == "0-3"
    assert (parent / "share" / "cpuset.cpus").read_text() == "0-3"

    task = manager.create(
        "alloc1.web", Limits(memory_bytes=64 << 20, memory_soft_bytes=32 << 20, cpu_shares=500)
    )
    assert task.procs_files == [str(d / "cgroup.procs")]
    assert task.oom_counters == [str(d / "memory.events")]
    assert (d / "memory.max").read_text() == str(64 << 20)
    assert (d / "memory.low").read_text() == str(32 << 20)
    assert (d / "memory.swap.max").read_text() == "0"
    assert (d / "cpu.weight").read_text() == str(cgroups.cpu_weight(500))

    pinned = manager.create("alloc2.db", Limits(memory_bytes=16 << 20, cpu_shares=1000, cores=2))
    assert pinned.cores == [0, 1]
    assert (parent / "reserve" / "alloc2.db" / "cpuset.cpus").read_text() == "0-1"
    assert (parent / "share" / "cpuset.cpus").read_text() == "2-3"

    (d / "cpu.stat").write_text(
        "usage_usec 1500\nuser_usec 1000\nsystem_usec 500\nnr_periods 9\n"
        "nr_throttled 2\nthrottled_usec 40\n"
    )
    (d / "memory.stat").write_text("anon 4096\nfile 8192\nfile_mapped 1024\nkernel 512\n")
    (d / "memory.current").write_text("20480\n")
    (d / "memory.swap.current").write_text("0\n")
    usage = task.usage()
    assert (usage.cpu_total_ns, usage.cpu_user_ns, usage.cpu_system_ns) == (1.5e6, 1e6, 5e5)
    assert (usage.throttled_periods, usage.throttled_ns) == (2, 40_000)
    assert (usage.rss, usage.cache, usage.mapped_file, usage.usage) == (4096, 8192, 1024, 20480)
    assert usage.memory_measured == ["RSS", "Cache", "Swap", "Usage"]

    _empty(d)
    manager.remove(task)
    assert not d.exists()
    _empty(parent / "reserve" / "alloc2.db")
    manager.remove(pinned)
    assert (parent / "share" / "cpuset.cpus").read_text() == "0-3"


def test_task_limits_from_allocated_resources() -> None:
    compute = Compute(total_mhz=4000, cores=2)
    plain = task_limits(TaskResources(cpu_mhz=300, memory_mb=64), compute)
    assert (plain.memory_bytes, plain.memory_soft_bytes, plain.cpu_shares) == (64 << 20, 0, 300)
    oversub = task_limits(TaskResources(cpu_mhz=300, memory_mb=64, memory_max_mb=128), compute)
    assert (oversub.memory_bytes, oversub.memory_soft_bytes) == (128 << 20, 64 << 20)
    # memory_max = -1: no hard limit, memory is the soft one (Nomad's MemoryNoLimit)
    unlimited = task_limits(TaskResources(cpu_mhz=300, memory_mb=64, memory_max_mb=-1), compute)
    assert (unlimited.memory_bytes, unlimited.memory_soft_bytes) == (0, 64 << 20)
    cores = task_limits(TaskResources(cores=1, memory_mb=16), compute)
    assert (cores.cpu_shares, cores.cores) == (2000, 1)  # a core's MHz as shares
