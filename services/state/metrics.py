"""Prometheus metrics of the state service (served on --metrics-listen).

The write path is the cluster's serial section: every write takes the
index counter's row lock, so `lock_wait` (queueing for it) and `hold` (how
long a transaction keeps it) say where write latency comes from."""

from __future__ import annotations

from prometheus_client import Histogram

_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)

WRITE_LOCK_WAIT = Histogram(
    "corral_state_write_lock_wait_seconds",
    "From asking for a connection to holding the index counter's lock",
    buckets=_BUCKETS,
)
WRITE_HOLD = Histogram(
    "corral_state_write_hold_seconds",
    "From taking the index counter's lock to the commit",
    buckets=_BUCKETS,
)
BATCH_SIZE = Histogram(
    "corral_state_write_batch_ops",
    "Operations coalesced into one node-write batch",
    buckets=(1, 2, 5, 10, 25, 50, 100, 250, 500),
)
