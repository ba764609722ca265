"""`corral dev`'s data directory: -data-dir is honoured with -ephemeral too
(a new directory inside it, so deleting it at exit never touches what the
user keeps there)."""

from __future__ import annotations

from pathlib import Path

import pytest

from cli.commands.dev import data_directory


def test_kept_data_dir_is_the_given_one(tmp_path: Path) -> None:
    d = data_directory(str(tmp_path / "dev"), ephemeral=False)
    assert d == (tmp_path / "dev").resolve() and d.is_dir()


def test_ephemeral_lives_inside_the_given_data_dir(tmp_path: Path) -> None:
    keep = tmp_path / "mine" / "notes.txt"
    keep.parent.mkdir()
    keep.write_text("kept")
    first = data_directory(str(tmp_path / "mine"), ephemeral=True)
    second = data_directory(str(tmp_path / "mine"), ephemeral=True)
    assert first.parent == second.parent == keep.parent.resolve()
    assert first != second and first.name.startswith("corral-dev-")


def test_ephemeral_without_data_dir_is_a_temporary_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)
    d = data_directory(None, ephemeral=True)
    assert d.parent == tmp_path and d.is_dir()
