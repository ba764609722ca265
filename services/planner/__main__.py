"""`python -m services.planner` — run a plan applier process.

    python -m services.planner --dsn DSN --state-addr HOST:PORT --broker-addr HOST:PORT
        [--listen 127.0.0.1:0] [--ready-file F] [--metrics-listen HOST:PORT]
        [--pipeline-depth 1] [--max-batch 64]

Every planner process keeps a replica of the state warm and serves `Plan`;
one of them wins the advisory-lock election and runs the plan queue and the
applier, the others answer UNAVAILABLE with the leader's address. Losing
leadership flushes the queue ("plan queue flushed").

Test-only fault injection: `CORRAL_PLANNER_FAULT=exit-before-apply` makes the
process exit (status 75) after it has evaluated a batch and before it
writes it, to show that a crash there commits nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import sys
import time
from typing import Any

from corral import telemetry
from corral.leader import LeaderElection
from corral.process import env_flag, new_member_id, register_member_loop, tune_gc, write_ready_file
from corral.replica import Replica
from corral.server import GrpcServer, install_signal_handlers
from corral.v1 import plan_pb2, plan_pb2_grpc, state_pb2
from services.planner.applier import PlanApplier
from services.planner.broker_client import BrokerClient
from services.planner.config import PlannerSettings
from services.planner.handlers import ROLE, PlanServicer
from services.planner.plan_queue import PlanQueue
from services.planner.state_client import StateClient

log = logging.getLogger("services.planner")


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m services.planner", description=__doc__)
    env_flag(parser, "--dsn", "CORRAL_DSN", help="PostgreSQL DSN (leader election)")
    env_flag(parser, "--state-addr", "CORRAL_STATE_ADDR", help="state service host:port")
    env_flag(parser, "--broker-addr", "CORRAL_BROKER_ADDR", help="broker host:port[,host:port]")
    env_flag(
        parser,
        "--listen",
        "CORRAL_PLANNER_LISTEN",
        default="127.0.0.1:0",
        help="gRPC listen address",
    )
    env_flag(
        parser,
        "--metrics-listen",
        "CORRAL_PLANNER_METRICS_LISTEN",
        default="",
        help="Prometheus host:port",
    )
    env_flag(
        parser,
        "--ready-file",
        "CORRAL_PLANNER_READY_FILE",
        default="",
        help="write address here once listening",
    )
    env_flag(
        parser,
        "--pipeline-depth",
        "CORRAL_PLANNER_PIPELINE_DEPTH",
        default=1,
        type=int,
        help="evaluated batches that may wait for their write (Nomad plan_apply_pipeline)",
    )
    env_flag(
        parser,
        "--max-batch",
        "CORRAL_PLANNER_MAX_BATCH",
        default=64,
        type=int,
        help="most plans written in one group commit",
    )
    env_flag(
        parser,
        "--max-batch-allocs",
        "CORRAL_PLANNER_MAX_BATCH_ALLOCS",
        default=5000,
        type=int,
        help="most allocs (placed, stopped, preempted) per group commit; 0 = no bound",
    )
    env_flag(
        parser,
        "--fault",
        "CORRAL_PLANNER_FAULT",
        default="",
        help="test-only fault injection: exit-before-apply",
    )
    args = parser.parse_args(argv)
    for flag in ("dsn", "state_addr", "broker_addr"):
        if not getattr(args, flag):
            parser.error(f"--{flag.replace('_', '-')} is required")
    return args


class PlannerProcess:
    def __init__(self, settings: PlannerSettings) -> None:
        settings.validate()
        self.settings = settings
        self.member_id = new_member_id(ROLE)
        self.replica = Replica(settings.state_addr, name="planner")
        self.queue = PlanQueue()
        self.state = StateClient(settings.state_addr)
        self.broker = BrokerClient(settings.broker_addr)
        self.applier = PlanApplier(self.queue, self.replica, self.state, settings)
        self.server = GrpcServer(settings.listen, name=ROLE)
        self.election: LeaderElection | None = None
        self.stop_event = asyncio.Event()
        self._term: asyncio.Task[None] | None = None
        self._tasks: list[asyncio.Task[Any]] = []

    def is_leader(self) -> bool:
        return self.election is not None and self.election.is_leader

    async def leader_address(self) -> str:
        if self.election is None:
            return ""
        address: str = await self.election.leader_address()
        return address

    async def start(self) -> str:
        await self.replica.start()
        servicer = PlanServicer(
            self.queue,
            self.broker,
            is_leader=self.is_leader,
            leader_address=self.leader_address,
            stats=lambda: self.applier.stats,
        )
        self.server.add(
            plan_pb2_grpc.add_PlanServicer_to_server,
            servicer,
            plan_pb2.DESCRIPTOR.services_by_name["Plan"].full_name,
        )
        await self.server.start()
        address = self.server.bound_address
        # Fencing: the state refuses a plan write unless this address holds
        # the planner's leader lock at commit (a deposed leader cannot write).
        self.state.leader_id = address
        self.election = LeaderElection(self.settings.dsn, ROLE, address)
        self._tasks.append(
            asyncio.create_task(self.election.run(self._on_elected, self._on_lost), name="election")
        )
        member = state_pb2.Member(
            id=self.member_id, role=ROLE, address=address, started_at=time.time_ns()
        )
        self._tasks.append(
            asyncio.create_task(
                register_member_loop(
                    self.settings.state_addr, member, self.stop_event, is_leader=self.is_leader
                ),
                name="member",
            )
        )
        return address

    async def _on_elected(self) -> None:
        log.info("planner elected leader; plan queue enabled")
        self.queue.set_enabled(True)
        if self._term is None or self._term.done():
            self._term = asyncio.create_task(self.applier.run(), name="plan-applier")

    async def _on_lost(self) -> None:
        log.warning("planner lost leadership; plan queue flushed")
        self.queue.set_enabled(False)
        if self._term is not None:
            self._term.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._term

    async def stop(self) -> None:
        self.stop_event.set()
        self.queue.set_enabled(False)
        if self.election is not None:
            with contextlib.suppress(Exception):
                await self.election.stop()
        if self._term is not None:
            self._term.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._term
        await self.server.stop()
        for task in self._tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        await self.replica.stop()
        await self.state.close()
        await self.broker.close()


async def serve(args: argparse.Namespace) -> int:
    settings = PlannerSettings(
        state_addr=args.state_addr,
        dsn=args.dsn,
        broker_addr=args.broker_addr,
        listen=args.listen,
        pipeline_depth=args.pipeline_depth,
        max_batch=args.max_batch,
        max_batch_allocs=args.max_batch_allocs,
        fault=args.fault,
    )
    proc = PlannerProcess(settings)
    address = await proc.start()
    metrics = ""
    if args.metrics_listen:
        host = args.metrics_listen.rpartition(":")[0] or "127.0.0.1"
        metrics = f"{host}:{telemetry.start_metrics_server(args.metrics_listen)}"
    install_signal_handlers(proc.stop_event.set)
    write_ready_file(args.ready_file, role=ROLE, address=address, metrics=metrics)
    log.info("planner ready on %s", address)
    await proc.stop_event.wait()
    await proc.stop()
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    telemetry.setup_logging(ROLE)
    tune_gc()
    telemetry.setup_tracing("corral-planner")
    return asyncio.run(serve(args))


if __name__ == "__main__":
    sys.exit(main())
