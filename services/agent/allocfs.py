"""An alloc's directory as `alloc fs` sees it (Nomad's AllocDir List, Stat
and ReadAt): paths relative to the alloc directory, confined to it
(services/agent/confined.py: no `..` above it, no symlink out of it), and a
task's `secrets/` listed but never read, as in Nomad.

Blocking file system calls: the handlers run them in a thread."""

from __future__ import annotations

import os
import stat
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

from corral.v1 import alloc_pb2
from services.agent import confined
from services.agent.confined import Escape

#: what Go's http.DetectContentType reads of a file
SNIFF_BYTES = 512

__all__ = ["AllocFS", "Escape", "SecretFile", "go_file_mode", "sniff_content_type"]


class SecretFile(PermissionError):
    """A read of a file under a task's secrets/ (Nomad refuses it too)."""


# ------------------------------------------------------------ Go's presentation

#: Go's os.FileMode type letters, in the order its String() prints them
_GO_TYPE_LETTERS = (
    (stat.S_IFDIR, "d"),
    (stat.S_IFLNK, "L"),
    (stat.S_IFBLK, "D"),
    (stat.S_IFIFO, "p"),
    (stat.S_IFSOCK, "S"),
)


def go_file_mode(mode: int) -> str:
    """A stat mode as Go's FileMode.String() writes it ("-rw-r--r--",
    "drwxrwxrwx", "dtrwxrwxrwx" for a sticky directory, "Lrwxrwxrwx",
    "Dcrw-rw-rw-" for a character device), as Nomad's AllocFileInfo has it."""
    fmt = stat.S_IFMT(mode)
    letters = ""
    for kind, letter in _GO_TYPE_LETTERS:
        if fmt == kind:
            letters += letter
    if fmt == stat.S_IFCHR:
        letters += "D"  # Go: ModeDevice and ModeCharDevice
    if mode & stat.S_ISUID:
        letters += "u"
    if mode & stat.S_ISGID:
        letters += "g"
    if fmt == stat.S_IFCHR:
        letters += "c"
    if mode & stat.S_ISVTX:
        letters += "t"
    perms = "".join(
        ch if mode & bit else "-"
        for ch, bit in zip(
            "rwxrwxrwx",
            (0o400, 0o200, 0o100, 0o040, 0o020, 0o010, 0o004, 0o002, 0o001),
            strict=True,
        )
    )
    return (letters or "-") + perms


_SIGNATURES: tuple[tuple[bytes, str], ...] = (
    (b"%PDF-", "application/pdf"),
    (b"%!PS-Adobe-", "application/postscript"),
    (b"GIF87a", "image/gif"),
    (b"GIF89a", "image/gif"),
    (b"\x89PNG\r\n\x1a\n", "image/png"),
    (b"\xff\xd8\xff", "image/jpeg"),
    (b"BM", "image/bmp"),
    (b"\x00\x00\x01\x00", "image/x-icon"),
    (b"PK\x03\x04", "application/zip"),
    (b"\x1f\x8b\x08", "application/x-gzip"),
    (b"Rar!\x1a\x07", "application/x-rar-compressed"),
    (b"\x00asm", "application/wasm"),
    (b"\xfe\xff", "text/plain; charset=utf-16be"),
    (b"\xff\xfe", "text/plain; charset=utf-16le"),
    (b"\xef\xbb\xbf", "text/plain; charset=utf-8"),
)
_HTML_TAGS = (b"<!doctype html", b"<html", b"<head", b"<script", b"<body", b"<!--", b"<p", b"<div")


def sniff_content_type(head: bytes, name: str) -> str:
    """The content type Nomad's Stat reports: Go's http.DetectContentType
    of the first 512 bytes for the common kinds (a `.json` file is
    application/json)."""
    if name.endswith(".json"):
        return "application/json"
    for prefix, kind in _SIGNATURES:
        if head.startswith(prefix):
            return kind
    text = head.lstrip(b"\t\n\x0c\r ")
    lowered = text[:16].lower()
    if any(lowered.startswith(tag) for tag in _HTML_TAGS):
        return "text/html; charset=utf-8"
    if text.startswith(b"<?xml"):
        return "text/xml; charset=utf-8"
    for b in head:
        if b <= 0x08 or b == 0x0B or 0x0E <= b <= 0x1A or 0x1C <= b <= 0x1F:
            return "application/octet-stream"
    return "text/plain; charset=utf-8"


