"""Artifacts (Nomad's TaskArtifact): files a task needs, fetched into its
directory before it starts. The rules the job parsers, the state and the
agent share: the defaults (`canonicalize`), what an artifact may say
(`problem`), and how its checksum option reads (`parse_checksum`).

Corral fetches `http://` and `https://` URLs, and `file::` paths only
where the agent's operator allows a directory; go-getter's other getters
(git, hg, s3, gcs) are refused when the job is submitted, not when the
task would start.
"""

from __future__ import annotations

import posixpath
from collections.abc import Iterator

from corral.v1 import structs_pb2 as pb

MODE_ANY, MODE_FILE, MODE_DIR = "any", "file", "dir"
MODES = (MODE_ANY, MODE_FILE, MODE_DIR)
DEFAULT_DESTINATION = "local/"

#: checksum type -> digest length in bytes (go-getter's, as Nomad validates)
CHECKSUM_BYTES = {"md5": 16, "sha1": 20, "sha256": 32, "sha512": 64}

#: go-getter's forced getters (`git::...`) and the sources Corral fetches
FILE_PREFIX = "file::"
UNSUPPORTED_GETTERS = ("git", "hg", "s3", "gcs")


#: go-getter's archive formats Corral unpacks, longest suffix first: the
#: `archive` option names one, or the URL's path ends with it
ARCHIVES = (
    "tar.bz2",
    "tar.gz",
    "tar.xz",
    "tar.zst",
    "tbz2",
    "tgz",
    "txz",
    "tzst",
    "tar",
    "zip",
    "bz2",
    "gz",
    "xz",
    "zst",
)
#: the `archive` values that turn unpacking off
NO_ARCHIVE = ("false", "0", "no")


class ChecksumError(ValueError):
    pass


def archive_problem(option: str) -> str | None:
    """Why an `archive = "..."` option cannot be honoured, or None."""
    value = option.strip().lower()
    if value in NO_ARCHIVE or value in ARCHIVES:
        return None
    return f"unknown archive format {option!r} (expected false or one of: {', '.join(ARCHIVES)})"


def archive_format(option: str | None, url_path: str) -> str | None:
    """The format to unpack with: the `archive` option's, else the one the
    URL's path ends with (go-getter); None to keep the file as it is.
    ValueError for a format Corral cannot unpack."""
    if option is not None:
        value = option.strip().lower()
        if value in NO_ARCHIVE:
            return None
        wrong = archive_problem(value)
        if wrong is not None:
            raise ValueError(wrong)
        return value
    name = url_path.lower()
    for suffix in ARCHIVES:
        if name.endswith("." + suffix):
            return suffix
    return None


def parse_checksum(value: str) -> tuple[str, bytes]:
    """`"sha256:<hex>"` → ("sha256", digest); ChecksumError says why not
    (Nomad's validateChecksum)."""
    check = value.strip()
    if not check:
        raise ChecksumError("checksum value cannot be empty")
    parts = check.split(":")
    if len(parts) != 2:
        raise ChecksumError(f'checksum must be given as "type:value"; got {check!r}')
    kind, hex_value = parts
    try:
        digest = bytes.fromhex(hex_value)
    except ValueError:
        raise ChecksumError(f"invalid checksum: {hex_value!r} is not hexadecimal") from None
    expected = CHECKSUM_BYTES.get(kind)
    if expected is None:
        raise ChecksumError(
            f"unsupported checksum type: {kind} (expected one of {', '.join(CHECKSUM_BYTES)})"
        )
    if len(digest) != expected:
        raise ChecksumError(f"invalid {kind} checksum: {hex_value}")
    return kind, digest


