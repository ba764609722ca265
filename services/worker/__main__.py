"""`python -m services.worker` — a worker process: a pool of scheduler loops
sharing one replica, plus the `Worker` admin API.

    python -m services.worker --state-addr ADDR --broker-addr ADDR[,ADDR]
        --planner-addr ADDR[,ADDR] [--num-schedulers N] [--schedulers service,batch,...]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import sys

import grpc

from corral import structs, telemetry
from corral.process import env_flag, new_member_id, register_member_loop, tune_gc, write_ready_file
from corral.replica import Replica
from corral.server import GrpcServer, install_signal_handlers
from corral.v1 import (
    eval_pb2_grpc,
    plan_pb2_grpc,
    state_pb2,
    state_pb2_grpc,
    worker_pb2,
    worker_pb2_grpc,
)
from services.worker.clients import LeaderClient
from services.worker.config import WorkerSettings, default_num_schedulers
from services.worker.handlers import WorkerAdminServicer
from services.worker.pool import WorkerPool

log = logging.getLogger("services.worker")


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m services.worker", description=__doc__)
    env_flag(p, "--state-addr", "CORRAL_STATE_ADDR", help="state service address")
    env_flag(p, "--broker-addr", "CORRAL_BROKER_ADDR", help="broker address(es), comma-separated")
    env_flag(
        p, "--planner-addr", "CORRAL_PLANNER_ADDR", help="planner address(es), comma-separated"
    )
    env_flag(
        p,
        "--listen",
        "CORRAL_WORKER_LISTEN",
        default="127.0.0.1:0",
        help="admin API listen address",
    )
    env_flag(
        p,
        "--advertise",
        "CORRAL_ADVERTISE_ADDR",
        default="",
        help="address others reach this process at",
    )
    env_flag(
        p,
        "--metrics-listen",
        "CORRAL_WORKER_METRICS_LISTEN",
        default="",
        help="Prometheus host:port",
    )
    env_flag(
        p,
        "--ready-file",
        "CORRAL_WORKER_READY_FILE",
        default="",
        help="write address here once listening",
    )
    env_flag(
        p,
        "--num-schedulers",
        "CORRAL_WORKER_NUM_SCHEDULERS",
        default=default_num_schedulers(),
        type=int,
        help="scheduler loops",
    )
    env_flag(
        p,
        "--schedulers",
        "CORRAL_WORKER_SCHEDULERS",
        default=",".join(structs.JobType.ALL),
        help="enabled scheduler types",
    )
    env_flag(
        p,
        "--sync-limit",
        "CORRAL_WORKER_SYNC_LIMIT",
        default=5.0,
        type=float,
        help="index wait (s)",
    )
    env_flag(
        p,
        "--slow-catchup",
        "CORRAL_WORKER_SLOW_CATCHUP",
        default=50.0,
        type=float,
        help="long backoff (s)",
    )
    env_flag(
        p,
        "--scheduler-version",
        "CORRAL_WORKER_SCHEDULER_VERSION",
        default=structs.SCHEDULER_VERSION,
        type=int,
        help="scheduler version sent on dequeue (rolling upgrades)",
    )
    env_flag(
        p,
        "--fault",
        "CORRAL_WORKER_FAULT",
        default="",
        help="test-only fault injection: stall-before-ack",
    )
    args = p.parse_args(argv)
    for flag in ("state_addr", "broker_addr", "planner_addr"):
        if not getattr(args, flag):
            p.error(f"--{flag.replace('_', '-')} is required")
    return args


async def run(args: argparse.Namespace) -> int:
    settings = WorkerSettings(
        state_addr=args.state_addr,
        broker_addrs=args.broker_addr.split(","),
        planner_addrs=args.planner_addr.split(","),
        listen=args.listen,
        num_schedulers=args.num_schedulers,
        enabled_schedulers=[s for s in args.schedulers.split(",") if s],
        scheduler_version=args.scheduler_version,
        sync_limit=args.sync_limit,
        slow_catchup=args.slow_catchup,
        fault=args.fault,
    )
    replica = Replica(settings.state_addr, name="worker")
    await replica.start()
    broker = LeaderClient(settings.broker_addrs, eval_pb2_grpc.EvalStub)
    planner = LeaderClient(settings.planner_addrs, plan_pb2_grpc.PlanStub)
    state_channel = grpc.aio.insecure_channel(settings.state_addr)
    pool = WorkerPool(settings, replica, broker, planner, state_pb2_grpc.StateStub(state_channel))

    server = GrpcServer(settings.listen, name="worker")
    process_id = new_member_id("worker")
    admin = WorkerAdminServicer(pool, process_id)
    server.add(
        worker_pb2_grpc.add_WorkerServicer_to_server,
        admin,
        worker_pb2.DESCRIPTOR.services_by_name["Worker"].full_name,
    )
    await server.start()
    address = args.advertise or server.bound_address
    admin.address = address
    await pool.start()

    stop = asyncio.Event()
    install_signal_handlers(stop.set)
    member = state_pb2.Member(id=process_id, role="worker", address=address, version="1")
    member_task = asyncio.create_task(register_member_loop(settings.state_addr, member, stop))
    metrics = ""
    if args.metrics_listen:
        host = args.metrics_listen.rpartition(":")[0] or "127.0.0.1"
        metrics = f"{host}:{telemetry.start_metrics_server(args.metrics_listen)}"
    write_ready_file(args.ready_file, role="worker", address=address, metrics=metrics)
    log.info("worker ready with %d scheduler loops", settings.num_schedulers)

    await stop.wait()
    log.info("worker shutting down")
    await pool.stop()
    await server.stop(grace=5.0)
    member_task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await member_task
    await replica.stop()
    await broker.close()
    await planner.close()
    await state_channel.close()
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    telemetry.setup_logging("worker")
    tune_gc()
    telemetry.setup_tracing("corral-worker")
    return asyncio.run(run(args))


if __name__ == "__main__":
    sys.exit(main())
