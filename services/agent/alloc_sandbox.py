"""Files inside an alloc directory, opened as if it were the root of the
file system: Nomad renders templates in a process chrooted into the alloc
directory, so a symlink a task planted (`local/x -> /etc/shadow`) or a
`..` resolves inside the alloc directory, never outside it.

Here the kernel does the same without a process: `openat2(2)` with
`RESOLVE_IN_ROOT` resolves every component of a path below the directory
fd it starts from, `..` and absolute symlinks included, in one system call
(no window between a check and an open for a task to swap a directory for
a symlink). Linux 5.6 or later; Python has no binding for it, hence the
small ctypes call."""

from __future__ import annotations

import ctypes
import errno
import os
import secrets
from pathlib import PurePosixPath

_SYS_OPENAT2 = 437  # the same number on every architecture (a new-style syscall)
_RESOLVE_NO_MAGICLINKS = 0x02
_RESOLVE_IN_ROOT = 0x10
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC

_libc = ctypes.CDLL(None, use_errno=True)


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]


def open_in_root(root_fd: int, path: str, flags: int, mode: int = 0) -> int:
    """`path` opened below the directory `root_fd` as if it were `/`
    (OSError as open(2) raises it)."""
    how = _OpenHow(flags | os.O_CLOEXEC, mode, _RESOLVE_IN_ROOT | _RESOLVE_NO_MAGICLINKS)
    fd = int(
        _libc.syscall(
            _SYS_OPENAT2, root_fd, os.fsencode(path), ctypes.byref(how), ctypes.sizeof(how)
        )
    )
    if fd < 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code), path)
    return fd


def _parts(path: str) -> list[str]:
    return [p for p in PurePosixPath("/", path).parts[1:] if p not in ("", ".")]


def read(root: str, path: str, limit: int) -> bytes:
    """The file `path` below `root` (FileNotFoundError, or ValueError when
    it is larger than `limit` bytes)."""
    root_fd = os.open(root, _DIR)
    try:
        fd = open_in_root(root_fd, path, os.O_RDONLY)
    finally:
        os.close(root_fd)
    with os.fdopen(fd, "rb") as f:
        data = f.read(limit + 1)
    if len(data) > limit:
        raise ValueError(f"{path} is larger than {limit} bytes")
    return data


def _open_dir(root_fd: int, parts: list[str], mode: int) -> int:
    """The directory `parts` below the root, made (with its missing parents,
    `mode`) where it does not exist."""
    try:
        return open_in_root(root_fd, "/".join(parts) or ".", _DIR)
    except FileNotFoundError:
        if not parts:
            raise
    parent = _open_dir(root_fd, parts[:-1], mode)
    try:
        try:
            os.mkdir(parts[-1], mode, dir_fd=parent)
        except FileExistsError:
            pass
        # the name may be a symlink: resolve it as any other path
        return open_in_root(root_fd, "/".join(parts), _DIR)
    finally:
        os.close(parent)


def write(
    root: str,
    path: str,
    data: bytes,
    *,
    mode: int,
    uid: int = -1,
    gid: int = -1,
    dir_mode: int = 0o755,
) -> None:
    """`data` into `path` below `root`, atomically (a reader sees the old
    file or the new one): written to a fresh file beside it with `mode` and
    the owner set before any byte, then renamed over it. Missing parent
    directories are made (`dir_mode`). The destination itself is replaced,
    never followed if it is a symlink."""
    parts = _parts(path)
    if not parts:
        raise IsADirectoryError(errno.EISDIR, "is a directory", path)
    root_fd = os.open(root, _DIR)
    try:
        parent = _open_dir(root_fd, parts[:-1], dir_mode)
    finally:
        os.close(root_fd)
    name = parts[-1]
    tmp = f".{name}.{secrets.token_hex(4)}.tmp"
    try:
        fd = os.open(
            tmp,
            os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
            0o600,
            dir_fd=parent,
        )
        try:
            os.fchmod(fd, mode)
            if uid >= 0 or gid >= 0:
                os.fchown(fd, uid, gid)
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        except BaseException:
            os.close(fd)
            os.unlink(tmp, dir_fd=parent)
            raise
        os.close(fd)
        try:
            os.rename(tmp, name, src_dir_fd=parent, dst_dir_fd=parent)
        except BaseException:
            os.unlink(tmp, dir_fd=parent)
            raise
    finally:
        os.close(parent)
