"""The configuration reference in docs/operations.md is generated from the
settings models; `make proto-check` (scripts/gen_config_docs.py --check)
fails when a model changed and the page did not."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "gen_config_docs.py"
DOC = ROOT / "docs" / "operations.md"


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_the_committed_reference_matches_the_models() -> None:
    proc = _run("--check")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    text = DOC.read_text()
    assert "| `--nack-timeout` | `CORRAL_BROKER_NACK_TIMEOUT` | `60.0` |" in text
    assert "| `--heartbeats-per-second` | `CORRAL_HEARTBEATS_PER_SECOND` |" in text


def test_a_stale_reference_is_caught_and_regenerated(tmp_path: Path) -> None:
    doc = tmp_path / "operations.md"
    shutil.copy(DOC, doc)
    doc.write_text(doc.read_text().replace("`CORRAL_BROKER_NACK_TIMEOUT` | `60.0`", "x | `1`"))

    stale = _run("--check", "--doc", str(doc))
    assert stale.returncode == 1
    assert "stale" in stale.stdout

    assert _run("--doc", str(doc)).returncode == 0
    assert doc.read_text() == DOC.read_text()
    assert _run("--check", "--doc", str(doc)).returncode == 0
