"""`corral operator scheduler get-config|set-config`, `operator worker
status|pause|resume|config` (Nomad's scheduler worker API), `operator
members` (every registered process of every role), `operator root
keyring list|rotate|remove` (the keyring of Variables and workload
identities) and `operator snapshot save|restore|inspect` (snapshot.py)."""

from __future__ import annotations

import argparse

import grpc

from cli.commands import group, keyring, snapshot
from cli.commands.server import replication_line, show_links
from cli.context import CliError, Context, common, grpc_message
from cli.output import fmt_ago, heading, kv, print_json, short, table, to_dict
from corral.v1 import federation_pb2, operator_pb2, state_pb2, worker_pb2
from corral.v1 import structs_pb2 as pb

SCHEDULERS = ("service", "batch", "system", "sysbatch", "_core")


def _bool(text: str) -> bool:
    lowered = text.lower()
    if lowered in ("true", "1", "yes", "on"):
        return True
    if lowered in ("false", "0", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    op = group(sub, "operator", "Scheduler configuration, worker pools and cluster members")

    sched = op.add_parser("scheduler", help="Scheduler configuration").add_subparsers(
        dest="scheduler_command", metavar="<subcommand>"
    )
    p = sched.add_parser("get-config", help="Show the scheduler configuration")
    common(p, json=True)
    p.set_defaults(func=cmd_get_config)

    p = sched.add_parser("set-config", help="Change the scheduler configuration")
    p.add_argument(
        "-scheduler-algorithm",
        "--scheduler-algorithm",
        dest="algorithm",
        choices=("binpack", "spread"),
        default=None,
    )
    for kind in ("system", "sysbatch", "batch", "service"):
        p.add_argument(
            f"-preempt-{kind}-scheduler",
            f"--preempt-{kind}-scheduler",
            dest=f"preempt_{kind}",
            type=_bool,
            default=None,
            metavar="BOOL",
        )
    p.add_argument(
        "-memory-oversubscription",
        "--memory-oversubscription",
        dest="oversub",
        type=_bool,
        default=None,
        metavar="BOOL",
    )
    p.add_argument(
        "-pause-eval-broker",
        "--pause-eval-broker",
        dest="pause_broker",
        type=_bool,
        default=None,
        metavar="BOOL",
    )
    p.add_argument("-check-index", "--check-index", dest="check_index", type=int, default=None)
    common(p, json=True)
    p.set_defaults(func=cmd_set_config)

    workers = op.add_parser(
        "worker", help="Scheduler worker pools (Nomad's worker API)"
    ).add_subparsers(dest="worker_command", metavar="<subcommand>")
    p = workers.add_parser("status", help="Every worker process and its scheduler loops")
    _worker_address_flag(p)
    common(p, json=True, verbose=True)
    p.set_defaults(func=cmd_worker_status)
    for name, help_text in (("pause", "Pause scheduler loops"), ("resume", "Resume paused loops")):
        p = workers.add_parser(name, help=help_text)
        p.add_argument(
            "-worker-id",
            "--worker-id",
            dest="worker_ids",
            action="append",
            default=[],
            help="a loop id (repeatable); default every loop",
        )
        p.add_argument(
            "-process",
            "--process",
            dest="process",
            default="",
            help="only this worker process (id or address)",
        )
        _worker_address_flag(p)
        common(p, json=True, verbose=True)
        p.set_defaults(func=cmd_worker_control, action=name)
    p = workers.add_parser("config", help="Show or set a worker pool's size and enabled schedulers")
    p.add_argument("-num-schedulers", "--num-schedulers", dest="num", type=int, default=None)
    p.add_argument(
        "-enabled-schedulers",
        "--enabled-schedulers",
        dest="enabled",
        default=None,
        help="comma-separated: service,batch,system,sysbatch,_core",
    )
    p.add_argument("-process", "--process", dest="process", default="")
    _worker_address_flag(p)
    common(p, json=True)
    p.set_defaults(func=cmd_worker_config)

    keyring.register(op)
    snapshot.register(op)

    p = op.add_parser("members", help="Registered processes of every role, with leaders")
    p.add_argument("-role", "--role", default="")
    p.add_argument(
        "-all-regions",
        "--all-regions",
        dest="all_regions",
        action="store_true",
        help="the members of every region this one knows (each asked through forwarding)",
    )
    common(p, json=True, verbose=True)
    p.set_defaults(func=cmd_members)


def _worker_address_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "-worker-address",
        "--worker-address",
        dest="worker_addresses",
        action="append",
        default=[],
        metavar="HOST:PORT",
        help="talk to this worker process directly (repeatable) instead of finding "
        "workers through the state service's member list",
    )