def file_info(name: str, st: os.stat_result, content_type: str = "") -> alloc_pb2.AllocFileInfo:
    return alloc_pb2.AllocFileInfo(
        name=name,
        is_dir=stat.S_ISDIR(st.st_mode),
        size=st.st_size,
        file_mode=go_file_mode(st.st_mode),
        mod_time=st.st_mtime_ns,
        content_type=content_type,
    )


# ------------------------------------------------------------ the view


@dataclass(frozen=True)
class AllocFS:
    """The files of one alloc: `root` is its directory, `tasks` the names
    of its tasks (whose secrets/ may not be read)."""

    root: Path
    tasks: Collection[str]

    def _secret(self, parts: list[str]) -> bool:
        lowered = [p.lower() for p in parts[:2]]
        tasks = {t.lower() for t in self.tasks}
        return len(lowered) == 2 and lowered[0] in tasks and lowered[1] == "secrets"

    def list(self, path: str) -> list[alloc_pb2.AllocFileInfo]:
        """The entries of a directory (symlinks as themselves, as Nomad)."""
        found = confined.resolve(str(self.root), path)
        try:
            fd = found.open(os.O_RDONLY | os.O_DIRECTORY)
            try:
                out = []
                for entry in sorted(os.scandir(fd), key=lambda e: e.name):
                    try:
                        st = entry.stat(follow_symlinks=False)
                    except FileNotFoundError:
                        continue  # removed while listed
                    out.append(file_info(entry.name, st))
                return out
            finally:
                os.close(fd)
        finally:
            found.close()

    def stat(self, path: str) -> alloc_pb2.AllocFileInfo:
        """One file or directory, symlinks followed (inside the root)."""
        found = confined.resolve(str(self.root), path)
        try:
            st = found.lstat()
            # Go's FileInfo.Name(): the last element of the path asked for
            name = os.path.basename(os.path.normpath(os.path.join(self.root, path.lstrip("/"))))
            kind = "application/octet-stream"  # Nomad's when it cannot sniff
            if stat.S_ISREG(st.st_mode) and not self._secret(found.parts):
                fd = _open_regular(found)
                try:
                    head = os.pread(fd, SNIFF_BYTES, 0)
                finally:
                    os.close(fd)
                if head:
                    kind = sniff_content_type(head, name)
            if name.endswith(".json"):
                kind = "application/json"
            return file_info(name, st, kind)
        finally:
            found.close()

    def open(self, path: str) -> tuple[int, os.stat_result]:
        """A regular file to read (fd, its stat); SecretFile under a task's
        secrets/, IsADirectoryError for anything but a regular file."""
        found = confined.resolve(str(self.root), path)
        try:
            if self._secret(found.parts):
                raise SecretFile(f"Reading secret file prohibited: {path}")
            st = found.lstat()
            if stat.S_ISDIR(st.st_mode):
                raise IsADirectoryError(f"file {path!r} is a directory")
            fd = _open_regular(found)
        finally:
            found.close()
        return fd, os.fstat(fd)


def _open_regular(found: confined.Resolved) -> int:
    """The final component if it is a regular file, never anything else: a
    task may make device nodes and fifos in its directory, and the agent
    reads as root. Checked before opening and again on what was opened."""
    if not stat.S_ISREG(found.lstat().st_mode):
        raise IsADirectoryError(f"{'/'.join(found.parts)} is not a regular file")
    fd = found.open(os.O_RDONLY | os.O_NONBLOCK)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise IsADirectoryError(f"{'/'.join(found.parts)} is not a regular file")
    os.set_blocking(fd, True)
    return fd
