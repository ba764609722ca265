"""The soak: an hour of job churn on `corral dev` with Nomad's default GC
settings. Does any role's memory grow once garbage collection runs?

    make soak                                        # 60 minutes (SOAK_ARGS=...)
    .venv/bin/python -m bench.soak --minutes 10      # a short run
    .venv/bin/python -m bench.soak --minutes 60 --rate 2 --out bench/results

`corral dev` runs as a user runs it (embedded PostgreSQL, state, broker,
planner, worker, one real agent, the gateway) in a data directory of its
own, with no GC setting changed: evals collected an hour after they end,
jobs four hours after they stop, a GC pass every 5 minutes (Nomad's
`eval_gc_threshold`, `job_gc_threshold`, `job_gc_interval`). The churn is
`bench/churn.py`'s: service jobs of `--count` mock allocs registered at
`--rate` per second, each stopped `--lifetime` seconds later, every other
one purged.

Every `--sample` seconds (a minute) each role's RSS and the rows the state
holds are recorded. The verdict compares each role's last sample with its
first one after the first GC cycle (the broker's first pass, 5 minutes in,
plus one sample): a role that grew more than `--max-growth` (10%) fails.
With Nomad's thresholds nothing churned is old enough to collect within
the first hour, so the rows held grow all along; they are reported next to
the memory, so a growth can be told from data the cluster must keep.

Writes `soak-<UTC time>.json` and `soak-<UTC time>.png` (RSS per role and
rows held over time) to `--out`, prints a table and the verdict; exits 1 on
a role over the bound, 2 if the cluster failed, 3 if the run was too short
to judge (no two samples after the first GC cycle: at least 7 minutes). To look inside the state
while it runs, set bench/memprobe.py's variables (they are passed on):
`PYTHONPATH=$PWD/bench/memprobe_site CORRAL_MEMPROBE_OUT=/tmp/probe.jsonl
CORRAL_MEMPROBE_TRACE=1 make soak`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bench.churn import Churn, drive, held_objects, rss_of
from bench.churn import Options as ChurnOptions
from corral.security import transport
from corral.v1 import node_pb2, node_pb2_grpc

ROOT = Path(__file__).resolve().parents[1]
#: Nomad's `job_gc_interval` (and our broker's `--core-gc-interval` default)
GC_INTERVAL_S = 300.0
START_TIMEOUT_S = 180.0


@dataclass
class Options:
    minutes: float = 60.0
    rate: float = 1.0
    count: int = 2
    lifetime: float = 20.0
    sample: float = 60.0
    max_growth: float = 0.10
    out: str = "bench/results"

    def churn(self) -> ChurnOptions:
        return ChurnOptions(
            minutes=self.minutes,
            rate=self.rate,
            count=self.count,
            lifetime=self.lifetime,
            cpu=10,
            memory=16,
        )


@dataclass
class Samples:
    """Per sample: seconds since the churn started, RSS by role, rows held."""

    t: list[float] = field(default_factory=list)
    rss_mb: list[dict[str, float]] = field(default_factory=list)
    rows: list[dict[str, int]] = field(default_factory=list)


class Dev:
    """`corral dev` in a data directory of its own, as a user runs it."""

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="corral-soak-"))
        env = {k: v for k, v in os.environ.items() if not k.startswith("CORRAL_")}
        for key, value in os.environ.items():
            if key.startswith("CORRAL_MEMPROBE_"):  # bench/memprobe.py, when asked for
                env[key] = value
        self.log = (self.dir.parent / f"{self.dir.name}.log").open("w")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "cli", "dev", "-data-dir", str(self.dir / "data"), "-port", "0"],
            cwd=ROOT,
            env=env,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        summary = self.dir / "data" / "dev.json"
        deadline = time.monotonic() + START_TIMEOUT_S
        while not summary.exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"corral dev did not start; see {self.log.name}")
            time.sleep(0.5)
        self.info: dict[str, Any] = json.loads(summary.read_text())

    @property
    def pids(self) -> dict[str, int]:
        return {role: int(r["pid"]) for role, r in self.info["roles"].items()}

    def check_alive(self) -> None:
        if self.proc.poll() is not None:
            raise RuntimeError(f"corral dev exited with {self.proc.returncode}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGINT)
            try:
                self.proc.wait(120)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)


async def node_ready(address: str, timeout: float = START_TIMEOUT_S) -> None:
    """Wait for the dev agent's node: jobs placed before it would block."""
    deadline = time.monotonic() + timeout
    async with transport.dial(address) as ch:
        nodes = node_pb2_grpc.NodeStub(ch)
        while time.monotonic() < deadline:
            listed = await nodes.List(node_pb2.NodeListRequest(), timeout=10)
            if any(n.status == "ready" for n in listed.nodes):
                return
            await asyncio.sleep(0.5)
    raise RuntimeError("the dev agent's node did not become ready")


