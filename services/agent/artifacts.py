"""Fetching a task's artifacts before it starts (Nomad's artifact hook and
its go-getter sandbox, for the sources Corral has).

Per artifact: `${...}` in its source, options, headers and destination
resolved from the task's environment; the source fetched — http(s) with
httpx (headers, redirects, `insecure`, the agent's read timeout and size
limit), or a `file::` path inside a directory the operator allowed — into
a staging file the task cannot reach; the `checksum` option verified on
what was fetched; then unpacked into the destination (an archive, by its
extension or the `archive` option; `archive = false` keeps it packed) or
put there as a file (go-getter's modes: "any" keeps the URL's file name in
the destination directory, "file" makes the destination the file, "dir"
wants an archive). Unpacking allows no member outside the destination (no
absolute name, no `..`, no link: go-getter's DisableSymlinks), no device or
fifo, no setuid bit, and stops at the agent's file count and size limits;
it writes through directory fds without following symlinks the task may
have left (services/agent/confined.py), since the agent writes as root.
With `chown` the result belongs to the task's user.

A failure is the task event "Failed Artifact Download" and counts as a
failed start for the restart policy, as in Nomad; an artifact fetched once
is not fetched again when the task restarts.
"""

from __future__ import annotations

import asyncio
import bz2
import contextlib
import dataclasses
import fnmatch
import gzip
import hashlib
import io
import lzma
import os
import posixpath
import pwd
import stat
import tarfile
import tempfile
import zipfile
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import httpx
import zstandard

from corral.domain import artifacts as rules
from corral.v1 import structs_pb2 as pb
from services.agent import confined
from services.agent.allocdir import TaskDir
from services.agent.taskenv import TaskEnv, interpolate

if TYPE_CHECKING:
    from services.agent.config import AgentSettings

MB = 1024 * 1024
#: bytes copied at a time
CHUNK = 1024 * 1024
#: go-getter options that steer the getter and are not sent to the server
GETTER_OPTIONS = ("checksum", "archive", "filename")
#: the modes an unpacked file may keep (go-getter's umask drops setuid/setgid)
MODE_MASK = 0o1777
#: redirects followed per download
MAX_REDIRECTS = 10
#: Nomad's sandbox deadline: at least 30 minutes, plus one
MIN_DEADLINE_S = 30 * 60
DEADLINE_GRACE_S = 60
_SINGLE_FILE: dict[str, Callable[[IO[bytes]], io.BufferedIOBase]] = {
    "gz": lambda f: gzip.GzipFile(fileobj=f, mode="rb"),
    "bz2": lambda f: bz2.BZ2File(f, "rb"),
    "xz": lambda f: lzma.LZMAFile(f, "rb"),  # noqa: SIM115 (the caller's `with` closes it)
    "zst": lambda f: io.BufferedReader(
        zstandard.ZstdDecompressor().stream_reader(f, closefd=False)
    ),
}
#: zstd-compressed tars, unpacked from a spooled plain tar (tarfile has no zstd before 3.14)
_ZSTD_TARS = ("tar.zst", "tzst")
_TAR_MODES: dict[str, Any] = {
    "tar": "r:",
    "tgz": "r:gz",
    "tar.gz": "r:gz",
    "tbz2": "r:bz2",
    "tar.bz2": "r:bz2",
    "txz": "r:xz",
    "tar.xz": "r:xz",
}


class ArtifactError(Exception):
    """An artifact could not be fetched; the message is the task event's."""


@dataclass(frozen=True)
class GetterSettings:
    """The agent's limits on artifacts (Nomad's client `artifact` block)."""

    http_read_timeout: float = 1800.0
    http_max_bytes: int = 100 * 1024 * MB
    decompression_size_limit: int = 100 * 1024 * MB
    decompression_file_count_limit: int = 4096
    #: directories `file::` sources may be read from (none: refused, as Nomad)
    file_dirs: tuple[str, ...] = ()

    @property
    def deadline(self) -> float:
        return max(MIN_DEADLINE_S, self.http_read_timeout) + DEADLINE_GRACE_S


def artifact_key(a: pb.TaskArtifact) -> str:
    """What identifies an artifact for "fetched already" (Nomad hashes the
    same fields)."""
    return a.SerializeToString(deterministic=True).hex()