def _show_config(
    ctx: Context, resp: operator_pb2.SchedulerConfigurationResponse, as_json: bool
) -> None:
    if as_json:
        print_json(resp, ctx.out)
        return
    c = resp.config
    pc = c.preemption_config
    kv(
        [
            ("Scheduler Algorithm", c.scheduler_algorithm or "binpack"),
            ("Memory Oversubscription", str(c.memory_oversubscription_enabled).lower()),
            ("Pause Eval Broker", str(c.pause_eval_broker).lower()),
            ("Preemption System Scheduler", str(pc.system_scheduler_enabled).lower()),
            ("Preemption Service Scheduler", str(pc.service_scheduler_enabled).lower()),
            ("Preemption Batch Scheduler", str(pc.batch_scheduler_enabled).lower()),
            ("Preemption SysBatch Scheduler", str(pc.sysbatch_scheduler_enabled).lower()),
            ("Modify Index", c.modify_index),
        ],
        ctx.out,
    )


def cmd_get_config(args: argparse.Namespace, ctx: Context) -> int:
    resp = ctx.client.operator.SchedulerGetConfiguration(
        operator_pb2.SchedulerGetConfigurationRequest(), timeout=30
    )
    _show_config(ctx, resp, args.json)
    return 0


def cmd_set_config(args: argparse.Namespace, ctx: Context) -> int:
    current = ctx.client.operator.SchedulerGetConfiguration(
        operator_pb2.SchedulerGetConfigurationRequest(), timeout=30
    )
    cfg = pb.SchedulerConfiguration()
    cfg.CopyFrom(current.config)
    changed = False
    if args.algorithm is not None:
        cfg.scheduler_algorithm, changed = args.algorithm, True
    for kind in ("system", "sysbatch", "batch", "service"):
        value = getattr(args, f"preempt_{kind}")
        if value is not None:
            setattr(cfg.preemption_config, f"{kind}_scheduler_enabled", value)
            changed = True
    if args.oversub is not None:
        cfg.memory_oversubscription_enabled, changed = args.oversub, True
    if args.pause_broker is not None:
        cfg.pause_eval_broker, changed = args.pause_broker, True
    if not changed:
        raise CliError(
            "nothing to change: give at least one flag "
            "(see `corral operator scheduler set-config -h`)"
        )
    req = operator_pb2.SchedulerSetConfigurationRequest(config=cfg)
    if args.check_index is not None:
        req.cas = True
        req.config.modify_index = args.check_index
    resp = ctx.client.operator.SchedulerSetConfiguration(req, timeout=30)
    if args.json:
        print_json(resp, ctx.out)
        return 0
    if req.cas and not resp.updated:
        raise CliError(
            f"the configuration changed since index {args.check_index}; nothing was written"
        )
    ctx.out.write("Scheduler configuration updated!\n")
    return 0


def _worker_members(
    ctx: Context, process: str = "", addresses: list[str] | None = None
) -> list[state_pb2.Member]:
    """Worker processes: the given addresses, else those registered with the
    state service (Operator.Members(role="worker"))."""
    if addresses:
        return [state_pb2.Member(id=a, role="worker", address=a) for a in addresses]
    members = list(
        ctx.client.operator.Members(operator_pb2.MembersRequest(role="worker"), timeout=30).members
    )
    if process:
        members = [m for m in members if m.id.startswith(process) or m.address == process]
    if not members:
        raise CliError(
            "no worker processes are registered" + (f" matching {process!r}" if process else "")
        )
    return members


def cmd_worker_status(args: argparse.Namespace, ctx: Context) -> int:
    results = []
    for m in _worker_members(ctx, "", args.worker_addresses):
        results.append(
            ctx.client.worker(m.address).List(worker_pb2.WorkerListRequest(), timeout=30)
        )
    if args.json:
        print_json(results, ctx.out)
        return 0
    for r in results:
        heading(
            f"Worker process {r.process_id} at {r.address} (replica index {r.replica_index})",
            ctx.out,
        )
        table(
            ("Worker ID", "Status", "Workload", "Schedulers", "Evals", "Current Eval", "Started"),
            [
                (
                    short(w.id, args.verbose),
                    w.status,
                    w.workload_status,
                    ",".join(w.enabled_schedulers),
                    w.evals_processed,
                    short(w.current_eval_id, args.verbose) or "<none>",
                    fmt_ago(w.started),
                )
                for w in r.workers
            ],
            ctx.out,
        )
    return 0


