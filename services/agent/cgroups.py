"""Control groups for tasks: the hard memory limit, CPU shares, a cpuset for
reserved cores, the usage the stats come from and the OOM kill counter
(Nomad's client/lib/cgroupslib).

Which version is detected at start-up from /proc/self/mountinfo (or forced
with `--cgroup-version`):

* **v2** when /sys/fs/cgroup itself is a cgroup2 mount whose root offers the
  cpu, cpuset and memory controllers (or, failing v1, any cgroup2 mount
  that does);
* **v1** when the cpu, cpuacct, cpuset and memory hierarchies are mounted
  (a "hybrid" host with a cgroup2 mount beside them is v1, as for Nomad:
  the controllers are bound to the v1 hierarchies and the v2 mount has
  none of them);
* **off** otherwise, or when the agent is not root.

Layout, `<parent>` being `--cgroup-parent` (`corral` on v1, `corral.slice`
on v2, as Nomad's `/nomad` and `nomad.slice`), and a task's scope
`<alloc id>.<task>`:

    v1  <memory|cpu|cpuacct>/<parent>/<scope>
        cpuset/<parent>/share                 tasks without cores, together
        cpuset/<parent>/reserve/<scope>       a task with cores, alone
    v2  <mount>/<parent>/share/<scope>
        <mount>/<parent>/reserve/<scope>

The share partition's cpuset is every usable core nobody reserved and
moves as reservations come and go (services/agent/cpuset.py).
"""

from __future__ import annotations

import contextlib
import enum
import os
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from services.agent.cpuset import Compute, CorePartition, format_cpus

V1_CONTROLLERS = ("cpu", "cpuacct", "cpuset", "memory")
V2_CONTROLLERS = ("cpu", "cpuset", "memory")
#: the kernel's bounds on cpu.shares (Nomad clamps the same way)
MIN_CPU_SHARES, MAX_CPU_SHARES = 2, 262_144
#: v1 CPU stats in USER_HZ ticks
_TICK_NS = 1e9 / os.sysconf("SC_CLK_TCK")

V1_MEMORY_MEASURED = [
    "RSS", "Cache", "Swap", "Usage", "Max Usage", "Kernel Usage", "Kernel Max Usage",
]  # fmt: skip
V2_MEMORY_MEASURED = ["RSS", "Cache", "Swap", "Usage"]
CPU_MEASURED = ["System Mode", "User Mode", "Throttled Periods", "Throttled Time", "Percent"]


class Version(enum.StrEnum):
    OFF = "off"
    V1 = "v1"
    V2 = "v2"


@dataclass(frozen=True)
class Mounts:
    """The cgroup file systems of this host."""

    v1: dict[str, Path] = field(default_factory=dict)  # controller -> mount point
    v2: list[Path] = field(default_factory=list)


def read_mounts(mountinfo: str) -> Mounts:
    v1: dict[str, Path] = {}
    v2: list[Path] = []
    for line in mountinfo.splitlines():
        pre, sep, post = line.partition(" - ")
        if not sep:
            continue
        fields, tail = pre.split(), post.split()
        if len(fields) < 5 or len(tail) < 3:
            continue
        point = Path(fields[4].replace("\\040", " "))
        if tail[0] == "cgroup2":
            v2.append(point)
        elif tail[0] == "cgroup":
            for option in tail[2].split(","):
                if option in V1_CONTROLLERS:
                    v1.setdefault(option, point)
    return Mounts(v1, v2)


def _v2_usable(mount: Path) -> bool:
    try:
        offered = (mount / "cgroup.controllers").read_text().split()
    except OSError:
        return False
    return all(c in offered for c in V2_CONTROLLERS)


@dataclass(frozen=True)
class Detected:
    version: Version
    mounts: Mounts
    v2_mount: Path | None = None
    #: why not v2 / why off, for the driver's health description and docs
    reason: str = ""