def verdict(opts: Options, samples: Samples) -> dict[str, Any]:
    """Growth of each role from its first sample after the first GC cycle
    to its last one."""
    first_gc = GC_INTERVAL_S + opts.sample
    base = next((i for i, t in enumerate(samples.t) if t >= first_gc), None)
    if base is None or base == len(samples.t) - 1:
        return {"judged": False, "why": f"no two samples after the first GC cycle ({first_gc} s)"}
    start, end = samples.rss_mb[base], samples.rss_mb[-1]
    roles: list[dict[str, Any]] = []
    worst = 0.0
    # what the GC thresholds make the cluster keep: a role holding these
    # rows grows with them (bench/replica_memory.py: a few KB a row)
    rows_added = sum(samples.rows[-1].values()) - sum(samples.rows[base].values())
    for role in end:
        a, b = start.get(role, 0.0), end[role]
        growth = round(((b - a) / a if a else 0.0) * 100, 1)
        worst = max(worst, growth)
        per_row = round((b - a) * 2**20 / rows_added / 1024, 1) if rows_added > 0 else None
        roles.append(
            {
                "role": role,
                "start_mb": a,
                "end_mb": b,
                "growth_pct": growth,
                "kb_per_row_added": per_row,
            }
        )
    return {
        "judged": True,
        "from_s": samples.t[base],
        "to_s": samples.t[-1],
        "roles": roles,
        "rows_from": samples.rows[base],
        "rows_to": samples.rows[-1],
        "max_growth_pct": worst,
        "ok": worst <= opts.max_growth * 100,
    }


def run(opts: Options) -> dict[str, Any]:
    churn = Churn()
    samples = Samples()
    dev = Dev()
    try:
        asyncio.run(node_ready(dev.info["address"]))
        dsn = dev.info["dsn"]
        pids = dev.pids
        next_sample = [0.0]

        def tick(elapsed: float) -> None:
            dev.check_alive()
            if elapsed >= next_sample[0]:
                samples.t.append(round(elapsed, 1))
                samples.rss_mb.append(rss_of(pids))
                samples.rows.append(held_objects(dsn))
                next_sample[0] += opts.sample

        until = time.monotonic() + opts.minutes * 60
        asyncio.run(drive(dev.info["address"], opts.churn(), churn, until, tick))
        tick(opts.minutes * 60 + opts.sample)  # the last sample, at the end
    finally:
        dev.stop()
    return {
        "options": asdict(opts),
        "gc": "Nomad's defaults: evals 1 h, batch evals 24 h, jobs 4 h, GC pass every 5 min",
        "registered": churn.registered,
        "stopped": churn.stopped,
        "purged": churn.purged,
        "errors": dict(churn.errors),
        "samples": asdict(samples),
        "verdict": verdict(opts, samples),
    }


