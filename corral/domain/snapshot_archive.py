"""The operator snapshot's file format (Nomad's `operator snapshot save`
archive, in Corral's own layout): written by the state, read back by the
state on restore and by `corral operator snapshot inspect`.

A gzip'd tar holding, in this order:

- `meta.json`: the format version, the Corral schema revision (the Alembic
  head the state ran), the index the snapshot was taken at, the region, when
  it was made, and per table its row count, size and SHA-256;
- `tables/<table>.bin`: each table's rows in PostgreSQL's binary COPY
  format, columns in the order `meta.json` names them;
- `keyring.json` (when the state had a keyring): the root keys' material,
  so a restore into another cluster re-wraps them with its own
  key-encryption key and the variables stay readable;
- `SHA256SUMS`: the SHA-256 of every other member.

Reading extracts into a directory, bounded in bytes, and checks every
checksum before anything is used: a damaged or edited archive is refused
whole. Pure file handling, no database.
"""

from __future__ import annotations

import hashlib
import io
import json
import re
import tarfile
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, Any

FORMAT_VERSION = 1
META = "meta.json"
SUMS = "SHA256SUMS"
KEYRING = "keyring.json"
TABLE_DIR = "tables"
_TABLE_NAME = re.compile(r"^[a-z][a-z0-9_]{0,62}$")
_COPY_CHUNK = 1 << 20


class ArchiveError(Exception):
    """The file is not a usable snapshot; the message says why, in the
    operator's words."""


@dataclass
class TablePart:
    name: str
    columns: list[str]
    rows: int
    size: int
    sha256: str


@dataclass
class Meta:
    schema_revision: str
    index: int
    region: str
    created: str
    tables: list[TablePart] = field(default_factory=list)
    #: SHA-256 of keyring.json, "" when the archive holds no keyring
    keyring_sha256: str = ""
    format_version: int = FORMAT_VERSION

    def to_json(self) -> bytes:
        return json.dumps(asdict(self), indent=2, sort_keys=True).encode()

    @classmethod
    def from_json(cls, data: bytes) -> Meta:
        try:
            raw = json.loads(data)
            tables = [TablePart(**t) for t in raw.pop("tables")]
            meta = cls(tables=tables, **raw)
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            raise ArchiveError(f"{META} is not a Corral snapshot's metadata ({exc})") from None
        if meta.format_version != FORMAT_VERSION:
            raise ArchiveError(
                f"snapshot format version {meta.format_version} is not supported "
                f"(this Corral reads version {FORMAT_VERSION})"
            )
        for t in meta.tables:
            if not _TABLE_NAME.match(t.name) or not all(_TABLE_NAME.match(c) for c in t.columns):
                raise ArchiveError(f"{META} names a table or column Corral does not have")
        return meta

    def table(self, name: str) -> TablePart | None:
        return next((t for t in self.tables if t.name == name), None)


