"""Results maths and rendering for a benchmark run (perf-anchors §6.3–6.4).

The runner assembles one `run` dict and hands it here:

    {"profile": "quick"|"full", "started": iso, "git_rev": str, "machine": {...},
     "baselines_before": Baselines.as_dict(), "baselines_after": same or None,
     "workloads": {"W1": {...}, ..., "W6": {"by_workers": {"1": {...}, "2": ...}}},
     "m1": bench.m1.measure(...)}

A workload dict carries placements, jobs, evals, duration_s,
placements_per_s, jobs_per_s, steady_placements_per_s, eval_latency_ms
(`percentiles`), mean_plan_size, commits(_per_eval), plans_submitted /
plans_rejected (node-plans), rpcs_per_eval, scheduler_runs, evals_cancelled,
quiescence_s (W5/W5b), replacement_p99_s / replacement_max_s / lost_allocs
(W4), processes {name: {cpu_s, peak_rss_mb}}, cpu_ms_per_placement,
timeline [[t, cumulative placements]], invariants {ok, violations},
profile_top [{process, frame, share}]; or "error" when it failed. Any key
may be missing. Everything in this module is pure except `plot` and
`write_json`, which write one file each.

Ratios, not raw rates, are the figures that survive a noisy 2-core machine:
each workload rate is divided by a baseline measured in the same run (B1–B5,
`bench.baselines`) or by a public anchor (C1M, C2M, Nomad 2.0.5,
kube-scheduler). A missing workload or figure leaves its ratio out; nothing
here raises on a partial run.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from bench.baselines import percentile

# ---------------------------------------------------------------- anchors

#: C1M: 1,000,000 containers in < 5 min on 5 x 32-vCPU servers.
C1M_PLACEMENTS_PER_S = 3750.0
C1M_PER_VCPU = 23.4  # 3,750 / 160 server vCPUs
#: C2M: 2,000,000 containers in 1,334 s on 3 x 64-vCPU servers.
C2M_PLACEMENTS_PER_S = 1499.0
C2M_PER_VCPU = 7.8  # 1,499 / 192 server vCPUs
#: Nomad 2.0.5 user load test (#28444): 780 jobs/s with p99 < 1 s.
NOMAD2_JOBS_PER_S = 780.0
NOMAD2_P99_MS = 1000.0
#: kube-scheduler CI floor, SchedulingBasic 5,000 nodes.
K8S_PODS_PER_S = 680.0
#: Kubernetes pod-startup SLO, p99.
K8S_STARTUP_P99_S = 5.0
#: W5 is 500 updates to one job in a burst.
W5_UPDATES = 500
#: #14621: the blocked queue of a 49,730-eval storm was empty after 15 s.
STORM_DRAIN_S = 15.0
#: Baselines differing by more than this before/after flag the run (§6.1).
DRIFT_LIMIT = 0.15
#: Cores the perf-anchors machine has; used when the run's machine lacks a count.
DEFAULT_VCPUS = 2

#: Target thresholds of issue 9.
TARGET_W2_PLACEMENTS_PER_S = 3750.0
TARGET_W1_JOBS_PER_S = 780.0
TARGET_W1_P99_MS = 1000.0
TARGET_W4_REPLACEMENT_P99_S = 5.0
TARGET_W5_SCHEDULER_RUNS = 3
TARGET_W6_REJECTION_RATE = 0.05

#: What each ratio means, for the Markdown table (key suffix -> reading).
RATIO_READINGS: dict[str, str] = {
    "pg_utilisation": "placements/s ÷ B2 rows/s at the nearest plan size; > 0.5: DB is the wall",
    "pg_utilisation_k": "B2 plan size used for pg_utilisation",
    "commit_budget": "B1 commits/s ÷ evals/s: serialized commits each eval may cost",
    "commits_per_eval": "measured commits per eval (goal → 1)",
    "rpc_floor": "RPCs/eval × B3 sequential p50 ÷ eval p50: share of latency that is wire time",
    "cpu_normalised_rate": "placements/s ÷ B5 kernel placements/s (cross-machine)",
    "c1m_ratio": "W2 placements/s ÷ 3,750 (C1M)",
    "c2m_ratio": "W2 placements/s ÷ 1,499 (C2M)",
    "c1m_per_vcpu_ratio": "(W2 placements/s ÷ vCPUs) ÷ 23.4 (C1M per server vCPU)",
    "c2m_per_vcpu_ratio": "(W2 placements/s ÷ vCPUs) ÷ 7.8 (C2M per server vCPU)",
    "nomad2_jobs_ratio": "W1 jobs/s ÷ 780 (Nomad 2.0.5, #28444)",
    "nomad2_p99_ratio": "W1 eval p99 ÷ 1 s (Nomad 2.0.5; < 1 is better)",
    "k8s_rate_ratio": "W1 placements/s ÷ 680 (kube-scheduler 5,000-node floor)",
    "k8s_replacement_ratio": "W4 replacement p99 ÷ 5 s (pod-startup SLO; < 1 is better)",
    "storm_runs_ratio": "W5 scheduler runs ÷ 500 updates (goal ≈ 0.004)",
    "storm_drain_ratio": "W5b time to quiescence ÷ 15 s (#14621)",
    "scaling_efficiency": "rate(N) ÷ (min(N, 2) × rate(1 worker))",
    "rejection_rate": "rejected ÷ submitted node-plans",
}


# ---------------------------------------------------------------- basic maths


def percentiles(values_ms: list[float]) -> dict[str, float]:
    """Nearest-rank p50/p95/p99, max and count of latencies in ms."""
    return {
        "p50": percentile(values_ms, 50),
        "p95": percentile(values_ms, 95),
        "p99": percentile(values_ms, 99),
        "max": max(values_ms) if values_ms else 0.0,
        "count": len(values_ms),
    }


def steady_rate(timeline: Sequence[Sequence[float]]) -> float:
    """Placements/s between the 10% and 90% marks of the final cumulative
    count: (count at the first sample reaching 90% − count at the first
    sample reaching 10%) ÷ the time between those samples. 0.0 when there is
    no steady phase to measure (empty, nothing placed, or both marks reached
    by the same sample, e.g. one huge plan)."""
    if not timeline:
        return 0.0
    points = sorted((float(t), float(c)) for t, c in timeline)
    final = points[-1][1]
    if final <= 0:
        return 0.0
    lo = next(p for p in points if p[1] >= 0.1 * final)
    hi = next(p for p in points if p[1] >= 0.9 * final)
    if hi[0] <= lo[0]:
        return 0.0
    return (hi[1] - lo[1]) / (hi[0] - lo[0])


def _numbers(d: Mapping[str, Any], prefix: str = "") -> Iterator[tuple[str, float]]:
    for k, v in d.items():
        name = f"{prefix}{k}"
        if isinstance(v, Mapping):
            yield from _numbers(v, f"{name}.")
        elif isinstance(v, int | float) and not isinstance(v, bool):
            yield name, float(v)


def baseline_drift(before: Mapping[str, Any] | None, after: Mapping[str, Any] | None) -> list[str]:
    """Baseline figures that moved by more than 15% between the start and
    the end of the run (§6.1): the machine changed under the workloads."""
    if not before or not after:
        return []
    after_n = dict(_numbers(after))
    out: list[str] = []
    for name, b in _numbers(before):
        a = after_n.get(name)
        if a is None:
            continue
        if b == 0:
            if a != 0:
                out.append(f"{name}: {b:g} -> {a:g} (from zero)")
            continue
        change = (a - b) / abs(b)
        if abs(change) > DRIFT_LIMIT:
            out.append(f"{name}: {b:g} -> {a:g} ({change * 100:+.1f}%)")
    return out


# ---------------------------------------------------------------- ratios


def _num(d: Mapping[str, Any] | None, key: str) -> float | None:
    if d is None:
        return None
    v = d.get(key)
    if isinstance(v, int | float) and not isinstance(v, bool):
        return float(v)
    return None


def _workload(run: Mapping[str, Any], wid: str) -> dict[str, Any] | None:
    """A workload's dict if present and not failed."""
    w = (run.get("workloads") or {}).get(wid)
    if not isinstance(w, dict) or "error" in w:
        return None
    return w


