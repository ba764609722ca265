"""`python -m bench` end to end on a small cluster: the harness itself must
not rot between the (long) benchmark runs. Figures are not asserted, only
that every workload ran, placed what it had to and wrote its files."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_bench_quick_runs_and_writes_results(tmp_path: Path) -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench",
            "--quick",
            "--only",
            "W3,W5",
            "--nodes",
            "60",
            "--out",
            str(tmp_path),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    results = list(tmp_path.glob("*.json"))
    assert len(results) == 1
    assert results[0].with_suffix(".png").stat().st_size > 0
    run = json.loads(results[0].read_text())
    w3, w5 = run["workloads"]["W3"], run["workloads"]["W5"]
    assert "error" not in w3 and "error" not in w5
    assert w3["placements"] == 1000
    assert w3["eval_latency_ms"]["count"] == 1
    assert w3["invariants"]["ok"]
    assert w5["invariants"]["ok"]
    assert w5["scheduler_runs"] + w5["evals_cancelled"] == w5["evals"]
    assert "# Corral benchmark" in proc.stdout
