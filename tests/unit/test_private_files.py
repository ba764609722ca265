"""Files holding secrets are created 0600 (never narrowed after writing) in
0700 directories, whatever the umask (issue 26, finding 5)."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from corral.security.private_files import private_dir, write_private


@pytest.fixture
def open_umask() -> Iterator[None]:
    """umask 0: a file or directory made with default modes is world-writable."""
    old = os.umask(0)
    try:
        yield
    finally:
        os.umask(old)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_a_new_directory_and_file_are_the_owners_alone(tmp_path: Path, open_umask: None) -> None:
    d = private_dir(tmp_path / "a" / "b")
    write_private(d / "secret.json", '{"secret_id": "x"}')
    assert mode(d) == 0o700
    assert mode(d / "secret.json") == 0o600
    assert (d / "secret.json").read_text() == '{"secret_id": "x"}'
    assert [p.name for p in d.iterdir()] == ["secret.json"]  # no temporary left


def test_an_open_directory_is_narrowed_and_a_wide_file_replaced(
    tmp_path: Path, open_umask: None
) -> None:
    d = tmp_path / "old"
    d.mkdir(mode=0o755)
    old = d / "client.json"
    old.write_text("old")
    old.chmod(0o644)
    private_dir(d)
    write_private(old, b"new")
    assert mode(d) == 0o700
    assert mode(old) == 0o600 and old.read_bytes() == b"new"


def test_the_file_is_never_readable_by_others_while_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The mode is the one `os.open` creates the file with, before a byte is
    written: no chmod afterwards (a reader could open it in between)."""
    created: list[int] = []
    real_open = os.open

    def spy(path: str | os.PathLike[str], flags: int, mode: int = 0o777, **kw: object) -> int:
        fd = real_open(path, flags, mode)
        created.append(stat.S_IMODE(os.fstat(fd).st_mode))
        return fd

    monkeypatch.setattr(os, "open", spy)
    monkeypatch.setattr(os, "chmod", lambda *a, **k: pytest.fail("chmod after writing"))
    write_private(private_dir(tmp_path / "d") / "token", "secret")
    assert created == [0o600]
