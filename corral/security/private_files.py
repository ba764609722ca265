"""Files that hold a secret (a token, a node secret, a private key) and the
directories they live in: readable by their owner only.

A file is created with mode 0600 by `os.open` itself, never written first
and narrowed after (in between, anyone could open it and keep the
descriptor), and replaces the old one atomically, so a process killed
mid-write leaves the previous file. Its directory is 0700: the names of the
files in it, and anything written beside them later, are the owner's too.
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Iterable
from pathlib import Path

FILE_MODE = 0o600
DIR_MODE = 0o700


def private_dir(path: Path) -> Path:
    """`path` as a directory only its owner may enter (parents are created as
    usual). An existing directory open to others is narrowed: a data
    directory made by an older version, or by hand."""
    path.mkdir(parents=True, exist_ok=True, mode=DIR_MODE)
    mode = stat.S_IMODE(path.stat().st_mode)
    if mode & 0o077:
        path.chmod(mode & ~0o077)
    return path


def write_private(path: Path, data: str | bytes) -> None:
    """Replace `path` with `data` in a file created 0600."""
    write_private_chunks(path, [data.encode() if isinstance(data, str) else data])


def write_private_chunks(path: Path, chunks: Iterable[bytes]) -> None:
    """Replace `path` with the bytes `chunks` yields, in a file created
    0600 (an operator snapshot, streamed as it arrives); if `chunks` raises,
    the previous file stays."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, FILE_MODE)
    try:
        with os.fdopen(fd, "wb") as fh:
            fd = -1
            for chunk in chunks:
                fh.write(chunk)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        if fd >= 0:
            os.close(fd)
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
