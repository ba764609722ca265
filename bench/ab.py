"""`python -m bench.ab --old REV` (`make bench-ab OLD=REV`): the old and the
new code measured in one invocation on the same machine, interleaved.

The shared development machine moves absolute figures by ±15% from one
hour to the next; only runs taken side by side decide whether a change
paid. This checks `REV` out into a temporary git worktree and runs the
benchmark (`python -m bench --quick --only W1,W2` by default) `--rounds`
times for each side, alternating which goes first (old, new; new, old;
...), each run a fresh process with fresh clusters. Both sides are started
the same way: the driver is this tree's `bench` (so both get the same
workloads, figures and ledger), the roles come from the side's tree
(`--roles-from`: that tree first on PYTHONPATH, PYTHONSAFEPATH set, its
own migrations), with this checkout's virtualenv. "New" is this working
tree as it is, uncommitted changes included.

It prints, per figure, the median of each side with its spread (lowest –
highest over the rounds) and the change of the medians, and writes every
run and the summary to `<out>/ab-<time>-<old>-<new>.json`. A figure whose
two spreads overlap did not move beyond the noise (marked `~`).

The old revision must accept the flags `bench/cluster.py` gives the
roles (`--metrics-listen`, `--log-retention`, ...): revisions from issue
17's reference run (f62d02d) on do. Its roles run with this checkout's
packages unless `--old-python` names another virtualenv's interpreter
(needed when the old revision depends on a package this one lacks).
"""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from bench import report

ROOT = Path(__file__).resolve().parent.parent
SIDES = ("old", "new")
#: one benchmark run longer than this is stopped
RUN_TIMEOUT_S = 7200


def say(text: str) -> None:
    print(f"[bench-ab {time.strftime('%H:%M:%S')}] {text}", flush=True)


def resolve(rev: str, repo: Path = ROOT) -> str:
    """The full commit `rev` names in `repo` (ValueError when none)."""
    proc = subprocess.run(
        ["git", "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}"],
        cwd=repo,
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0 or not proc.stdout.strip():
        raise ValueError(f"no commit named {rev!r} in {repo}")
    return proc.stdout.strip()


def add_worktree(commit: str, path: Path, repo: Path = ROOT) -> None:
    """Check `commit` out at `path` (a detached worktree of `repo`)."""
    subprocess.run(
        ["git", "worktree", "add", "--detach", "--quiet", str(path), commit],
        cwd=repo,
        check=True,
        capture_output=True,
        text=True,
    )


def remove_worktree(path: Path, repo: Path = ROOT) -> None:
    subprocess.run(
        ["git", "worktree", "remove", "--force", str(path)],
        cwd=repo,
        check=False,
        capture_output=True,
    )
    shutil.rmtree(path, ignore_errors=True)
    subprocess.run(["git", "worktree", "prune"], cwd=repo, check=False, capture_output=True)


def order(round_no: int) -> tuple[str, str]:
    """Which side runs first in a round: old first in even rounds, new
    first in odd ones, so a machine drifting through the invocation
    favours neither side."""
    return SIDES if round_no % 2 == 0 else (SIDES[1], SIDES[0])


# ------------------------------------------------------------------ figures


def run_figures(run: Mapping[str, Any]) -> dict[str, float]:
    """The figures of one run `bench.report` compares (rates, latencies,
    CPU per role, the ledger's headline figures)."""
    return report.figures(run)


def method_figures(run: Mapping[str, Any]) -> dict[str, float]:
    """The ledger's calls and bytes per placement of every method."""
    return report.ledger_method_figures(run)


def spread(values: Sequence[float]) -> dict[str, float]:
    return {
        "median": statistics.median(values),
        "min": min(values),
        "max": max(values),
        "rounds": len(values),
    }


def summarize(runs: Mapping[str, Sequence[Mapping[str, Any]]]) -> list[dict[str, Any]]:
    """Per figure: each side's median, lowest and highest over its rounds,
    the change of the medians, and whether the two ranges overlap (then the
    change is within the noise); `by_method` marks the ledger's per-method
    rows. Figures in the new side's order; a figure only one side has keeps
    the other empty."""
    rows = []
    for by_method, extract in ((False, run_figures), (True, method_figures)):
        values: dict[str, dict[str, list[float]]] = {}
        for side in (SIDES[1], SIDES[0]):
            for run in runs.get(side, ()):
                for name, v in extract(run).items():
                    values.setdefault(name, {s: [] for s in SIDES})[side].append(v)
        for name, by_side in values.items():
            row: dict[str, Any] = {"figure": name, "by_method": by_method}
            for side in SIDES:
                if by_side[side]:
                    row[side] = spread(by_side[side])
            old, new = row.get("old"), row.get("new")
            if old and new:
                if old["median"]:
                    row["change"] = (new["median"] - old["median"]) / abs(old["median"])
                row["overlap"] = not (new["max"] < old["min"] or new["min"] > old["max"])
            rows.append(row)
    return rows


def _cell(s: Mapping[str, float] | None) -> str:
    if not s:
        return "–"
    med, lo, hi = s["median"], s["min"], s["max"]
    if lo == hi:
        return report._fmt(med)
    return f"{report._fmt(med)} [{report._fmt(lo)}–{report._fmt(hi)}]"


def _rows(rows: Sequence[Mapping[str, Any]]) -> list[list[str]]:
    out = []
    for r in rows:
        change = ""
        if "change" in r:
            change = f"{r['change'] * 100:+.0f}%" + (" ~" if r.get("overlap") else "")
        out.append([r["figure"], _cell(r.get("old")), _cell(r.get("new")), change])
    return out


def markdown(rows: Sequence[Mapping[str, Any]], old: str, new: str, rounds: int) -> str:
    headers = ["figure", "old", "new", "change"]
    lines = [
        f"# A/B: {old} → {new} ({rounds} rounds each, interleaved)",
        "",
        "median [lowest–highest] over the rounds; `~`: the two ranges overlap "
        "(the change is within the noise)",
        "",
        *report._table(headers, _rows([r for r in rows if not r.get("by_method")])),
    ]
    methods = [r for r in rows if r.get("by_method")]
    if methods:
        lines += ["", "## The ledger by method (per placement)", ""]
        lines += report._table(headers, _rows(methods))
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------ running


def bench_run(
    side: str,
    tree: Path,
    round_no: int,
    out_dir: Path,
    bench_args: Sequence[str],
    python: str = "",
) -> dict[str, Any]:
    """One `python -m bench` with the roles from `tree` (run by `python`);
    its run dict, or {"error": ...} when it wrote none. Interrupted, the
    run is stopped with SIGTERM so it stops its clusters and PostgreSQL."""
    dest = out_dir / f"{side}-{round_no}"
    dest.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "bench", *bench_args, "--roles-from", str(tree)]
    cmd += ["--out", str(dest)] + (["--roles-python", python] if python else [])
    with open(dest / "bench.log", "w") as log:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
        try:
            code = proc.wait(timeout=RUN_TIMEOUT_S)
        except BaseException:
            proc.terminate()
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
            raise
    found = sorted(dest.glob("*.json"))
    if not found:
        return {"error": f"exit {code}, no results; see {dest / 'bench.log'}"}
    run: dict[str, Any] = json.loads(found[-1].read_text())
    if code != 0:
        run["ab_exit"] = code
    return run