def detect(
    forced: str = "auto", mountinfo: str | None = None, *, root: bool | None = None
) -> Detected:
    if mountinfo is None:
        try:
            mountinfo = Path("/proc/self/mountinfo").read_text()
        except OSError:
            mountinfo = ""
    mounts = read_mounts(mountinfo)
    is_root = os.geteuid() == 0 if root is None else root
    if forced == Version.OFF:
        return Detected(Version.OFF, mounts, reason="cgroups turned off by configuration")
    if not is_root:
        return Detected(Version.OFF, mounts, reason="the agent is not root")
    v1_ok = all(c in mounts.v1 for c in V1_CONTROLLERS)
    usable_v2 = [m for m in mounts.v2 if _v2_usable(m)]
    unified = next((m for m in usable_v2 if m == Path("/sys/fs/cgroup")), None)
    if forced == Version.V2 or (forced == "auto" and unified is not None):
        mount = unified or (usable_v2[0] if usable_v2 else None)
        if mount is None:
            why = "no cgroup2 mount offers the cpu, cpuset and memory controllers"
            return Detected(Version.OFF, mounts, reason=why)
        return Detected(Version.V2, mounts, mount)
    if v1_ok:
        why = "" if usable_v2 else "the cgroup2 mounts lack the cpu, cpuset and memory controllers"
        return Detected(Version.V1, mounts, reason=why)
    if forced == Version.V1:
        missing = [c for c in V1_CONTROLLERS if c not in mounts.v1]
        return Detected(Version.OFF, mounts, reason=f"no v1 hierarchy for {', '.join(missing)}")
    if usable_v2:
        return Detected(Version.V2, mounts, usable_v2[0])
    return Detected(Version.OFF, mounts, reason="no usable cgroup v1 hierarchies or v2 mount")


# ---------------------------------------------------------------- limits and usage


@dataclass(frozen=True)
class Limits:
    """What a task is held to. `memory_bytes` is the hard limit (memory, or
    memory_max where oversubscription is on; 0: none); `memory_soft_bytes`
    the reservation when a higher max is set; `cores` reserved cores (0:
    the share partition)."""

    memory_bytes: int = 0
    memory_soft_bytes: int = 0
    cpu_shares: int = 0
    cores: int = 0


def cpu_shares(mhz: int, total_compute: int) -> int:
    """A task's MHz as cpu.shares: clamped to the kernel's range, scaled down
    where the node has more MHz than shares can express (Nomad)."""
    if mhz < MIN_CPU_SHARES:
        return MIN_CPU_SHARES
    if total_compute >= MAX_CPU_SHARES:
        return max(MIN_CPU_SHARES, int(mhz / total_compute * MAX_CPU_SHARES))
    return mhz


def cpu_weight(shares: int) -> int:
    """cpu.shares [2, 262144] onto cgroup v2's cpu.weight [1, 10000] (runc)."""
    return 1 + ((shares - 2) * 9999) // 262142


@dataclass
class Usage:
    """Raw counters of one cgroup; percentages are computed by the caller
    from two readings (services/agent/stats.py)."""

    cpu_total_ns: float = 0.0
    cpu_user_ns: float = 0.0
    cpu_system_ns: float = 0.0
    throttled_periods: int = 0
    throttled_ns: int = 0
    rss: int = 0
    cache: int = 0
    swap: int = 0
    mapped_file: int = 0
    usage: int = 0
    max_usage: int = 0
    kernel_usage: int = 0
    kernel_max_usage: int = 0
    memory_measured: list[str] = field(default_factory=list)
    cpu_measured: list[str] = field(default_factory=list)


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def _int(path: Path) -> int:
    text = _read(path).strip()
    return int(text) if text.lstrip("-").isdigit() else 0


def _keyed(path: Path) -> dict[str, int]:
    out = {}
    for line in _read(path).splitlines():
        key, _, value = line.partition(" ")
        if value.strip().lstrip("-").isdigit():
            out[key] = int(value)
    return out


def _write(path: Path, value: str) -> None:
    path.write_text(value)


class TaskCgroup(Protocol):
    """One task run's cgroup(s)."""

    scope: str
    #: the cores reserved for it ([] when it shares)
    cores: list[int]

    @property
    def procs_files(self) -> list[str]:
        """cgroup.procs files the task joins (one per v1 hierarchy)."""
        ...

    @property
    def oom_counters(self) -> list[str]:
        """Where the kernel counts OOM kills."""
        ...

    def pids(self) -> set[int]: ...

    def usage(self) -> Usage: ...

    def kill_all(self) -> None: ...

    def remove(self) -> None: ...


def _kill_listed(procs: Path) -> None:
    """SIGKILL every process listed, until none is left (forks race us)."""
    for _ in range(100):
        pids = [int(p) for p in _read(procs).split() if p.isdigit()]
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.02)


