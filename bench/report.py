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
(W4), processes {name: {cpu_s, peak_rss_mb, rss_start_mb, rss_end_mb}},
cpu_ms_per_placement, cpu_ms_by_role {state, broker, planner, workers,
postgres, total, sim}, timeline [[t, cumulative placements]], invariants
{ok, violations}, profile_top [{process, frame, share}]; or "error" when it
failed. W1L holds saturated_jobs_per_s, rate_source and by_load {"50": a
workload dict plus driver (`bench.openloop`), achieved_jobs_per_s,
placement_to_running_ms, never_running}; S1 holds by_nodes {"500": a
workload dict plus nodes, cluster_ready_s, replica_rss_per_1000_allocs_mb}
and replica_memory (`bench.replica_memory`). Any key may be missing.
Everything in this module is pure except `plot` and `write_json`, which
write one file each.

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

from bench import ledger as ledger_mod
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

#: Target thresholds of issue 17 (full profile).
TARGET_W2_PLACEMENTS_PER_S = 2000.0
TARGET_W1_PLACEMENTS_PER_S = 1000.0
TARGET_W1_CPU_MS = 1.5
TARGET_W2_CPU_MS = 0.8
TARGET_W1L_P99_MS = 1000.0
TARGET_M1_1200_SPREAD_S = 1.0
TARGET_M1_300_SPREAD_S = 0.3
TARGET_M1_SPREAD_FACTOR = 3.0
TARGET_W4_REPLACEMENT_P99_S = 5.0
TARGET_W5_SCHEDULER_RUNS = 3
#: W1L's offered loads, as fractions of W1's saturated jobs/s.
W1L_LOADS = (0.5, 0.8)
#: Roles whose CPU is counted per placement (the simulator is shown apart).
ROLES = ("state", "broker", "planner", "workers", "postgres")
ROLE_ABBREV = {"state": "s", "broker": "b", "planner": "p", "workers": "w", "postgres": "pg"}

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


def _sub_runs(run: Mapping[str, Any], wid: str, key: str) -> dict[str, dict[str, Any]]:
    """A workload's successful sub-runs (`by_load`, `by_nodes`) in numeric order."""
    w = _workload(run, wid)
    if w is None:
        return {}
    by = w.get(key) or {}
    ok = {str(n): v for n, v in by.items() if isinstance(v, dict) and "error" not in v}
    return dict(sorted(ok.items(), key=lambda kv: float(kv[0])))