def canonicalize(artifact: pb.TaskArtifact) -> None:
    """Nomad's api defaults: mode "any"; the destination `local/`, or for
    a file `local/<the source's base name>`."""
    if not artifact.getter_mode:
        artifact.getter_mode = MODE_ANY
    if not artifact.relative_dest:
        if artifact.getter_mode == MODE_FILE:
            base = posixpath.basename(artifact.getter_source.split("?", 1)[0])
            artifact.relative_dest = posixpath.join("local", base)
        else:
            artifact.relative_dest = DEFAULT_DESTINATION


def split_subdir(source: str) -> tuple[str, str]:
    """go-getter's SourceDirSubdir: `https://host/app.tar.gz//bin` fetches
    `https://host/app.tar.gz` and keeps only `bin` of what it unpacks (a
    query string stays with the source); ("source", "") without one."""
    start = source.index("://") + 3 if "://" in source else 0
    at = source.find("//", start)
    if at < 0:
        return source, ""
    source, subdir = source[:at], source[at + 2 :]
    subdir, sep, query = subdir.partition("?")
    return (source + sep + query if sep else source), subdir


def _escapes_alloc_dir(destination: str) -> bool:
    """Nomad's PathEscapesAllocViaRelative("task", dest): the destination is
    relative to the task directory and may reach the alloc's shared
    directory (`../alloc/data`) but not above the alloc."""
    joined = posixpath.normpath(posixpath.join("/alloc-dir/alloc-id/task", destination))
    return not (joined + "/").startswith("/alloc-dir/alloc-id/")


def _runtime(value: str) -> bool:
    """A value interpolated on the client (`${NOMAD_...}`, `${attr...}`)."""
    return "${" in value


def source_problem(source: str) -> str | None:
    """Why Corral cannot fetch `source`, or None."""
    if _runtime(source):
        return None
    forced, sep, _ = source.partition("::")
    if sep and forced in UNSUPPORTED_GETTERS:
        return f"the {forced} getter is not supported by Corral (http, https and file:: are)"
    if sep and forced != "file":
        return f"unknown getter {forced!r} (Corral fetches http, https and file:: sources)"
    if sep or source.startswith("/"):
        return None
    scheme = source.partition("://")[0].lower() if "://" in source else ""
    if scheme in ("http", "https"):
        return None
    if scheme in UNSUPPORTED_GETTERS:
        return f"the {scheme} getter is not supported by Corral (http, https and file:: are)"
    return "unsupported artifact source: Corral fetches http:// and https:// URLs and file:: paths"


def problem(job: pb.Job) -> tuple[str, str] | None:
    """(proto path, problem) of the first wrong artifact of `job`, or None
    (Nomad's TaskArtifact.Validate, and the getters Corral does not have)."""
    for found in _problems(job):
        return found
    return None


def _problems(job: pb.Job) -> Iterator[tuple[str, str]]:
    for gi, tg in enumerate(job.task_groups):
        for ti, task in enumerate(tg.tasks):
            for ai, a in enumerate(task.artifacts):
                ap = f"job.task_groups[{gi}].tasks[{ti}].artifacts[{ai}]"
                if not a.getter_source:
                    yield f"{ap}.getter_source", "source must be specified"
                else:
                    wrong = source_problem(a.getter_source)
                    if wrong is not None:
                        yield f"{ap}.getter_source", wrong
                if a.getter_mode and a.getter_mode not in MODES:
                    yield (
                        f"{ap}.getter_mode",
                        f"invalid artifact mode {a.getter_mode!r}; must be one of: "
                        + ", ".join(MODES),
                    )
                if _escapes_alloc_dir(a.relative_dest):
                    yield f"{ap}.relative_dest", "destination escapes allocation directory"
                check = a.getter_options.get("checksum")
                if check is not None and not _runtime(check):
                    try:
                        parse_checksum(check)
                    except ChecksumError as exc:
                        yield f"{ap}.getter_options[checksum]", str(exc)
                archive = a.getter_options.get("archive")
                if archive is not None and not _runtime(archive):
                    wrong = archive_problem(archive)
                    if wrong is not None:
                        yield f"{ap}.getter_options[archive]", wrong