def plot(result: dict[str, Any], path: Path) -> Path:
    """RSS per role, and the rows held, over the run."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    s = result["samples"]
    minutes = [t / 60 for t in s["t"]]
    fig, (mem, rows) = plt.subplots(2, 1, figsize=(9, 7), sharex=True)
    for role in s["rss_mb"][0] if s["rss_mb"] else ():
        mem.plot(minutes, [r.get(role, 0.0) for r in s["rss_mb"]], label=role, linewidth=1.4)
    for table in s["rows"][0] if s["rows"] else ():
        rows.plot(minutes, [r.get(table, 0) for r in s["rows"]], label=table, linewidth=1.4)
    first_gc = (GC_INTERVAL_S + result["options"]["sample"]) / 60
    for ax in (mem, rows):
        ax.axvline(first_gc, color="grey", linestyle="--", linewidth=1)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize="small", ncol=3)
    mem.set_ylabel("RSS (MB)")
    rows.set_ylabel("rows held by the state")
    rows.set_xlabel("minutes of churn (dashed: judged from here, after the first GC pass)")
    v = result["verdict"]
    verdict_text = f"max growth {v['max_growth_pct']:+.1f}%" if v.get("judged") else "not judged"
    fig.suptitle(f"corral dev soak: {result['registered']} jobs, {verdict_text}")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def table(result: dict[str, Any]) -> str:
    v = result["verdict"]
    lines = [
        f"soak: {result['registered']} jobs registered, {result['stopped']} stopped "
        f"({result['purged']} purged); GC: {result['gc']}",
    ]
    if result["errors"]:
        lines.append(f"errors: {result['errors']}")
    if not v.get("judged"):
        return "\n".join([*lines, f"NOT JUDGED: {v['why']}"])
    lines += [
        "",
        f"| role | MB at {v['from_s']:.0f} s | MB at {v['to_s']:.0f} s | growth "
        "| KB per row the state added |",
        "|---|---|---|---|---|",
    ]
    lines += [
        f"| {r['role']} | {r['start_mb']} | {r['end_mb']} | {r['growth_pct']:+.1f}% "
        f"| {r['kb_per_row_added'] if r['kb_per_row_added'] is not None else '-'} |"
        for r in v["roles"]
    ]
    lines += ["", "| rows held | from | to |", "|---|---|---|"]
    lines += [f"| {t} | {n} | {v['rows_to'].get(t, 0)} |" for t, n in v["rows_from"].items()]
    limit = result["options"]["max_growth"] * 100
    word = "OK" if v["ok"] else "FAIL"
    return "\n".join(
        [*lines, "", f"{word}: largest growth {v['max_growth_pct']:+.1f}% (limit {limit:g}%)"]
    )


def parse(argv: list[str] | None) -> Options:
    d = Options()
    p = argparse.ArgumentParser(prog="bench.soak", description=__doc__.split("\n\n")[0])
    p.add_argument("--minutes", type=float, default=d.minutes, help="length of the churn")
    p.add_argument("--rate", type=float, default=d.rate, help="job registrations per second")
    p.add_argument("--count", type=int, default=d.count, help="allocs per job")
    p.add_argument("--lifetime", type=float, default=d.lifetime, help="seconds before a stop")
    p.add_argument("--sample", type=float, default=d.sample, help="seconds between samples")
    p.add_argument("--max-growth", type=float, default=d.max_growth, help="0.10 = 10%%")
    p.add_argument("--out", default=d.out, help="directory for the JSON and the plot")
    a = p.parse_args(argv)
    return Options(a.minutes, a.rate, a.count, a.lifetime, a.sample, a.max_growth, a.out)


def main(argv: list[str] | None = None) -> int:
    opts = parse(argv)
    try:
        result = run(opts)
    except Exception as exc:  # the cluster failed: say so, exit 2
        print(f"soak failed: {exc}", file=sys.stderr)
        return 2
    stem = f"soak-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}"
    out = Path(opts.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{stem}.json").write_text(json.dumps(result, indent=2))
    png = plot(result, out / f"{stem}.png")
    print(table(result))
    print(f"wrote {out / (stem + '.json')} and {png}")
    v = result["verdict"]
    if not v.get("judged"):
        return 3
    return 0 if v["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
