"""Issue 17's benchmark figures (bench/report.py, bench/openloop.py): CPU
per placement per role, W1L's offered rates, open-loop pacing and its
lateness, S1's replica growth, the issue-17 targets on M1/W1L/N1, and the
old → new comparison; hand-made runs, no cluster."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from bench import openloop, report
from bench.__main__ import main


def by_prefix(ts: list[dict[str, Any]], prefix: str) -> dict[str, Any]:
    return next(t for t in ts if t["target"].startswith(prefix))


def m1_case(allocs: int, spread: bool, eval_s: float) -> dict[str, Any]:
    return {"nodes": 5000, "racks": 25, "allocs": allocs, "spread": spread, "eval_s": eval_s}


def run17() -> dict[str, Any]:
    """A run with every figure issue 17 sets a target on."""
    return {
        "profile": "full",
        "git_rev": "feedface",
        "workloads": {
            "N1": {"node_status_changes": 0, "invariants": {"ok": True, "violations": []}},
            "W1": {
                "placements": 10000,
                "placements_per_s": 1200.0,
                "cpu_ms_per_placement": 1.4,
                "processes": {
                    "state": {"cpu_s": 6.0},
                    "broker": {"cpu_s": 2.0},
                    "planner": {"cpu_s": 2.0},
                    "worker0": {"cpu_s": 3.0},
                    "worker1": {"cpu_s": 1.0},
                    "postgres": {"cpu_s": 0.5},
                    "sim": {"cpu_s": 9.0},
                },
                "invariants": {"ok": True, "violations": []},
            },
            "W2": {
                "placements": 20000,
                "placements_per_s": 2100.0,
                "cpu_ms_per_placement": 0.81,
                "invariants": {"ok": True, "violations": []},
            },
            "W1L": {
                "saturated_jobs_per_s": 120.0,
                "rate_source": "W1 in this run",
                "by_load": {
                    "80": {
                        "placements": 5760,
                        "eval_latency_ms": {"p50": 300.0, "p95": 900.0, "p99": 2500.0, "count": 9},
                        "invariants": {"ok": True, "violations": []},
                    },
                    "50": {
                        "placements": 3600,
                        "achieved_jobs_per_s": 59.5,
                        "driver": {"offered_jobs_per_s": 60.0, "sent": 3600, "late": 3},
                        "eval_latency_ms": {"p50": 40.0, "p95": 300.0, "p99": 999.0, "count": 9},
                        "placement_to_running_ms": {
                            "p50": 210.0,
                            "p95": 400.0,
                            "p99": 450.0,
                            "count": 3600,
                        },
                        "never_running": 0,
                        "invariants": {"ok": True, "violations": []},
                    },
                },
            },
            "W4": {"replacement_p99_s": 5.0},
            "W5": {"scheduler_runs": 3},
            "W5b": {"quiescence_s": 15.0},
            "S1": {
                "by_nodes": {
                    "2000": {
                        "placements": 10000,
                        "placements_per_s": 900.0,
                        "cpu_ms_per_placement": 1.1,
                        "replica_rss_per_1000_allocs_mb": {"broker": 3.1},
                        "invariants": {"ok": True, "violations": []},
                    },
                    "500": {
                        "placements": 10000,
                        "placements_per_s": 1000.0,
                        "cpu_ms_per_placement": 1.0,
                        "invariants": {"ok": True, "violations": []},
                    },
                },
                "replica_memory": {"allocs": 10000, "rss_per_alloc": 3052},
            },
        },
        "m1": {
            "cases": [
                m1_case(300, False, 0.1),
                m1_case(300, True, 0.3),
                m1_case(1200, False, 0.4),
                m1_case(1200, True, 1.0),
            ]
        },
    }


# ---------------------------------------------------------------- CPU per role


def test_cpu_ms_by_role_sums_workers_and_sets_the_simulator_apart() -> None:
    w1 = run17()["workloads"]["W1"]
    by = report.cpu_ms_by_role(w1["processes"], 10000)
    # 6 s of state CPU over 10,000 placements = 0.6 ms each; workers 3 + 1 s
    assert by == {
        "state": 0.6,
        "broker": 0.2,
        "planner": 0.2,
        "workers": 0.4,
        "postgres": 0.05,
        "total": 1.45,
        "sim": 0.9,
    }


def test_cpu_ms_by_role_without_placements_is_empty() -> None:
    assert report.cpu_ms_by_role({"state": {"cpu_s": 1.0}}, 0) == {}
    assert report.cpu_ms_by_role({}, 10) == {"total": 0.0}
    assert report.role_of("worker12") == "workers" and report.role_of("state") == "state"


# ---------------------------------------------------------------- W1L


def test_w1l_rates_are_50_and_80_percent_of_saturation() -> None:
    assert report.w1l_rates(120.0) == {"50": 60.0, "80": pytest.approx(96.0)}
    assert report.w1l_rates(0.0) == {}


def test_achieved_rate_counts_intervals() -> None:
    # 5 registrations 0.5 s apart: 4 intervals over 2 s = 2/s
    assert report.achieved_rate([0.0, 0.5, 1.0, 1.5, 2.0]) == 2.0
    assert report.achieved_rate([3.0]) == 0.0
    assert report.achieved_rate([1.0, 1.0]) == 0.0


def test_schedule_is_one_call_every_1_over_rate() -> None:
    assert openloop.schedule(4.0, 1.0) == [0.0, 0.25, 0.5, 0.75]
    assert len(openloop.schedule(60.0, 15.0)) == 900
    assert openloop.schedule(0.0, 10.0) == [] and openloop.schedule(5.0, 0.0) == []


def test_lateness_counts_dispatches_after_the_tolerance() -> None:
    late, worst = openloop.lateness([0.0, 0.1, 0.2], [0.0, 0.2, 0.21])
    assert late == 1  # 100 ms late; 10 ms is within the 50 ms tolerance
    assert worst == pytest.approx(100.0)


def test_open_loop_does_not_wait_for_slow_calls() -> None:
    """Each call blocks until the last one has started: a closed loop
    would deadlock, an open loop dispatches them all on schedule."""

    async def scenario() -> openloop.OpenLoopResult:
        started: list[int] = []
        all_started = asyncio.Event()

        async def call(i: int) -> None:
            started.append(i)
            if len(started) == 10:
                all_started.set()
            await all_started.wait()
            if i == 3:
                raise RuntimeError("refused")

        return await asyncio.wait_for(openloop.run(call, 100.0, 0.1), timeout=10)

    r = asyncio.run(scenario())
    assert r.sent == 10
    assert r.max_in_flight == 10
    assert r.errors == ["3: RuntimeError: refused"]
    assert r.as_dict()["offered_jobs_per_s"] == 100.0


def test_open_loop_counts_late_dispatches_from_its_clock() -> None:
    """A clock that moves 1 s on every read (start 0; per call one read
    for the wait, one for the dispatch): every call is dispatched late."""
    ticks = iter(range(100))

    def clock() -> float:
        return float(next(ticks))

    async def call(i: int) -> None:
        return None

    r = asyncio.run(openloop.run(call, 10.0, 0.3, clock=clock))
    assert r.sent == 3
    assert r.late == 3  # dispatched at 2, 4, 6 s for offsets 0, 0.1, 0.2
    assert r.max_late_ms == pytest.approx(5800.0)


# ---------------------------------------------------------------- S1


def test_rss_per_1000_allocs() -> None:
    assert report.rss_per_1000_allocs_mb(100.0, 130.0, 10000) == pytest.approx(3.0)
    assert report.rss_per_1000_allocs_mb(100.0, 130.0, 0) is None
    # 3,052 B per alloc is 2.91 MB per 1,000
    assert report.replica_rss_per_1000_allocs_mb({"rss_per_alloc": 3052}) == pytest.approx(
        3.052e6 / 2**20
    )


# ---------------------------------------------------------------- targets


def test_issue17_targets_at_their_edges() -> None:
    ts = report.targets(run17())
    assert all(t["met"] for t in ts if not t["target"].startswith("W2 CPU")), ts
    assert not by_prefix(ts, "W2 CPU")["met"]  # 0.81 > 0.8
    w1l = by_prefix(ts, "W1L")
    assert w1l["measured"] == 999.0 and w1l["met"]
    assert by_prefix(ts, "M1 1,200")["measured"] == 1.0
    factor = by_prefix(ts, "M1 spread")
    assert factor["measured"] == pytest.approx(3.0) and factor["met"]
    assert factor["detail"] == "300: 3.0x, 1,200: 2.5x"
    assert by_prefix(ts, "N1")["met"]
    assert by_prefix(ts, "invariants")["detail"] == "7 checked, all ok"


def test_issue17_targets_missed() -> None:
    run = run17()
    run["workloads"]["W1L"]["by_load"]["50"]["eval_latency_ms"]["p99"] = 1000.0
    run["m1"]["cases"][1]["eval_s"] = 0.31
    run["workloads"]["N1"]["node_status_changes"] = 2
    run["workloads"]["S1"]["by_nodes"]["500"]["invariants"] = {"ok": False, "violations": ["x"]}
    ts = report.targets(run)
    assert not by_prefix(ts, "W1L")["met"]
    assert not by_prefix(ts, "M1 300")["met"]
    assert not by_prefix(ts, "M1 spread")["met"]  # 0.31 / 0.1
    assert not by_prefix(ts, "N1")["met"]
    assert by_prefix(ts, "invariants")["detail"] == "violated after S1 500 nodes"


# ---------------------------------------------------------------- rendering and comparing


def test_markdown_shows_w1l_s1_and_cpu_by_role() -> None:
    text = report.markdown(run17())
    assert "## W1L latency at an offered load" in text
    assert "saturated rate 120.0 jobs/s (from W1 in this run)" in text
    lines = text.splitlines()
    half = next(line for line in lines if line.startswith("| 50%"))
    assert "60.0" in half and "59.5" in half and "3 / 3,600" in half
    assert "40 / 300 / 999" in half and "210 / 400 / 450" in half
    assert lines.index(half) < lines.index(next(ln for ln in lines if ln.startswith("| 80%")))
    assert "## S1 scaling curve" in text
    assert "broker 3.10" in text
    assert "2.91 MB (3,052 B per alloc)" in text
    # the workload's summary row: state/broker/planner/workers/postgres
    summary = next(line for line in lines if line.startswith("| W1 "))
    assert "0.60/0.20/0.20/0.40/0.05" in summary
    table = lines.index("### CPU-ms per placement by role")
    row = next(line for line in lines[table:] if line.startswith("| W1 "))
    assert "0.60" in row and "1.45" in row and "0.90" in row
    assert "W1L 50%" in text and "S1 2000 nodes" in text


def test_compare_prints_old_to_new_per_figure() -> None:
    old = run17()
    new = run17()
    new["workloads"]["W1"]["placements_per_s"] = 1800.0
    del new["workloads"]["W2"]
    rows = {r[0]: r[1:] for r in report.compare(old, new)}
    assert rows["W1 placements/s"] == ["1,200.0", "1,800.0", "+50%"]
    assert rows["W2 placements/s"] == ["2,100.0", "–", ""]
    assert rows["W1 CPU-ms state"] == ["0.60", "0.60", "+0%"]
    assert rows["W1L 50% eval p99 ms"][1] == "999.0"
    assert rows["W1L 50% placement->running p99 ms"][0] == "450.0"
    assert rows["M1 1200 spread s"] == ["1.00", "1.00", "+0%"]
    text = report.markdown(new, old, "ref.json")
    assert "## Compared with ref.json (feedface, full)" in text


def test_compare_reads_the_previous_reference_shape() -> None:
    """The committed reference run predates per-role CPU in the JSON: its
    per-role figures come from its processes."""
    old = {"workloads": {"W1": {"placements": 1000, "processes": {"state": {"cpu_s": 2.0}}}}}
    figs = report.figures(old)
    assert figs["W1 CPU-ms state"] == 2.0


# ---------------------------------------------------------------- command line


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--w1l-rate", "-1"], "--w1l-rate must not be negative"),
        (["--scaling-nodes", "500,0"], "every size must be a positive number"),
        (["--scaling-nodes", "many"], "expected comma-separated integers"),
        (["--compare", "/nonexistent/old.json"], "no such file"),
        (["--only", "W7"], "unknown W7"),
    ],
)
def test_bad_flags_are_refused_before_anything_starts(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        main(args)
    assert exc.value.code == 2
    assert message in capsys.readouterr().err
