"""The chaos suite's short profile (issue 19; `make chaos` runs the full
one): kill -9 of the state, the broker leader and the planner leader under
steady load, each followed by recovery, the invariant checker and the
lost / duplicated / over-committed counts — all zero, recovery under 10 s."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_chaos_quick_profile_loses_nothing(tmp_path: Path) -> None:
    out = tmp_path / "chaos.json"
    proc = subprocess.run(
        [sys.executable, "-m", "bench.chaos", "--quick", "--seed", "19", "--json", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "| fault | lost | duplicated | over-committed | recovery (s)" in proc.stdout
    run = json.loads(out.read_text())
    assert run["ok"]
    results = {r["fault"]: r for r in run["results"]}
    assert sorted(results) == ["broker-leader", "planner-leader", "state"]
    for r in results.values():
        assert (r["lost"], r["duplicated"], r["over_committed"]) == (0, 0, 0), r
        assert r["violations"] == [] and r["error"] == "", r
        assert 0 < r["recovery_s"] < 10, r
        assert r["jobs"] > 0