@dataclass
class Getter:
    settings: GetterSettings = field(default_factory=GetterSettings)
    #: the http transport (tests may point it elsewhere)
    transport: httpx.AsyncBaseTransport | None = None

    async def fetch_all(
        self,
        artifacts: list[pb.TaskArtifact],
        env: TaskEnv,
        task_dir: TaskDir,
        *,
        user: str,
        staging: Path,
        done: set[str],
    ) -> None:
        """Every artifact not in `done` (which each one fetched joins);
        ArtifactError for the first that fails."""
        for a in artifacts:
            key = artifact_key(a)
            if key in done:
                continue
            try:
                async with asyncio.timeout(self.settings.deadline):
                    await self.fetch(a, env, task_dir, user=user, staging=staging)
            except TimeoutError:
                raise ArtifactError(
                    f"failed to download artifact {a.getter_source!r}: it took longer than "
                    f"{self.settings.deadline:.0f}s"
                ) from None
            except ArtifactError as exc:
                raise ArtifactError(
                    f"failed to download artifact {a.getter_source!r}: {exc}"
                ) from None
            done.add(key)

    async def fetch(
        self, a: pb.TaskArtifact, env: TaskEnv, task_dir: TaskDir, *, user: str, staging: Path
    ) -> None:
        variables = env.variables
        source = interpolate(a.getter_source, variables)
        options = {k: interpolate(v, variables) for k, v in a.getter_options.items()}
        headers = {k: interpolate(v, variables) for k, v in a.getter_headers.items()}
        mode = a.getter_mode or rules.MODE_ANY
        dest_parts = _destination(task_dir, interpolate(a.relative_dest, variables))
        source, subdir = rules.split_subdir(source)
        wrong = rules.source_problem(source)
        if wrong is not None:
            raise ArtifactError(wrong)
        checksum = None
        if "checksum" in options:
            try:
                checksum = rules.parse_checksum(options["checksum"])
            except rules.ChecksumError as exc:
                raise ArtifactError(str(exc)) from None
        staging.mkdir(parents=True, exist_ok=True)
        os.chmod(staging, 0o700)
        fd, tmp = tempfile.mkstemp(dir=staging, prefix="artifact-")
        try:
            with os.fdopen(fd, "w+b") as out:
                if source.startswith(rules.FILE_PREFIX) or source.startswith("/"):
                    path = source.removeprefix(rules.FILE_PREFIX)
                    name = posixpath.basename(path)
                    digest = await asyncio.to_thread(self._copy_file, path, out, checksum)
                else:
                    url, name = _url(source, options)
                    digest = await self._download(url, headers, a.getter_insecure, out, checksum)
                if checksum is not None and digest != checksum[1]:
                    raise ArtifactError(
                        f"checksums did not match: expected {checksum[0]}:{checksum[1].hex()}, "
                        f"got {checksum[0]}:{digest.hex()}"
                    )
                try:
                    fmt = rules.archive_format(options.get("archive"), name)
                except ValueError as exc:
                    raise ArtifactError(str(exc)) from None
                out.seek(0)
                await asyncio.to_thread(
                    self._place,
                    out,
                    fmt,
                    mode,
                    str(task_dir.dir.parent),
                    dest_parts,
                    options.get("filename") or name,
                    staging,
                    subdir,
                )
            if a.chown and user:
                await asyncio.to_thread(_chown, str(task_dir.dir.parent), dest_parts, mode, user)
        finally:
            with contextlib.suppress(OSError):
                os.unlink(tmp)

    # ------------------------------------------------------------ fetching

    async def _download(
        self,
        url: str,
        headers: dict[str, str],
        insecure: bool,
        out: IO[bytes],
        checksum: tuple[str, bytes] | None,
    ) -> bytes:
        limit = self.settings.http_max_bytes
        hasher = hashlib.new(checksum[0]) if checksum else None
        timeout = httpx.Timeout(self.settings.http_read_timeout, connect=30.0)
        try:
            async with (
                httpx.AsyncClient(
                    verify=not insecure,
                    timeout=timeout,
                    follow_redirects=True,
                    max_redirects=MAX_REDIRECTS,
                    transport=self.transport,
                    trust_env=False,
                ) as client,
                client.stream("GET", url, headers=headers) as resp,
            ):
                if resp.status_code != 200:
                    raise ArtifactError(f"bad response code: {resp.status_code}")
                size = 0
                async for chunk in resp.aiter_raw(CHUNK):
                    size += len(chunk)
                    if size > limit:
                        raise ArtifactError(
                            f"the download is larger than the agent's limit of {limit} bytes"
                        )
                    if hasher is not None:
                        hasher.update(chunk)
                    await asyncio.to_thread(out.write, chunk)
        except httpx.HTTPError as exc:
            raise ArtifactError(f"{type(exc).__name__.lower()}: {exc}") from None
        return hasher.digest() if hasher is not None else b""

    def _copy_file(self, path: str, out: IO[bytes], checksum: tuple[str, bytes] | None) -> bytes:
        """A `file::` source, when the operator allowed its directory."""
        real = os.path.realpath(path)
        allowed = [os.path.realpath(d) for d in self.settings.file_dirs]
        if not any(real == d or real.startswith(d.rstrip("/") + "/") for d in allowed):
            raise ArtifactError(
                "file:: sources are refused on this node (its operator may allow a directory "
                "with --artifact-file-dirs)"
            )
        hasher = hashlib.new(checksum[0]) if checksum else None
        try:
            with open(real, "rb") as src:
                if not stat.S_ISREG(os.fstat(src.fileno()).st_mode):
                    raise ArtifactError(f"{path} is not a regular file")
                size = 0
                while chunk := src.read(CHUNK):
                    size += len(chunk)
                    if size > self.settings.http_max_bytes:
                        raise ArtifactError("the file is larger than the agent's artifact limit")
                    if hasher is not None:
                        hasher.update(chunk)
                    out.write(chunk)
        except OSError as exc:
            raise ArtifactError(f"{path}: {exc.strerror}") from None
        return hasher.digest() if hasher is not None else b""

    # ------------------------------------------------------------ placing

    def _place(
        self,
        src: IO[bytes],
        fmt: str | None,
        mode: str,
        alloc_root: str,
        dest: list[str],
        name: str,
        staging: Path,
        subdir: str = "",
    ) -> None:
        limits = _Limits(
            self.settings.decompression_size_limit, self.settings.decompression_file_count_limit
        )
        if fmt in _ZSTD_TARS:
            with _unzstd(src, staging, limits) as tar:
                self._place(tar, "tar", mode, alloc_root, dest, name, staging, subdir)
            return
        if subdir and (fmt is None or fmt in _SINGLE_FILE):
            raise ArtifactError(f"subdir {subdir!r} not found: the source is not an archive")
        if subdir and mode == rules.MODE_FILE:
            raise ArtifactError(f'a subdir ({subdir!r}) needs mode "any" or "dir"')
        if fmt in _SINGLE_FILE:
            if mode != rules.MODE_FILE:
                raise ArtifactError(
                    f"{fmt}-compressed files can only unarchive to a single file "
                    '(mode = "file" with the file\'s path as destination)'
                )
            try:
                with _SINGLE_FILE[fmt](src) as plain:
                    _write_file(alloc_root, dest, plain, 0o644, limits)
            except (EOFError, OSError, zlib.error, lzma.LZMAError, zstandard.ZstdError) as exc:
                raise ArtifactError(f"cannot unpack the {fmt} file: {exc}") from None
            return
        if fmt is None:
            if mode == rules.MODE_DIR:
                raise ArtifactError('mode "dir" needs an archive to unpack')
            target = dest if mode == rules.MODE_FILE else [*dest, name]
            if not name and mode != rules.MODE_FILE:
                raise ArtifactError('the source names no file (give mode = "file")')
            _write_file(alloc_root, target, src, 0o644, limits, counted=False)
            return
        with _archive_members(src, fmt, limits.files) as listed:
            members = _subdir_members(listed, subdir)
            if mode == rules.MODE_FILE:
                if len(members) != 1 or members[0].directory:
                    raise ArtifactError('expected a single file in the archive (mode is "file")')
                with members[0].open() as data:
                    _write_file(alloc_root, dest, data, members[0].mode, limits)
                return
            for m in members:
                target = [*dest, *m.parts]
                if m.directory:
                    limits.count(0)
                    try:
                        os.close(confined.open_dir(alloc_root, target, create=True))
                    except confined.Escape as exc:
                        raise ArtifactError(f"cannot unpack {m.parts}: {exc}") from None
                    continue
                with m.open() as data:
                    _write_file(alloc_root, target, data, m.mode, limits)