def _baselines(run: Mapping[str, Any]) -> dict[str, Any]:
    b = run.get("baselines_before") or run.get("baselines_after") or {}
    return dict(b)


def nearest_plan_size(sizes: list[int], mean_plan_size: float) -> int:
    """The measured B2 plan size nearest `mean_plan_size` on a log scale
    (B2's sizes are decades apart: a 300-alloc plan is nearer 100 than
    1,000); ties go to the smaller size."""
    if not sizes:
        raise ValueError("no B2 plan sizes")
    m = max(mean_plan_size, 1e-9)
    return min(sorted(sizes), key=lambda k: abs(math.log10(k) - math.log10(m)))


def _vcpus(run: Mapping[str, Any]) -> int:
    machine = run.get("machine") or {}
    for key in ("vcpus", "cpu_count", "cpus", "logical_cpus"):
        v = machine.get(key)
        if isinstance(v, int) and v > 0:
            return v
    return DEFAULT_VCPUS


def _rejection_rate(w: Mapping[str, Any]) -> float | None:
    sub = _num(w, "plans_submitted")
    rej = _num(w, "plans_rejected")
    if sub is None or rej is None or sub <= 0:
        return None
    return rej / sub


def _evals_per_s(w: Mapping[str, Any]) -> float | None:
    evals, dur = _num(w, "evals"), _num(w, "duration_s")
    if evals is not None and dur:
        return evals / dur
    return _num(w, "jobs_per_s")