def table_member(name: str) -> str:
    return f"{TABLE_DIR}/{name}.bin"


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(_COPY_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def write(out: IO[bytes], meta: Meta, parts: dict[str, Path]) -> None:
    """Write the archive to `out`: `meta.json`, each part (member name →
    file) in the order given, then `SHA256SUMS`."""
    meta_bytes = meta.to_json()
    sums = {META: hashlib.sha256(meta_bytes).hexdigest()}
    with tarfile.open(fileobj=out, mode="w:gz") as tar:
        _add_bytes(tar, META, meta_bytes)
        for member, path in parts.items():
            sums[member] = sha256_file(path)
            info = tar.gettarinfo(str(path), arcname=member)
            info.mode, info.uid, info.gid, info.uname, info.gname = 0o600, 0, 0, "", ""
            with path.open("rb") as f:
                tar.addfile(info, f)
        _add_bytes(tar, SUMS, "".join(f"{h}  {n}\n" for n, h in sums.items()).encode())


def _add_bytes(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mode = 0o600
    tar.addfile(info, io.BytesIO(data))


@dataclass
class Extracted:
    """A verified archive, unpacked in `root`."""

    root: Path
    meta: Meta
    #: the archive's bytes, compressed (what inspect prints as its size)
    size: int

    def part(self, member: str) -> Path:
        return self.root / member

    @property
    def has_keyring(self) -> bool:
        return bool(self.meta.keyring_sha256)


def extract(archive: Path, into: Path, max_unpacked: int) -> Extracted:
    """Unpack `archive` into the directory `into` and verify it: only the
    members a snapshot has, at most `max_unpacked` bytes in all, and every
    checksum right. Raises ArchiveError otherwise."""
    into.mkdir(parents=True, exist_ok=True)
    (into / TABLE_DIR).mkdir(exist_ok=True)
    found: dict[str, str] = {}
    total = 0
    try:
        with tarfile.open(str(archive), mode="r|gz") as tar:
            for info in tar:
                name = info.name
                if not info.isfile() or not _allowed(name) or name in found:
                    raise ArchiveError(f"unexpected member {name[:100]!r} in the snapshot")
                total += info.size
                if total > max_unpacked:
                    raise ArchiveError(
                        f"the snapshot unpacks to more than {max_unpacked} bytes "
                        "(the state's --snapshot-max-bytes bounds it)"
                    )
                src = tar.extractfile(info)
                assert src is not None
                digest = hashlib.sha256()
                with (into / name).open("wb") as dst:
                    while chunk := src.read(_COPY_CHUNK):
                        digest.update(chunk)
                        dst.write(chunk)
                found[name] = digest.hexdigest()
    except (tarfile.TarError, OSError, EOFError) as exc:
        raise ArchiveError(f"not a readable snapshot archive ({exc})") from None
    if META not in found or SUMS not in found:
        raise ArchiveError("not a Corral snapshot: no meta.json or SHA256SUMS")
    sums = _parse_sums((into / SUMS).read_bytes())
    for name, got in found.items():
        if name != SUMS and sums.get(name) != got:
            raise ArchiveError(f"checksum mismatch for {name}: the snapshot is damaged")
    missing = set(sums) - set(found)
    if missing:
        raise ArchiveError(f"the snapshot lacks {', '.join(sorted(missing))}")
    meta = Meta.from_json((into / META).read_bytes())
    for t in meta.tables:
        if found.get(table_member(t.name)) != t.sha256:
            raise ArchiveError(f"checksum mismatch for table {t.name}: the snapshot is damaged")
    if meta.keyring_sha256 and found.get(KEYRING) != meta.keyring_sha256:
        raise ArchiveError("checksum mismatch for the keyring: the snapshot is damaged")
    return Extracted(into, meta, archive.stat().st_size)


def _allowed(name: str) -> bool:
    if name in (META, SUMS, KEYRING):
        return True
    prefix, _, rest = name.partition("/")
    return prefix == TABLE_DIR and rest.endswith(".bin") and bool(_TABLE_NAME.match(rest[:-4]))


def _parse_sums(data: bytes) -> dict[str, str]:
    sums: dict[str, str] = {}
    for line in data.decode("utf-8", "replace").splitlines():
        digest, _, name = line.partition("  ")
        if not re.fullmatch(r"[0-9a-f]{64}", digest) or not name:
            raise ArchiveError("SHA256SUMS is malformed: the snapshot is damaged")
        sums[name] = digest
    return sums


def chunks(path: Path, size: int = _COPY_CHUNK) -> Iterator[bytes]:
    with path.open("rb") as f:
        while chunk := f.read(size):
            yield chunk


def summary(ex: Extracted) -> dict[str, Any]:
    """What `corral operator snapshot inspect -json` prints."""
    return {
        "Index": ex.meta.index,
        "Region": ex.meta.region,
        "Created": ex.meta.created,
        "Size": ex.size,
        "SchemaRevision": ex.meta.schema_revision,
        "FormatVersion": ex.meta.format_version,
        "Keyring": ex.has_keyring,
        "Tables": [{"Name": t.name, "Count": t.rows, "Size": t.size} for t in ex.meta.tables],
    }