# ------------------------------------------------------------ destinations


def _destination(task_dir: TaskDir, relative: str) -> list[str]:
    """The destination as components from the alloc directory: relative
    to the task directory, and within the alloc (`../alloc/data` is fine)."""
    joined = posixpath.normpath(posixpath.join(task_dir.name, relative or "local/"))
    parts = confined.parts_of(joined)
    if not parts or parts[0] == "..":
        raise ArtifactError("artifact destination path escapes alloc directory")
    return parts


def _url(source: str, options: dict[str, str]) -> tuple[str, str]:
    """The URL to fetch (options other than the getter's own as query
    parameters, as go-getter sends them) and the name of its file."""
    scheme, netloc, path, query, _ = urlsplit(source)
    params = parse_qsl(query, keep_blank_values=True)
    params += [(k, v) for k, v in sorted(options.items()) if k not in GETTER_OPTIONS]
    return urlunsplit((scheme, netloc, path, urlencode(params), "")), posixpath.basename(path)


# ------------------------------------------------------------ archives


class _Limits:
    def __init__(self, size: int, files: int) -> None:
        self.size, self.files = size, files
        self.used_size = self.used_files = 0

    def count(self, size: int, *, file: bool = True) -> None:
        self.used_size += size
        if file:
            self.used_files += 1
        if self.used_files > self.files:
            raise ArtifactError(f"the archive holds more than {self.files} files")
        if self.used_size > self.size:
            raise ArtifactError(f"the archive unpacks to more than {self.size} bytes")


