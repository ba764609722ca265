"""The benchmark report's maths and rendering (bench/report.py), on
hand-made run dicts whose expected figures are worked out by hand."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from bench import report


def baselines(**over: Any) -> dict[str, Any]:
    b: dict[str, Any] = {
        "B1_commits_per_s": 2000.0,
        "B2_alloc_rows_per_s": {"10": 20000.0, "100": 30000.0, "1000": 80000.0},
        "B3_grpc_sequential_rps": 1500.0,
        "B3_grpc_sequential_p50_ms": 0.5,
        "B3_grpc_sequential_p99_ms": 2.0,
        "B3_grpc_8_in_flight_rps": 3000.0,
        "B4_notify_p50_ms": 0.2,
        "B4_notify_p99_ms": 0.8,
        "B5_kernel_placements_per_s": 30000.0,
    }
    b.update(over)
    return b


def make_run() -> dict[str, Any]:
    return {
        "profile": "quick",
        "started": "2026-11-23T04:00:00Z",
        "git_rev": "0123456789abcdef",
        "machine": {"vcpus": 2, "python": "3.11.7"},
        "baselines_before": baselines(),
        "baselines_after": None,
        "workloads": {
            "W1": {
                "name": "throughput",
                "params": {"jobs": 1000, "count": 10},
                "placements": 10000,
                "jobs": 1000,
                "evals": 1000,
                "duration_s": 4.0,
                "placements_per_s": 2500.0,
                "jobs_per_s": 250.0,
                "steady_placements_per_s": 2600.0,
                "eval_latency_ms": {"p50": 10.0, "p95": 500.0, "p99": 800.0, "max": 900.0},
                "mean_plan_size": 10.0,
                "commits": 3000,
                "commits_per_eval": 3.0,
                "rpcs_per_eval": 5.0,
                "processes": {"planner": {"cpu_s": 3.5, "peak_rss_mb": 120.0}},
                "cpu_ms_per_placement": 0.9,
                "timeline": [[0.0, 0], [1.0, 2000], [2.0, 5000], [4.0, 10000]],
                "invariants": {"ok": True, "violations": []},
                "profile_top": [{"process": "planner", "frame": "apply_plan", "share": 0.12}],
            },
            "W2": {
                "name": "c1m",
                "placements": 20000,
                "placements_per_s": 1500.0,
                "mean_plan_size": 1000.0,
                "timeline": [[0.0, 0], [5.0, 10000], [13.3, 20000]],
                "invariants": {"ok": False, "violations": ["node n1 over-committed on cpu"]},
            },
            "W3": {"error": "timed out waiting for 10000 placements"},
            "W4": {"replacement_p99_s": 4.0, "replacement_max_s": 6.0, "lost_allocs": 500},
            "W5": {"params": {"updates": 500}, "scheduler_runs": 2, "evals_cancelled": 498},
            "W5b": {"quiescence_s": 30.0},
            "W6": {
                "by_workers": {
                    "1": {"placements_per_s": 1000.0, "plans_submitted": 100, "plans_rejected": 0},
                    "2": {
                        "placements_per_s": 1500.0,
                        "plans_submitted": 200,
                        "plans_rejected": 6,
                        "timeline": [[0.0, 0], [2.0, 3000]],
                    },
                    "4": {
                        "placements_per_s": 1600.0,
                        "plans_submitted": 200,
                        "plans_rejected": 30,
                    },
                }
            },
        },
        "m1": {
            "cases": [
                {
                    "nodes": 5000,
                    "racks": 25,
                    "allocs": 300,
                    "spread": False,
                    "eval_s": 0.2,
                    "eval_median_s": 0.21,
                    "placements_per_s": 1500.0,
                    "repeats": 3,
                }
            ]
        },
    }


# ---------------------------------------------------------------- maths


def test_percentiles_nearest_rank() -> None:
    p = report.percentiles([float(v) for v in range(100, 0, -1)])
    assert p == {"p50": 50.0, "p95": 95.0, "p99": 99.0, "max": 100.0, "count": 100}
    assert report.percentiles([7.0])["p99"] == 7.0
    assert report.percentiles([]) == {"p50": 0.0, "p95": 0.0, "p99": 0.0, "max": 0.0, "count": 0}


def test_steady_rate_between_the_10_and_90_percent_marks() -> None:
    # 10% of 100 is first reached at t=1 (10), 90% at t=3 (90): 80 in 2 s
    timeline = [[0.0, 0.0], [1.0, 10.0], [2.0, 50.0], [3.0, 90.0], [4.0, 100.0]]
    assert report.steady_rate(timeline) == pytest.approx(40.0)
    # order does not matter
    assert report.steady_rate(list(reversed(timeline))) == pytest.approx(40.0)
    # the marks land inside chunks: 10% first met at t=2 (30), 90% at t=5 (95)
    assert report.steady_rate([[0, 0], [2, 30], [3, 60], [5, 95], [9, 100]]) == pytest.approx(
        65 / 3
    )


def test_steady_rate_without_a_steady_phase() -> None:
    assert report.steady_rate([]) == 0.0
    assert report.steady_rate([[0.0, 0.0], [3.0, 0.0]]) == 0.0
    # one huge plan: both marks on the same sample
    assert report.steady_rate([[0.0, 0.0], [5.0, 10000.0]]) == 0.0


def test_baseline_drift_flags_changes_over_15_percent() -> None:
    before = baselines()
    after = baselines(
        B1_commits_per_s=1600.0,  # -20%: flagged
        B3_grpc_sequential_rps=1700.0,  # +13%: not flagged
        B2_alloc_rows_per_s={"10": 18000.0, "100": 30000.0, "1000": 100000.0},  # 1000: +25%
    )
    drift = report.baseline_drift(before, after)
    assert len(drift) == 2
    assert drift[0].startswith("B1_commits_per_s: 2000 -> 1600 (-20.0%)")
    assert drift[1].startswith("B2_alloc_rows_per_s.1000: 80000 -> 100000 (+25.0%)")
    assert report.baseline_drift(before, None) == []
    assert report.baseline_drift(before, before) == []


def test_nearest_plan_size_on_a_log_scale() -> None:
    sizes = [10, 100, 1000]
    assert report.nearest_plan_size(sizes, 10) == 10
    assert report.nearest_plan_size(sizes, 30) == 10  # log10 1.48: nearer 1 than 2
    assert report.nearest_plan_size(sizes, 300) == 100
    assert report.nearest_plan_size(sizes, 400) == 1000
    assert report.nearest_plan_size(sizes, 5000) == 1000
    with pytest.raises(ValueError):
        report.nearest_plan_size([], 10)


# ---------------------------------------------------------------- ratios


def test_ratios_of_a_full_run() -> None:
    r = report.ratios(make_run())
    expected = {
        # W1: 2500/s ÷ B2(k=10) 20,000
        "W1.pg_utilisation": 2500 / 20000,
        "W1.pg_utilisation_k": 10.0,
        # 5 RPCs × 0.5 ms ÷ 10 ms p50
        "W1.rpc_floor": 0.25,
        "W1.cpu_normalised_rate": 2500 / 30000,
        # B1 2,000 ÷ (1,000 evals / 4 s)
        "W1.commit_budget": 8.0,
        "W1.commits_per_eval": 3.0,
        "W1.nomad2_jobs_ratio": 250 / 780,
        "W1.nomad2_p99_ratio": 0.8,
        "W1.k8s_rate_ratio": 2500 / 680,
        # W2: 1,500/s ÷ B2(k=1000) 80,000
        "W2.pg_utilisation": 1500 / 80000,
        "W2.pg_utilisation_k": 1000.0,
        "W2.cpu_normalised_rate": 1500 / 30000,
        "W2.c1m_ratio": 0.4,
        "W2.c2m_ratio": 1500 / 1499,
        "W2.c1m_per_vcpu_ratio": 750 / 23.4,
        "W2.c2m_per_vcpu_ratio": 750 / 7.8,
        "W4.k8s_replacement_ratio": 0.8,
        "W5.storm_runs_ratio": 2 / 500,
        "W5b.storm_drain_ratio": 2.0,
        "W6.1.scaling_efficiency": 1.0,
        "W6.1.rejection_rate": 0.0,
        "W6.2.scaling_efficiency": 1500 / 2000,
        "W6.2.rejection_rate": 0.03,
        "W6.4.scaling_efficiency": 1600 / 2000,
        "W6.4.rejection_rate": 0.15,
    }
    assert set(r) == set(expected)
    for key, value in expected.items():
        assert r[key] == pytest.approx(value), key


def test_ratios_pg_utilisation_falls_back_to_placements_per_eval() -> None:
    run = make_run()
    w1 = run["workloads"]["W1"]
    del w1["mean_plan_size"]
    w1["placements"], w1["evals"] = 30000, 100  # 300 per eval -> k = 100
    r = report.ratios(run)
    assert r["W1.pg_utilisation_k"] == 100.0
    assert r["W1.pg_utilisation"] == pytest.approx(2500 / 30000)


def test_ratios_omit_what_is_missing() -> None:
    assert report.ratios({}) == {}
    run = make_run()
    run["workloads"] = {"W1": {"error": "boom"}, "W6": {"by_workers": {"2": {"error": "x"}}}}
    run["baselines_before"] = None
    assert report.ratios(run) == {}
    # W1 without baselines: only the anchor ratios
    run = make_run()
    run["baselines_before"] = None
    run["workloads"] = {"W1": make_run()["workloads"]["W1"]}
    assert set(report.ratios(run)) == {
        "W1.commits_per_eval",
        "W1.nomad2_jobs_ratio",
        "W1.nomad2_p99_ratio",
        "W1.k8s_rate_ratio",
    }
    # W6 without the 1-worker run: rejection rates but no scaling efficiency
    run = make_run()
    del run["workloads"]["W6"]["by_workers"]["1"]
    r = report.ratios(run)
    assert "W6.2.rejection_rate" in r
    assert not any(k.endswith("scaling_efficiency") for k in r)


def test_ratios_use_baselines_after_when_before_is_missing() -> None:
    run = make_run()
    run["baselines_before"] = None
    run["baselines_after"] = baselines(B1_commits_per_s=1000.0)
    assert report.ratios(run)["W1.commit_budget"] == pytest.approx(4.0)


# ---------------------------------------------------------------- targets


def by_prefix(ts: list[dict[str, Any]], prefix: str) -> dict[str, Any]:
    return next(t for t in ts if t["target"].startswith(prefix))


def test_targets_met_and_unmet() -> None:
    ts = report.targets(make_run())
    assert [t["target"][:2] for t in ts] == [
        "W2", "W1", "W1", "W2", "W1", "M1", "M1", "M1", "W4", "W5", "W5", "N1", "in"
    ]  # fmt: skip
    w2 = by_prefix(ts, "W2 >=")
    assert w2["measured"] == 1500.0 and not w2["met"]
    w1 = by_prefix(ts, "W1 >=")
    assert w1["measured"] == 2500.0 and w1["met"]
    assert by_prefix(ts, "W1 CPU")["met"] and by_prefix(ts, "W1 CPU")["measured"] == 0.9
    assert by_prefix(ts, "W4") == {
        "target": "W4 every lost alloc replaced within 5 s p99",
        "measured": 4.0,
        "met": True,
        "detail": "p99 4.00 s",
    }
    assert by_prefix(ts, "W5")["met"] and by_prefix(ts, "W5")["measured"] == 2
    assert by_prefix(ts, "W5b") == {
        "target": "W5b quiet <= 15 s after the workers resume",
        "measured": 30.0,
        "met": False,
        "detail": "30.0 s",
    }
    inv = by_prefix(ts, "invariants")
    assert not inv["met"] and inv["detail"] == "violated after W2"


def test_target_w2_cpu_not_measured_when_w2_lacks_it() -> None:
    t = by_prefix(report.targets(make_run()), "W2 CPU")
    assert t["measured"] is None and not t["met"]


def test_targets_thresholds_are_edges() -> None:
    run = make_run()
    run["workloads"]["W2"]["placements_per_s"] = 2000.0
    run["workloads"]["W1"]["cpu_ms_per_placement"] = 1.5
    run["workloads"]["W4"]["replacement_p99_s"] = 5.01
    run["workloads"]["W5"]["scheduler_runs"] = 4
    run["workloads"]["W5b"]["quiescence_s"] = 15.0
    ts = report.targets(run)
    assert by_prefix(ts, "W2 >=")["met"]
    assert by_prefix(ts, "W1 CPU")["met"]
    assert not by_prefix(ts, "W4")["met"]
    assert not by_prefix(ts, "W5")["met"]
    assert by_prefix(ts, "W5b")["met"]


def test_targets_of_missing_or_failed_workloads() -> None:
    run = make_run()
    run["workloads"] = {"W2": {"error": "cluster died"}}
    del run["m1"]
    ts = report.targets(run)
    assert len(ts) == 13
    assert all(t["measured"] is None and not t["met"] for t in ts)
    assert by_prefix(ts, "W2 >=")["detail"] == "W2 failed: cluster died"
    assert by_prefix(ts, "W5")["detail"] == "W5 not run"
    assert by_prefix(ts, "W1L")["detail"] == "W1L not run"
    assert by_prefix(ts, "M1 1,200")["detail"] == "M1 not run"


# ---------------------------------------------------------------- rendering


def test_markdown_renders_every_section() -> None:
    run = make_run()
    run["baselines_after"] = baselines(B1_commits_per_s=1600.0)
    text = report.markdown(run)
    for heading in (
        "# Corral benchmark (quick profile)",
        "## Baselines",
        "## Workloads",
        "### Processes",
        "## M1 scheduler micro-benchmark",
        "## Ratios",
        "## Targets",
        "## Invariants",
        "## Top profile frames",
        "## Errors",
    ):
        assert heading in text, heading
    assert "machine: vcpus 2, python 3.11.7" in text
    assert "rev 0123456789abcdef" in text
    assert "DRIFT > 15%" in text and "B1_commits_per_s: 2000 -> 1600" in text
    assert "✓" in text and "✗" in text
    assert "W6 x2" in text and "W6 x4" in text
    assert "node n1 over-committed on cpu" in text
    assert "apply_plan" in text
    assert "W3: timed out waiting for 10000 placements" in text
    assert "W2.c1m_ratio" in text
    # tables are aligned: every row of a table has the same width
    lines = text.splitlines()
    start = lines.index("## Targets") + 2
    widths = {len(line) for line in lines[start : start + 7] if line.startswith("|")}
    assert len(widths) == 1


def test_markdown_tolerates_partial_runs() -> None:
    text = report.markdown({"workloads": {"W1": {"error": "state service exited"}}})
    assert "FAILED" in text
    assert "W1: state service exited" in text
    assert "(not measured)" in text
    assert report.markdown({}).startswith("# Corral benchmark (? profile)")


def test_plot_writes_a_png(tmp_path: Path) -> None:
    path = report.plot(make_run(), tmp_path / "plots" / "run.png")
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(data) > 5000
    empty = report.plot({}, tmp_path / "empty.png")
    assert empty.read_bytes()[:4] == b"\x89PNG"


def test_write_json_names_the_file_by_time_and_rev(tmp_path: Path) -> None:
    run = make_run()
    path = report.write_json(run, tmp_path / "results")
    assert re.fullmatch(r"\d{8}T\d{6}Z-01234567\.json", path.name)
    assert json.loads(path.read_text()) == run
    assert report.result_name({}, now=0).endswith("-unknown")