def _terminate(signum: int, _frame: object) -> None:
    raise SystemExit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.ab", description=__doc__)
    p.add_argument("--old", required=True, help="the old revision (anything git rev-parse takes)")
    p.add_argument("--rounds", type=int, default=3, help="runs of each side (default 3)")
    p.add_argument("--only", default="W1,W2", help="workloads, as bench --only (default W1,W2)")
    p.add_argument("--full", action="store_true", help="the full profile (default: --quick)")
    p.add_argument("--nodes", type=int, default=0, help="simulated nodes (default: the profile's)")
    p.add_argument("--out", default=str(ROOT / "bench" / "results"), help="results directory")
    p.add_argument(
        "--old-python",
        default="",
        help="the interpreter of a virtualenv with the old revision's dependencies, when "
        "they differ from this checkout's (default: this interpreter)",
    )
    args = p.parse_args(sys.argv[1:] if argv is None else argv)
    # started in the background of a non-interactive shell SIGINT comes
    # ignored; SIGTERM unwinds too, so the worktree and the run are cleaned up
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, _terminate)
    if args.rounds < 1:
        p.error("--rounds must be at least 1")
    try:
        old_commit = resolve(args.old)
    except ValueError as exc:
        p.error(str(exc))
    bench_args = ([] if args.full else ["--quick"]) + ["--only", args.only]
    if args.nodes:
        bench_args += ["--nodes", str(args.nodes)]
    from bench.__main__ import git_rev

    new_rev = git_rev(ROOT)
    old_rev = old_commit[:7]
    tmp = Path(tempfile.mkdtemp(prefix="corral-bench-ab-"))
    old_tree = tmp / "old"
    runs: dict[str, list[dict[str, Any]]] = {s: [] for s in SIDES}
    errors: list[str] = []
    t0 = time.monotonic()
    try:
        say(f"checking out {old_rev} into {old_tree}")
        add_worktree(old_commit, old_tree)
        trees = {"old": old_tree, "new": ROOT}
        for r in range(args.rounds):
            for side in order(r):
                say(
                    f"round {r + 1}/{args.rounds}: {side} ({old_rev if side == 'old' else new_rev})"
                )
                python = args.old_python if side == "old" else ""
                run = bench_run(side, trees[side], r, tmp / "runs", bench_args, python)
                if "error" in run:
                    errors.append(f"{side} round {r + 1}: {run['error']}")
                    say(f"  FAILED: {run['error']}")
                    continue
                failed = [n for n, w in (run.get("workloads") or {}).items() if "error" in w]
                if failed:
                    errors.append(f"{side} round {r + 1}: {', '.join(failed)} failed")
                runs[side].append(run)
        rows = summarize(runs)
        text = markdown(rows, old_rev, new_rev, args.rounds)
        print()
        print(text)
        for e in errors:
            print(f"- error: {e}")
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        path = out / f"ab-{stamp}-{old_rev}-{new_rev}.json"
        path.write_text(
            json.dumps(
                {
                    "old": old_commit,
                    "new": new_rev,
                    "rounds": args.rounds,
                    "bench_args": bench_args,
                    "wall_s": round(time.monotonic() - t0, 1),
                    "summary": rows,
                    "errors": errors,
                    "runs": runs,
                },
                indent=2,
                default=str,
            )
            + "\n"
        )
        say(f"results: {path}")
    finally:
        remove_worktree(old_tree)
        if errors:
            say(f"logs of every run kept in {tmp / 'runs'}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    return 1 if errors or not all(runs.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