def ratios(run: Mapping[str, Any]) -> dict[str, float]:
    """Every ratio of perf-anchors §6.4 the run has the figures for, keyed
    `<workload>.<ratio>` (W6 per worker count: `W6.<N>.<ratio>`)."""
    out: dict[str, float] = {}
    base = _baselines(run)
    b1 = _num(base, "B1_commits_per_s")
    b2_raw = base.get("B2_alloc_rows_per_s") or {}
    b2 = {int(k): float(v) for k, v in b2_raw.items() if float(v) > 0}
    b3_p50 = _num(base, "B3_grpc_sequential_p50_ms")
    b5 = _num(base, "B5_kernel_placements_per_s")
    workloads = run.get("workloads") or {}

    # per-workload ratios: PG utilisation (W1, W2), RPC floor, CPU-normalised
    for wid in workloads:
        w = _workload(run, wid)
        if w is None or wid == "W6":
            continue
        pps = _num(w, "placements_per_s")
        if wid in ("W1", "W2") and pps is not None and b2:
            size = _num(w, "mean_plan_size")
            if size is None:
                placements, evals = _num(w, "placements"), _num(w, "evals")
                size = placements / evals if placements and evals else None
            if size is not None and size > 0:
                k = nearest_plan_size(list(b2), size)
                out[f"{wid}.pg_utilisation"] = pps / b2[k]
                out[f"{wid}.pg_utilisation_k"] = float(k)
        rpcs = _num(w, "rpcs_per_eval")
        p50 = _num(w.get("eval_latency_ms"), "p50")
        if rpcs is not None and b3_p50 is not None and p50:
            out[f"{wid}.rpc_floor"] = rpcs * b3_p50 / p50
        if pps is not None and b5:
            out[f"{wid}.cpu_normalised_rate"] = pps / b5

    w1 = _workload(run, "W1")
    if w1 is not None:
        eps = _evals_per_s(w1)
        if b1 is not None and eps:
            out["W1.commit_budget"] = b1 / eps
        cpe = _num(w1, "commits_per_eval")
        if cpe is not None:
            out["W1.commits_per_eval"] = cpe
        jps = _num(w1, "jobs_per_s")
        if jps is not None:
            out["W1.nomad2_jobs_ratio"] = jps / NOMAD2_JOBS_PER_S
        p99 = _num(w1.get("eval_latency_ms"), "p99")
        if p99 is not None:
            out["W1.nomad2_p99_ratio"] = p99 / NOMAD2_P99_MS
        pps = _num(w1, "placements_per_s")
        if pps is not None:
            out["W1.k8s_rate_ratio"] = pps / K8S_PODS_PER_S

    w2 = _workload(run, "W2")
    pps2 = _num(w2, "placements_per_s")
    if pps2 is not None:
        per_vcpu = pps2 / _vcpus(run)
        out["W2.c1m_ratio"] = pps2 / C1M_PLACEMENTS_PER_S
        out["W2.c2m_ratio"] = pps2 / C2M_PLACEMENTS_PER_S
        out["W2.c1m_per_vcpu_ratio"] = per_vcpu / C1M_PER_VCPU
        out["W2.c2m_per_vcpu_ratio"] = per_vcpu / C2M_PER_VCPU

    rep = _num(_workload(run, "W4"), "replacement_p99_s")
    if rep is not None:
        out["W4.k8s_replacement_ratio"] = rep / K8S_STARTUP_P99_S

    w5 = _workload(run, "W5")
    runs = _num(w5, "scheduler_runs")
    if w5 is not None and runs is not None:
        updates = _num(w5.get("params"), "updates") or float(W5_UPDATES)
        out["W5.storm_runs_ratio"] = runs / updates
    drain = _num(_workload(run, "W5b"), "quiescence_s")
    if drain is not None:
        out["W5b.storm_drain_ratio"] = drain / STORM_DRAIN_S

    by_workers = _w6_by_workers(run)
    one = _num(by_workers.get("1"), "placements_per_s")
    for n, w in by_workers.items():
        rate = _num(w, "placements_per_s")
        if one and rate is not None:
            out[f"W6.{n}.scaling_efficiency"] = rate / (min(int(n), 2) * one)
        rr = _rejection_rate(w)
        if rr is not None:
            out[f"W6.{n}.rejection_rate"] = rr
    return out


