"""`python -m bench [--quick] [--only W1,W4,...]` — the benchmark suite of
perf-anchors §6 (`make bench` runs `--quick`, `make bench-full` the rest).

One embedded PostgreSQL serves the whole run; the baselines and every
cluster get a database of their own, so each cluster starts empty:

* baselines B1–B5 (before the workloads, and again after, to flag drift);
* cluster A (5,000 simulated nodes; 500 in --quick): N1 (idle heartbeats),
  W1, W2, W3, W4, W5 in that order — W4's node failures hit the allocs the
  earlier ones placed;
* cluster L (same size as A): W1L, W1's jobs registered open-loop at 50%
  and 80% of the jobs/s W1 just measured (`--w1l-rate` without W1);
* cluster B: W5b (every node goes down and comes back with workers paused);
* one cluster per worker-process count for W6 (W1's shape with 4 loops per
  process; W1 itself runs one process with the worker's default loops);
* S1, the scaling curve: one cluster per size (`scaling_nodes`, or
  `--scaling-nodes`) running W2's shape, then `bench.replica_memory`;
* M1, the in-process scheduler grid.

Writes `bench/results/<time>-<rev>.json` and `.png`, prints the Markdown
summary (with old → new per figure under `--compare OLD.json`). A
workload that fails is recorded with its error and the run goes on to the
next.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import datetime as dt
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
import warnings
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import psutil
import psycopg

from bench import baselines, report
from bench.cluster import BenchCluster, ClusterSpec, postmaster_pid
from bench.workloads import (
    FULL,
    QUICK,
    Context,
    Profile,
    n1_heartbeats,
    s1_scaling_point,
    w1_throughput,
    w1l_offered_load,
    w2_c1m,
    w3_big_job,
    w4_node_failure,
    w5_eval_storm,
    w5b_reregister_storm,
)

ROOT = Path(__file__).resolve().parent.parent
W6_LOOPS = 4  # perf-anchors §6.2: 1, 2, 4 worker processes x 4 loops
ALL = ("B", "N1", "W1", "W1L", "W2", "W3", "W4", "W5", "W5b", "W6", "S1", "M1")
Workload = Callable[[Context], Awaitable[dict[str, Any]]]


def say(text: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {text}", flush=True)


def git_rev(tree: Path = ROOT) -> str:
    """The short commit of `tree`, `+` when it has uncommitted changes."""
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=tree,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=tree,
            capture_output=True,
            text=True,
            check=False,
        ).stdout.strip()
        return out + ("+" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def machine() -> dict[str, Any]:
    freq = psutil.cpu_freq()
    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpus": os.cpu_count(),
        "cpu_mhz": round(freq.current) if freq else None,
        "memory_gb": round(psutil.virtual_memory().total / 2**30, 1),
        "load_avg": [round(x, 2) for x in os.getloadavg()],
    }


class Suite:
    def __init__(
        self,
        profile: Profile,
        only: set[str],
        out_dir: Path,
        *,
        w1l_rate: float = 0.0,
        compare: Path | None = None,
        ledger: bool = True,
        roles_from: Path | None = None,
        roles_python: str = "",
    ) -> None:
        self.profile = profile
        self.ledger = ledger  # count the ledger in the roles (bench/ledger.py)
        self.roles_from = roles_from  # the roles' source tree (bench.ab); None: this one
        self.roles_python = roles_python  # and interpreter; "": this one
        self.only = only
        self.out_dir = out_dir
        self.w1l_rate = w1l_rate  # jobs/s; used when W1 does not run first
        self.compare = compare
        self.tmp = Path(tempfile.mkdtemp(prefix="corral-bench-"))
        self._pg: Any = None
        self.admin_dsn = ""
        self._databases = 0
        self.run: dict[str, Any] = {
            "profile": profile.name,
            "started": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            "git_rev": git_rev(roles_from or ROOT),
            "machine": machine(),
            "sizes": {k: v for k, v in vars(profile).items() if not k.startswith("_")},
            "baselines_before": None,
            "baselines_after": None,
            "workloads": {},
        }

    def wants(self, name: str) -> bool:
        return not self.only or name in self.only

    # ------------------------------------------------------------ database

    def start_pg(self) -> None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from corral.devtools.pgserver import EmbeddedPostgres

            self._pg = EmbeddedPostgres(self.tmp / "pg", delete_on_stop=True)
            self.admin_dsn = self._pg.start()

    def new_database(self, label: str, migrate: bool = True) -> str:
        """A fresh database; `migrate` applies this tree's migrations (a
        cluster's own `services.state migrate` applies its tree's)."""
        from corral.devtools.pgserver import with_database
        from services.state.db.migrate import upgrade

        self._databases += 1
        name = f"bench_{self._databases}_{label}"
        with psycopg.connect(self.admin_dsn, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        dsn = with_database(self.admin_dsn, name)
        if migrate:
            upgrade(dsn)
        return dsn

    # ------------------------------------------------------------ phases

    def baselines(self, key: str) -> None:
        say(f"baselines B1-B5 ({key.split('_')[-1]} the workloads)")
        dsn = self.new_database("baselines")
        b = asyncio.run(
            baselines.measure(
                dsn, seconds=self.profile.baseline_seconds, repeats=self.profile.baseline_repeats
            )
        )
        self.run[key] = b.as_dict()

    def cluster(self, label: str, workers: int = 1, loops: int = 0, nodes: int = 0) -> BenchCluster:
        p = self.profile
        nodes = nodes or p.nodes
        spec = ClusterSpec(
            nodes=nodes,
            workers=workers,
            loops=loops,
            state_args=p.heartbeat_args,
            ledger=self.ledger,
            code_root=self.roles_from,
            python=self.roles_python,
        )
        say(
            f"starting cluster {label}: {nodes} nodes, {workers} worker process(es)"
            + (f" x {loops} loops" if loops else "")
        )
        t0 = time.monotonic()
        cl = BenchCluster(
            spec,
            data_dir=self.tmp / label,
            dsn=self.new_database(label, migrate=False),
            postgres_pid=postmaster_pid(self.tmp / "pg"),
        )
        cl.start()
        ready_s = round(time.monotonic() - t0, 1)
        self.run.setdefault("clusters", {})[label] = {
            "nodes": nodes,
            "workers": workers,
            "ready_s": ready_s,  # start, register every node, every node ready
        }
        say(f"cluster {label} ready in {ready_s}s")
        return cl

    def workloads(
        self, cluster_label: str, steps: list[tuple[str, Workload]], nodes: int = 0
    ) -> None:
        steps = [(n, w) for n, w in steps if self.wants(n)]
        if not steps:
            return
        try:
            cl = self.cluster(cluster_label, workers=1, nodes=nodes)
        except Exception as exc:
            for name, _ in steps:
                self.run["workloads"][name] = {"name": name, "error": f"cluster: {exc}"}
            return
        try:
            asyncio.run(self._steps(cl, steps))
        finally:
            cl.stop()

    async def _steps(self, cl: BenchCluster, steps: list[tuple[str, Workload]]) -> None:
        ctx = Context(cl, self.profile, self.tmp, say)
        try:
            for name, fn in steps:
                say(f"{name} ...")
                t0 = time.monotonic()
                try:
                    result = await fn(ctx)
                except Exception as exc:
                    traceback.print_exc()
                    result = {"name": name, "error": f"{type(exc).__name__}: {exc}"}
                self.run["workloads"][name] = result
                say(f"{name} done in {time.monotonic() - t0:.1f}s: {headline(result)}")
        finally:
            await ctx.close()

    def w6(self) -> None:
        if not self.wants("W6"):
            return
        by: dict[str, Any] = {}
        for n in self.profile.w6_workers:
            try:
                cl = self.cluster(f"w6x{n}", workers=n, loops=W6_LOOPS)
            except Exception as exc:
                by[str(n)] = {"name": f"W6 x{n}", "error": f"cluster: {exc}"}
                continue
            try:
                result: dict[str, Any] = {}

                async def one(ctx: Context, n: int = n) -> dict[str, Any]:
                    return await w1_throughput(ctx, prefix=f"w6x{n}")

                asyncio.run(self._steps(cl, [(f"W6 x{n}", one)]))
                result = self.run["workloads"].pop(f"W6 x{n}")
                by[str(n)] = result
            finally:
                cl.stop()
        self.run["workloads"]["W6"] = {"name": "worker scaling", "by_workers": by}

    def w1l(self) -> None:
        """W1L on a fresh cluster of the profile's size, at 50% and 80% of
        the W1 rate this run measured (or `--w1l-rate`)."""
        if not self.wants("W1L"):
            return
        w1 = self.run["workloads"].get("W1") or {}
        rate, source = float(w1.get("jobs_per_s") or 0.0), "W1 in this run"
        if rate <= 0 or "error" in w1:
            rate, source = self.w1l_rate, "--w1l-rate"
        if rate <= 0:
            self.run["workloads"]["W1L"] = {
                "name": "W1L",
                "error": "no saturated W1 rate: run W1 first (--only W1,W1L) or pass --w1l-rate",
            }
            return

        async def w1l(ctx: Context) -> dict[str, Any]:
            return await w1l_offered_load(ctx, rate, source)

        self.workloads("l", [("W1L", w1l)])

    def s1(self) -> None:
        """S1: W2's shape on a fresh cluster of every scaling size, then the
        replica store's bytes per alloc (`bench.replica_memory`)."""
        if not self.wants("S1"):
            return
        by: dict[str, Any] = {}
        for n in self.profile.scaling_nodes:
            self.workloads(f"s1n{n}", [("S1", s1_scaling_point)], nodes=n)
            point = self.run["workloads"].pop("S1", None) or {"error": "did not run"}
            point["cluster_ready_s"] = (
                self.run.get("clusters", {}).get(f"s1n{n}", {}).get("ready_s")
            )
            by[str(n)] = point
        out: dict[str, Any] = {"name": "scaling: W2 by cluster size", "by_nodes": by}
        say(f"S1 replica memory ({self.profile.replica_memory_jobs} jobs x 5 allocs) ...")
        try:
            proc = subprocess.run(
                [sys.executable, "-m", "bench.replica_memory", "--store", "lean"]
                + ["--jobs", str(self.profile.replica_memory_jobs)],
                cwd=ROOT,
                capture_output=True,
                text=True,
                check=True,
                timeout=600,
            )
            out["replica_memory"] = json.loads(proc.stdout.splitlines()[-1])
        except (OSError, subprocess.SubprocessError, ValueError, IndexError) as exc:
            out["replica_memory"] = {"error": f"{type(exc).__name__}: {exc}"}
        self.run["workloads"]["S1"] = out

    def m1(self) -> None:
        if not self.wants("M1"):
            return
        say("M1 in-process scheduler grid ...")
        from bench import m1

        try:
            self.run["m1"] = m1.measure(quick=self.profile.name == "quick")
        except Exception as exc:
            traceback.print_exc()
            self.run["m1"] = {"error": f"{type(exc).__name__}: {exc}"}

    def execute(self) -> int:
        t0 = time.monotonic()
        self.start_pg()
        try:
            if self.wants("B"):
                self.baselines("baselines_before")
            self.workloads(
                "a",
                [
                    ("N1", n1_heartbeats),
                    ("W1", w1_throughput),
                    ("W2", w2_c1m),
                    ("W3", w3_big_job),
                    ("W4", w4_node_failure),
                    ("W5", w5_eval_storm),
                ],
            )
            self.w1l()
            self.workloads("b", [("W5b", w5b_reregister_storm)])
            self.w6()
            self.s1()
            self.m1()
            if self.wants("B"):
                self.baselines("baselines_after")
        finally:
            with contextlib.suppress(Exception):
                self._pg.stop()
            if not os.environ.get("CORRAL_BENCH_KEEP"):
                shutil.rmtree(self.tmp, ignore_errors=True)
        self.run["wall_s"] = round(time.monotonic() - t0, 1)
        path = report.write_json(self.run, self.out_dir)
        png = report.plot(self.run, path.with_suffix(".png"))
        previous: dict[str, Any] | None = None
        if self.compare is not None:
            previous = json.loads(self.compare.read_text())
        print()
        print(report.markdown(self.run, previous, self.compare.name if self.compare else ""))
        say(f"results: {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}")
        say(f"plot: {png.relative_to(ROOT) if png.is_relative_to(ROOT) else png}")
        failed = [n for n, w in self.run["workloads"].items() if "error" in w]
        return 1 if failed else 0