@dataclass
class _Member:
    parts: list[str]
    directory: bool
    mode: int
    open: Callable[[], IO[bytes]]


def _member_parts(name: str) -> list[str]:
    if name.startswith("/") or name.startswith("\\"):
        raise ArtifactError(f"archive entry {name!r} has an absolute path")
    parts = confined.parts_of(name.replace("\\", "/"))
    if ".." in parts:
        raise ArtifactError(f"archive entry {name!r} escapes the destination (..)")
    return parts


def _unzstd(src: IO[bytes], staging: Path, limits: _Limits) -> IO[bytes]:
    """A zstd-compressed tar, decompressed into an unnamed file in the
    staging directory (tarfile reads members out of order in mode "file"),
    no larger than the decompression limit allows the tar it holds to be:
    the files' bytes, plus a header and padding for each and the end."""
    bound = limits.size + 1024 * (limits.files + 1) + 20 * 1024
    out = tempfile.TemporaryFile(dir=staging)  # noqa: SIM115 (the caller's `with` closes it)
    try:
        with zstandard.ZstdDecompressor().stream_reader(src, closefd=False) as plain:
            size = 0
            while chunk := plain.read(CHUNK):
                size += len(chunk)
                if size > bound:
                    raise ArtifactError(f"the archive unpacks to more than {limits.size} bytes")
                out.write(chunk)
        out.seek(0)
    except zstandard.ZstdError as exc:
        out.close()
        raise ArtifactError(f"cannot unpack the zstd archive: {exc}") from None
    except BaseException:
        out.close()
        raise
    return out


@contextlib.contextmanager
def _archive_members(src: IO[bytes], fmt: str, most: int) -> Iterator[list[_Member]]:
    """The archive's members (at most `most`), every one checked before any
    is written, and readable while the archive is open (inside the `with`;
    mode "file" reads its one member after listing them all); a corrupt
    archive, found while listing or while reading a member, is an
    ArtifactError."""
    try:
        if fmt == "zip":
            with zipfile.ZipFile(src) as zipped:
                yield _at_most(_zip_members(zipped), most)
        else:
            with tarfile.open(fileobj=src, mode=_TAR_MODES[fmt]) as tar:
                yield _at_most(_tar_members(tar), most)
    except (
        tarfile.TarError,
        zipfile.BadZipFile,
        EOFError,
        OSError,
        zlib.error,
        lzma.LZMAError,
    ) as exc:
        raise ArtifactError(f"cannot unpack the {fmt} archive: {exc}") from None


def _subdir_members(members: list[_Member], subdir: str) -> list[_Member]:
    """The members under `subdir` (go-getter's SubdirGlob: each component
    may be a glob, and the pattern must match exactly one directory), with
    paths relative to it; all of them without a subdir."""
    pattern = confined.parts_of(subdir)
    if not pattern:
        return members
    if ".." in pattern:
        raise ArtifactError(f"subdir {subdir!r} escapes the archive (..)")
    depth = len(pattern)
    dirs = {
        tuple(m.parts[:depth])
        for m in members
        if len(m.parts) > depth or (m.directory and len(m.parts) == depth)
    }
    found = sorted(
        d for d in dirs if all(fnmatch.fnmatchcase(c, p) for c, p in zip(d, pattern, strict=True))
    )
    if not found:
        raise ArtifactError(f"subdir {subdir!r} not found in the archive")
    if len(found) > 1:
        raise ArtifactError(f"subdir {subdir!r} matches multiple paths")
    prefix = list(found[0])
    return [
        dataclasses.replace(m, parts=m.parts[depth:])
        for m in members
        if m.parts[:depth] == prefix and len(m.parts) > depth
    ]


def _at_most(members: Iterator[_Member], most: int) -> list[_Member]:
    listed: list[_Member] = []
    for m in members:
        listed.append(m)
        if len(listed) > most:
            raise ArtifactError(f"the archive holds more than {most} files")
    return listed


