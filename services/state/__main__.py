"""`python -m services.state` — run a state service process.

    python -m services.state --dsn DSN [--listen 127.0.0.1:0] [--ready-file F]
    python -m services.state migrate --dsn DSN

Migrations are applied on start-up (and by `migrate`, which `corral state
migrate` runs); several state processes may share one database.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys

from corral import telemetry
from corral.process import env_flag, tune_gc, write_ready_file
from corral.server import install_signal_handlers
from services.state.app import StateApp, StateSettings
from services.state.db.migrate import upgrade
from services.state.heartbeat import HeartbeatSettings

log = logging.getLogger("services.state")


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m services.state", description=__doc__)
    parser.add_argument("command", nargs="?", default="serve", choices=["serve", "migrate"])
    env_flag(parser, "--dsn", "CORRAL_DSN", help="PostgreSQL DSN")
    env_flag(
        parser, "--listen", "CORRAL_STATE_LISTEN", default="127.0.0.1:0", help="gRPC listen address"
    )
    env_flag(
        parser,
        "--metrics-listen",
        "CORRAL_STATE_METRICS_LISTEN",
        default="",
        help="Prometheus host:port",
    )
    env_flag(
        parser,
        "--ready-file",
        "CORRAL_STATE_READY_FILE",
        default="",
        help="write address here once listening",
    )
    env_flag(
        parser,
        "--log-retention",
        "CORRAL_STATE_LOG_RETENTION",
        default=50_000,
        type=int,
        help="change-log entries kept for lagging subscribers",
    )
    env_flag(
        parser,
        "--advertise",
        "CORRAL_ADVERTISE_ADDR",
        default="",
        help="address others reach this process at",
    )
    env_flag(
        parser,
        "--heartbeat-min-ttl",
        "CORRAL_HEARTBEAT_MIN_TTL",
        default=10.0,
        type=float,
        help="min node TTL (s)",
    )
    env_flag(
        parser,
        "--heartbeat-grace",
        "CORRAL_HEARTBEAT_GRACE",
        default=10.0,
        type=float,
        help="grace after TTL (s)",
    )
    env_flag(
        parser,
        "--heartbeat-failover-ttl",
        "CORRAL_HEARTBEAT_FAILOVER_TTL",
        default=300.0,
        type=float,
        help="TTL every node gets after a leader change (s)",
    )
    env_flag(
        parser,
        "--heartbeats-per-second",
        "CORRAL_HEARTBEATS_PER_SECOND",
        default=50.0,
        type=float,
        help="cluster heartbeat rate the TTL is sized for",
    )
    args = parser.parse_args(argv)
    if not args.dsn:
        parser.error("--dsn (or CORRAL_DSN) is required")
    return args


async def serve(args: argparse.Namespace) -> int:
    upgrade(args.dsn)
    heartbeat = HeartbeatSettings(
        min_ttl=args.heartbeat_min_ttl,
        grace=args.heartbeat_grace,
        failover_ttl=args.heartbeat_failover_ttl,
        max_per_second=args.heartbeats_per_second,
    )
    app = StateApp(
        StateSettings(
            dsn=args.dsn,
            listen=args.listen,
            advertise=args.advertise,
            log_retention=args.log_retention,
            heartbeat=heartbeat,
        )
    )
    address = await app.start()
    metrics = ""
    if args.metrics_listen:
        host = args.metrics_listen.rpartition(":")[0] or "127.0.0.1"
        metrics = f"{host}:{telemetry.start_metrics_server(args.metrics_listen)}"
    stopping: list[asyncio.Task[None]] = []
    install_signal_handlers(lambda: stopping.append(asyncio.ensure_future(app.stop())))
    write_ready_file(
        args.ready_file, role="state", address=args.advertise or address, metrics=metrics
    )
    log.info("state service ready", extra={"index": app.feed.index})
    await app.wait_stopped()
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    telemetry.setup_logging("state")
    tune_gc()
    telemetry.setup_tracing("corral-state")
    if args.command == "migrate":
        revision = upgrade(args.dsn)
        print(f"database migrated to revision {revision}")
        return 0
    return asyncio.run(serve(args))


if __name__ == "__main__":
    sys.exit(main())
