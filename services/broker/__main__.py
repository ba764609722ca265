"""`python -m services.broker` — run an eval broker process.

    python -m services.broker --dsn DSN --state-addr HOST:PORT [--listen 127.0.0.1:0]
        [--nack-timeout 60] [--delivery-limit 3] [--initial-nack-delay 1]
        [--subsequent-nack-delay 20] [--failed-followup-delay 60] [--reaper-interval 5]
        [--core-gc-interval 300]

Every broker process keeps a replica warm; the one holding the advisory
lock is the leader: it restores pending and blocked evals from the state
and serves `Eval`. On losing the lock it flushes and becomes a standby.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import sys

import grpc

from corral import telemetry
from corral.leader import LeaderElection
from corral.process import env_flag, new_member_id, register_member_loop, tune_gc, write_ready_file
from corral.replica import Replica
from corral.server import GrpcServer, install_signal_handlers
from corral.v1 import eval_pb2, eval_pb2_grpc, state_pb2, state_pb2_grpc
from corral.v1 import structs_pb2 as pb
from services.broker.blocked_evals import BlockedEvals
from services.broker.config import BrokerSettings
from services.broker.core_timers import run_core_timers
from services.broker.deployments import watcher_over_state
from services.broker.eval_broker import EvalBroker
from services.broker.feed import FeedRouter
from services.broker.handlers import ROLE, EvalServicer, export_metrics
from services.broker.reaper import Reaper

log = logging.getLogger("services.broker")

_TIMINGS = [
    ("--nack-timeout", "CORRAL_BROKER_NACK_TIMEOUT", "nack_timeout", float),
    ("--delivery-limit", "CORRAL_BROKER_DELIVERY_LIMIT", "delivery_limit", int),
    ("--initial-nack-delay", "CORRAL_BROKER_INITIAL_NACK_DELAY", "initial_nack_delay", float),
    (
        "--subsequent-nack-delay",
        "CORRAL_BROKER_SUBSEQUENT_NACK_DELAY",
        "subsequent_nack_delay",
        float,
    ),
    (
        "--failed-followup-delay",
        "CORRAL_BROKER_FAILED_FOLLOWUP_DELAY",
        "failed_followup_delay",
        float,
    ),
    (
        "--failed-followup-jitter",
        "CORRAL_BROKER_FAILED_FOLLOWUP_JITTER",
        "failed_followup_jitter",
        float,
    ),
    ("--reaper-interval", "CORRAL_BROKER_REAPER_INTERVAL", "reaper_interval", float),
    ("--core-gc-interval", "CORRAL_BROKER_CORE_GC_INTERVAL", "core_gc_interval", float),
    (
        "--unblock-failed-interval",
        "CORRAL_BROKER_UNBLOCK_FAILED_INTERVAL",
        "unblock_failed_interval",
        float,
    ),
]


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m services.broker", description=__doc__)
    env_flag(p, "--dsn", "CORRAL_DSN", help="PostgreSQL DSN (leader election)")
    env_flag(p, "--state-addr", "CORRAL_STATE_ADDR", help="state service host:port")
    env_flag(
        p, "--listen", "CORRAL_BROKER_LISTEN", default="127.0.0.1:0", help="gRPC listen address"
    )
    env_flag(
        p,
        "--advertise",
        "CORRAL_ADVERTISE_ADDR",
        default="",
        help="address clients reach this process at",
    )
    env_flag(
        p,
        "--metrics-listen",
        "CORRAL_BROKER_METRICS_LISTEN",
        default="",
        help="Prometheus host:port",
    )
    env_flag(
        p,
        "--ready-file",
        "CORRAL_BROKER_READY_FILE",
        default="",
        help="write address here once listening",
    )
    defaults = BrokerSettings()
    for flag, env, attr, kind in _TIMINGS:
        env_flag(
            p, flag, env, default=getattr(defaults, attr), type=kind, help=attr.replace("_", " ")
        )
    args = p.parse_args(argv)
    for flag in ("dsn", "state_addr"):
        if not getattr(args, flag):
            p.error(f"--{flag.replace('_', '-')} is required")
    return args


class BrokerProcess:
    def __init__(self, args: argparse.Namespace) -> None:
        self.settings = BrokerSettings(**{attr: getattr(args, attr) for _, _, attr, _ in _TIMINGS})
        self.settings.validate()
        self.args = args
        self.replica = Replica(args.state_addr, name="broker")
        self.state_channel = grpc.aio.insecure_channel(args.state_addr)
        self.state = state_pb2_grpc.StateStub(self.state_channel)
        self.broker = EvalBroker(self.settings, on_cancelable=lambda: self.reaper.wake.set())
        self.blocked = BlockedEvals(on_release=lambda evs, i: self.reaper.on_release(evs, i))
        self.router = FeedRouter(self.broker, self.blocked)
        self.reaper = Reaper(
            self.settings, self.broker, self.blocked, self.write_evals, self._job_exists
        )
        self.deployments = watcher_over_state(
            self.replica.snapshot, self.state_channel, lambda: self.address, self.write_evals
        )
        self.server = GrpcServer(args.listen, name=ROLE)
        self.address = ""
        self.election: LeaderElection | None = None
        self._term: asyncio.Task[None] | None = None

    def _job_exists(self, ev: pb.Evaluation) -> bool:
        return self.replica.snapshot().job_by_id(ev.namespace, ev.job_id) is not None

    async def write_evals(self, evals: list[pb.Evaluation]) -> int:
        resp = await self.state.UpsertEvals(
            state_pb2.UpsertEvalsRequest(evals=evals, leader_id=self.address), timeout=30
        )
        return int(resp.index)

    def is_leader(self) -> bool:
        return self.election is not None and self.election.is_leader

    async def leader_address(self) -> str:
        return await self.election.leader_address() if self.election is not None else ""

    async def start(self) -> None:
        await self.replica.start()
        self.replica.add_listener(self.router.on_batch, self.router.on_reset)
        self.replica.add_listener(self.deployments.on_batch, self.deployments.on_reset)
        servicer = EvalServicer(
            self.settings,
            self.broker,
            self.blocked,
            self.replica,
            self.write_evals,
            self.is_leader,
            self.leader_address,
        )
        self.server.add(
            eval_pb2_grpc.add_EvalServicer_to_server,
            servicer,
            eval_pb2.DESCRIPTOR.services_by_name["Eval"].full_name,
        )
        await self.server.start()
        self.address = self.args.advertise or self.server.bound_address
        self.election = LeaderElection(self.args.dsn, ROLE, self.address)

    async def on_elected(self) -> None:
        """Restore every pending and blocked eval exactly once: catch up with
        the state, then (with no await in between) enable and restore from
        that snapshot; later batches reach the router as they commit."""
        latest = await self.state.GetIndex(state_pb2.GetIndexRequest(), timeout=30)
        snap = await self.replica.wait_for_index(latest.index, timeout=60)
        snap = self.replica.snapshot()
        self.broker.set_enabled(True)
        self.blocked.set_enabled(True)
        pending, blocked = self.router.restore(snap)
        log.info(
            "broker leader: restored %d pending and %d blocked evals at index %d",
            pending,
            blocked,
            snap.index,
        )
        self._term = asyncio.create_task(self._leader_tasks(), name="leader-tasks")

    async def _leader_tasks(self) -> None:
        async with asyncio.TaskGroup() as tg:
            tg.create_task(self.reaper.run(), name="reaper")
            tg.create_task(
                run_core_timers(
                    self.broker, self.settings.core_gc_interval, lambda: self.replica.index
                ),
                name="core-gc",
            )
            tg.create_task(self.deployments.run(), name="deployment-watcher")

    async def on_lost(self) -> None:
        self.router.enabled = False
        self.broker.set_enabled(False)
        self.blocked.set_enabled(False)
        if self._term is not None:
            self._term.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._term
            self._term = None
        log.warning("broker lost leadership: flushed")

    async def metrics_loop(self) -> None:
        while True:
            export_metrics(self.broker, self.blocked)
            await asyncio.sleep(1.0)

    async def stop(self) -> None:
        await self.server.stop(grace=5.0)
        if self.election is not None:
            await self.election.stop()
        await self.on_lost()
        await self.replica.stop()
        await self.state_channel.close()


async def run(args: argparse.Namespace) -> int:
    proc = BrokerProcess(args)
    await proc.start()
    assert proc.election is not None
    stop = asyncio.Event()
    install_signal_handlers(stop.set)
    tasks = [
        asyncio.create_task(proc.election.run(proc.on_elected, proc.on_lost), name="election"),
        asyncio.create_task(proc.metrics_loop(), name="metrics"),
        asyncio.create_task(
            register_member_loop(
                args.state_addr,
                state_pb2.Member(
                    id=new_member_id(ROLE), role=ROLE, address=proc.address, version="1"
                ),
                stop,
                is_leader=proc.is_leader,
            )
        ),
    ]
    metrics = ""
    if args.metrics_listen:
        host = args.metrics_listen.rpartition(":")[0] or "127.0.0.1"
        metrics = f"{host}:{telemetry.start_metrics_server(args.metrics_listen)}"
    write_ready_file(args.ready_file, role=ROLE, address=proc.address, metrics=metrics)
    log.info("broker ready on %s", proc.address)
    await stop.wait()
    await proc.stop()
    for t in tasks:
        t.cancel()
    for t in tasks:
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await t
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    telemetry.setup_logging(ROLE)
    tune_gc()
    telemetry.setup_tracing("corral-broker")
    return asyncio.run(run(args))


if __name__ == "__main__":
    sys.exit(main())
