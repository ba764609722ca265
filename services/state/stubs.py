"""The list entries of jobs and nodes (Nomad's JobListStub, NodeListStub)
and a job's summary, built from the feed's snapshot: shared by the Job,
Node and NodePool handlers."""

from __future__ import annotations

from corral.domain import structs
from corral.domain.store import StateSnapshot
from corral.domain.structs import ClientStatus, DesiredStatus
from corral.v1 import job_pb2, node_pb2
from corral.v1 import structs_pb2 as pb


def summarize(snap: StateSnapshot, job: pb.Job) -> pb.JobSummary:
    """Counts by task group computed from the allocs in the snapshot, with
    the scheduler's queued counts from the persisted summary."""
    out = pb.JobSummary(job_id=job.id, namespace=job.namespace)
    stored = snap.job_summary(job.namespace, job.id)
    for tg in job.task_groups:
        out.summary[tg.name].queued = (
            stored.summary[tg.name].queued if stored and tg.name in stored.summary else 0
        )
    for a in snap.allocs_by_job(job.namespace, job.id):
        s = out.summary[a.task_group]
        if a.client_status == ClientStatus.PENDING and a.desired_status == DesiredStatus.RUN:
            s.starting += 1
        elif a.client_status == ClientStatus.RUNNING:
            s.running += 1
        elif a.client_status == ClientStatus.COMPLETE:
            s.complete += 1
        elif a.client_status == ClientStatus.FAILED:
            s.failed += 1
        elif a.client_status == ClientStatus.LOST:
            s.lost += 1
        elif a.client_status == ClientStatus.UNKNOWN:
            s.unknown += 1
    return out


def job(snap: StateSnapshot, job: pb.Job) -> job_pb2.JobListStub:
    """A job as its list entry (Job.List, NodePool.Jobs): its summary computed."""
    stub = structs.project(
        job_pb2.JobListStub,
        job,
        periodic=job.HasField("periodic") and job.periodic.enabled,
        parameterized=job.HasField("parameterized"),
        meta=job.meta,
    )
    for tg, s in summarize(snap, job).summary.items():
        stub.summary[tg].CopyFrom(s)
    return stub


def node(snap: StateSnapshot, n: pb.Node, *, resources: bool = False) -> node_pb2.NodeListStub:
    """A node as its list entry (Node.List, NodePool.Nodes); with
    `resources` its node and reserved resources too (Node.List's
    `resources`, Nomad's /v1/nodes?resources=true)."""
    stub = structs.project(
        node_pb2.NodeListStub,
        n,
        address=n.http_addr,
        running_allocs=sum(1 for a in snap.allocs_by_node(n.id) if not structs.alloc_terminal(a)),
    )
    for name, d in n.drivers.items():
        stub.drivers[name].detected = d.detected
        stub.drivers[name].healthy = d.healthy
    if resources:
        stub.node_resources.CopyFrom(n.node_resources)
        stub.reserved_resources.CopyFrom(n.reserved_resources)
    return stub
