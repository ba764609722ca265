"""The client's alloc garbage collection (Nomad's client/gc.go,
AllocGarbageCollector): what makes the agent destroy finished allocs, and
how an alloc's directory is removed.

Nomad destroys terminal allocs, oldest first, while the alloc directory's
file system is fuller than `gc_disk_usage_threshold` (blocks) or
`gc_inode_usage_threshold` (inodes), or the node holds more than
`gc_max_allocs` allocs; on demand it destroys one (`/v1/client/allocation/
:id/gc`) or every terminal one (`/v1/client/gc`). Destroying removes the
alloc's directory, its tasks' executor state and its client state; the
servers keep the alloc until their own garbage collection.
"""

from __future__ import annotations

import logging
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DiskUsage:
    used_percent: float
    inodes_used_percent: float


def disk_usage(path: Path) -> DiskUsage:
    """The usage of the file system holding `path`, as Nomad's host stats
    read it (used / (used + available to unprivileged users))."""
    st = os.statvfs(path)
    used = st.f_blocks - st.f_bfree
    total = used + st.f_bavail
    inodes_used = st.f_files - st.f_ffree
    return DiskUsage(
        used_percent=100.0 * used / total if total else 0.0,
        inodes_used_percent=100.0 * inodes_used / st.f_files if st.f_files else 0.0,
    )


def over_threshold(
    usage: DiskUsage, allocs: int, *, disk: float, inodes: float, max_allocs: int
) -> str:
    """Why the agent must collect now ("" when it need not), in Nomad's order."""
    if usage.used_percent > disk:
        return f"disk usage of {usage.used_percent:.0f} is over gc threshold of {disk:.0f}"
    if usage.inodes_used_percent > inodes:
        return (
            f"inode usage of {usage.inodes_used_percent:.0f} is over gc threshold of {inodes:.0f}"
        )
    if allocs > max_allocs:
        return f"number of allocations ({allocs}) is over the limit ({max_allocs})"
    return ""


def mounts_below(path: Path, mountinfo: str | None = None) -> list[str]:
    """Mount points at or below `path` in this process's mount namespace."""
    if mountinfo is None:
        try:
            mountinfo = Path("/proc/self/mountinfo").read_text()
        except OSError:
            return []
    root = os.path.realpath(path)
    found = []
    for line in mountinfo.splitlines():
        fields = line.split()
        if len(fields) < 5:
            continue
        # the mount point is the fifth field, octal escapes for spaces and the like
        point = fields[4].encode().decode("unicode_escape")
        if point == root or point.startswith(root + "/"):
            found.append(point)
    return found


def remove_dir(path: Path) -> bool:
    """Remove a directory an alloc kept: its alloc directory, a task's
    executor state (blocking: call it in a thread). Never
    through a mount: a bind mount left below it (a host volume) would have
    its source deleted, so such a directory is kept and the reason logged.
    Whether it is gone."""
    if not path.exists():
        return True
    mounted = mounts_below(path)
    if mounted:
        log.error("not removing %s: mounts below it: %s", path, ", ".join(mounted))
        return False
    errors: list[str] = []

    def failed(
        _fn: object, name: str, info: tuple[type[BaseException], BaseException, object]
    ) -> None:
        errors.append(f"{name}: {info[1]}")

    # symlinks a task planted are removed, never followed (rmtree's own rule)
    shutil.rmtree(path, onerror=failed)
    if errors:
        log.error("removing %s: %s", path, "; ".join(errors[:5]))
    return not path.exists()
