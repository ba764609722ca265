"""Sampling profiles of the role processes during a workload, with py-spy
(it attaches to a running process, so the roles run unmodified).

`Profiler.start(pids)` launches one `py-spy record --gil` per process
(only the thread holding the GIL is sampled, so gRPC's poller threads
waiting in C do not drown the Python work) writing collapsed stacks;
`stop()` ends them and returns the top frames by self time ("where the
CPU went") per process. If py-spy cannot attach (no
ptrace permission in a container), the profile is reported as unavailable
and the workload still runs.
"""

from __future__ import annotations

import collections
import contextlib
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# frames that only say "waiting" rather than where work is done
_IDLE = (
    "select (selectors.py",
    "_run_once (asyncio/base_events.py",
    "wait (threading.py",
    "Thread.run (threading.py",
    "_worker (concurrent/futures/thread.py",
)


@dataclass
class _Recording:
    process: str
    out: Path
    proc: subprocess.Popen[bytes]


def py_spy() -> str | None:
    exe = Path(sys.executable).with_name("py-spy")
    if exe.exists():
        return str(exe)
    return shutil.which("py-spy")


def top_frames(collapsed: str, limit: int = 10) -> tuple[int, list[tuple[str, float]]]:
    """(samples, [(frame, share of samples)]) by self time from py-spy's
    collapsed ("raw") output: `frame;frame;... count` per line."""
    counts: collections.Counter[str] = collections.Counter()
    total = 0
    for line in collapsed.splitlines():
        stack, _, n = line.rstrip().rpartition(" ")
        if not stack or not n.isdigit():
            continue
        frames = stack.split(";")
        leaf = frames[-1]
        if any(idle in leaf for idle in _IDLE):
            continue
        counts[leaf] += int(n)
        total += int(n)
    if not total:
        return 0, []
    return total, [(f, round(c / total, 4)) for f, c in counts.most_common(limit)]


class Profiler:
    def __init__(self, out_dir: Path, rate: int = 50) -> None:
        self.out_dir = out_dir
        self.rate = rate
        self._recordings: list[_Recording] = []
        self.error = ""

    def start(self, pids: dict[str, int], label: str) -> None:
        exe = py_spy()
        if exe is None:
            self.error = "py-spy is not installed"
            return
        self.out_dir.mkdir(parents=True, exist_ok=True)
        for process, pid in pids.items():
            out = self.out_dir / f"{label}-{process}.txt"
            proc = subprocess.Popen(
                [exe, "record", "--gil", "-p", str(pid), "-r", str(self.rate), "-f", "raw"]
                + ["-o", str(out)],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
            )
            self._recordings.append(_Recording(process, out, proc))

    def stop(self, limit: int = 10) -> list[dict[str, Any]]:
        """End the recordings; the top `limit` frames of each process."""
        top: list[dict[str, Any]] = []
        errors: list[str] = []
        for rec in self._recordings:
            # SIGINT makes py-spy write what it has sampled and exit
            with contextlib.suppress(ProcessLookupError):
                rec.proc.send_signal(signal.SIGINT)
            try:
                _, err = rec.proc.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                rec.proc.kill()
                _, err = rec.proc.communicate()
            if not rec.out.exists():
                errors.append(f"{rec.process}: {err.decode(errors='replace').strip()[-200:]}")
                continue
            samples, frames = top_frames(rec.out.read_text(errors="replace"), limit)
            for frame, share in frames:
                top.append(
                    {"process": rec.process, "frame": frame, "share": share, "samples": samples}
                )
        self._recordings.clear()
        if errors and not top:
            self.error = "; ".join(errors)
        return top
