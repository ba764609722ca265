"""Log rotation as Nomad's logmon does it (FileRotator: files
`<task>.<stream>.<n>`, at most max_files of max_bytes, lines not split
where they fit, a restart appends to the newest) and reading the rotated
files as one stream (Nomad's logsImpl: positions from the start or the
end across files, following across rotations)."""

from __future__ import annotations

import asyncio
import os
import threading
from pathlib import Path

from services.agent import logs
from services.agent.executor.logmon import FileRotator, LogSpec, indexes, pump, start


def files(d: Path, base: str = "web.stdout") -> dict[int, bytes]:
    return {i: (d / f"{base}.{i}").read_bytes() for i in indexes(str(d), base)}


def test_rotation_keeps_max_files_of_max_bytes(tmp_path: Path) -> None:
    r = FileRotator(str(tmp_path), "web.stdout", max_files=3, max_bytes=100)
    for i in range(40):
        r.write(f"line {i:02d} {'x' * 20}\n".encode())  # 29 bytes a line
    r.close()
    kept = files(tmp_path)
    assert sorted(kept) == [11, 12, 13]  # 3 lines a file; the oldest files are gone
    for data in kept.values():
        assert len(data) <= 100
        assert data.endswith(b"\n")  # no line split between files
    assert kept[13] == b"line 39 " + b"x" * 20 + b"\n"


def test_a_line_longer_than_a_file_fills_files(tmp_path: Path) -> None:
    r = FileRotator(str(tmp_path), "web.stdout", max_files=10, max_bytes=50)
    r.write(b"a" * 120 + b"\n")
    r.close()
    kept = files(tmp_path)
    assert b"".join(kept[i] for i in sorted(kept)) == b"a" * 120 + b"\n"
    assert all(len(v) <= 50 for v in kept.values())


def test_a_restarted_writer_appends_to_the_newest_file(tmp_path: Path) -> None:
    r = FileRotator(str(tmp_path), "web.stdout", max_files=5, max_bytes=100)
    r.write(b"x" * 150)
    r.close()
    again = FileRotator(str(tmp_path), "web.stdout", max_files=5, max_bytes=100)
    assert again.index == 1 and again.size == 50
    again.write(b"y\n")
    again.close()
    assert files(tmp_path)[1] == b"x" * 50 + b"y\n"


def test_pump_reads_a_pipe_until_every_writer_closed_it(tmp_path: Path) -> None:
    read, write = os.pipe()
    thread = start(LogSpec(str(tmp_path), "web", max_files=2, max_bytes=1024), "stdout", read)
    os.write(write, b"hello\n" * 400)
    os.close(write)
    thread.join(5)
    assert not thread.is_alive()
    kept = files(tmp_path)
    assert len(kept) == 2 and b"".join(kept[i] for i in sorted(kept)).endswith(b"hello\n")


def test_pump_keeps_reading_when_it_cannot_write(tmp_path: Path) -> None:
    """A full disk must not block the task on a full pipe: the data is dropped."""
    read, write = os.pipe()
    r = FileRotator(str(tmp_path), "web.stdout", max_files=2, max_bytes=1024)
    r.close()  # every write now fails (bad file descriptor)
    r._fd = 10_000
    thread = threading.Thread(target=pump, args=(read, r, "stdout"), daemon=True)
    thread.start()
    os.write(write, b"z" * 200_000)  # more than a pipe holds
    os.close(write)
    thread.join(5)
    assert not thread.is_alive()


def test_find_closest_counts_across_files() -> None:
    fs = [(3, 10), (4, 10), (5, 4)]
    assert logs.find_closest(fs, 0, 0) == (3, 0)
    assert logs.find_closest(fs, 0, 15) == (4, 5)
    assert logs.find_closest(fs, 0, 100) == (5, 4)
    assert logs.find_closest(fs, logs.END, -2) == (5, 2)
    assert logs.find_closest(fs, logs.END, -9) == (4, 5)
    assert logs.find_closest(fs, logs.END, -100) == (3, 0)
    assert logs.find_closest([], 0, 0) is None


async def _collect(stream: object, until: bytes = b"") -> list[logs.Chunk]:
    out: list[logs.Chunk] = []
    async for chunk in stream:  # type: ignore[attr-defined]
        out.append(chunk)
        if until and b"".join(c.data for c in out).endswith(until):
            break
    return out


async def test_stream_reads_the_rotated_files_as_one(tmp_path: Path) -> None:
    r = FileRotator(str(tmp_path), "web.stdout", max_files=3, max_bytes=10)
    r.write(b"0123456789abcdefghijKLMNO")
    r.close()
    assert sorted(files(tmp_path)) == [0, 1, 2]
    whole = await _collect(logs.stream(tmp_path, "web", "stdout"))
    assert b"".join(c.data for c in whole) == b"0123456789abcdefghijKLMNO"
    assert [c.file for c in whole] == [
        "alloc/logs/web.stdout.0",
        "alloc/logs/web.stdout.1",
        "alloc/logs/web.stdout.2",
    ]
    tail = await _collect(logs.stream(tmp_path, "web", "stdout", origin="end", offset=8))
    assert b"".join(c.data for c in tail) == b"hijKLMNO"
    assert (tail[0].file, tail[0].offset) == ("alloc/logs/web.stdout.1", 7)
    skip = await _collect(logs.stream(tmp_path, "web", "stdout", offset=12))
    assert b"".join(c.data for c in skip) == b"cdefghijKLMNO"


async def test_follow_carries_on_across_a_rotation(tmp_path: Path) -> None:
    r = FileRotator(str(tmp_path), "web.stdout", max_files=2, max_bytes=8)
    r.write(b"one\n")
    got: list[logs.Chunk] = []

    async def follow() -> None:
        async for chunk in logs.stream(tmp_path, "web", "stdout", follow=True):
            got.append(chunk)
            if b"".join(c.data for c in got).endswith(b"four\n"):
                return

    reader = asyncio.create_task(follow())
    await asyncio.sleep(0.3)
    r.write(b"two\n")  # fills file 0
    r.write(b"three\n")  # file 1
    r.write(b"four\n")  # file 2: file 0 is purged, the reader holds it open
    r.close()
    await asyncio.wait_for(reader, 10)
    assert b"".join(c.data for c in got) == b"one\ntwo\nthree\nfour\n"
    assert got[-1].file == "alloc/logs/web.stdout.2"


async def test_nothing_to_read_yet(tmp_path: Path) -> None:
    assert await _collect(logs.stream(tmp_path, "web", "stdout")) == []
