"""Worker metrics, named after Nomad's `nomad.worker.*` series."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import REGISTRY, Counter, Histogram
from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

from services.worker.scheduler.feasible.inflight import InFlightPlacements

DEQUEUE_EVAL = Histogram(
    "corral_worker_dequeue_eval_seconds", "Time to dequeue an eval (nomad.worker.dequeue_eval)"
)
WAIT_FOR_INDEX = Histogram(
    "corral_worker_wait_for_index_seconds",
    "Wait for the replica to reach the eval's index (nomad.worker.wait_for_index)",
)
INVOKE_SCHEDULER = Histogram(
    "corral_worker_invoke_scheduler_seconds",
    "Scheduler run time by eval type (nomad.worker.invoke_scheduler.<type>)",
    ["type"],
)
SUBMIT_PLAN = Histogram(
    "corral_worker_submit_plan_seconds", "Plan submission round trip (nomad.worker.submit_plan)"
)
EVAL_WRITE = Histogram(
    "corral_worker_eval_write_seconds",
    "State.DecideEval round trip: op=outcome writes the outcome and acks (nomad.worker."
    "update_eval, reblock_eval), op=create the evals created before a plan (create_eval)",
    ["op"],
)
SEND_ACK = Histogram(
    "corral_worker_send_ack_seconds", "Ack/Nack round trip (nomad.worker.send_ack)", ["op"]
)
EVALS_PROCESSED = Counter("corral_worker_evals_total", "Evals finished by outcome", ["outcome"])
BEHIND_STATE = Counter(
    "corral_worker_behind_state_total",
    "Evals nacked because the replica could not reach their index",
)


class _ClaimsCollector(Collector):
    """`corral_worker_placement_claims_total{outcome}`, read at scrape time
    from the process's pool (scheduler/feasible/inflight.py): `claimed`,
    `conflict` (another loop claimed the chosen node first: selected
    again), `forced` (claimed after repeated conflicts)."""

    def __init__(self) -> None:
        self.source: InFlightPlacements | None = None

    def collect(self) -> Iterator[CounterMetricFamily]:
        family = CounterMetricFamily(
            "corral_worker_placement_claims",
            "Placements claimed for the other scheduler loops of this process, by outcome",
            labels=["outcome"],
        )
        if self.source is not None:
            for outcome, n in self.source.outcomes.items():
                family.add_metric([outcome], n)
        yield family


PLACEMENT_CLAIMS = _ClaimsCollector()
REGISTRY.register(PLACEMENT_CLAIMS)
