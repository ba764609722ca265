"""One trace per evaluation across every role (issue 18), seen by a real
OTLP receiver: `corral job run` against a cluster of processes exporting to
it yields one trace holding the CLI, state, broker, worker, planner and
agent, every span's parent in it, children nested in time, database spans,
and no root spans of the pipeline's own (idle dequeues start none)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from opentelemetry.proto.collector.trace.v1 import (
    trace_service_pb2,
    trace_service_pb2_grpc,
)

from corral.security import transport
from corral.v1 import node_pb2, node_pb2_grpc
from tests.cluster import ROOT, Cluster
from tests.wait import until

pytestmark = pytest.mark.slow

JOB = """
job "traced" {
  type        = "service"
  datacenters = ["*"]
  group "g" {
    count = 1
    task "main" {
      driver = "mock"
      config {
        run_for = "1h"
      }
      resources {
        cpu    = 50
        memory = 32
      }
    }
  }
}
"""

#: spans that hand work to a queue: they may end before their child starts
#: (the eval waits in the broker, the alloc waits for its agent)
HAND_OFFS = {"broker.enqueue", "broker.dequeue", "worker.eval", "agent.start_alloc"}
PIPELINE = {"corral-broker", "corral-worker", "corral-planner"}
STARTUP_READS = {"/corral.v1.State/Snapshot", "/corral.v1.State/PeriodicLaunches"}


@dataclass(frozen=True)
class Span:
    service: str
    name: str
    kind: int
    trace_id: str
    span_id: str
    parent_id: str
    start: int
    end: int
    attributes: dict[str, str]


class Receiver(trace_service_pb2_grpc.TraceServiceServicer):
    """The OTLP trace service: keeps every span exported to it."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.spans: list[Span] = []

    def Export(
        self, request: trace_service_pb2.ExportTraceServiceRequest, context: object
    ) -> trace_service_pb2.ExportTraceServiceResponse:
        got: list[Span] = []
        for rs in request.resource_spans:
            service = next(
                (a.value.string_value for a in rs.resource.attributes if a.key == "service.name"),
                "",
            )
            for ss in rs.scope_spans:
                for s in ss.spans:
                    got.append(
                        Span(
                            service,
                            s.name,
                            s.kind,
                            s.trace_id.hex(),
                            s.span_id.hex(),
                            s.parent_span_id.hex(),
                            s.start_time_unix_nano,
                            s.end_time_unix_nano,
                            {
                                a.key: str(
                                    a.value.string_value or a.value.int_value or a.value.bool_value
                                )
                                for a in s.attributes
                            },
                        )
                    )
        with self.lock:
            self.spans.extend(got)
        return trace_service_pb2.ExportTraceServiceResponse()

    def snapshot(self) -> list[Span]:
        with self.lock:
            return list(self.spans)


