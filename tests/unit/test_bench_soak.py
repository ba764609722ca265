"""bench/soak.py's verdict: each role judged from its first sample after
the first GC pass to its last, against the bound; too short a run is not
judged."""

from __future__ import annotations

from bench.soak import GC_INTERVAL_S, Options, Samples, table, verdict


def samples(growth: dict[str, float], minutes: int = 12) -> Samples:
    s = Samples()
    for m in range(minutes):
        s.t.append(m * 60.0)
        s.rss_mb.append({role: 100.0 + g * m for role, g in growth.items()})
        s.rows.append({"jobs": 10 * m, "evals": 20 * m})
    return s


def test_judged_from_the_first_sample_after_the_first_gc_pass() -> None:
    v = verdict(Options(minutes=11), samples({"state": 1.0, "agent": 5.0}))
    assert v["judged"] and v["from_s"] == GC_INTERVAL_S + 60 and v["to_s"] == 660.0
    by_role = {r["role"]: r for r in v["roles"]}
    assert by_role["state"]["growth_pct"] == round(5 / 106 * 100, 1)  # 106 -> 111 MB
    assert by_role["agent"]["growth_pct"] > 10 and not v["ok"]
    assert by_role["state"]["kb_per_row_added"] == round(5 * 1024 / 150, 1)
    assert "FAIL: largest growth" in table({**_result(), "verdict": v})


def test_a_flat_run_passes_and_a_short_one_is_not_judged() -> None:
    assert verdict(Options(), samples({"state": 0.1}))["ok"]
    short = verdict(Options(minutes=5), samples({"state": 0.1}, minutes=6))
    assert not short["judged"] and "first GC cycle" in short["why"]


def _result() -> dict[str, object]:
    return {
        "registered": 1,
        "stopped": 1,
        "purged": 0,
        "errors": {},
        "gc": "defaults",
        "options": {"max_growth": 0.1},
    }