def cmd_worker_control(args: argparse.Namespace, ctx: Context) -> int:
    results = []
    req = worker_pb2.WorkerControlRequest(worker_ids=args.worker_ids)
    for m in _worker_members(ctx, args.process, args.worker_addresses):
        stub = ctx.client.worker(m.address)
        call = stub.Pause if args.action == "pause" else stub.Resume
        results.append(call(req, timeout=30))
    if args.json:
        print_json(results, ctx.out)
        return 0
    for r in results:
        for w in r.workers:
            if not args.worker_ids or w.id in args.worker_ids:
                ctx.out.write(f"{short(w.id, args.verbose)}: {w.status}\n")
    return 0


def cmd_worker_config(args: argparse.Namespace, ctx: Context) -> int:
    out = []
    for m in _worker_members(ctx, args.process, args.worker_addresses):
        stub = ctx.client.worker(m.address)
        if args.num is None and args.enabled is None:
            cfg = stub.GetConfig(worker_pb2.WorkerConfigRequest(), timeout=30)
        else:
            cfg = stub.GetConfig(worker_pb2.WorkerConfigRequest(), timeout=30)
            if args.num is not None:
                if args.num < 0:
                    raise CliError("-num-schedulers must not be negative")
                cfg.num_schedulers = args.num
            if args.enabled is not None:
                names = [s.strip() for s in args.enabled.split(",") if s.strip()]
                bad = [s for s in names if s not in SCHEDULERS]
                if bad:
                    raise CliError(
                        f"unknown scheduler(s) {', '.join(bad)} (expected {', '.join(SCHEDULERS)})"
                    )
                del cfg.enabled_schedulers[:]
                cfg.enabled_schedulers.extend(names)
            cfg = stub.SetConfig(cfg, timeout=30)
        out.append((m, cfg))
    if args.json:
        print_json(
            [{"process_id": m.id, "address": m.address, **to_dict(c)} for m, c in out], ctx.out
        )
        return 0
    table(
        ("Process", "Address", "Schedulers", "Enabled"),
        [(m.id, m.address, c.num_schedulers, ",".join(c.enabled_schedulers)) for m, c in out],
        ctx.out,
    )
    return 0


def cmd_members(args: argparse.Namespace, ctx: Context) -> int:
    """Every registered process of the region (of each region with
    -all-regions), then the region's federation: its links' health and
    ACL replication from the authoritative region."""
    status: federation_pb2.FederationStatus | None = None
    try:
        status = ctx.client.federation.Status(federation_pb2.FederationStatusRequest(), timeout=30)
    except grpc.RpcError as exc:
        if exc.code() != grpc.StatusCode.PERMISSION_DENIED or args.all_regions:
            raise
    here = status.region if status is not None else ctx.region
    regions = [here]
    if args.all_regions and status is not None:
        regions += [link.region for link in status.links if link.region]
    rows: list[tuple[str, state_pb2.Member]] = []
    problems: list[str] = []
    for region in regions:
        client = ctx.client if region == here else ctx.for_region(region)
        try:
            resp = client.operator.Members(operator_pb2.MembersRequest(role=args.role), timeout=30)
        except grpc.RpcError as exc:
            problems.append(f"region {region}: {grpc_message(exc, ctx.address)}")
            continue
        rows += [(region, m) for m in sorted(resp.members, key=lambda m: (m.role, m.id))]
    if args.json:
        # the members (`server members -json` has the federation's status)
        print_json([{**to_dict(m), "region": r} for r, m in rows], ctx.out)
        for problem in problems:
            ctx.err.write(f"Error: {problem}\n")
        return 1 if problems else 0
    table(
        ("Region", "Role", "ID", "Address", "Leader", "Version", "Last Seen"),
        [
            (
                r,
                m.role,
                m.id,
                m.address,
                str(m.leader).lower(),
                m.version or "<none>",
                fmt_ago(m.last_seen),
            )
            for r, m in rows
        ],
        ctx.out,
    )
    if status is not None:
        show_links(status, ctx)
        ctx.out.write("\n" + replication_line(status.acl_replication) + "\n")
    for problem in problems:
        ctx.err.write(f"Error: {problem}\n")
    return 1 if problems else 0