def _rmdir(path: Path) -> None:
    """Remove a cgroup; its last processes may still be exiting."""
    for _ in range(50):
        try:
            path.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:
            time.sleep(0.02)
    with contextlib.suppress(OSError):
        path.rmdir()


# ---------------------------------------------------------------- v1


@dataclass
class V1Task:
    scope: str
    dirs: dict[str, Path]  # controller -> the task's directory (cpuset: its partition)
    own_cpuset: bool
    cores: list[int]

    @property
    def procs_files(self) -> list[str]:
        return sorted({str(d / "cgroup.procs") for d in self.dirs.values()})

    @property
    def oom_counters(self) -> list[str]:
        return [str(self.dirs["memory"] / "memory.oom_control")]

    def pids(self) -> set[int]:
        return {int(p) for p in _read(self.dirs["memory"] / "cgroup.procs").split() if p.isdigit()}

    def usage(self) -> Usage:
        mem, cpu, acct = self.dirs["memory"], self.dirs["cpu"], self.dirs["cpuacct"]
        stat = _keyed(mem / "memory.stat")
        throttling = _keyed(cpu / "cpu.stat")
        user, system = _int(acct / "cpuacct.usage_user"), _int(acct / "cpuacct.usage_sys")
        if not (acct / "cpuacct.usage_user").exists():
            ticks = _keyed(acct / "cpuacct.stat")
            user, system = (
                int(ticks.get("user", 0) * _TICK_NS),
                int(ticks.get("system", 0) * _TICK_NS),
            )
        return Usage(
            cpu_total_ns=_int(acct / "cpuacct.usage"),
            cpu_user_ns=user,
            cpu_system_ns=system,
            throttled_periods=throttling.get("nr_throttled", 0),
            throttled_ns=throttling.get("throttled_time", 0),
            rss=stat.get("total_rss", stat.get("rss", 0)),
            cache=stat.get("total_cache", stat.get("cache", 0)),
            swap=stat.get("total_swap", stat.get("swap", 0)),
            mapped_file=stat.get("total_mapped_file", stat.get("mapped_file", 0)),
            usage=_int(mem / "memory.usage_in_bytes"),
            max_usage=_int(mem / "memory.max_usage_in_bytes"),
            kernel_usage=_int(mem / "memory.kmem.usage_in_bytes"),
            kernel_max_usage=_int(mem / "memory.kmem.max_usage_in_bytes"),
            memory_measured=list(V1_MEMORY_MEASURED),
            cpu_measured=list(CPU_MEASURED),
        )

    def kill_all(self) -> None:
        _kill_listed(self.dirs["memory"] / "cgroup.procs")

    def remove(self) -> None:
        if self.pids():
            self.kill_all()
        for controller, d in self.dirs.items():
            if controller != "cpuset" or self.own_cpuset:
                _rmdir(d)


