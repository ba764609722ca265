"""The state leader's cluster gauges (services/state/metrics.py): a job's
summary gauge counts its allocs, as every read of a summary does (the
stored summary keeps only the queued counts)."""

from __future__ import annotations

from corral.domain.store import StateStore
from corral.domain.structs import ClientStatus
from corral.testing import mock
from corral.v1 import structs_pb2 as pb
from services.state.metrics import ClusterCollector, LeaderView


def test_job_summary_gauge_counts_allocs_and_the_stored_queued() -> None:
    job = mock.job(job_id="web", count=3)
    node = mock.node()
    allocs = [
        mock.alloc(job, node, index=0),
        mock.alloc(job, node, index=1),
        mock.alloc(job, node, index=2, client_status=ClientStatus.FAILED),
    ]
    stored = pb.JobSummary(job_id="web", namespace="default")
    stored.summary["web"].queued = 4
    stored.summary["web"].running = 99  # never stored by the state: not what is shown
    snap = StateStore.build(10, jobs=[job], nodes=[node], allocs=allocs, job_summaries=[stored])
    collector = ClusterCollector()
    collector.add_source(lambda: LeaderView(snapshot=snap, heartbeats_active=0))
    samples = {
        s.labels["state"]: s.value
        for family in collector.collect()
        if family.name == "corral_job_summary"
        for s in family.samples
        if s.labels["job"] == "web"
    }
    assert samples["running"] == 2 and samples["failed"] == 1 and samples["queued"] == 4
    assert samples["complete"] == 0