def _w6_by_workers(run: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """W6's successful worker-count runs, ordered by worker count."""
    w6 = _workload(run, "W6")
    if w6 is None:
        return {}
    by = w6.get("by_workers") or {}
    ok = {str(n): w for n, w in by.items() if isinstance(w, dict) and "error" not in w}
    return dict(sorted(ok.items(), key=lambda kv: int(kv[0])))


# ---------------------------------------------------------------- targets


def targets(run: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The five targets of issue 9, each {target, measured, met, detail};
    `measured` is None (and `met` False) when the workload did not run or
    failed."""
    out: list[dict[str, Any]] = []

    def add(target: str, measured: float | None, met: bool, detail: str) -> None:
        out.append({"target": target, "measured": measured, "met": met, "detail": detail})

    def missing(wid: str) -> str:
        w = (run.get("workloads") or {}).get(wid)
        if isinstance(w, dict) and "error" in w:
            return f"{wid} failed: {w['error']}"
        return f"{wid} not run"

    w2 = _num(_workload(run, "W2"), "placements_per_s")
    t = f"W2 >= {TARGET_W2_PLACEMENTS_PER_S:,.0f} placements/s"
    if w2 is None:
        add(t, None, False, missing("W2"))
    else:
        add(t, w2, w2 >= TARGET_W2_PLACEMENTS_PER_S, f"{w2:,.0f} placements/s")

    w1 = _workload(run, "W1")
    jps = _num(w1, "jobs_per_s")
    p99 = _num((w1 or {}).get("eval_latency_ms"), "p99")
    t = f"W1 >= {TARGET_W1_JOBS_PER_S:,.0f} jobs/s with eval p99 < {TARGET_W1_P99_MS / 1000:g} s"
    if jps is None:
        add(t, None, False, missing("W1"))
    else:
        met = jps >= TARGET_W1_JOBS_PER_S and p99 is not None and p99 < TARGET_W1_P99_MS
        p99_text = f"p99 {p99:,.0f} ms" if p99 is not None else "p99 not measured"
        add(t, jps, met, f"{jps:,.1f} jobs/s, {p99_text}")

    rep = _num(_workload(run, "W4"), "replacement_p99_s")
    t = f"W4 every lost alloc replaced within {TARGET_W4_REPLACEMENT_P99_S:g} s p99"
    if rep is None:
        add(t, None, False, missing("W4"))
    else:
        add(t, rep, rep <= TARGET_W4_REPLACEMENT_P99_S, f"p99 {rep:.2f} s")

    runs = _num(_workload(run, "W5"), "scheduler_runs")
    t = f"W5 <= {TARGET_W5_SCHEDULER_RUNS} scheduler runs for {W5_UPDATES} updates"
    if runs is None:
        add(t, None, False, missing("W5"))
    else:
        add(t, runs, runs <= TARGET_W5_SCHEDULER_RUNS, f"{runs:g} runs")

    two = _w6_by_workers(run).get("2")
    rr = _rejection_rate(two) if two is not None else None
    t = f"W6 rejection rate < {TARGET_W6_REJECTION_RATE:.0%} at 2 workers"
    if rr is None:
        detail = missing("W6") if _workload(run, "W6") is None else "no 2-worker plan counts"
        add(t, None, False, detail)
    else:
        add(t, rr, rr < TARGET_W6_REJECTION_RATE, f"{rr:.1%} of node-plans rejected")
    return out


# ---------------------------------------------------------------- markdown


def _fmt(v: Any, digits: int = 1) -> str:
    if v is None:
        return "–"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, int):
        return f"{v:,}"
    if isinstance(v, float):
        if v != 0 and abs(v) < 0.01:
            return f"{v:.2g}"
        if abs(v) < 10:
            return f"{v:,.{max(digits, 2)}f}"
        return f"{v:,.{digits}f}"
    return str(v)


def _table(headers: list[str], rows: list[list[str]]) -> list[str]:
    """A Markdown table padded to column width, so it reads in a terminal."""
    widths = [len(h) for h in headers]
    for r in rows:
        for i, cell in enumerate(r):
            widths[i] = max(widths[i], len(cell))

    def line(cells: list[str]) -> str:
        return "| " + " | ".join(c.ljust(widths[i]) for i, c in enumerate(cells)) + " |"

    return [line(headers), "|" + "|".join("-" * (w + 2) for w in widths) + "|"] + [
        line(r) for r in rows
    ]


def _flat_workloads(run: Mapping[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """(label, dict) for every workload, W6 expanded per worker count."""
    out: list[tuple[str, dict[str, Any]]] = []
    for wid, w in (run.get("workloads") or {}).items():
        if not isinstance(w, dict):
            continue
        if wid == "W6" and "by_workers" in w:
            by = w["by_workers"] or {}
            for n in sorted(by, key=lambda x: int(x)):
                if isinstance(by[n], dict):
                    out.append((f"W6 x{n}", by[n]))
            if "error" in w:
                out.append(("W6", {"error": w["error"]}))
        else:
            out.append((wid, w))
    return out


def _section_baselines(run: Mapping[str, Any]) -> list[str]:
    before = run.get("baselines_before") or {}
    after = run.get("baselines_after") or {}
    if not before and not after:
        return ["## Baselines", "", "(not measured)", ""]
    after_n = dict(_numbers(after))
    drift = {line.split(":")[0] for line in baseline_drift(before, after)}
    rows = []
    names = [n for n, _ in _numbers(before)] or [n for n, _ in _numbers(after)]
    before_n = dict(_numbers(before))
    for name in names:
        rows.append(
            [
                name,
                _fmt(before_n.get(name)),
                _fmt(after_n.get(name)),
                "DRIFT > 15%" if name in drift else "",
            ]
        )
    lines = ["## Baselines", ""]
    lines += _table(["figure", "before", "after", ""], rows)
    return [*lines, ""]


def _section_workloads(run: Mapping[str, Any]) -> list[str]:
    items = _flat_workloads(run)
    if not items:
        return ["## Workloads", "", "(none ran)", ""]
    rows = []
    for label, w in items:
        if "error" in w and "placements" not in w:
            rows.append([label, "FAILED", *["–"] * 9])
            continue
        lat = w.get("eval_latency_ms") or {}
        rows.append(
            [
                label,
                _fmt(w.get("placements")),
                _fmt(w.get("duration_s"), 2),
                _fmt(w.get("placements_per_s")),
                _fmt(w.get("steady_placements_per_s")),
                _fmt(w.get("jobs_per_s")),
                f"{_fmt(lat.get('p50'))} / {_fmt(lat.get('p99'))}" if lat else "–",
                _fmt(w.get("mean_plan_size")),
                _fmt(w.get("commits_per_eval"), 2),
                _fmt(w.get("cpu_ms_per_placement"), 2),
                "error" if "error" in w else "ok",
            ]
        )
    headers = [
        "workload",
        "placements",
        "duration s",
        "placements/s",
        "steady/s",
        "jobs/s",
        "eval p50/p99 ms",
        "plan size",
        "commits/eval",
        "CPU-ms/placement",
        "status",
    ]
    lines = ["## Workloads", "", *_table(headers, rows), ""]

    extras = []
    for label, w in items:
        bits = []
        for key, name in (
            ("min_ready_nodes", "fewest nodes ready"),
            ("node_status_changes", "node status changes"),
            ("state_cpu_share", "state CPU share"),
            ("sim_cpu_share", "simulator CPU share"),
            ("system_allocs", "system allocs"),
            ("detect_s", "failure to all down s"),
            ("nodes_down", "nodes down"),
            ("lost_allocs", "lost allocs"),
            ("replaced", "replaced"),
            ("replacement_p50_s", "replacement p50 s"),
            ("replacement_p99_s", "replacement p99 s"),
            ("replacement_max_s", "replacement max s"),
            ("scheduler_runs", "scheduler runs"),
            ("evals_cancelled", "evals cancelled"),
            ("evals_queued", "evals queued while paused"),
            ("runs_per_job", "runs per job"),
            ("quiescence_s", "quiescence s"),
            ("plans_submitted", "node-plans submitted"),
            ("plans_rejected", "rejected"),
        ):
            if key in w:
                bits.append(f"{name} {_fmt(w[key], 2)}")
        if bits:
            extras.append(f"- {label}: " + ", ".join(bits))
    if extras:
        lines += extras + [""]

    proc_rows = []
    for label, w in items:
        for pname, p in (w.get("processes") or {}).items():
            proc_rows.append([label, pname, _fmt(p.get("cpu_s"), 2), _fmt(p.get("peak_rss_mb"))])
    if proc_rows:
        lines += ["### Processes", ""]
        lines += _table(["workload", "process", "CPU s", "peak RSS MB"], proc_rows)
        lines.append("")
    return lines


def _section_m1(run: Mapping[str, Any]) -> list[str]:
    m1 = run.get("m1")
    if not isinstance(m1, dict):
        return []
    if "error" in m1:
        return ["## M1 scheduler micro-benchmark", "", f"FAILED: {m1['error']}", ""]
    rows = []
    for c in m1.get("cases") or []:
        rows.append(
            [
                _fmt(c.get("nodes")),
                _fmt(c.get("racks")),
                _fmt(c.get("allocs")),
                "spread" if c.get("spread") else "none",
                _fmt(c.get("eval_s"), 3),
                _fmt(c.get("eval_median_s"), 3),
                _fmt(c.get("placements_per_s")),
                _fmt(c.get("repeats")),
            ]
        )
    headers = ["nodes", "racks", "allocs", "spread", "eval s (best)", "median s", "placements/s"]
    return [
        "## M1 scheduler micro-benchmark (Nomad BenchmarkServiceScheduler shape)",
        "",
        *_table([*headers, "repeats"], rows),
        "",
    ]


def _section_ratios(run: Mapping[str, Any]) -> list[str]:
    r = ratios(run)
    if not r:
        return ["## Ratios (perf-anchors §6.4)", "", "(no figures to compute them from)", ""]
    rows = []
    for key, v in r.items():
        suffix = key.rsplit(".", 1)[-1]
        if suffix == "pg_utilisation_k" or abs(v) >= 1000:
            value = f"{v:,.0f}"
        else:
            value = f"{v:.3g}"
        rows.append([key, value, RATIO_READINGS.get(suffix, "")])
    return ["## Ratios (perf-anchors §6.4)", "", *_table(["ratio", "value", "reading"], rows), ""]


def _section_targets(run: Mapping[str, Any]) -> list[str]:
    rows = [[t["target"], t["detail"], "✓" if t["met"] else "✗"] for t in targets(run)]
    return ["## Targets", "", *_table(["target", "measured", "met"], rows), ""]


def _section_invariants(run: Mapping[str, Any]) -> list[str]:
    lines = ["## Invariants", ""]
    any_line = False
    for label, w in _flat_workloads(run):
        inv = w.get("invariants")
        if not isinstance(inv, dict):
            continue
        any_line = True
        violations = list(inv.get("violations") or [])
        if inv.get("ok") and not violations:
            lines.append(f"- {label}: ok")
            continue
        lines.append(f"- {label}: VIOLATED ({len(violations)})")
        for v in violations[:5]:
            lines.append(f"  - {v}")
        if len(violations) > 5:
            lines.append(f"  - ... {len(violations) - 5} more")
    if not any_line:
        lines.append("(not checked)")
    return [*lines, ""]


def _section_profiles(run: Mapping[str, Any]) -> list[str]:
    lines = ["## Top profile frames", ""]
    found = False
    for label, w in _flat_workloads(run):
        top = w.get("profile_top") or []
        if not top:
            continue
        found = True
        lines.append(f"### {label}")
        rows = [
            [str(f.get("process", "")), f"{float(f.get('share', 0.0)):.1%}", str(f.get("frame"))]
            for f in top
        ]
        lines += _table(["process", "share", "frame"], rows)
        lines.append("")
    return lines if found else []


def _section_errors(run: Mapping[str, Any]) -> list[str]:
    errs = [(label, w["error"]) for label, w in _flat_workloads(run) if "error" in w]
    if not errs:
        return []
    return ["## Errors", "", *[f"- {label}: {e}" for label, e in errs], ""]


def markdown(run: Mapping[str, Any]) -> str:
    """The run summary: machine, baselines, workloads, M1, ratios, targets,
    invariants, top profile frames, errors."""
    machine = run.get("machine") or {}
    machine_line = ", ".join(f"{k} {v}" for k, v in machine.items()) or "unknown machine"
    lines = [
        f"# Corral benchmark ({run.get('profile', '?')} profile)",
        "",
        f"started {run.get('started', '?')}, rev {run.get('git_rev', '?')}",
        f"machine: {machine_line}",
        "",
    ]
    drift = baseline_drift(run.get("baselines_before"), run.get("baselines_after"))
    if drift:
        lines += ["**Baselines drifted by more than 15% during the run:**", ""]
        lines += [f"- {d}" for d in drift] + [""]
    lines += _section_baselines(run)
    lines += _section_workloads(run)
    lines += _section_m1(run)
    lines += _section_ratios(run)
    lines += _section_targets(run)
    lines += _section_invariants(run)
    lines += _section_profiles(run)
    lines += _section_errors(run)
    return "\n".join(lines).rstrip() + "\n"


# ---------------------------------------------------------------- files


def _timelines(run: Mapping[str, Any]) -> list[tuple[str, list[tuple[str, list[list[float]]]]]]:
    """Panels to plot: (workload, [(series label, timeline)]); W6 puts its
    worker counts on one panel."""
    panels = []
    for wid, w in (run.get("workloads") or {}).items():
        if not isinstance(w, dict):
            continue
        if wid == "W6" and "by_workers" in w:
            series = [
                (f"{n} worker{'s' if n != '1' else ''}", by["timeline"])
                for n, by in sorted((w["by_workers"] or {}).items(), key=lambda kv: int(kv[0]))
                if isinstance(by, dict) and by.get("timeline")
            ]
            if series:
                panels.append((wid, series))
        elif w.get("timeline"):
            panels.append((wid, [(wid, w["timeline"])]))
    return panels


def plot(run: Mapping[str, Any], path: Path | str) -> Path:
    """One PNG of cumulative placements over time, a panel per workload
    (W6: one line per worker count)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    panels = _timelines(run)
    cols = 2 if len(panels) > 1 else 1
    rows = max(1, math.ceil(len(panels) / cols))
    fig, axes = plt.subplots(rows, cols, figsize=(6 * cols, 3.6 * rows), squeeze=False)
    flat = [ax for row in axes for ax in row]
    if not panels:
        flat[0].text(0.5, 0.5, "no workload timelines", ha="center", va="center")
        flat[0].set_axis_off()
    for ax, (wid, series) in zip(flat, panels, strict=False):
        for label, timeline in series:
            pts = sorted((float(t), float(c)) for t, c in timeline)
            ax.plot([p[0] for p in pts], [p[1] for p in pts], label=label, linewidth=1.4)
        ax.set_title(wid)
        ax.set_xlabel("seconds since start")
        ax.set_ylabel("placements (cumulative)")
        ax.grid(True, alpha=0.3)
        if len(series) > 1 or wid == "W6":
            ax.legend(fontsize="small")
    for ax in flat[len(panels) :]:
        if panels:
            ax.set_axis_off()
    fig.suptitle(
        f"Corral placements over time ({run.get('profile', '?')}, {run.get('git_rev', '?')})"
    )
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


def result_name(run: Mapping[str, Any], now: float | None = None) -> str:
    """`<UTC timestamp>-<short git rev>`, the stem of a run's files."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(now))
    rev = str(run.get("git_rev") or "unknown")[:8]
    return f"{stamp}-{rev}"


def write_json(run: Mapping[str, Any], out_dir: Path | str) -> Path:
    """Write the run to `<out_dir>/<UTC timestamp>-<short rev>.json`."""
    d = Path(out_dir)
    d.mkdir(parents=True, exist_ok=True)
    path = d / f"{result_name(run)}.json"
    path.write_text(json.dumps(run, indent=2, sort_keys=False, default=str) + "\n")
    return path
