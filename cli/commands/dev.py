"""`corral dev` (also `corral agent -dev`): a whole Corral on one machine.

Embedded PostgreSQL, migrations, then every role as its own process, started
by module name and in dependency order — state, broker, planner, worker, the
gateway and one client agent (exec, raw_exec and mock drivers; its tasks' Task
API proxies to the gateway) — each waited for through its ready file. Prints
a table of the processes, then watches them: Ctrl-C or SIGTERM stops every
role (SIGTERM, SIGKILL after a grace period) and the database, so nothing is
left running. A role (or the database) that exits
on its own is restarted after a backoff (1 s, doubling up to 30 s); one that
dies 5 times within a minute is given up on: everything is
stopped and the exit code is 1.

Data (PostgreSQL, logs, ready files, agent state) lives in `-data-dir`
(default `.corral/dev`), kept between runs; `-ephemeral` uses a new
directory removed at exit (inside `-data-dir` when one is given, else in
the system's temporary directory)."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import sys
import tempfile
import warnings
from pathlib import Path
from typing import TYPE_CHECKING

from cli import dev_metrics, dev_trust
from cli.client import DEFAULT_HTTP_PORT, ENV_HTTP_ADDR
from cli.context import CliError, Context
from cli.output import table
from cli.supervisor import (
    GRACE_SECONDS,
    GiveUp,
    RoleProcess,
    Shutdown,
    StartError,
    Supervised,
    SupervisedRole,
    Supervisor,
    shutdown_signals,
    stop_all,
)
from corral.runtime.settings import ADDRESS, REGION_NAME
from corral.security.keyring import write_kek_file
from corral.security.private_files import private_dir, write_private

if TYPE_CHECKING:
    from corral.devtools.pgserver import EmbeddedPostgres

DEFAULT_DATA_DIR = ".corral/dev"
DEFAULT_PORT = 4646
#: the keyring's key-encryption key in the data directory
KEK_FILE = "keyring.kek"


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "dev",
        help="Run a whole Corral locally (embedded PostgreSQL and every role)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_dev_flags(p)
    p.set_defaults(func=cmd_dev)


def add_dev_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "-data-dir",
        "--data-dir",
        dest="data_dir",
        default=None,
        help=f"where PostgreSQL data, logs and agent state live (default {DEFAULT_DATA_DIR})",
    )
    p.add_argument(
        "-ephemeral",
        "--ephemeral",
        action="store_true",
        help="use a new data directory, deleted at exit (inside -data-dir if given)",
    )
    p.add_argument(
        "-port",
        "--port",
        type=int,
        default=None,
        help=f"state service (public API) port (default {DEFAULT_PORT}; 0 = any free port)",
    )
    p.add_argument(
        "-http-port",
        "--http-port",
        dest="http_port",
        type=int,
        default=None,
        help=(
            f"HTTP gateway port: Nomad's /v1 API and the web UI (default {DEFAULT_HTTP_PORT}; "
            "any free one with -port 0; 0 = any free port)"
        ),
    )
    p.add_argument(
        "-metrics-port",
        "--metrics-port",
        dest="metrics_port",
        type=int,
        default=None,
        help=(
            "first of the roles' /metrics ports: state, broker, planner, worker, agent, gateway "
            f"(default {dev_metrics.DEFAULT_METRICS_PORT}..+5; any free ones with -port 0; "
            "0 = any free ones)"
        ),
    )
    p.add_argument("-bind", "--bind", default="127.0.0.1", help="address every role listens on")
    p.add_argument(
        "-dsn",
        "--dsn",
        default=os.environ.get("CORRAL_DSN", ""),
        help="use this PostgreSQL instead of the embedded one (env CORRAL_DSN)",
    )
    p.add_argument(
        "-workers",
        "--workers",
        type=int,
        default=None,
        help="scheduler loops in the worker process (default: the worker's own)",
    )
    p.add_argument(
        "-tls",
        "--tls",
        action="store_true",
        help="mutual TLS everywhere, with a throwaway CA in the data directory",
    )
    p.add_argument(
        "-acl",
        "--acl",
        action="store_true",
        help="enforce ACLs; prints the bootstrap (management) token",
    )
    p.add_argument(
        "-no-agent",
        "--no-agent",
        dest="no_agent",
        action="store_true",
        help="do not start the local client node",
    )
    p.add_argument(
        "-region",
        "--region",
        dest="region",
        default="global",
        help="this Corral's region (default global); regions federate with -join",
    )
    p.add_argument(
        "-join",
        "--join",
        dest="join",
        action="append",
        default=[],
        metavar="HOST:PORT",
        help="the state (public API) address of another region's Corral to federate with "
        "(repeatable); both regions then forward requests to each other",
    )
    p.add_argument(
        "-authoritative-region",
        "--authoritative-region",
        dest="authoritative_region",
        default="",
        help="the region whose ACL policies and global tokens this one replicates "
        "(default: this region)",
    )
    p.add_argument(
        "-tls-ca",
        "--tls-ca",
        dest="tls_ca",
        default=None,
        metavar="DIR",
        help="with -tls, sign this region's certificates with the CA in DIR (another dev "
        "region's <data-dir>/tls) instead of a new one: federated regions share a CA",
    )


def _port_free(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


RAW_EXEC_NOTICE = (
    "The dev agent enables the raw_exec driver: its tasks run as you, without "
    "isolation. Agents outside dev mode leave it off unless --drivers names it."
)


def _say(text: str) -> None:
    print(f"==> {text}", flush=True)


def _acl_sentence(acl: bool, replicated_from: str) -> str:
    """What the start-up message says of ACLs: a region that replicates
    them has no bootstrap token of its own to print."""
    if not acl:
        return ""
    if replicated_from:
        return (
            f". ACLs are on, replicated from region {replicated_from}: "
            f"use a global token of {replicated_from}"
        )
    return ". ACLs are on; the bootstrap (management) token is below"


def _check_federation_flags(args: argparse.Namespace) -> None:
    for what, value in (
        ("-region", args.region),
        ("-authoritative-region", args.authoritative_region),
    ):
        if value and not REGION_NAME.match(value):
            raise CliError(f"{what}: {value!r} is not a region name (letters, digits, - and _)")
    for address in args.join:
        if not ADDRESS.match(address):
            raise CliError(f"-join: {address!r} is not host:port")
    if args.tls_ca and not args.tls:
        raise CliError("-tls-ca needs -tls")


def cmd_dev(args: argparse.Namespace, ctx: Context) -> int:
    _check_federation_flags(args)
    port = DEFAULT_PORT if args.port is None else args.port
    if port < 0 or port > 65535:
        raise CliError("-port must be 0..65535")
    if port and not _port_free(args.bind, port):
        raise CliError(
            f"port {port} on {args.bind} is in use (is another `corral dev` running?); "
            "stop it or pick another port with -port"
        )
    http_port = args.http_port
    if http_port is None:
        http_port = 0 if port == 0 else DEFAULT_HTTP_PORT
    if http_port < 0 or http_port > 65535:
        raise CliError("-http-port must be 0..65535")
    if http_port and not _port_free(args.bind, http_port):
        raise CliError(
            f"HTTP port {http_port} on {args.bind} is in use (is another `corral dev` "
            "running?); stop it or pick another port with -http-port (0 = any free port)"
        )
    args.http_port = http_port
    metrics_base = dev_metrics.base_port(args.metrics_port, port)
    if metrics_base < 0 or metrics_base > 65535 - len(dev_metrics.ROLES):
        raise CliError(f"-metrics-port must be 0..{65535 - len(dev_metrics.ROLES)}")
    args.metrics_ports = dev_metrics.metrics_ports(metrics_base)
    busy = dev_metrics.ports_in_use(args.bind, args.metrics_ports)
    if busy:
        raise CliError(
            f"metrics ports in use on {args.bind}: {', '.join(busy)} (is another `corral dev` "
            "running?); pick others with -metrics-port (0 = any free ones)"
        )
    data_dir = data_directory(args.data_dir, ephemeral=args.ephemeral)
    logs = data_dir / "logs"
    run = data_dir / "run"
    roles: list[RoleProcess] = []
    pg = None
    code = 0
    with shutdown_signals():
        try:
            _say(f"Data directory: {data_dir}{' (ephemeral)' if args.ephemeral else ''}")
            dsn = args.dsn
            if not dsn:
                _say("Starting embedded PostgreSQL")
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    from corral.devtools.pgserver import EmbeddedPostgres

                    pg = EmbeddedPostgres(
                        data_dir / "pg", delete_on_stop=args.ephemeral, private_parent=data_dir
                    )
                    # A signal in the middle of start() would leave a server we
                    # hold no handle to; hold signals until it has returned.
                    held = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP}
                    signal.pthread_sigmask(signal.SIG_BLOCK, held)
                    try:
                        dsn = pg.start()
                    except Exception as exc:
                        raise StartError(f"the embedded PostgreSQL did not start: {exc}") from None
                    finally:
                        signal.pthread_sigmask(signal.SIG_UNBLOCK, held)
            env = dict(os.environ)
            env.update({"CORRAL_DSN": dsn, "PYTHONUNBUFFERED": "1"})
            try:
                trust = dev_trust.prepare(
                    data_dir,
                    tls=args.tls,
                    acl=args.acl,
                    region=args.region,
                    ca_dir=Path(args.tls_ca) if args.tls_ca else None,
                )
            except RuntimeError as exc:
                raise StartError(str(exc)) from None
            env.pop("CORRAL_ADDR", None)
            _say("Applying migrations")
            _migrate(dsn, env, logs / "migrate.log")
            code = _run_roles(args, data_dir, logs, run, env, dsn, port, roles, trust, pg)
        except Shutdown as sig:
            print(f"\n==> Caught {sig}, shutting down", flush=True)
        except StartError as exc:
            print(f"Error: {exc}", file=sys.stderr, flush=True)
            code = 1
        finally:
            # No signal may interrupt the orderly stop below.
            for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
                signal.signal(signum, signal.SIG_IGN)
            if roles:
                _say("Stopping " + ", ".join(r.role for r in reversed(roles) if r.proc))
                killed = stop_all(roles)
                if killed:
                    _say(f"Killed after {GRACE_SECONDS:g}s grace: {', '.join(killed)}")
            if pg is not None:
                _say("Stopping PostgreSQL")
                try:
                    pg.stop()
                except Exception as exc:  # report, keep cleaning up
                    print(f"Error: stopping PostgreSQL: {exc}", file=sys.stderr)
            (data_dir / "dev.json").unlink(missing_ok=True)
            if args.ephemeral:
                shutil.rmtree(data_dir, ignore_errors=True)
            _say("Stopped")
    return code


def _migrate(dsn: str, env: dict[str, str], log_path: Path) -> None:
    import subprocess

    from cli.supervisor import module_exists

    if not module_exists("services.state"):
        raise StartError("role state: module services.state does not exist yet; cannot migrate")
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:
        proc = subprocess.run(
            [sys.executable, "-m", "services.state", "migrate", "--dsn", dsn],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            stdin=subprocess.DEVNULL,
            check=False,
        )
    if proc.returncode != 0:
        tail = log_path.read_text(errors="replace").splitlines()[-8:]
        raise StartError(
            "migrations failed; last lines of " + str(log_path) + ":\n    " + "\n    ".join(tail)
        )


def data_directory(given: str | None, *, ephemeral: bool) -> Path:
    """The run's data directory, created: `given` (default .corral/dev)
    kept between runs, or with `ephemeral` a new one inside `given` (or the
    system's temporary directory) that the caller removes at exit."""
    if ephemeral:
        parent = Path(given).resolve() if given else None
        if parent is not None:
            parent.mkdir(parents=True, exist_ok=True)
        return Path(tempfile.mkdtemp(prefix="corral-dev-", dir=parent))  # made 0700
    # 0700: it holds dev.json (the exports, the management token), the ACL
    # bootstrap token, the throwaway CA's key and the agent's secret
    return private_dir(Path(given or DEFAULT_DATA_DIR).resolve())


def _run_roles(
    args: argparse.Namespace,
    data_dir: Path,
    logs: Path,
    run: Path,
    env: dict[str, str],
    dsn: str,
    port: int,
    roles: list[RoleProcess],
    trust: dev_trust.DevTrust,
    pg: EmbeddedPostgres | None,
) -> int:
    """Start every role in order, then supervise them (and the embedded
    PostgreSQL) until a signal, or until one keeps dying (exit 1)."""
    bind = args.bind
    role_envs: dict[str, dict[str, str]] = {}

    def start(role: str, argv: list[str], extra_env: dict[str, str] | None = None) -> RoleProcess:
        rp = RoleProcess(role, f"services.{role}", argv, logs / f"{role}.log", run / f"{role}.json")
        roles.append(rp)
        _say(f"Starting {role}")
        role_env = {**env, **trust.role_env(role), **(extra_env or {})}
        role_env[f"CORRAL_{role.upper()}_LISTEN"] = argv[argv.index("--listen") + 1]
        # the role's fixed metrics port (cli/dev_metrics.py)
        metrics_listen = f"{bind}:{args.metrics_ports.get(role, 0)}"
        argv[argv.index("--metrics-listen") + 1] = metrics_listen
        role_env[f"CORRAL_{role.upper()}_METRICS_LISTEN"] = metrics_listen
        role_envs[role] = role_env
        rp.start(role_env)
        rp.wait_ready()
        return rp

    # the keyring's key-encryption key: one per data directory, kept across
    # restarts (variables stay readable), mode 0600
    kek = data_dir / KEK_FILE
    write_kek_file(kek)
    keyring_env = {"CORRAL_KEYRING_KEK_FILE": str(kek)}
    if args.http_port:
        # workload identities name the gateway, which serves their JWKS
        scheme = "https" if trust.tls else "http"
        keyring_env["CORRAL_OIDC_ISSUER"] = f"{scheme}://{bind}:{args.http_port}"
    federation_env = {}
    if args.join:
        federation_env["CORRAL_FEDERATION_PEERS"] = ",".join(args.join)
    if args.authoritative_region:
        federation_env["CORRAL_AUTHORITATIVE_REGION"] = args.authoritative_region
    state = start(
        "state",
        ["--dsn", dsn, "--listen", f"{bind}:{port}", "--metrics-listen", f"{bind}:0"],
        {**keyring_env, **federation_env},
    )
    env["CORRAL_STATE_ADDR"] = state.address
    replicated = bool(args.authoritative_region) and args.authoritative_region != args.region
    if trust.acl and replicated:
        _say(
            f"ACLs are replicated from region {args.authoritative_region}: use its tokens "
            "(its management token works here once replicated)"
        )
    elif trust.acl:
        try:
            dev_trust.bootstrap(trust, data_dir, state.address)
        except RuntimeError as exc:
            raise StartError(str(exc)) from None
    broker = start(
        "broker",
        [
            "--dsn",
            dsn,
            "--state-addr",
            state.address,
            "--listen",
            f"{bind}:0",
            "--metrics-listen",
            f"{bind}:0",
        ],
    )
    env["CORRAL_BROKER_ADDR"] = broker.address
    planner = start(
        "planner",
        [
            "--dsn",
            dsn,
            "--state-addr",
            state.address,
            "--broker-addr",
            broker.address,
            "--listen",
            f"{bind}:0",
            "--metrics-listen",
            f"{bind}:0",
        ],
    )
    env["CORRAL_PLANNER_ADDR"] = planner.address
    worker_env = {}
    if args.workers is not None:
        worker_env["CORRAL_WORKER_NUM_SCHEDULERS"] = str(args.workers)
    start(
        "worker",
        [
            "--state-addr",
            state.address,
            "--broker-addr",
            broker.address,
            "--planner-addr",
            planner.address,
            "--listen",
            f"{bind}:0",
            "--metrics-listen",
            f"{bind}:0",
        ],
        worker_env,
    )
    gateway = start(
        "gateway",
        [
            "--state-addr",
            state.address,
            "--listen",
            f"{bind}:{args.http_port}",
            "--metrics-listen",
            f"{bind}:0",
        ],
    )
    http_addr = str(gateway.info.get("http_addr") or f"http://{gateway.address}")
    if not args.no_agent:
        # as `nomad agent -dev`: raw_exec on, which no agent has otherwise;
        # after the gateway: its tasks' Task API sockets proxy to it
        _say(RAW_EXEC_NOTICE)
        agent_dir = private_dir(data_dir / "agent")
        start(
            "agent",
            [
                "--state-addr",
                state.address,
                "--listen",
                f"{bind}:0",
                "--metrics-listen",
                f"{bind}:0",
            ],
            {
                "CORRAL_AGENT_DATA_DIR": str(agent_dir),
                "CORRAL_AGENT_DRIVERS": "exec,raw_exec,mock",
                # a dev agent leaves nothing behind (a killed one is restarted
                # by the supervisor and adopts its tasks)
                "CORRAL_AGENT_STOP_TASKS_ON_SHUTDOWN": "true",
                "CORRAL_AGENT_NODE_NAME": socket.gethostname(),
                "CORRAL_AGENT_GATEWAY_ADDR": http_addr,
            },
        )

    summary = {
        r.role: {
            "pid": r.pid,
            "address": r.address,
            "metrics": r.info.get("metrics", ""),
            "log": str(r.log_path),
        }
        for r in roles
    }
    write_private(
        data_dir / "dev.json",
        json.dumps(
            {
                "address": state.address,
                "http_addr": http_addr,
                "data_dir": str(data_dir),
                "dsn": dsn,
                "roles": summary,
                "tls": trust.tls is not None,
                "acl": trust.acl,
                "exports": trust.exports(),
            },
            indent=2,
        ),
    )
    scrape = dev_metrics.write_scrape_config(
        data_dir, {r: v["metrics"] for r, v in summary.items()}
    )
    print()
    table(
        ("Role", "PID", "Address", "Metrics", "Log"),
        [
            (r.role, r.pid, r.address, r.info.get("metrics") or "-", os.path.relpath(r.log_path))
            for r in roles
        ],
    )
    federated = f" Region {args.region}" + (
        f", federated with {', '.join(args.join)}" if args.join else ""
    )
    other_http = args.http_port != DEFAULT_HTTP_PORT
    print(
        f"\nCorral is running.{federated}. The public API is at {state.address}"
        + (" (mutual TLS)" if trust.tls else "")
        + _acl_sentence(trust.acl, args.authoritative_region if replicated else "")
        + f".\nNomad's HTTP API is at {http_addr}/v1 and the web UI at {http_addr}/ui"
        + ".\nIn another terminal:\n\n"
        + (f"    export CORRAL_ADDR={state.address}\n" if port != DEFAULT_PORT else "")
        + (f"    export {ENV_HTTP_ADDR}={http_addr}\n" if other_http else "")
        + "".join(f"    {line}\n" for line in trust.exports())
        + "    corral job run examples/hello.nomad.hcl\n"
        "    corral job status hello\n\n"
        f"Prometheus scrapes the metrics with {os.path.relpath(scrape)}.\n"
        "Press Ctrl-C to stop everything.\n",
        flush=True,
    )
    supervised: list[Supervised] = []
    if pg is not None:
        supervised.append(_SupervisedPostgres(pg))
    for r in roles:
        item = SupervisedRole(r, role_envs[r.role])
        item.pin_address()
        supervised.append(item)
    try:
        Supervisor(supervised, say=_say).run()
    except GiveUp as exc:
        print(f"Error: {exc}", file=sys.stderr, flush=True)
    return 1


class _SupervisedPostgres(Supervised):
    """The embedded PostgreSQL: restarted in place (same data directory and
    socket, so every role's DSN still works; they reconnect by themselves)."""

    name = "postgres"

    def __init__(self, pg: EmbeddedPostgres) -> None:
        self.pg = pg

    def exit_code(self) -> int | None:
        return None if self.pg.alive() else -1

    def restart(self) -> None:
        self.pg.restart()

    def tail(self) -> str:
        log = self.pg.data_dir / "log"
        try:
            lines = log.read_text(errors="replace").splitlines()[-20:]
        except OSError:
            return "    (no log)"
        return "\n".join(f"    {line}" for line in lines)