class V1:
    version = Version.V1

    def __init__(self, mounts: Mounts, parent: str, partition: CorePartition) -> None:
        self.mounts = mounts
        self.parent = parent.strip("/")
        self.partition = partition
        self._cpuset = mounts.v1["cpuset"] / self.parent
        self._mems = ""

    def init(self) -> None:
        for controller in V1_CONTROLLERS:
            (self.mounts.v1[controller] / self.parent).mkdir(parents=True, exist_ok=True)
        root = self.mounts.v1["cpuset"]
        mems = _read(self._cpuset / "cpuset.mems").strip() or _read(root / "cpuset.mems").strip()
        usable = format_cpus(self.partition.usable)
        for d, cpus in (
            (self._cpuset, usable),
            (self._cpuset / "share", format_cpus(self.partition.shared())),
            (self._cpuset / "reserve", usable),
        ):
            d.mkdir(exist_ok=True)
            with contextlib.suppress(OSError):
                _write(d / "cgroup.clone_children", "0")
            _write(d / "cpuset.mems", mems)
            _write(d / "cpuset.cpus", cpus)
        self._mems = mems
        # no swapping for tasks (Nomad), where the kernel lets us say so
        with contextlib.suppress(OSError):
            _write(self.mounts.v1["memory"] / self.parent / "memory.swappiness", "0")

    def share(self, cpus: list[int]) -> None:
        _write(self._cpuset / "share" / "cpuset.cpus", format_cpus(cpus))

    def create(self, scope: str, limits: Limits, cores: list[int]) -> V1Task:
        dirs: dict[str, Path] = {}
        for controller in ("memory", "cpu", "cpuacct"):
            d = self.mounts.v1[controller] / self.parent / scope
            d.mkdir(exist_ok=True)
            dirs[controller] = d
        mem = dirs["memory"]
        if limits.memory_bytes:
            _write(mem / "memory.limit_in_bytes", str(limits.memory_bytes))
            with contextlib.suppress(OSError):  # no swap accounting: no memsw files
                _write(mem / "memory.memsw.limit_in_bytes", str(limits.memory_bytes))
        if limits.memory_soft_bytes:
            _write(mem / "memory.soft_limit_in_bytes", str(limits.memory_soft_bytes))
        with contextlib.suppress(OSError):
            _write(mem / "memory.swappiness", "0")
        if limits.cpu_shares:
            _write(dirs["cpu"] / "cpu.shares", str(limits.cpu_shares))
        if cores:
            d = self._cpuset / "reserve" / scope
            d.mkdir(exist_ok=True)
            with contextlib.suppress(OSError):
                _write(d / "cgroup.clone_children", "0")
            _write(d / "cpuset.mems", self._mems)
            _write(d / "cpuset.cpus", format_cpus(cores))
            dirs["cpuset"] = d
        else:
            dirs["cpuset"] = self._cpuset / "share"
        return V1Task(scope, dirs, bool(cores), cores)

    def open(self, scope: str, cores: list[int]) -> V1Task:
        dirs = {c: self.mounts.v1[c] / self.parent / scope for c in ("memory", "cpu", "cpuacct")}
        dirs["cpuset"] = self._cpuset / "reserve" / scope if cores else self._cpuset / "share"
        return V1Task(scope, dirs, bool(cores), cores)


# ---------------------------------------------------------------- v2


@dataclass
class V2Task:
    scope: str
    dir: Path
    cores: list[int]

    @property
    def procs_files(self) -> list[str]:
        return [str(self.dir / "cgroup.procs")]

    @property
    def oom_counters(self) -> list[str]:
        return [str(self.dir / "memory.events")]

    def pids(self) -> set[int]:
        return {int(p) for p in _read(self.dir / "cgroup.procs").split() if p.isdigit()}

    def usage(self) -> Usage:
        cpu = _keyed(self.dir / "cpu.stat")
        stat = _keyed(self.dir / "memory.stat")
        return Usage(
            cpu_total_ns=cpu.get("usage_usec", 0) * 1000,
            cpu_user_ns=cpu.get("user_usec", 0) * 1000,
            cpu_system_ns=cpu.get("system_usec", 0) * 1000,
            throttled_periods=cpu.get("nr_throttled", 0),
            throttled_ns=cpu.get("throttled_usec", 0) * 1000,
            rss=stat.get("anon", 0),
            cache=stat.get("file", 0),
            swap=_int(self.dir / "memory.swap.current"),
            mapped_file=stat.get("file_mapped", 0),
            usage=_int(self.dir / "memory.current"),
            max_usage=_int(self.dir / "memory.peak"),
            kernel_usage=stat.get("kernel", 0),
            memory_measured=list(V2_MEMORY_MEASURED),
            cpu_measured=list(CPU_MEASURED),
        )

    def kill_all(self) -> None:
        try:
            _write(self.dir / "cgroup.kill", "1")
        except OSError:
            _kill_listed(self.dir / "cgroup.procs")
            return
        for _ in range(100):
            if not self.pids():
                return
            time.sleep(0.02)

    def remove(self) -> None:
        if self.pids():
            self.kill_all()
        _rmdir(self.dir)


