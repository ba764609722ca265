"""Reading a task's rotated log files as one stream (Nomad's logsImpl in
client/fs_endpoint.go): `<task>.<type>.<n>` in the alloc's alloc/logs,
oldest kept index first. A position counts from the start of the oldest
file kept, or back from the end of the newest (origin "end"); reading
goes file after file, and when following, waits at the end of the newest
for more output or for the next file the rotation opens — so `alloc logs
-f` carries on across rotations and across agent restarts (the executor
writes the files, services/agent/executor/logmon.py)."""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path

from services.agent.executor.logmon import indexes

CHUNK = 64 * 1024
#: how often a followed stream looks for more output
POLL_S = 0.25
END = 2**63 - 1


@dataclass(frozen=True)
class Chunk:
    file: str  # relative to the alloc dir: alloc/logs/<task>.<type>.<n>
    offset: int  # of `data` in that file
    data: bytes


def _sizes(directory: Path, base: str) -> list[tuple[int, int]]:
    """(index, size) of each `<base>.<n>` file, by index."""
    out = []
    for index in indexes(str(directory), base):
        with contextlib.suppress(OSError):
            out.append((index, os.stat(directory / f"{base}.{index}").st_size))
    return out


def find_closest(
    files: list[tuple[int, int]], wanted_index: int, offset: int
) -> tuple[int, int] | None:
    """Nomad's findClosest: the file at or after `wanted_index` (the newest
    when none is), then `offset` bytes on (negative: back) across files, to
    a (index, offset in that file). None when there are no files."""
    if not files:
        return None
    i = next((k for k, (index, _) in enumerate(files) if index >= wanted_index), len(files) - 1)
    while True:
        size = files[i][1]
        if offset == 0:
            break
        if offset < 0:
            if size + offset >= 0:
                offset = size + offset
                break
            if i == 0:
                offset = 0
                break
            offset += size
            i -= 1
        else:
            if offset <= size:
                break
            if i == len(files) - 1:
                offset = size
                break
            offset -= size
            i += 1
    return files[i][0], offset


async def stream(
    directory: Path,
    task: str,
    kind: str,
    *,
    origin: str = "start",
    offset: int = 0,
    follow: bool = False,
    stopping: Callable[[], bool] = lambda: False,
) -> AsyncIterator[Chunk]:
    """The task's `kind` output from the position asked for; with `follow`
    until `stopping()` says so (or the caller stops reading)."""
    base = f"{task}.{kind}"
    next_index = 0 if origin == "start" else END
    position = offset if origin == "start" else -min(offset, END)
    while True:
        files = _sizes(directory, base)
        if not files:
            if not follow or stopping():
                return
            await asyncio.sleep(POLL_S)
            continue
        last = files[-1][0]
        found = find_closest(files, next_index, position)
        assert found is not None
        index, start = found
        name = f"{base}.{index}"
        try:
            f = (directory / name).open("rb")
        except FileNotFoundError:
            continue  # rotated out from under us: look again
        with f:
            f.seek(start)
            at = start
            while True:
                data = f.read(CHUNK)
                if data:
                    yield Chunk(f"alloc/logs/{name}", at, data)
                    at += len(data)
                    continue
                if not follow:
                    if index >= last:
                        return
                    break
                if indexes(str(directory), base)[-1:] > [index]:
                    # the writer moved on to a newer file: drain this one
                    while data := f.read(CHUNK):
                        yield Chunk(f"alloc/logs/{name}", at, data)
                        at += len(data)
                    break
                if stopping():
                    return
                await asyncio.sleep(POLL_S)
        next_index, position = index + 1, 0
