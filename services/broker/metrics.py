"""The broker's counters of repairs (the gauges of its queues are refreshed
in handlers.export_metrics). Nomad has no equivalents: it neither leases
workers nor reconciles its broker with the state while in office."""

from __future__ import annotations

from prometheus_client import Counter

LEASE_EXPIRIES = Counter(
    "corral_broker_worker_lease_expiries_total",
    "Worker leases that lapsed (their outstanding evals were nacked at once)",
)
LEASE_NACKS = Counter(
    "corral_broker_worker_lease_nacks_total",
    "Evals nacked because the worker holding them lost its lease",
)
RECONCILE_REPAIRS = Counter(
    "corral_broker_reconcile_repairs_total",
    "Evals of the state the broker did not hold, put back by the reconciler",
    ["kind"],  # pending (re-enqueued) or blocked (re-tracked)
)
ACKS_REFUSED = Counter(
    "corral_broker_acks_refused_total",
    "Acks refused because the eval was still pending in the state (the worker must nack)",
)
