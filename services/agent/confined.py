"""Paths inside a directory the agent does not trust (an alloc directory,
written by its tasks), opened without ever leaving it.

A task may have replaced any directory under its task dir with a symlink
(to `/`, to another alloc's secrets) while the agent was not looking.
Checking a path first and opening it afterwards leaves a window for such a
swap, so nothing here opens a path by its full name: every component is
opened relative to the directory before it (`dir_fd`) with `O_NOFOLLOW`,
and `..` goes back to the directory the walk came from, never to the file
system's parent.

`resolve` is the reader's walk (`alloc fs`): a symlink is followed when
its target is relative and stays inside the root, as Nomad's
PathEscapesAllocDir allows; an absolute target, or one climbing out, is an
escape. `open_dir` is the writer's (artifacts): it follows no symlink at
all and creates the directories that are missing.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from dataclasses import dataclass

#: symlinks followed in one walk (Linux's own limit)
MAX_SYMLINKS = 40
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class Escape(ValueError):
    """The path leaves the root (`..` above it, or a symlink out of it)."""


def parts_of(path: str) -> list[str]:
    """The components of a path relative to the root ("/a/./b" = a, b)."""
    return [p for p in path.split("/") if p not in ("", ".")]


@dataclass
class Resolved:
    """Where a walk ended: the directory holding the last component (an
    open fd the caller closes with `close`), that component's name ("" for
    the root itself), and the path from the root with symlinks resolved."""

    parent: int
    name: str
    parts: list[str]
    _fds: list[int]

    def close(self) -> None:
        for fd in self._fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        self._fds.clear()

    def lstat(self) -> os.stat_result:
        if not self.name:
            return os.fstat(self.parent)
        return os.stat(self.name, dir_fd=self.parent, follow_symlinks=False)

    def open(self, flags: int = os.O_RDONLY) -> int:
        """The final component, opened without following a symlink."""
        if not self.name:
            return os.dup(self.parent)
        return os.open(self.name, flags | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=self.parent)


def resolve(root: str, path: str) -> Resolved:
    """Walk `path` inside `root` (see the module doc). FileNotFoundError
    when a directory on the way is missing; Escape when the path leaves
    the root."""
    fds = [os.open(root, _DIR_FLAGS)]
    done: list[str] = []
    todo = parts_of(path)
    hops = 0
    try:
        while todo:
            part = todo.pop(0)
            if part == "..":
                if not done:
                    raise Escape("path escapes the alloc directory")
                os.close(fds.pop())
                done.pop()
                continue
            try:
                st = os.stat(part, dir_fd=fds[-1], follow_symlinks=False)
            except FileNotFoundError:
                if todo:
                    raise
                return Resolved(fds[-1], part, [*done, part], fds)
            if stat.S_ISLNK(st.st_mode):
                hops += 1
                if hops > MAX_SYMLINKS:
                    raise Escape("too many levels of symbolic links")
                target = os.readlink(part, dir_fd=fds[-1])
                if target.startswith("/"):
                    raise Escape("path escapes the alloc directory (an absolute symlink)")
                todo = parts_of(target) + todo
                continue
            if not todo:
                return Resolved(fds[-1], part, [*done, part], fds)
            if not stat.S_ISDIR(st.st_mode):
                raise NotADirectoryError(errno.ENOTDIR, "not a directory", "/".join(done + [part]))
            try:
                fds.append(os.open(part, _DIR_FLAGS, dir_fd=fds[-1]))
            except OSError as exc:
                if exc.errno == errno.ELOOP:  # swapped for a symlink meanwhile
                    raise Escape("path changed while it was read") from None
                raise
            done.append(part)
        return Resolved(fds[-1], "", done, fds)
    except BaseException:
        for fd in fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        raise


def open_dir(root: str, parts: list[str], *, create: bool = False, mode: int = 0o755) -> int:
    """An fd of the directory `root/parts...`, following no symlink on the
    way (Escape if one is met, or `..`); missing directories are made when
    `create`."""
    fd = os.open(root, _DIR_FLAGS)
    try:
        for part in parts:
            if part == "..":
                raise Escape("path escapes its directory")
            if create:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(part, mode, dir_fd=fd)
            try:
                nxt = os.open(part, _DIR_FLAGS, dir_fd=fd)
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                    raise Escape(f"{'/'.join(parts)}: {part} is not a directory") from None
                raise
            os.close(fd)
            fd = nxt
        return fd
    except BaseException:
        os.close(fd)
        raise


def chown_tree(fd: int, uid: int, gid: int) -> None:
    """Change the owner of the directory `fd` and everything under it,
    following no symlink."""
    os.fchown(fd, uid, gid)
    for entry in os.scandir(fd):
        if entry.is_dir(follow_symlinks=False):
            sub = os.open(entry.name, _DIR_FLAGS, dir_fd=fd)
            try:
                chown_tree(sub, uid, gid)
            finally:
                os.close(sub)
        else:
            os.chown(entry.name, uid, gid, dir_fd=fd, follow_symlinks=False)