def _tar_members(tar: tarfile.TarFile) -> Iterator[_Member]:
    for info in tar:
        parts = _member_parts(info.name)
        if info.issym() or info.islnk():
            raise ArtifactError(f"archive entry {info.name!r} is a link, which is not allowed")
        if not (info.isdir() or info.isfile()):
            raise ArtifactError(f"archive entry {info.name!r} is not a file or directory")
        if not parts:
            continue

        def opener(info: tarfile.TarInfo = info) -> IO[bytes]:
            data = tar.extractfile(info)
            if data is None:
                raise ArtifactError(f"archive entry {info.name!r} cannot be read")
            return data

        yield _Member(parts, info.isdir(), info.mode, opener)


def _zip_members(archive: zipfile.ZipFile) -> Iterator[_Member]:
    for info in archive.infolist():
        parts = _member_parts(info.filename)
        unix_mode = info.external_attr >> 16
        if stat.S_ISLNK(unix_mode):
            raise ArtifactError(f"archive entry {info.filename!r} is a link, which is not allowed")
        kind = stat.S_IFMT(unix_mode)  # 0: the archiver wrote no file type
        if kind and kind not in (stat.S_IFREG, stat.S_IFDIR):
            raise ArtifactError(f"archive entry {info.filename!r} is not a file or directory")
        if not parts:
            continue

        def opener(info: zipfile.ZipInfo = info) -> IO[bytes]:
            return archive.open(info)

        mode = stat.S_IMODE(unix_mode) or (0o755 if info.is_dir() else 0o644)
        yield _Member(parts, info.is_dir(), mode, opener)


def _write_file(
    alloc_root: str,
    parts: list[str],
    data: IO[bytes] | io.BufferedIOBase,
    mode: int,
    limits: _Limits,
    *,
    counted: bool = True,
) -> None:
    """`data` as the file `parts` under the alloc directory, replacing a
    file there, never through a symlink (see the module doc)."""
    try:
        parent = confined.open_dir(alloc_root, parts[:-1], create=True)
    except confined.Escape as exc:
        raise ArtifactError(f"cannot write the artifact: {exc}") from None
    except OSError as exc:
        raise ArtifactError(f"cannot write the artifact: {exc.strerror}") from None
    name = parts[-1]
    try:
        with contextlib.suppress(FileNotFoundError, IsADirectoryError):
            if stat.S_ISLNK(os.stat(name, dir_fd=parent, follow_symlinks=False).st_mode):
                os.unlink(name, dir_fd=parent)  # a file replaces a link, never writes through it
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC
        try:
            fd = os.open(name, flags, mode & MODE_MASK & ~0o6000, dir_fd=parent)
        except OSError as exc:
            raise ArtifactError(f"cannot write {'/'.join(parts)}: {exc.strerror}") from None
        with os.fdopen(fd, "wb") as out:
            if counted:
                limits.count(0)
            while chunk := data.read(CHUNK):
                if counted:
                    limits.count(len(chunk), file=False)
                out.write(chunk)
            os.fchmod(out.fileno(), mode & MODE_MASK & ~0o6000)
    finally:
        os.close(parent)


def _chown(alloc_root: str, dest: list[str], mode: str, user: str) -> None:
    """The destination (its tree; in mode "file" the file) to the task's user."""
    try:
        entry = pwd.getpwnam(user)
    except KeyError:
        raise ArtifactError(f"chown: user {user!r} not found on this node") from None
    if mode == rules.MODE_FILE:
        parent = confined.open_dir(alloc_root, dest[:-1])
        try:
            os.chown(dest[-1], entry.pw_uid, entry.pw_gid, dir_fd=parent, follow_symlinks=False)
        finally:
            os.close(parent)
        return
    fd = confined.open_dir(alloc_root, dest)
    try:
        confined.chown_tree(fd, entry.pw_uid, entry.pw_gid)
    finally:
        os.close(fd)


def getter_settings(settings: AgentSettings) -> GetterSettings:
    """The agent's settings (services/agent/config.py) as the getter's."""
    return GetterSettings(
        http_read_timeout=settings.artifact_http_read_timeout,
        http_max_bytes=settings.artifact_http_max_size_mb * MB,
        decompression_size_limit=settings.artifact_decompression_size_limit_mb * MB,
        decompression_file_count_limit=settings.artifact_decompression_file_count_limit,
        file_dirs=tuple(settings.artifact_file_dirs),
    )


__all__ = ["ArtifactError", "Getter", "GetterSettings", "artifact_key", "getter_settings"]
