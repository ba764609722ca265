"""The task's stdout and stderr into rotated files (Nomad's logmon and its
FileRotator), run as two threads of the executor that read the task's
pipes: it lives as long as the task, so rotation goes on while the agent
is down.

Files are `<dir>/<task>.<stream>.<n>`. Writing continues in the file with
the highest index (a restarted task appends to it); once a file reached
`max_bytes` the next index is opened (a line that would not fit in what
is left goes whole into the next file, unless it is longer than a file),
and only the newest `max_files` files are kept. Standard
library only.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import threading
from dataclasses import dataclass

READ_SIZE = 64 * 1024


@dataclass
class LogSpec:
    """Where and how much of a task's output is kept (Nomad's logs block)."""

    dir: str
    task: str
    max_files: int = 10
    max_bytes: int = 10 * 1024 * 1024


def indexes(directory: str, base: str) -> list[int]:
    """The indexes of `<base>.<n>` files in `directory`, ascending."""
    pattern = re.compile(re.escape(base) + r"\.(\d+)")
    try:
        names = os.listdir(directory)
    except OSError:
        return []
    found = []
    for name in names:
        m = pattern.fullmatch(name)
        if m is not None:
            found.append(int(m.group(1)))
    return sorted(found)


class FileRotator:
    def __init__(self, directory: str, base: str, max_files: int, max_bytes: int) -> None:
        self.directory = directory
        self.base = base
        self.max_files = max(1, max_files)
        self.max_bytes = max(1, max_bytes)
        found = indexes(directory, base)
        self.index = found[-1] if found else 0
        self._fd = -1
        self.size = 0
        self._open()

    def path(self, index: int) -> str:
        return os.path.join(self.directory, f"{self.base}.{index}")

    def _open(self) -> None:
        self._fd = os.open(
            self.path(self.index), os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644
        )
        self.size = os.fstat(self._fd).st_size

    def _rotate(self) -> None:
        os.close(self._fd)
        while True:
            self.index += 1
            try:
                full = os.stat(self.path(self.index)).st_size >= self.max_bytes
            except FileNotFoundError:
                full = False
            if not full:
                break
        self._open()
        self._purge()

    def _purge(self) -> None:
        found = indexes(self.directory, self.base)
        for old in found[: max(0, len(found) - self.max_files)]:
            try:
                os.unlink(self.path(old))
            except FileNotFoundError:
                pass

    def write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            if self.size >= self.max_bytes:
                self._rotate()
            room = self.max_bytes - self.size
            if len(view) <= room:
                chunk = view
            else:
                newline = bytes(view[:room]).rfind(b"\n")
                first_line = bytes(view).find(b"\n") + 1 or len(view)
                if newline >= 0:
                    chunk = view[: newline + 1]  # the whole lines that fit
                elif self.size > 0 and first_line <= self.max_bytes:
                    self._rotate()  # the line fits whole in a fresh file
                    continue
                else:
                    chunk = view[:room]  # a line longer than a file: fill this one
            written = os.write(self._fd, chunk)
            self.size += written
            view = view[written:]

    def close(self) -> None:
        if self._fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = -1


def pump(fd: int, rotator: FileRotator, name: str) -> None:
    """Copy a pipe into the rotator until every writer closed it. A write
    that fails drops the data but keeps reading, so the task never blocks
    on a full pipe."""
    warned = False
    try:
        while True:
            try:
                data = os.read(fd, READ_SIZE)
            except InterruptedError:
                continue
            if not data:
                return
            try:
                rotator.write(data)
            except OSError as exc:
                if not warned:
                    sys.stderr.write(f"logmon: writing {name}: {exc}\n")
                    warned = True
    finally:
        os.close(fd)
        rotator.close()


def start(spec: LogSpec, stream: str, fd: int) -> threading.Thread:
    rotator = FileRotator(spec.dir, f"{spec.task}.{stream}", spec.max_files, spec.max_bytes)
    thread = threading.Thread(
        target=pump, args=(fd, rotator, stream), name=f"logmon-{stream}", daemon=True
    )
    thread.start()
    return thread
