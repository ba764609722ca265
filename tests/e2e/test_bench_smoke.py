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
    # the ledger (bench/ledger.py): RPCs, bytes, protobuf and SQL counted in
    # every role, plans per eval
    lg = w3["ledger"]
    assert sorted(lg["probe"]) == ["broker", "planner", "state", "worker0"]
    assert lg["by_method"]["/corral.v1.Plan/Submit"]["callers"] == {"workers": 1}
    assert lg["by_method"]["/corral.v1.Job/Register"]["callers"] == {"outside": 1}
    assert "/corral.v1.Eval/Stats" not in lg["by_method"]
    # the replicas' change feed: a stream opened before the window, its bytes counted
    assert lg["by_method"]["/corral.v1.State/Subscribe"]["response_bytes"] > 0
    assert lg["bytes"]["total"] > 0 and lg["sql"]["statements"] > 0
    assert lg["protobuf"]["encodes"] > 0 and lg["protobuf"]["decodes"] > 0
    assert lg["plans"]["plans_per_eval"] == 1.0 and lg["plans"]["partial_share"] == 0.0
    assert w3["commit_kinds"]["plan"] == 1
    assert "# Corral benchmark" in proc.stdout
    assert "## Per-placement ledger" in proc.stdout


def test_bench_w1l_and_s1_run_and_report(tmp_path: Path) -> None:
    """W1L at a given rate (no W1 in this invocation) and one S1 point, on
    100-node clusters: the open loop sent every registration, every alloc
    was reported running, and the summary shows both sections."""
    proc = subprocess.run(
        [sys.executable, "-m", "bench", "--quick", "--only", "W1L,S1", "--nodes", "100"]
        + ["--w1l-rate", "5", "--scaling-nodes", "100", "--out", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=400,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (result,) = tmp_path.glob("*.json")
    run = json.loads(result.read_text())
    w1l = run["workloads"]["W1L"]
    assert w1l["rate_source"] == "--w1l-rate" and w1l["saturated_jobs_per_s"] == 5.0
    for load, jobs in (("50", 37), ("80", 60)):  # 2.5 and 4 jobs/s for 15 s
        r = w1l["by_load"][load]
        assert "error" not in r, r
        assert r["driver"]["sent"] == jobs and r["driver"]["errors"] == 0
        assert r["jobs"] == jobs and r["placements"] == jobs * 10
        assert r["placement_to_running_ms"]["count"] == jobs * 10
        assert r["never_running"] == 0
        assert r["eval_latency_ms"]["count"] == jobs
        assert r["cpu_ms_by_role"]["total"] > 0 and "sim" in r["cpu_ms_by_role"]
        assert r["invariants"]["ok"]
    point = run["workloads"]["S1"]["by_nodes"]["100"]
    assert "error" not in point, point
    assert point["placements"] == 2000 and point["nodes"] == 100
    assert point["invariants"]["ok"]
    assert run["workloads"]["S1"]["replica_memory"]["rss_per_alloc"] > 0
    for heading in ("## W1L latency at an offered load", "## S1 scaling curve"):
        assert heading in proc.stdout
