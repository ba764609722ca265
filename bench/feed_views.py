"""CPU of the change feed per placement, by view and event loop
(`python -m bench.feed_views`): the levers of issue 17's "replicas read only
what they use", measured in one process on CPU time, so a machine shared
with other work moves the figures less than it moves the workloads'.

* replica: parse one W2-shaped batch (a plan of 200 allocs with their
  placement metrics) and apply it to a replica's store, for each view a
  replica can ask for (the full one re-parses the batch to drop metrics);
* state: what the state spends per batch to send it to a broker, a planner
  and `--workers` workers: before, one serialization per stream; now one
  projection and serialization per view;
* loop: a unary gRPC call on a grpc.aio server and channel in one process,
  on asyncio's loop and on uvloop.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Callable

import grpc

from corral.domain import topics
from corral.domain.store import StateStore
from corral.domain.structs import new_id
from corral.domain.topics import EventType
from corral.runtime import event_loop, feed_view
from corral.runtime.feed_view import FeedView
from corral.testing import mock
from corral.v1 import structs_pb2 as pb

STATUS_VIEW = feed_view.BROKER_STATUS_VIEW

PLAN_ALLOCS = 200


def w2_batch(index: int) -> pb.ChangeBatch:
    """One committed plan of W2's shape: 200 allocs of one group, each with
    metrics as the scheduler records them (top scored nodes and all)."""
    j = mock.job(job_id=f"w2-{index}", count=PLAN_ALLOCS)
    nodes = [mock.node(node_class=f"class-{i % 5}") for i in range(20)]
    batch = pb.ChangeBatch(index=index, time=time.time_ns())
    for i in range(PLAN_ALLOCS):
        a = mock.alloc(j, nodes[i % len(nodes)], index=i, eval_id=f"eval-{index}")
        a.create_index = a.modify_index = index
        m = a.metrics
        m.nodes_evaluated, m.nodes_in_pool, m.allocation_time = 100, 500, 123456
        m.nodes_available["dc1"] = 250
        m.nodes_available["dc2"] = 250
        m.class_filtered["class-1"] = 100
        m.constraint_filtered["${node.class} = class-0"] = 400
        for n in nodes[:5]:
            meta = m.score_meta_data.add(node_id=n.id, norm_score=0.73)
            meta.scores["binpack"] = 0.61
            meta.scores["job-anti-affinity"] = -0.2
            meta.scores["node-reschedule-penalty"] = 0.0
        batch.events.add(
            index=index,
            topic=topics.ALLOCATION.name,
            type=EventType.PLAN_RESULT,
            key=a.id,
            namespace=a.namespace,
            allocation=a,
        )
    batch.events.add(
        index=index,
        topic=topics.EVALUATION.name,
        type=EventType.PLAN_RESULT,
        key=new_id(),
        evaluation=mock.eval_for(j),
    )
    return batch


def cpu_per(fn: Callable[[], object], repeat: int) -> float:
    """CPU ms per call of fn (best of three rounds)."""
    best = float("inf")
    for _ in range(3):
        t0 = time.process_time()
        for _ in range(repeat):
            fn()
        best = min(best, (time.process_time() - t0) / repeat * 1000)
    return best


def replica_side(batches: list[pb.ChangeBatch]) -> dict[str, float]:
    """CPU ms per placement a replica spends receiving and applying."""
    out = {}
    for name, view in (
        ("full (before)", FeedView()),
        ("scheduling", FeedView.of((), feed_view.SCHEDULING)),
        ("broker status", STATUS_VIEW),
    ):
        wire = [view.batch(b).SerializeToString() for b in batches]

        def apply(wire: list[bytes] = wire) -> None:
            store = StateStore(lean=True)
            for data in wire:
                store.apply(pb.ChangeBatch.FromString(data))

        out[name] = cpu_per(apply, 3) / (len(batches) * PLAN_ALLOCS)
    return out


def state_side(batches: list[pb.ChangeBatch], workers: int) -> dict[str, float]:
    """CPU ms per placement the state spends encoding the feed for a broker,
    a planner and `workers` workers."""
    sched = FeedView.of((), feed_view.SCHEDULING)

    def before() -> None:
        for b in batches:
            for _ in range(2 + workers):
                b.SerializeToString()

    def per_stream() -> None:
        for b in batches:
            STATUS_VIEW.batch(b).SerializeToString()
            for _ in range(1 + workers):
                sched.batch(b).SerializeToString()

    def per_view() -> None:
        for b in batches:
            STATUS_VIEW.batch(b).SerializeToString()
            sched.batch(b).SerializeToString()

    def one_view() -> None:
        for b in batches:
            sched.batch(b).SerializeToString()

    n = len(batches) * PLAN_ALLOCS
    return {
        "full, once per stream (before)": cpu_per(before, 3) / n,
        "views, once per stream": cpu_per(per_stream, 3) / n,
        "broker status view, once per view": cpu_per(per_view, 3) / n,
        "one scheduling view for all": cpu_per(one_view, 3) / n,
    }


async def _unary_calls(calls: int) -> float:
    """CPU ms per unary call, server and client in this process."""

    def echo(request: bytes, context: object) -> bytes:
        return request

    handler = grpc.method_handlers_generic_handler(
        "bench.Echo",
        {
            "Echo": grpc.unary_unary_rpc_method_handler(
                echo, request_deserializer=None, response_serializer=None
            )
        },
    )
    server = grpc.aio.server()
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")  # local benchmark only
    call: grpc.aio.UnaryUnaryMultiCallable[bytes, bytes] = channel.unary_unary("/bench.Echo/Echo")
    payload = b"x" * 200
    for _ in range(200):
        await call(payload)
    t0 = time.process_time()
    for _ in range(calls // 16):
        await asyncio.gather(*(call(payload) for _ in range(16)))
    spent = time.process_time() - t0
    await channel.close()
    await server.stop(None)
    return spent / calls * 1000


def loop_side(calls: int) -> dict[str, float]:
    out = {}
    for kind in ("asyncio", "uvloop"):
        out[kind] = min(event_loop.run(_unary_calls(calls), kind) for _ in range(3))  # type: ignore[arg-type]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--batches", type=int, default=10)
    ap.add_argument("--workers", type=int, default=1, help="worker processes subscribed")
    ap.add_argument("--calls", type=int, default=4000)
    args = ap.parse_args()
    batches = [w2_batch(i + 1) for i in range(args.batches)]
    size = {
        n: len(v.batch(batches[0]).SerializeToString())
        for n, v in (
            ("full", FeedView()),
            ("scheduling", FeedView.of((), feed_view.SCHEDULING)),
            ("broker status", STATUS_VIEW),
        )
    }
    print(f"bytes per {PLAN_ALLOCS}-alloc batch: {size}")
    print("replica, CPU ms per placement:")
    for k, v in replica_side(batches).items():
        print(f"  {k:40s} {v:.4f}")
    print(f"state (broker + planner + {args.workers} worker(s)), CPU ms per placement:")
    for k, v in state_side(batches, args.workers).items():
        print(f"  {k:40s} {v:.4f}")
    print("grpc.aio unary call, CPU ms per call (client + server):")
    for k, v in loop_side(args.calls).items():
        print(f"  {k:40s} {v:.4f}")


if __name__ == "__main__":
    main()