def _w1l_by_load(run: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    return _sub_runs(run, "W1L", "by_load")


def _s1_by_nodes(run: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    return _sub_runs(run, "S1", "by_nodes")


# ---------------------------------------------------------------- per role, W1L, S1


def role_of(process: str) -> str:
    """The role a measured process belongs to: `worker0`, `worker1`, ...
    are the `workers`; the others are their own role."""
    return "workers" if process.startswith("worker") else process


def cpu_ms_by_role(processes: Mapping[str, Any], placements: float) -> dict[str, float]:
    """CPU-ms per placement of each role (the worker processes summed), of
    all of them but the simulator (`total`: what issue 17's targets count)
    and of the simulator apart (`sim`). Empty when nothing was placed."""
    if not placements or placements <= 0:
        return {}
    cpu: dict[str, float] = {}
    for name, figures in processes.items():
        c = _num(figures if isinstance(figures, Mapping) else None, "cpu_s")
        if c is None:
            continue
        role = role_of(name)
        cpu[role] = cpu.get(role, 0.0) + c
    out = {role: round(v * 1000 / placements, 3) for role, v in cpu.items() if role != "sim"}
    out["total"] = round(sum(v for r, v in cpu.items() if r != "sim") * 1000 / placements, 3)
    if "sim" in cpu:
        out["sim"] = round(cpu["sim"] * 1000 / placements, 3)
    return out


def w1l_rates(saturated_jobs_per_s: float, loads: Sequence[float] = W1L_LOADS) -> dict[str, float]:
    """W1L's offered registration rates, keyed by percent of saturation
    ("50", "80"); empty when there is no saturated rate to scale."""
    if saturated_jobs_per_s <= 0:
        return {}
    return {f"{round(f * 100)}": saturated_jobs_per_s * f for f in loads}


def achieved_rate(times: Sequence[float]) -> float:
    """Events per second of sorted event times (s): the intervals between
    the first and the last, (n − 1) ÷ span; 0.0 with fewer than two."""
    if len(times) < 2:
        return 0.0
    span = max(times) - min(times)
    return (len(times) - 1) / span if span > 0 else 0.0


def rss_per_1000_allocs_mb(rss_start_mb: float, rss_end_mb: float, allocs: int) -> float | None:
    """RSS a replica grew by per 1,000 allocs it came to hold, in MB."""
    if allocs <= 0:
        return None
    return (rss_end_mb - rss_start_mb) * 1000 / allocs


def replica_rss_per_1000_allocs_mb(memory: Mapping[str, Any]) -> float | None:
    """`bench.replica_memory`'s bytes per alloc (a lean replica store) as
    MB per 1,000 allocs held."""
    per_alloc = _num(memory, "rss_per_alloc")
    return per_alloc * 1000 / 2**20 if per_alloc is not None else None


# ---------------------------------------------------------------- targets


def _m1_case(run: Mapping[str, Any], allocs: int, spread: bool) -> float | None:
    m1 = run.get("m1")
    if not isinstance(m1, Mapping) or "error" in m1:
        return None
    for c in m1.get("cases") or []:
        if c.get("allocs") == allocs and bool(c.get("spread")) == spread:
            return _num(c, "eval_s")
    return None


def targets(run: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The targets of issue 17, each {target, measured, met, detail};
    `measured` is None (and `met` False) when the figure was not taken
    (the workload did not run or failed)."""
    out: list[dict[str, Any]] = []

    def add(target: str, measured: float | None, met: bool, detail: str) -> None:
        out.append({"target": target, "measured": measured, "met": met, "detail": detail})

    def missing(wid: str) -> str:
        w = (run.get("workloads") or {}).get(wid)
        if isinstance(w, dict) and "error" in w:
            return f"{wid} failed: {w['error']}"
        return f"{wid} not run"

    def at_least(t: str, wid: str, v: float | None, floor: float, unit: str) -> None:
        if v is None:
            add(t, None, False, missing(wid))
        else:
            add(t, v, v >= floor, f"{_fmt(v)} {unit}")

    def at_most(t: str, wid: str, v: float | None, ceiling: float, text: str) -> None:
        if v is None:
            add(t, None, False, missing(wid))
        else:
            add(t, v, v <= ceiling, text.format(v))

    w1, w2 = _workload(run, "W1"), _workload(run, "W2")
    at_least(
        f"W2 >= {TARGET_W2_PLACEMENTS_PER_S:,.0f} placements/s",
        "W2",
        _num(w2, "placements_per_s"),
        TARGET_W2_PLACEMENTS_PER_S,
        "placements/s",
    )
    at_least(
        f"W1 >= {TARGET_W1_PLACEMENTS_PER_S:,.0f} placements/s",
        "W1",
        _num(w1, "placements_per_s"),
        TARGET_W1_PLACEMENTS_PER_S,
        "placements/s",
    )
    at_most(
        f"W1 CPU-ms per placement <= {TARGET_W1_CPU_MS:g} (simulator excluded)",
        "W1",
        _num(w1, "cpu_ms_per_placement"),
        TARGET_W1_CPU_MS,
        "{:.2f} ms",
    )
    at_most(
        f"W2 CPU-ms per placement <= {TARGET_W2_CPU_MS:g} (simulator excluded)",
        "W2",
        _num(w2, "cpu_ms_per_placement"),
        TARGET_W2_CPU_MS,
        "{:.2f} ms",
    )

    half = _w1l_by_load(run).get("50")
    p99 = _num((half or {}).get("eval_latency_ms"), "p99")
    t = f"W1L at 50% of saturation: eval p99 < {TARGET_W1L_P99_MS / 1000:g} s"
    if p99 is None:
        add(t, None, False, missing("W1L") if half is None else "no eval latencies")
    else:
        add(t, p99, p99 < TARGET_W1L_P99_MS, f"p99 {p99:,.0f} ms")

    for allocs, limit in ((1200, TARGET_M1_1200_SPREAD_S), (300, TARGET_M1_300_SPREAD_S)):
        v = _m1_case(run, allocs, True)
        t = f"M1 {allocs:,} allocs with spread <= {limit:g} s"
        if v is None:
            add(t, None, False, "M1 not run" if "m1" not in run else "case not measured")
        else:
            add(t, v, v <= limit, f"{v:.3f} s")
    factors = []
    for allocs in (300, 1200):
        sp, none = _m1_case(run, allocs, True), _m1_case(run, allocs, False)
        if sp is not None and none:
            factors.append((allocs, sp / none))
    t = f"M1 spread within {TARGET_M1_SPREAD_FACTOR:g}x of no-spread"
    if not factors:
        add(t, None, False, "M1 not run" if "m1" not in run else "cases not measured")
    else:
        worst = max(f for _, f in factors)
        detail = ", ".join(f"{a:,}: {f:.1f}x" for a, f in factors)
        add(t, worst, worst <= TARGET_M1_SPREAD_FACTOR, detail)

    at_most(
        f"W4 every lost alloc replaced within {TARGET_W4_REPLACEMENT_P99_S:g} s p99",
        "W4",
        _num(_workload(run, "W4"), "replacement_p99_s"),
        TARGET_W4_REPLACEMENT_P99_S,
        "p99 {:.2f} s",
    )
    at_most(
        f"W5 <= {TARGET_W5_SCHEDULER_RUNS} scheduler runs for {W5_UPDATES} updates",
        "W5",
        _num(_workload(run, "W5"), "scheduler_runs"),
        TARGET_W5_SCHEDULER_RUNS,
        "{:g} runs",
    )
    at_most(
        f"W5b quiet <= {STORM_DRAIN_S:g} s after the workers resume",
        "W5b",
        _num(_workload(run, "W5b"), "quiescence_s"),
        STORM_DRAIN_S,
        "{:.1f} s",
    )
    at_most(
        "N1 idle cluster: zero node status changes",
        "N1",
        _num(_workload(run, "N1"), "node_status_changes"),
        0,
        "{:g} changes",
    )

    checked = [
        (label, w["invariants"])
        for label, w in _flat_workloads(run)
        if isinstance(w.get("invariants"), Mapping)
    ]
    bad = [label for label, inv in checked if not inv.get("ok")]
    t = "invariants hold after every workload"
    if not checked:
        add(t, None, False, "no workload checked")
    else:
        detail = f"violated after {', '.join(bad)}" if bad else f"{len(checked)} checked, all ok"
        add(t, float(len(bad)), not bad, detail)
    return out


# ---------------------------------------------------------------- comparing


def figures(run: Mapping[str, Any]) -> dict[str, float]:
    """The headline figures of a run, flat (`W1 placements/s`, `W1 CPU-ms
    state`, `M1 1200 spread s`, `S1 2000 placements/s`, ...), for
    `compare`: what issue 17 sets targets on, plus per-role CPU."""
    out: dict[str, float] = {}

    def put(name: str, v: float | None) -> None:
        if v is not None:
            out[name] = v

    for label, w in _flat_workloads(run):
        if "error" in w:
            continue
        put(f"{label} placements/s", _num(w, "placements_per_s"))
        put(f"{label} steady placements/s", _num(w, "steady_placements_per_s"))
        put(f"{label} jobs/s", _num(w, "jobs_per_s"))
        lat = w.get("eval_latency_ms") or {}
        put(f"{label} eval p50 ms", _num(lat, "p50"))
        put(f"{label} eval p99 ms", _num(lat, "p99"))
        run_lat = w.get("placement_to_running_ms") or {}
        put(f"{label} placement->running p99 ms", _num(run_lat, "p99"))
        put(f"{label} CPU-ms/placement", _num(w, "cpu_ms_per_placement"))
        by_role = w.get("cpu_ms_by_role") or cpu_ms_by_role(
            w.get("processes") or {}, _num(w, "placements") or 0.0
        )
        for role, v in by_role.items():
            if role != "total":
                put(f"{label} CPU-ms {role}", float(v))
        for key in (
            "replacement_p99_s",
            "scheduler_runs",
            "evals_cancelled",
            "node_status_changes",
            "state_calls_per_s",
            "state_cpu_ms_per_call",
            "state_sql_per_call",
            "burst_s",
            "quiescence_s",
            "placed_after_resume_s",
            "canceled_after_resume_s",
        ):
            put(f"{label} {key}", _num(w, key))
        if isinstance(w.get("ledger"), Mapping):
            out.update(ledger_mod.figures(label, w["ledger"]))
    m1 = run.get("m1")
    if isinstance(m1, Mapping):
        for c in m1.get("cases") or []:
            kind = "spread" if c.get("spread") else "none"
            put(f"M1 {c.get('allocs')} {kind} s", _num(c, "eval_s"))
    return out


def compare(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[list[str]]:
    """[figure, old, new, change] for every figure either run has, in the
    new run's order; a figure only one run has shows `–` for the other."""
    a, b = figures(old), figures(new)
    rows = []
    for name in [*b, *(n for n in a if n not in b)]:
        va, vb = a.get(name), b.get(name)
        change = ""
        if va is not None and vb is not None and va != 0:
            change = f"{(vb - va) / abs(va) * 100:+.0f}%"
        rows.append([name, _fmt(va), _fmt(vb), change])
    return rows


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
        expand = {"W6": ("by_workers", "W6 x{}"), "W1L": ("by_load", "W1L {}%")}
        expand["S1"] = ("by_nodes", "S1 {} nodes")
        if wid in expand and expand[wid][0] in w:
            key, fmt = expand[wid]
            by = w[key] or {}
            for n in sorted(by, key=lambda x: float(x)):
                if isinstance(by[n], dict):
                    out.append((fmt.format(n), by[n]))
            if "error" in w:
                out.append((wid, {"error": w["error"]}))
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
            rows.append([label, "FAILED", *["–"] * 10])
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
                _role_split(w),
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
        "by role " + "/".join(ROLE_ABBREV[r] for r in ROLES),
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
            ("state_calls_per_s", "state calls/s"),
            ("state_cpu_ms_per_call", "state CPU-ms per call"),
            ("state_sql_per_call", "state SQL per call"),
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
            ("burst_s", "burst s"),
            ("quiescence_s", "quiescence s"),
            ("placed_after_resume_s", "last plan s after resume"),
            ("canceled_after_resume_s", "last cancel s after resume"),
            ("plans_submitted", "node-plans submitted"),
            ("plans_rejected", "rejected"),
        ):
            if key in w:
                bits.append(f"{name} {_fmt(w[key], 2)}")
        by_method = w.get("state_calls_by_method")
        if isinstance(by_method, Mapping) and by_method:
            bits.append("state calls " + ", ".join(f"{m} {n:,}" for m, n in by_method.items()))
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
    return lines + _section_cpu_by_role(run)


def _role_split(w: Mapping[str, Any]) -> str:
    """The workload row's CPU-ms per placement per role, `0.69/0.12/...`
    in `ROLES` order; `–` when nothing was placed."""
    by = w.get("cpu_ms_by_role") or cpu_ms_by_role(
        w.get("processes") or {}, _num(w, "placements") or 0.0
    )
    if not by:
        return "–"
    return "/".join(_fmt(by.get(r), 2) for r in ROLES)


def _section_cpu_by_role(run: Mapping[str, Any]) -> list[str]:
    """CPU-ms per placement per role for every workload that placed
    anything; the simulator apart (it stands in for the clients)."""
    rows = []
    for label, w in _flat_workloads(run):
        placements = _num(w, "placements") or 0.0
        by = w.get("cpu_ms_by_role") or cpu_ms_by_role(w.get("processes") or {}, placements)
        if not by:
            continue
        rows.append(
            [label, *[_fmt(by.get(r), 2) for r in ROLES], _fmt(by.get("total"), 2)]
            + [_fmt(by.get("sim"), 2)]
        )
    if not rows:
        return []
    headers = ["workload", *ROLES, "all (no sim)", "simulator"]
    return ["### CPU-ms per placement by role", "", *_table(headers, rows), ""]


def _pcts(d: Mapping[str, Any] | None) -> str:
    if not d or not d.get("count"):
        return "–"
    return " / ".join(_fmt(d.get(k), 0) for k in ("p50", "p95", "p99"))


def _section_w1l(run: Mapping[str, Any]) -> list[str]:
    w = (run.get("workloads") or {}).get("W1L")
    if not isinstance(w, dict):
        return []
    head = ["## W1L latency at an offered load", ""]
    if "error" in w and not w.get("by_load"):
        return [*head, f"FAILED: {w['error']}", ""]
    sat = _num(w, "saturated_jobs_per_s")
    head.append(
        f"saturated rate {_fmt(sat)} jobs/s (from {w.get('rate_source', '?')}); "
        "eval = register commit → first plan commit; running = plan commit → "
        "the client's `running` commit"
    )
    head.append("")
    rows = []
    for load, r in sorted((w.get("by_load") or {}).items(), key=lambda kv: float(kv[0])):
        if not isinstance(r, dict):
            continue
        if "error" in r:
            rows.append([f"{load}%", "FAILED", *["–"] * 7])
            continue
        drv = r.get("driver") or {}
        rows.append(
            [
                f"{load}%",
                _fmt(_num(drv, "offered_jobs_per_s")),
                _fmt(r.get("achieved_jobs_per_s")),
                f"{_fmt(drv.get('late'))} / {_fmt(drv.get('sent'))}",
                _fmt(r.get("placements_per_s")),
                _pcts(r.get("eval_latency_ms")),
                _pcts(r.get("placement_to_running_ms")),
                _fmt(r.get("never_running")),
                _fmt(r.get("cpu_ms_per_placement"), 2),
            ]
        )
    headers = [
        "load",
        "offered jobs/s",
        "achieved jobs/s",
        "late / sent",
        "placements/s",
        "eval p50/p95/p99 ms",
        "running p50/p95/p99 ms",
        "never running",
        "CPU-ms/placement",
    ]
    return [*head, *_table(headers, rows), ""]


def _section_s1(run: Mapping[str, Any]) -> list[str]:
    w = (run.get("workloads") or {}).get("S1")
    if not isinstance(w, dict):
        return []
    head = ["## S1 scaling curve (W2 shape, a fresh cluster per size)", ""]
    if "error" in w and not w.get("by_nodes"):
        return [*head, f"FAILED: {w['error']}", ""]
    rows = []
    for nodes, r in sorted((w.get("by_nodes") or {}).items(), key=lambda kv: float(kv[0])):
        if not isinstance(r, dict):
            continue
        if "error" in r:
            rows.append([nodes, "FAILED", *["–"] * 5])
            continue
        growth = r.get("replica_rss_per_1000_allocs_mb") or {}
        rows.append(
            [
                _fmt(int(nodes)),
                _fmt(r.get("placements")),
                _fmt(r.get("placements_per_s")),
                _fmt(r.get("steady_placements_per_s")),
                _fmt(r.get("cpu_ms_per_placement"), 2),
                _fmt(r.get("cluster_ready_s")),
                " / ".join(f"{k} {_fmt(v, 2)}" for k, v in growth.items()) or "–",
            ]
        )
    headers = [
        "nodes",
        "placements",
        "placements/s",
        "steady/s",
        "CPU-ms/placement",
        "cluster ready s",
        "replica RSS growth MB per 1,000 allocs",
    ]
    lines = [*head, *_table(headers, rows), ""]
    mem = w.get("replica_memory")
    if isinstance(mem, dict) and "error" not in mem:
        lines.append(
            f"replica store RSS per 1,000 allocs held (bench.replica_memory, "
            f"{_fmt(mem.get('allocs'))} allocs): "
            f"{_fmt(replica_rss_per_1000_allocs_mb(mem), 2)} MB "
            f"({_fmt(mem.get('rss_per_alloc'))} B per alloc)"
        )
        lines.append("")
    elif isinstance(mem, dict):
        lines += [f"replica memory: FAILED {mem['error']}", ""]
    return lines


def _section_compare(old: Mapping[str, Any], new: Mapping[str, Any], name: str) -> list[str]:
    rows = compare(old, new)
    if not rows:
        return []
    title = f"## Compared with {name} ({old.get('git_rev', '?')}, {old.get('profile', '?')})"
    lines = [title, "", *_table(["figure", "old", "new", "change"], rows), ""]
    method_rows = compare_methods(old, new)
    if method_rows:
        lines += ["### Ledger by method, old → new (per placement)", ""]
        lines += [*_table(["figure", "old", "new", "change"], method_rows), ""]
    return lines


def ledger_method_figures(run: Mapping[str, Any]) -> dict[str, float]:
    """`bench.ledger.method_figures` of every workload of `run`."""
    out: dict[str, float] = {}
    for label, w in _flat_workloads(run):
        if isinstance(w.get("ledger"), Mapping):
            out.update(ledger_mod.method_figures(label, w["ledger"]))
    return out


def compare_methods(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[list[str]]:
    """[figure, old, new, change] for the calls and bytes per placement of
    every method, in the workloads both runs have a ledger of; a method only
    one run called shows 0 for the other."""
    a, b = ledger_method_figures(old), ledger_method_figures(new)
    workloads = {n.split(" ", 1)[0] for n in a} & {n.split(" ", 1)[0] for n in b}
    rows = []
    for name in [*b, *(n for n in a if n not in b)]:
        if name.split(" ", 1)[0] not in workloads:
            continue
        va, vb = a.get(name, 0.0), b.get(name, 0.0)
        change = f"{(vb - va) / abs(va) * 100:+.0f}%" if va else ("new" if vb else "")
        rows.append([name, _fmt(va, 3), _fmt(vb, 3), change])
    return rows


# ---------------------------------------------------------------- the ledger


def _section_ledger(run: Mapping[str, Any]) -> list[str]:
    """Issue 30's per-placement ledger of every workload that has one."""
    items = [
        (label, w["ledger"])
        for label, w in _flat_workloads(run)
        if isinstance(w.get("ledger"), dict)
    ]
    if not items:
        return []
    lines = [
        "## Per-placement ledger",
        "",
        "Per placement: RPCs served by the roles (the bench's own stats polls left out), the "
        "protobuf bytes their servers read and wrote, protobuf encodes/decodes and SQL "
        "statements in the roles (not the simulator); plans and commits per eval.",
        "",
    ]
    rows = []
    for label, lg in items:
        pl = lg.get("plans") or {}
        pbuf = lg.get("protobuf") or {}
        share = pl.get("partial_share")
        rows.append(
            [
                label,
                _fmt((lg.get("rpcs") or {}).get("per_placement"), 2),
                _fmt(_kb((lg.get("bytes") or {}).get("per_placement")), 2),
                _fmt(pbuf.get("encodes_per_placement"), 2),
                _fmt(pbuf.get("decodes_per_placement"), 2),
                _fmt((lg.get("sql") or {}).get("per_placement"), 2),
                _fmt(pl.get("plans_per_eval"), 2),
                f"{_fmt(pl.get('plans_partial'))} / {_fmt(pl.get('plans_applied'))}"
                + (
                    f" ({share * 100:.0f}%)"
                    if isinstance(share, int | float) and pl.get("plans_applied")
                    else ""
                ),
                _fmt(pl.get("node_plans_rejected")),
                _fmt(pl.get("commits_per_eval"), 2),
                _fmt(pl.get("plan_commits_per_eval"), 2),
                _fmt(pl.get("planner_commits_per_eval"), 2),
                _fmt(pl.get("evals_failed")),
                _fmt(pl.get("nodes_per_1000_allocs")),
            ]
        )
    headers = [
        "workload",
        "RPCs",
        "KB on the wire",
        "pb encodes",
        "pb decodes",
        "SQL",
        "plans/eval",
        "partial / applied",
        "node-plans rejected",
        "commits/eval",
        "plan commits/eval",
        "planner commits/eval",
        "evals failed",
        "nodes per 1,000 allocs",
    ]
    lines += [*_table(headers, rows), ""]
    claims = [
        f"{label} {lg['claims'].get('claimed', 0):,} claimed, "
        f"{lg['claims'].get('conflict', 0):,} conflicts (selected again), "
        f"{lg['claims'].get('forced', 0):,} forced"
        for label, lg in items
        if isinstance(lg.get("claims"), dict)
    ]
    if claims:
        lines += ["Worker loops' placement claims: " + "; ".join(claims) + ".", ""]
    lines += _ledger_kinds(run)
    for label, lg in items:
        methods = _top_methods(lg.get("by_method") or {})
        if not methods:
            continue
        mrows = [
            [
                m.removeprefix("/corral.v1."),
                str(f.get("server", "")),
                _fmt(f.get("calls")),
                _fmt(f.get("per_placement"), 3),
                _fmt(f.get("messages")) if lg.get("probe") else "–",
                _fmt(f.get("bytes_per_placement")) if lg.get("probe") else "–",
                ", ".join(f"{k} {_fmt(v)}" for k, v in (f.get("callers") or {}).items()),
            ]
            for m, f in methods
        ]
        lines += [f"### {label}: RPCs by method", ""]
        headers = ["method", "served by", "calls", "per placement", "messages", "bytes/placement"]
        lines += _table([*headers, "callers"], mrows)
        lines.append("")
    lines += _ledger_by_role(items)
    return lines


def _top_methods(by_method: Mapping[str, Any]) -> list[tuple[str, Any]]:
    """The most called methods, and the ones that move the most bytes
    (a long-lived stream has messages but no call in the window)."""
    calls = list(by_method.items())[: ledger_mod.TOP_METHODS]
    heavy = sorted(
        by_method.items(),
        key=lambda kv: -(kv[1].get("request_bytes", 0) + kv[1].get("response_bytes", 0)),
    )[:3]
    return calls + [kv for kv in heavy if kv not in calls]


def _kb(v: Any) -> float | None:
    return float(v) / 1024 if isinstance(v, int | float) else None


def _ledger_kinds(run: Mapping[str, Any]) -> list[str]:
    kinds = ("plan", "job", "eval", "client update", "node", "other", "shared")
    rows = []
    for label, w in _flat_workloads(run):
        k = w.get("commit_kinds")
        if isinstance(k, dict) and k:
            rows.append([label, _fmt(w.get("indexes")), *[_fmt(k.get(x, 0)) for x in kinds]])
    if not rows:
        return []
    return [
        "### Commits by kind (indexes written; `shared`: a batch holding several kinds, "
        "counted under the first)",
        "",
        *_table(["workload", "indexes", *kinds], rows),
        "",
    ]


def _ledger_by_role(items: list[tuple[str, dict[str, Any]]]) -> list[str]:
    rows = []
    top = []
    for label, lg in items:
        pbuf = (lg.get("protobuf") or {}).get("by_role") or {}
        sql = lg.get("sql") or {}
        placed = float(lg.get("placements") or 0)
        for role in sorted(set(pbuf) | set(sql.get("by_role") or {})):
            n_sql = (sql.get("by_role") or {}).get(role, 0)
            rows.append(
                [
                    label,
                    role,
                    _fmt((pbuf.get(role) or {}).get("per_placement"), 3),
                    _fmt(n_sql / placed if placed else 0.0, 3),
                ]
            )
        for s in (sql.get("top") or [])[: ledger_mod.TOP_STATEMENTS]:
            top.append(
                [label, str(s["role"]), _fmt(s.get("per_placement"), 3), str(s["statement"])[:100]]
            )
    lines: list[str] = []
    if rows:
        lines += ["### Protobuf encodes + decodes and SQL statements per placement, by role", ""]
        lines += [*_table(["workload", "role", "pb", "SQL"], rows), ""]
    if top:
        lines += ["### Top SQL statements", ""]
        lines += [*_table(["workload", "role", "per placement", "statement"], top), ""]
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


def markdown(
    run: Mapping[str, Any], previous: Mapping[str, Any] | None = None, previous_name: str = ""
) -> str:
    """The run summary: machine, baselines, workloads (with CPU per role),
    W1L, S1, M1, ratios, targets, invariants, top profile frames, errors,
    and old → new per figure when a `previous` run is given."""
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
    lines += _section_ledger(run)
    lines += _section_w1l(run)
    lines += _section_s1(run)
    lines += _section_m1(run)
    lines += _section_ratios(run)
    lines += _section_targets(run)
    lines += _section_invariants(run)
    lines += _section_profiles(run)
    lines += _section_errors(run)
    if previous is not None:
        lines += _section_compare(previous, run, previous_name or "the previous run")
    return "\n".join(lines).rstrip() + "\n"


# ---------------------------------------------------------------- files


def _timelines(run: Mapping[str, Any]) -> list[tuple[str, list[tuple[str, list[list[float]]]]]]:
    """Panels to plot: (workload, [(series label, timeline)]); W6 puts its
    worker counts on one panel."""
    panels = []
    for wid, w in (run.get("workloads") or {}).items():
        if not isinstance(w, dict):
            continue
        sub = {"W6": ("by_workers", "{} workers"), "W1L": ("by_load", "{}% load")}
        sub["S1"] = ("by_nodes", "{} nodes")
        if wid in sub and sub[wid][0] in w:
            key, fmt = sub[wid]
            series = [
                (fmt.format(n), by["timeline"])
                for n, by in sorted((w[key] or {}).items(), key=lambda kv: float(kv[0]))
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
        if len(series) > 1 or wid in ("W6", "W1L", "S1"):
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