def headline(result: dict[str, Any]) -> str:
    if "error" in result:
        return f"FAILED {result['error']}"
    for key in ("by_load", "by_nodes"):
        if isinstance(result.get(key), dict):
            return "; ".join(f"{k}: {headline(v)}" for k, v in result[key].items())
    parts = [f"{result.get('placements', 0)} placements"]
    if result.get("placements_per_s"):
        parts.append(f"{result['placements_per_s']}/s")
    lat = result.get("eval_latency_ms") or {}
    if lat.get("count"):
        parts.append(f"eval p99 {lat['p99']:.0f} ms")
    if "replacement_p99_s" in result:
        parts.append(f"replacement p99 {result['replacement_p99_s']}s")
    if "scheduler_runs" in result:
        parts.append(f"{result['scheduler_runs']} scheduler runs")
    inv = result.get("invariants") or {}
    if inv and not inv.get("ok"):
        parts.append(f"{inv.get('count')} INVARIANT VIOLATIONS")
    return ", ".join(parts)


def _terminate(signum: int, _frame: object) -> None:
    """SIGTERM (bench.ab stopping a run) unwinds like an error, so the
    clusters and the embedded PostgreSQL are stopped on the way out."""
    raise SystemExit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    # started in the background of a non-interactive shell, SIGINT comes
    # ignored: take Python's handler back so Ctrl-C stops a run cleanly
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, _terminate)
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    p.add_argument("--quick", action="store_true", help="1/10 scale, under 5 minutes")
    p.add_argument(
        "--only",
        default="",
        help=f"comma-separated subset of {','.join(ALL)} (B = the baselines)",
    )
    p.add_argument("--out", default=str(ROOT / "bench" / "results"), help="results directory")
    p.add_argument(
        "--nodes", type=int, default=0, help="simulated nodes (default: the profile's own)"
    )
    p.add_argument(
        "--w1l-rate",
        type=float,
        default=0.0,
        help="W1's saturated jobs/s for W1L when W1 does not run in this invocation",
    )
    p.add_argument("--scaling", action="store_true", help="run S1, the scaling curve (adds S1)")
    p.add_argument(
        "--scaling-nodes",
        default="",
        help="S1's cluster sizes, comma-separated (default: the profile's own)",
    )
    p.add_argument(
        "--compare", default="", help="a previous results JSON: the summary shows old -> new"
    )
    p.add_argument(
        "--no-ledger",
        action="store_true",
        help="do not load the ledger's counters into the roles (RPC counts and plans remain)",
    )
    p.add_argument(
        "--roles-from",
        default="",
        help="run the roles from this source tree (bench.ab: an older revision's worktree)",
    )
    p.add_argument(
        "--roles-python",
        default="",
        help="the interpreter of the roles, for a tree whose dependencies differ (default: this)",
    )
    args = p.parse_args(sys.argv[1:] if argv is None else argv)
    only = {x.strip() for x in args.only.split(",") if x.strip()}
    if args.scaling:
        only.add("S1")
    if args.w1l_rate < 0:
        p.error("--w1l-rate must not be negative")
    compare = Path(args.compare) if args.compare else None
    if compare is not None and not compare.is_file():
        p.error(f"--compare: no such file {compare}")
    unknown = only - set(ALL)
    if unknown:
        p.error(f"--only: unknown {', '.join(sorted(unknown))}; choose from {', '.join(ALL)}")
    profile = QUICK if args.quick else FULL
    if args.nodes < 0:
        p.error("--nodes must not be negative")
    if args.nodes:
        profile = dataclasses.replace(profile, nodes=args.nodes)
    if args.scaling_nodes:
        try:
            sizes = tuple(int(x) for x in args.scaling_nodes.split(",") if x.strip())
        except ValueError:
            p.error(
                f"--scaling-nodes: expected comma-separated integers, got {args.scaling_nodes!r}"
            )
        if not sizes or min(sizes) <= 0:
            p.error("--scaling-nodes: every size must be a positive number of nodes")
        profile = dataclasses.replace(profile, scaling_nodes=sizes)
    roles_from = Path(args.roles_from).resolve() if args.roles_from else None
    if roles_from is not None and not (roles_from / "services" / "state").is_dir():
        p.error(f"--roles-from: {roles_from} holds no Corral source tree")
    suite = Suite(
        profile,
        only,
        Path(args.out),
        w1l_rate=args.w1l_rate,
        compare=compare,
        ledger=not args.no_ledger,
        roles_from=roles_from,
        roles_python=args.roles_python,
    )
    return suite.execute()


if __name__ == "__main__":
    sys.exit(main())
