"""A memory probe for the state process under churn (issue 19's diagnosis).

    PYTHONPATH=$PWD/bench/memprobe_site CORRAL_MEMPROBE_OUT=/tmp/probe.jsonl \
        [CORRAL_MEMPROBE_EVERY=20] [CORRAL_MEMPROBE_TRACE=1] \
        [CORRAL_MEMPROBE_EXPERIMENT_AT=250] .venv/bin/python -m bench.churn --minutes 4

`bench/memprobe_site/sitecustomize.py` installs it in every role the churn
starts; it acts only in the process that runs the state's change feed.
Every `EVERY` seconds it appends one JSON line: RSS, glibc's heap in use and
free (`mallinfo2`: protobuf's upb arenas live there, invisible to
tracemalloc), the feed's ring (batches, serialized bytes, events), the
objects the state's store holds, and with `TRACE=1` the Python heap and the
top tracemalloc lines grown since the first sample. At `EXPERIMENT_AT`
seconds it trims the heap, empties the ring, then re-parses every live object
into one fresh arena, measuring after each: what the ring holds, and what
objects pinning their whole change batch cost.

A debugging aid, never loaded by a deployment; the figures it gave are in
bench/README.md's churn section.
"""

from __future__ import annotations

import ctypes
import gc
import json
import os
import sys
import threading
import time
import tracemalloc
from typing import Any


class _MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        )
    ]


def _mb(n: float) -> float:
    return round(n / 2**20, 2)


def _rss() -> float:
    with open("/proc/self/statm") as f:
        return _mb(int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE"))


class Probe:
    def __init__(self, out: str, every: float, trace: bool, experiment_at: float) -> None:
        self.out = out
        self.every = every
        self.trace = trace
        self.experiment_at = experiment_at
        self.libc = ctypes.CDLL("libc.so.6")
        self.libc.mallinfo2.restype = _MallInfo2
        self.feed: Any = None
        self.first: tracemalloc.Snapshot | None = None
        self.t0 = time.monotonic()

    def heap(self) -> dict[str, float]:
        mi = self.libc.mallinfo2()
        return {"rss_mb": _rss(), "malloc_inuse_mb": _mb(mi.uordblks)}

    def find_feed(self) -> Any:
        if self.feed is None and "services.state.feed" in sys.modules:
            self.feed = next(
                (o for o in gc.get_objects() if type(o).__name__ == "ChangeFeed"), None
            )
        return self.feed

    def on_loop(self, fn: Any) -> None:
        """Run `fn` on the feed's event loop and wait for it."""
        done = threading.Event()

        def call() -> None:
            try:
                fn()
            finally:
                done.set()

        self.feed._tasks[0].get_loop().call_soon_threadsafe(call)
        done.wait(60)

    def sample(self) -> dict[str, Any]:
        feed = self.feed
        ring = list(feed._ring)
        snap = feed.store.snapshot()
        mi = self.libc.mallinfo2()
        rec: dict[str, Any] = {
            "t": round(time.monotonic() - self.t0, 1),
            "rss_mb": _rss(),
            "malloc_inuse_mb": _mb(mi.uordblks),
            "malloc_free_mb": _mb(mi.fordblks),
            "ring_len": len(ring),
            "ring_serialized_mb": _mb(sum(b.ByteSize() for b in ring)),
            "ring_events": sum(len(b.events) for b in ring),
            "allocs": len(snap.allocs),
            "evals": len(snap.evals),
            "jobs": len(snap.jobs),
            "job_versions": sum(len(v) for v in snap.job_versions.values()),
            "nodes": len(snap.nodes),
            "gc_objects": len(gc.get_objects()),
        }
        del ring
        if self.trace:
            cur = tracemalloc.take_snapshot()
            rec["traced_mb"] = _mb(tracemalloc.get_traced_memory()[0])
            if self.first is None:
                self.first = cur
            else:
                rec["top_diff"] = [str(s) for s in cur.compare_to(self.first, "lineno")[:12]]
        return rec

    def experiment(self, rec: dict[str, Any]) -> None:
        from corral.domain.store import StateStore

        self.libc.malloc_trim(0)
        rec["after_trim"] = self.heap()

        def clear_ring() -> None:
            self.feed._ring.clear()
            self.feed._ring_sizes.clear()
            self.feed._ring_bytes = 0
            gc.collect()

        self.on_loop(clear_ring)
        self.libc.malloc_trim(0)
        rec["after_ring_clear"] = self.heap()

        def compact() -> None:
            s = self.feed.store.snapshot()
            self.feed.store.reset(
                StateStore.build(
                    s.index,
                    jobs=s.jobs.values(),
                    job_versions=[j for v in s.job_versions.values() for j in v.values()],
                    nodes=s.nodes.values(),
                    allocs=s.allocs.values(),
                    evals=s.evals.values(),
                    deployments=s.deployments.values(),
                    job_summaries=s.job_summaries.values(),
                    scheduler_config=s.scheduler_config,
                    table_indexes=dict(s.table_indexes),
                )
            )
            del s
            gc.collect()

        self.on_loop(compact)
        self.libc.malloc_trim(0)
        rec["after_compact"] = self.heap()

    def run(self) -> None:
        experimented = False
        while True:
            time.sleep(self.every)
            if self.find_feed() is None:
                continue
            if self.trace and not tracemalloc.is_tracing():
                tracemalloc.start(1)
            rec = self.sample()
            if self.experiment_at and not experimented and rec["t"] >= self.experiment_at:
                experimented = True
                self.experiment(rec)
            with open(self.out, "a") as f:
                f.write(json.dumps(rec) + "\n")


def install() -> None:
    """Start the probe thread if CORRAL_MEMPROBE_OUT is set."""
    out = os.environ.get("CORRAL_MEMPROBE_OUT")
    if not out:
        return
    probe = Probe(
        out,
        float(os.environ.get("CORRAL_MEMPROBE_EVERY", "30")),
        os.environ.get("CORRAL_MEMPROBE_TRACE") == "1",
        float(os.environ.get("CORRAL_MEMPROBE_EXPERIMENT_AT", "0")),
    )
    threading.Thread(target=probe.run, name="memprobe", daemon=True).start()