class V2:
    version = Version.V2

    def __init__(self, mount: Path, parent: str, partition: CorePartition) -> None:
        self.mount = mount
        self.parent = mount / parent.strip("/")
        self.partition = partition

    def _enable(self, d: Path) -> None:
        offered = _read(d / "cgroup.controllers").split()
        enabled = _read(d / "cgroup.subtree_control").split()
        wanted = [c for c in (*V2_CONTROLLERS, "pids") if c in offered and c not in enabled]
        if wanted:
            _write(d / "cgroup.subtree_control", " ".join(f"+{c}" for c in wanted))

    def init(self) -> None:
        # every level from the mount down to the partitions hands the
        # controllers on (a delegated parent must have them already)
        chain = [self.mount]
        for part in self.parent.relative_to(self.mount).parts:
            chain.append(chain[-1] / part)
        for d in chain:
            d.mkdir(exist_ok=True)
            self._enable(d)
        _write(self.parent / "cpuset.cpus", format_cpus(self.partition.usable))
        for name in ("share", "reserve"):
            d = self.parent / name
            d.mkdir(exist_ok=True)
            self._enable(d)
        self.share(self.partition.shared())

    def share(self, cpus: list[int]) -> None:
        _write(self.parent / "share" / "cpuset.cpus", format_cpus(cpus))

    def create(self, scope: str, limits: Limits, cores: list[int]) -> V2Task:
        d = self.parent / ("reserve" if cores else "share") / scope
        d.mkdir(exist_ok=True)
        if limits.memory_bytes:
            _write(d / "memory.max", str(limits.memory_bytes))
        if limits.memory_soft_bytes:
            _write(d / "memory.low", str(limits.memory_soft_bytes))
        with contextlib.suppress(OSError):  # no swap for tasks (Nomad)
            _write(d / "memory.swap.max", "0")
        if limits.cpu_shares:
            _write(d / "cpu.weight", str(cpu_weight(limits.cpu_shares)))
        if cores:
            _write(d / "cpuset.cpus", format_cpus(cores))
        return V2Task(scope, d, cores)

    def open(self, scope: str, cores: list[int]) -> V2Task:
        return V2Task(scope, self.parent / ("reserve" if cores else "share") / scope, cores)


# ---------------------------------------------------------------- the agent's view


class Backend(Protocol):
    version: Version

    def init(self) -> None: ...

    def share(self, cpus: list[int]) -> None: ...

    def create(self, scope: str, limits: Limits, cores: list[int]) -> TaskCgroup: ...

    def open(self, scope: str, cores: list[int]) -> TaskCgroup: ...


class CgroupManager:
    """The agent's one owner of the task cgroups and the core partition."""

    def __init__(
        self,
        detected: Detected,
        compute: Compute,
        parent: str = "",
        usable_cpus: list[int] | None = None,
    ) -> None:
        self.detected = detected
        self.compute = compute
        self.version = detected.version
        cpus = usable_cpus if usable_cpus is not None else sorted(os.sched_getaffinity(0))
        self.partition = CorePartition(cpus)
        self.backend: Backend | None = None
        if detected.version == Version.V1:
            self.backend = V1(detected.mounts, parent or "corral", self.partition)
        elif detected.version == Version.V2:
            assert detected.v2_mount is not None
            self.backend = V2(detected.v2_mount, parent or "corral.slice", self.partition)

    @property
    def enabled(self) -> bool:
        return self.backend is not None

    def init(self) -> None:
        if self.backend is not None:
            self.backend.init()

    def create(self, scope: str, limits: Limits) -> TaskCgroup:
        """A fresh cgroup for one run of a task (a left-over one of the same
        scope is emptied first). Raises NotEnoughCores."""
        assert self.backend is not None
        cores = self.partition.reserve(scope, limits.cores) if limits.cores else []
        try:
            if cores:
                self.backend.share(self.partition.shared())
            return self.backend.create(scope, limits, cores)
        except OSError:
            self.release_cores(scope)
            raise

    def adopt(self, scope: str, cores: list[int]) -> TaskCgroup:
        """The cgroup of a run found still running after an agent restart, as
        it was made (its limits stand); its reserved cores are taken again
        (Nomad's restoreCores)."""
        assert self.backend is not None
        if cores:
            self.partition.adopt(scope, cores)
            with contextlib.suppress(OSError):
                self.backend.share(self.partition.shared())
        return self.backend.open(scope, cores)

    def release_cores(self, scope: str) -> None:
        self.partition.release(scope)
        if self.backend is not None:
            with contextlib.suppress(OSError):
                self.backend.share(self.partition.shared())

    def remove(self, cgroup: TaskCgroup) -> None:
        """After the run: kill stragglers, remove the cgroup, free its cores."""
        try:
            cgroup.remove()
        finally:
            if cgroup.cores:
                self.release_cores(cgroup.scope)
