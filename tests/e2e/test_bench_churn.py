"""`python -m bench.churn` on a short profile: the churn harness (a real
cluster, short GC thresholds, jobs registered and stopped, half purged)
must not rot between its 10-minute runs. RSS is timing-dependent, so only
that it ran, churned, collected and printed its table is asserted, not the
verdict."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.slow]


def test_churn_short_profile_runs_and_prints_the_table(tmp_path: Path) -> None:
    out = tmp_path / "churn.json"
    proc = subprocess.run(
        [
            sys.executable, "-m", "bench.churn",
            "--minutes", "1", "--warmup", "20", "--nodes", "20", "--rate", "2",
            "--lifetime", "5", "--gc-threshold", "5", "--gc-interval", "3",
            "--json", str(out),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )  # fmt: skip
    assert proc.returncode in (0, 1), proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "| role | booted MB | start MB | end MB | growth |" in proc.stdout
    result = json.loads(out.read_text())
    assert {r["role"] for r in result["roles"]} == {"state", "broker", "planner", "worker0", "sim"}
    assert all(r["start_mb"] > 0 and r["end_mb"] > 0 for r in result["roles"])
    assert result["registered"] >= 100 and result["purged"] >= 40
    assert not result["errors"], result["errors"]
    # the GC kept up: far fewer jobs are held than were registered
    assert result["objects_end"]["jobs"] < result["registered"] / 2