@pytest.fixture
def receiver() -> Iterator[tuple[Receiver, int]]:
    # its own threads, so the exporters are answered while a test blocks
    rec = Receiver()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(rec, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield rec, port
    finally:
        server.stop(0)


def _names(spans: list[Span]) -> dict[str, list[Span]]:
    out: dict[str, list[Span]] = {}
    for s in spans:
        out.setdefault(s.name, []).append(s)
    return out


def _one(by_name: dict[str, list[Span]], name: str, service: str = "") -> Span:
    found = [s for s in by_name.get(name, []) if not service or s.service == service]
    assert found, f"no {name} span from {service or 'any service'}"
    return found[0]


async def test_one_trace_per_eval(
    make_cluster: Callable[..., Cluster], receiver: tuple[Receiver, int], tmp_path: Path
) -> None:
    rec, port = receiver
    otel = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{port}",
        "OTEL_BSP_SCHEDULE_DELAY": "100",
    }
    c = make_cluster(**otel)
    c.start("state")
    c.start("broker")
    c.start("planner")
    c.start("worker", "--num-schedulers", "2", "--dequeue-timeout", "0.1")
    c.start("agent", "--data-dir", str(tmp_path / "agent"), "--name", "agent0")

    async def node_ready() -> bool:
        async with transport.dial(c.state_addr) as ch:
            resp = await node_pb2_grpc.NodeStub(ch).List(node_pb2.NodeListRequest())
        return any(n.status == "ready" for n in resp.nodes)

    await until(node_ready, what="the agent's node ready")
    # the node's registration was traced and exported: meanwhile the
    # workers long-polled idle many times (0.1 s each)
    await until(
        lambda: any(
            s.name == "/corral.v1.Node/Register" and s.service == "corral-state"
            for s in rec.snapshot()
        ),
        what="the node registration's trace exported",
    )

    spec = tmp_path / "traced.nomad.hcl"
    spec.write_text(JOB)
    env = {**os.environ, **otel, "CORRAL_ADDR": c.state_addr}
    run = subprocess.run(
        [sys.executable, "-m", "cli", "job", "run", "-detach", str(spec)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 0, run.stderr

    def cli_root() -> Span | None:
        return next((s for s in rec.snapshot() if s.name == "corral job run"), None)

    root = await until(cli_root, what="the CLI's span")
    expected = {
        ("corral-state", "/corral.v1.State/DecideEval"),
        ("corral-agent", "agent.start_task"),
        ("corral-state", "/corral.v1.State/ApplyPlans"),
    }

    def trace() -> list[Span] | None:
        spans = [s for s in rec.snapshot() if s.trace_id == root.trace_id]
        have = {(s.service, s.name) for s in spans}
        return spans if expected <= have else None

    spans = await until(trace, what="the eval's trace through its decision and the agent")
    # the spans still in flight (the worker's eval ends after the decision) land too
    await until(
        lambda: (
            {"worker.eval", "worker.decide_eval"}
            <= {s.name for s in rec.snapshot() if s.trace_id == root.trace_id}
        ),
        what="the worker's spans",
    )
    spans = [s for s in rec.snapshot() if s.trace_id == root.trace_id]
    by_id = {s.span_id: s for s in spans}
    by_name = _names(spans)

    # one root, the CLI's; every other span's parent is in the trace
    roots = [s for s in spans if not s.parent_id]
    assert [r.name for r in roots] == ["corral job run"]
    orphans = [(s.service, s.name) for s in spans if s.parent_id and s.parent_id not in by_id]
    assert not orphans, orphans
    assert {s.service for s in spans} >= {
        "corral-cli",
        "corral-state",
        "corral-broker",
        "corral-worker",
        "corral-planner",
        "corral-agent",
    }

    def parent(s: Span) -> Span:
        found: Span = by_id[s.parent_id]
        return found

    def ancestors(s: Span) -> list[str]:
        out = []
        while s.parent_id:
            s = parent(s)
            out.append(s.name)
        return out

    # the chain, nested as it happens
    register = _one(by_name, "/corral.v1.Job/Register", "corral-state")
    assert parent(register).name == "/corral.v1.Job/Register"  # the CLI's client span
    enqueue = _one(by_name, "broker.enqueue")
    assert parent(enqueue).name == "state.commit"
    assert parent(parent(enqueue)) == register
    dequeue = _one(by_name, "broker.dequeue")
    assert parent(dequeue) == enqueue
    worker_eval = _one(by_name, "worker.eval")
    assert parent(worker_eval) == dequeue
    assert parent(_one(by_name, "worker.wait_for_index")) == worker_eval
    scheduler = _one(by_name, "scheduler.service")
    assert parent(scheduler) == worker_eval
    submit = _one(by_name, "worker.submit_plan")
    assert parent(submit) == scheduler
    plan_server = _one(by_name, "/corral.v1.Plan/Submit", "corral-planner")
    assert "worker.submit_plan" in ancestors(plan_server)
    assert parent(_one(by_name, "plan.evaluate")) == plan_server
    apply = _one(by_name, "plan.apply")
    assert parent(apply) == plan_server
    apply_server = _one(by_name, "/corral.v1.State/ApplyPlans", "corral-state")
    assert "plan.apply" in ancestors(apply_server)
    plan_commit = next(s for s in by_name["state.commit"] if parent(s) == apply_server)
    assert any(
        s.attributes.get("db.system") == "postgresql" and parent(s) == plan_commit for s in spans
    ), "no database spans in the plan's commit"
    # the outcome and the ack: one call to the state (issue 30)
    decide = _one(by_name, "worker.decide_eval")
    assert parent(decide) == scheduler
    decide_server = _one(by_name, "/corral.v1.State/DecideEval", "corral-state")
    assert "worker.decide_eval" in ancestors(decide_server)
    assert not by_name.get("/corral.v1.Eval/Ack")  # the broker acks from the feed
    start_alloc = _one(by_name, "agent.start_alloc")
    assert parent(start_alloc) == apply
    assert parent(_one(by_name, "agent.start_task")) == start_alloc

    # time: no child starts before its parent; outside the hand-offs to a
    # queue, every child also ends within its parent
    for s in spans:
        if not s.parent_id:
            continue
        p = parent(s)
        assert s.start >= p.start, f"{s.name} starts before its parent {p.name}"
        if p.name not in HAND_OFFS and s.name not in HAND_OFFS:
            assert s.end <= p.end, f"{s.name} ends after its parent {p.name}"

    # the pipeline starts no trace of its own: no idle dequeue anywhere; its
    # steps all in the eval's trace; no root from the worker, planner or
    # broker but their one-off start-up reads (the replica's snapshot, the
    # broker's periodic launches on taking leadership)
    everything = rec.snapshot()
    assert not [s for s in everything if s.name == "/corral.v1.Eval/Dequeue"]
    steps = {"/corral.v1.State/DecideEval", "/corral.v1.Plan/Submit", "/corral.v1.State/ApplyPlans"}
    stray = [
        (s.service, s.name)
        for s in everything
        if (s.name in steps or s.name.split(".")[0] in ("worker", "plan", "broker", "agent"))
        and s.trace_id != root.trace_id
    ]
    assert not stray, stray
    pipeline_roots = {s.name for s in everything if not s.parent_id and s.service in PIPELINE}
    assert pipeline_roots <= STARTUP_READS, pipeline_roots
