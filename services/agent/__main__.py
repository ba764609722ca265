"""`python -m services.agent` — a client node: runs allocations with the
raw_exec and mock drivers and serves their logs.

    python -m services.agent --state-addr HOST:PORT [--data-dir DIR]
        [--datacenter dc1] [--node-class C] [--meta k=v ...] [--drivers raw_exec,mock]
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import socket
import sys
from pathlib import Path

from corral import telemetry
from corral.process import env_flag, new_member_id, register_member_loop, tune_gc, write_ready_file
from corral.server import GrpcServer, install_signal_handlers
from corral.v1 import alloc_pb2, alloc_pb2_grpc, state_pb2
from services.agent.client import Agent, AgentSettings
from services.agent.handlers import ClientAllocServicer

log = logging.getLogger("services.agent")


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m services.agent", description=__doc__)
    env_flag(p, "--state-addr", "CORRAL_STATE_ADDR", help="state service host:port")
    env_flag(
        p,
        "--data-dir",
        "CORRAL_AGENT_DATA_DIR",
        default=".corral/agent",
        help="alloc and state files",
    )
    env_flag(p, "--datacenter", "CORRAL_AGENT_DATACENTER", default="dc1", help="datacenter")
    env_flag(p, "--node-class", "CORRAL_AGENT_NODE_CLASS", default="", help="node class")
    env_flag(p, "--node-pool", "CORRAL_AGENT_NODE_POOL", default="default", help="node pool")
    env_flag(p, "--name", "CORRAL_AGENT_NODE_NAME", default=socket.gethostname(), help="node name")
    env_flag(
        p, "--drivers", "CORRAL_AGENT_DRIVERS", default="raw_exec,mock", help="enabled drivers"
    )
    env_flag(
        p,
        "--listen",
        "CORRAL_AGENT_LISTEN",
        default="127.0.0.1:0",
        help="ClientAlloc (logs) address",
    )
    env_flag(
        p,
        "--metrics-listen",
        "CORRAL_AGENT_METRICS_LISTEN",
        default="",
        help="Prometheus host:port",
    )
    env_flag(
        p,
        "--ready-file",
        "CORRAL_AGENT_READY_FILE",
        default="",
        help="write address here once registered",
    )
    p.add_argument("--meta", action="append", default=[], help="node meta k=v (repeatable)")
    args = p.parse_args(argv)
    if not args.state_addr:
        p.error("--state-addr (or CORRAL_STATE_ADDR) is required")
    for kv in args.meta:
        if "=" not in kv:
            p.error(f"--meta expects key=value, got {kv!r}")
    return args


async def run(args: argparse.Namespace) -> int:
    data_dir = Path(args.data_dir).resolve()
    data_dir.mkdir(parents=True, exist_ok=True)
    stop = asyncio.Event()
    server = GrpcServer(args.listen, name="agent")
    server.add(
        alloc_pb2_grpc.add_ClientAllocServicer_to_server,
        ClientAllocServicer(data_dir, server.shutting_down),
        alloc_pb2.DESCRIPTOR.services_by_name["ClientAlloc"].full_name,
    )
    await server.start()
    settings = AgentSettings(
        state_addr=args.state_addr,
        data_dir=data_dir,
        datacenter=args.datacenter,
        node_class=args.node_class,
        node_pool=args.node_pool,
        name=args.name,
        meta=dict(kv.split("=", 1) for kv in args.meta),
        drivers=[d for d in args.drivers.split(",") if d],
        http_addr=server.bound_address,
    )
    agent = Agent(settings)
    await agent.start()
    install_signal_handlers(stop.set)
    member = state_pb2.Member(
        id=new_member_id("agent"), role="agent", address=server.bound_address, version="1"
    )
    member.tags["node_id"] = agent.node.id
    member_task = asyncio.create_task(register_member_loop(args.state_addr, member, stop))
    metrics = ""
    if args.metrics_listen:
        host = args.metrics_listen.rpartition(":")[0] or "127.0.0.1"
        metrics = f"{host}:{telemetry.start_metrics_server(args.metrics_listen)}"
    write_ready_file(
        args.ready_file,
        role="agent",
        address=server.bound_address,
        metrics=metrics,
        node_id=agent.node.id,
    )
    log.info("client agent ready: node %s", agent.node.id)
    await stop.wait()
    await agent.stop()
    member_task.cancel()
    await server.stop(grace=2.0)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    telemetry.setup_logging("agent")
    tune_gc()
    return asyncio.run(run(args))


if __name__ == "__main__":
    sys.exit(main())
