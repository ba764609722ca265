"""The node's CPU capacity, and which cores a task may run on (Nomad's
cpuset partitions).

A task asking for `cores` gets that many cores to itself; every other task
shares the cores nobody reserved. The scheduler counts cores per node and
never places more than the node has, so the agent chooses which ones:
the lowest numbered free cores.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Compute:
    """The node's CPU: MHz over all cores, and how many cores."""

    total_mhz: int
    cores: int

    @property
    def mhz_per_core(self) -> int:
        return self.total_mhz // max(1, self.cores)

    def ticks(self, percent: float) -> float:
        """A percentage of one core as MHz consumed (Nomad's TicksConsumed)."""
        return percent / 100 * self.total_mhz / max(1, self.cores)


class NotEnoughCores(Exception):
    pass


def parse_cpus(text: str) -> list[int]:
    """The kernel's list format ("0-3,8,10-11") as numbers."""
    out: list[int] = []
    for part in text.strip().split(","):
        part = part.strip()
        if not part:
            continue
        first, _, last = part.partition("-")
        out.extend(range(int(first), int(last or first) + 1))
    return sorted(set(out))


def format_cpus(cpus: list[int]) -> str:
    """Numbers in the kernel's list format, ranges folded."""
    out: list[str] = []
    ordered = sorted(set(cpus))
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        out.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ",".join(out)


class CorePartition:
    def __init__(self, usable: list[int]) -> None:
        self.usable = sorted(set(usable))
        self._reserved: dict[str, list[int]] = {}

    def reserve(self, owner: str, count: int) -> list[int]:
        """`count` cores for `owner` alone (the same ones again if it holds some)."""
        if owner in self._reserved:
            return self._reserved[owner]
        taken = {c for cores in self._reserved.values() for c in cores}
        free = [c for c in self.usable if c not in taken]
        if count > len(free):
            raise NotEnoughCores(
                f"{count} cores asked, {len(free)} of {len(self.usable)} are free on this node"
            )
        self._reserved[owner] = free[:count]
        return self._reserved[owner]

    def adopt(self, owner: str, cores: list[int]) -> None:
        """Record cores already held (a task found running)."""
        self._reserved[owner] = sorted(cores)

    def release(self, owner: str) -> None:
        self._reserved.pop(owner, None)

    def shared(self) -> list[int]:
        """The cores nobody reserved; all of them if every core is reserved
        (a cpuset cannot be empty)."""
        taken = {c for cores in self._reserved.values() for c in cores}
        return [c for c in self.usable if c not in taken] or list(self.usable)
