"""The operator snapshot's file format (corral/domain/snapshot_archive.py):
what is written reads back verified; anything a snapshot does not hold
(another member, a link, a path out of the directory), a damaged or
missing checksum, another format version or an archive unpacking past
its bound is refused before anything is used."""

from __future__ import annotations

import hashlib
import io
import tarfile
from pathlib import Path

import pytest

from cli.main import main
from corral.domain import snapshot_archive as archive


def _meta(tmp: Path, rows: bytes = b"rows of jobs") -> tuple[archive.Meta, dict[str, Path]]:
    part = tmp / "jobs.bin"
    part.write_bytes(rows)
    meta = archive.Meta(
        schema_revision="0008",
        index=42,
        region="global",
        created="2026-11-27T10:00:00+00:00",
        tables=[
            archive.TablePart(
                name="jobs",
                columns=["namespace", "id", "payload"],
                rows=3,
                size=len(rows),
                sha256=hashlib.sha256(rows).hexdigest(),
            )
        ],
    )
    return meta, {archive.table_member("jobs"): part}


def _written(tmp: Path) -> Path:
    meta, parts = _meta(tmp)
    path = tmp / "snap.tar.gz"
    with path.open("wb") as f:
        archive.write(f, meta, parts)
    return path


def _tar(tmp: Path, members: dict[str, bytes], extra: tarfile.TarInfo | None = None) -> Path:
    path = tmp / "crafted.tar.gz"
    with tarfile.open(str(path), "w:gz") as tar:
        for name, body in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(body)
            tar.addfile(info, io.BytesIO(body))
        if extra is not None:
            tar.addfile(extra)
    return path


def _members(path: Path) -> dict[str, bytes]:
    out: dict[str, bytes] = {}
    with tarfile.open(str(path), "r:gz") as tar:
        for info in tar:
            f = tar.extractfile(info)
            assert f is not None
            out[info.name] = f.read()
    return out


def test_written_archive_reads_back_verified(tmp_path: Path) -> None:
    path = _written(tmp_path)
    ex = archive.extract(path, tmp_path / "out", 1 << 20)
    assert ex.meta.index == 42 and ex.meta.schema_revision == "0008"
    assert ex.part(archive.table_member("jobs")).read_bytes() == b"rows of jobs"
    assert not ex.has_keyring and ex.size == path.stat().st_size
    assert list(_members(path))[0] == archive.META  # the metadata leads, as Nomad's
    summary = archive.summary(ex)
    assert summary["Tables"] == [{"Name": "jobs", "Count": 3, "Size": 12}]


@pytest.mark.parametrize(
    "name", ["../escape", "/etc/passwd", "tables/../../x.bin", "tables/Jobs.bin", "other.txt"]
)
def test_members_a_snapshot_does_not_have_are_refused(tmp_path: Path, name: str) -> None:
    members = _members(_written(tmp_path))
    members[name] = b"x"
    with pytest.raises(archive.ArchiveError, match="unexpected member"):
        archive.extract(_tar(tmp_path, members), tmp_path / "out", 1 << 20)
    assert not (tmp_path.parent / "escape").exists()


def test_a_link_is_refused(tmp_path: Path) -> None:
    link = tarfile.TarInfo(archive.KEYRING)
    link.type = tarfile.SYMTYPE
    link.linkname = "/etc/shadow"
    members = _members(_written(tmp_path))
    with pytest.raises(archive.ArchiveError, match="unexpected member"):
        archive.extract(_tar(tmp_path, members, link), tmp_path / "out", 1 << 20)


def test_damaged_or_missing_checksums_are_refused(tmp_path: Path) -> None:
    members = _members(_written(tmp_path))
    damaged = dict(members)
    damaged[archive.table_member("jobs")] = b"rows of jobZ"
    with pytest.raises(archive.ArchiveError, match="checksum mismatch for tables/jobs.bin"):
        archive.extract(_tar(tmp_path, damaged), tmp_path / "a", 1 << 20)
    no_sums = {k: v for k, v in members.items() if k != archive.SUMS}
    with pytest.raises(archive.ArchiveError, match="no meta.json or SHA256SUMS"):
        archive.extract(_tar(tmp_path, no_sums), tmp_path / "b", 1 << 20)
    missing = {k: v for k, v in members.items() if k != archive.table_member("jobs")}
    with pytest.raises(archive.ArchiveError, match="lacks tables/jobs.bin"):
        archive.extract(_tar(tmp_path, missing), tmp_path / "c", 1 << 20)


def test_another_format_version_is_refused(tmp_path: Path) -> None:
    meta, _ = _meta(tmp_path)
    meta.format_version = 99
    with pytest.raises(archive.ArchiveError, match="format version 99 is not supported"):
        archive.Meta.from_json(meta.to_json())
    with pytest.raises(archive.ArchiveError, match="not a Corral snapshot's metadata"):
        archive.Meta.from_json(b'{"index": 1}')


def test_unpacking_past_the_bound_is_refused(tmp_path: Path) -> None:
    """A small archive of zeros (a gzip bomb) stops at the bound."""
    meta, parts = _meta(tmp_path, rows=bytes(4 << 20))
    path = tmp_path / "bomb.tar.gz"
    with path.open("wb") as f:
        archive.write(f, meta, parts)
    assert path.stat().st_size < 64 << 10
    with pytest.raises(archive.ArchiveError, match="unpacks to more than"):
        archive.extract(path, tmp_path / "out", 1 << 20)


def test_not_an_archive_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "junk"
    path.write_bytes(b"not gzip at all")
    with pytest.raises(archive.ArchiveError, match="not a readable snapshot archive"):
        archive.extract(path, tmp_path / "out", 1 << 20)


def test_cli_inspect_prints_index_size_and_counts_per_table(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`corral operator snapshot inspect` reads the file locally (no server:
    the address points nowhere), as Nomad's inspect does."""
    path = _written(tmp_path)
    assert main(["operator", "snapshot", "inspect", "-address", "127.0.0.1:1", str(path)]) == 0
    out = capsys.readouterr().out
    assert "Index   = 42" in out and "Region  = global" in out and "Schema  = 0008" in out
    lines = [line.split() for line in out.splitlines()]
    assert ["Type", "Count", "Size"] in lines
    assert ["jobs", "3", "12", "B"] in lines and ["Total", "3", "12", "B"] in lines
    damaged = tmp_path / "damaged.tar.gz"
    damaged.write_bytes(path.read_bytes()[:-40])
    assert main(["operator", "snapshot", "inspect", str(damaged)]) == 1
    assert "not a readable snapshot archive" in capsys.readouterr().err
