"""Which process a pid is: its start time (clock ticks after boot, from
/proc/<pid>/stat) and the boot's id. A pid alone may have been reused by
another process after ours exited; pid, start time and boot id together
name one process for good, which is how a restarted agent finds an
executor again and never signals a stranger. Standard library only."""

from __future__ import annotations

import contextlib
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

_BOOT_ID = Path("/proc/sys/kernel/random/boot_id")


def boot_id() -> str:
    try:
        return _BOOT_ID.read_text().strip()
    except OSError:
        return ""


def _stat(pid: int) -> tuple[str, int] | None:
    """(state letter, start time) of a live pid, None when there is none."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except (OSError, ValueError):
        return None
    # the command name is in parentheses and may hold spaces or ')'
    rest = text[text.rfind(")") + 2 :].split()
    if len(rest) < 20:
        return None
    return rest[0], int(rest[19])


@dataclass(frozen=True)
class ProcessIdentity:
    pid: int
    start_time: int
    boot_id: str

    @classmethod
    def of(cls, pid: int) -> ProcessIdentity | None:
        found = _stat(pid)
        if found is None:
            return None
        return cls(pid, found[1], boot_id())

    def alive(self) -> bool:
        """The same process still runs (not a zombie, not a pid reused)."""
        if self.pid <= 0 or self.boot_id != boot_id():
            return False
        found = _stat(self.pid)
        return found is not None and found[1] == self.start_time and found[0] not in ("Z", "X")

    def open(self) -> int | None:
        """A pidfd that refers to this very process (None if it is gone):
        checked after opening, so a pid reused in between is refused."""
        try:
            fd = os.pidfd_open(self.pid)
        except OSError:
            return None
        if self.alive():
            return fd
        with contextlib.suppress(OSError):
            os.close(fd)
        return None

    def dump(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def load(cls, data: Any) -> ProcessIdentity | None:
        if not isinstance(data, dict):
            return None
        try:
            return cls(int(data["pid"]), int(data["start_time"]), str(data["boot_id"]))
        except (KeyError, TypeError, ValueError):
            return None
