"""`corral alloc status [-stats]|stop|logs|signal|restart` (and `exec`, `fs`:
alloc_access.py)."""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import dataclass
from typing import TextIO

import grpc

from cli.allocs import get_alloc
from cli.commands import alloc_access, group
from cli.context import CliError, Context, common
from cli.monitor import monitor_eval
from cli.output import fmt_ago, fmt_bytes, fmt_time, heading, kv, print_json, short, table
from corral.v1 import alloc_pb2, alloc_pb2_grpc, node_pb2
from corral.v1 import structs_pb2 as pb


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    allocs = group(sub, "alloc", "Inspect and stop allocations, read task logs")

    p = allocs.add_parser(
        "status", help="Show an allocation: task states, events, placement metrics"
    )
    p.add_argument("alloc", help="alloc id or unique prefix")
    p.add_argument(
        "-stats",
        "--stats",
        dest="stats",
        action="store_true",
        help="detailed resource usage of each task (memory and CPU)",
    )
    common(p, json=True, verbose=True)
    p.set_defaults(func=cmd_status)

    p = allocs.add_parser("stop", help="Stop an allocation (the scheduler replaces it)")
    p.add_argument("alloc")
    p.add_argument("-detach", "--detach", action="store_true")
    p.add_argument(
        "-no-shutdown-delay", "--no-shutdown-delay", dest="no_shutdown_delay", action="store_true"
    )
    common(p, json=True, verbose=True)
    p.set_defaults(func=cmd_stop)

    p = allocs.add_parser("logs", help="Print a task's stdout (or -stderr), from its client node")
    p.add_argument("alloc")
    p.add_argument(
        "task", nargs="?", default="", help="task name (needed when the group has several)"
    )
    p.add_argument("-task", "--task", dest="task_flag", default="")
    p.add_argument("-stderr", "--stderr", dest="stderr", action="store_true")
    p.add_argument("-f", "--follow", "-follow", dest="follow", action="store_true")
    p.add_argument("-tail", "--tail", dest="tail", action="store_true", help="start from the end")
    p.add_argument(
        "-n", "--lines", dest="lines", type=int, default=10, help="lines with -tail (default 10)"
    )
    p.add_argument("-c", "--bytes", dest="bytes", type=int, default=0, help="bytes with -tail")
    common(p, verbose=True)
    p.set_defaults(func=cmd_logs)

    p = allocs.add_parser(
        "signal", help="Send a signal to an allocation's running tasks, or to one of them"
    )
    p.add_argument("alloc")
    p.add_argument("task", nargs="?", default="", help="only this task (default: every task)")
    p.add_argument("-task", "--task", dest="task_flag", default="")
    p.add_argument(
        "-s", "--signal", dest="signal", default="SIGKILL", help="signal name (default SIGKILL)"
    )
    common(p, verbose=True)
    p.set_defaults(func=cmd_signal)

    p = allocs.add_parser(
        "restart",
        help="Restart an allocation's running tasks, one task, or every task (-all-tasks)",
    )
    p.add_argument("alloc")
    p.add_argument("task", nargs="?", default="", help="only this task")
    p.add_argument("-task", "--task", dest="task_flag", default="")
    p.add_argument(
        "-all-tasks",
        "--all-tasks",
        dest="all_tasks",
        action="store_true",
        help="restart every task, dead ones too, in lifecycle order",
    )
    common(p, verbose=True)
    p.set_defaults(func=cmd_restart)

    alloc_access.register(allocs)


def cmd_status(args: argparse.Namespace, ctx: Context) -> int:
    a = get_alloc(ctx, args.alloc)
    if args.json:
        print_json(a, ctx.out)
        return 0
    v = args.verbose
    pairs: list[tuple[str, object]] = [
        ("ID", short(a.id, v)),
        ("Eval ID", short(a.eval_id, v)),
        ("Name", a.name),
        ("Node ID", short(a.node_id, v)),
        ("Node Name", a.node_name),
        ("Job ID", a.job_id),
        ("Job Version", a.job_version),
        ("Client Status", a.client_status),
        ("Client Description", a.client_description or "<none>"),
        ("Desired Status", a.desired_status),
        ("Desired Description", a.desired_description or "<none>"),
        ("Created", fmt_ago(a.create_time)),
        ("Modified", fmt_ago(a.modify_time)),
    ]
    if a.previous_allocation:
        pairs.append(("Replacement Of", short(a.previous_allocation, v)))
    if a.next_allocation:
        pairs.append(("Replaced By", short(a.next_allocation, v)))
    if a.followup_eval_id:
        pairs.append(("Follow-up Eval", short(a.followup_eval_id, v)))
    if a.preempted_by_allocation:
        pairs.append(("Preempted By", short(a.preempted_by_allocation, v)))
    kv(pairs, ctx.out)
    r = a.resources
    heading("Allocated Resources", ctx.out)
    ports = [
        f"{p.label}:{p.value}" for n in r.networks for p in (*n.reserved_ports, *n.dynamic_ports)
    ]
    kv(
        [
            ("CPU", f"{r.cpu} MHz"),
            ("Memory", f"{r.memory_mb} MiB"),
            ("Disk", f"{r.disk_mb} MiB"),
            ("Ports", ", ".join(ports) or "<none>"),
        ],
        ctx.out,
    )
    usage = alloc_usage(ctx, a)
    for name in sorted(a.task_states):
        ts = a.task_states[name]
        heading(f'Task "{name}" is "{ts.state}"', ctx.out)
        task_resources(a, name, usage, args.stats, ctx.out)
        kv(
            [
                ("Started At", fmt_time(ts.started_at)),
                ("Finished At", fmt_time(ts.finished_at)),
                ("Total Restarts", ts.restarts),
                ("Failed", str(ts.failed).lower()),
            ],
            ctx.out,
        )
        if ts.events:
            heading("Recent Events:", ctx.out)
            events = list(ts.events)[::-1] if v else list(ts.events)[-10:][::-1]
            table(
                ("Time", "Type", "Description"),
                [(fmt_time(e.time), e.type, e.display_message or e.message) for e in events],
                ctx.out,
            )
    if v and a.HasField("metrics"):
        m = a.metrics
        heading("Placement Metrics", ctx.out)
        kv(
            [
                ("Nodes Evaluated", m.nodes_evaluated),
                ("Nodes Filtered", m.nodes_filtered),
                ("Nodes Exhausted", m.nodes_exhausted),
                ("Nodes In Pool", m.nodes_in_pool),
                ("Allocation Time", f"{m.allocation_time / 1e6:.3f}ms"),
            ],
            ctx.out,
        )
        if m.score_meta_data:
            scorers = sorted({k for s in m.score_meta_data for k in s.scores})
            table(
                ("Node", *scorers, "final score"),
                [
                    (
                        short(s.node_id, v),
                        *(f"{s.scores.get(k, 0):.3g}" for k in scorers),
                        f"{s.norm_score:.3g}",
                    )
                    for s in m.score_meta_data
                ],
                ctx.out,
            )
    return 0


@dataclass
class Usage:
    """What the alloc's agent says it uses, and its node's MHz per core
    (reserved cores are allocated as that many MHz)."""

    alloc: pb.AllocResourceUsage | None = None
    mhz_per_core: int = 0


def alloc_usage(ctx: Context, a: pb.Allocation) -> Usage:
    """The running alloc's resource usage from its agent (Nomad prints why
    when it cannot get it, and goes on)."""
    out = Usage()
    if a.client_status != "running" or not a.node_id:
        return out
    try:
        node = ctx.client.nodes.Get(node_pb2.NodeGetRequest(node_id=a.node_id), timeout=30).node
        r = node.node_resources
        out.mhz_per_core = r.cpu // r.total_cores if r.total_cores else 0
        if not node.http_addr:
            return out
        resp = ctx.client.client_alloc(node.http_addr).Stats(
            alloc_pb2.AllocStatsRequest(alloc_id=a.id), timeout=10
        )
        out.alloc = resp.usage
    except grpc.RpcError as exc:
        ctx.err.write(f"Couldn't retrieve stats: {exc.details()}\n")  # type: ignore[attr-defined]
    return out


def task_resources(a: pb.Allocation, task: str, usage: Usage, detailed: bool, out: TextIO) -> None:
    """Nomad's "Task Resources": used/allocated CPU and memory when the
    agent answered, and with -stats every measured figure."""
    if task not in a.task_resources:
        return
    r = a.task_resources[task]
    cpu = f"{r.cpu + r.cores * usage.mhz_per_core}"
    memory = fmt_bytes(r.memory_mb * 1024 * 1024)
    tasks = usage.alloc.tasks if usage.alloc is not None else {}
    reading = tasks[task].resource_usage if task in tasks else None
    if reading is not None:
        cpu = f"{math.floor(reading.cpu_stats.total_ticks)}/{cpu}"
        m = reading.memory_stats
        used = m.rss if m.rss or "RSS" in m.measured else m.usage
        memory = f"{fmt_bytes(used)}/{memory}"
    heading("Task Resources:", out)
    cpu_header = f"CPU ({r.cores} cores)" if r.cores else "CPU"
    rows = [(f"{cpu} MHz", memory, fmt_bytes(a.resources.disk_mb * 1024 * 1024))]
    if r.memory_max_mb < 0:
        rows.append(("", "Max: no limit", ""))
    elif r.memory_max_mb and r.memory_max_mb != r.memory_mb:
        rows.append(("", f"Max: {fmt_bytes(r.memory_max_mb * 1024 * 1024)}", ""))
    table((cpu_header, "Memory", "Disk"), rows, out)
    if reading is None or not detailed:
        return
    m = reading.memory_stats
    memory_values = {
        "RSS": m.rss,
        "Cache": m.cache,
        "Swap": m.swap,
        "Usage": m.usage,
        "Max Usage": m.max_usage,
        "Kernel Usage": m.kernel_usage,
        "Kernel Max Usage": m.kernel_max_usage,
    }
    measured = sorted(x for x in m.measured if x in memory_values)
    if measured:
        heading("Memory Stats", out)
        table(measured, [[fmt_bytes(memory_values[x]) for x in measured]], out)
    c = reading.cpu_stats
    cpu_values = {
        "Percent": f"{c.percent:.2f}%",
        "System Mode": f"{c.system_mode:.2f}%",
        "User Mode": f"{c.user_mode:.2f}%",
        "Throttled Periods": str(c.throttled_periods),
        "Throttled Time": str(c.throttled_time),
    }
    measured = sorted(x for x in c.measured if x in cpu_values)
    if measured:
        heading("CPU Stats", out)
        table(measured, [[cpu_values[x] for x in measured]], out)


def cmd_stop(args: argparse.Namespace, ctx: Context) -> int:
    a = get_alloc(ctx, args.alloc)
    resp: alloc_pb2.AllocStopResponse = ctx.client.allocs.Stop(
        alloc_pb2.AllocStopRequest(alloc_id=a.id, no_shutdown_delay=args.no_shutdown_delay),
        timeout=30,
    )
    if args.json:
        print_json(resp, ctx.out)
        return 0
    if args.detach or not resp.eval_id:
        ctx.out.write(f"Eval ID: {resp.eval_id}\n")
        return 0
    return monitor_eval(
        ctx.client, resp.eval_id, ctx.out, verbose=args.verbose, min_index=resp.index
    ).exit_code


def cmd_logs(args: argparse.Namespace, ctx: Context) -> int:
    a = get_alloc(ctx, args.alloc)
    task = args.task_flag or args.task
    if not task:
        names = sorted(a.task_states) or sorted(a.task_resources)
        if len(names) == 1:
            task = names[0]
        elif not names:
            raise CliError(f'allocation "{short(a.id)}" has no tasks yet; give the task name')
        else:
            raise CliError(
                f'allocation "{short(a.id)}" has several tasks ({", ".join(names)}); name one'
            )
    node = ctx.client.nodes.Get(node_pb2.NodeGetRequest(node_id=a.node_id), timeout=30).node
    if not node.http_addr:
        raise CliError(f'node "{short(node.id)}" does not advertise an address for logs')
    req = alloc_pb2.AllocLogsRequest(
        alloc_id=a.id, task=task, type="stderr" if args.stderr else "stdout", follow=args.follow
    )
    trim_lines = 0
    if args.tail:
        req.origin = "end"
        if args.bytes:
            req.offset = args.bytes
        else:
            req.offset = max(4096, args.lines * 512)
            trim_lines = args.lines
    stream = ctx.client.client_alloc(node.http_addr).Logs(req, timeout=None if args.follow else 60)
    out = sys.stdout.buffer
    first = True
    for chunk in stream:
        data = chunk.data
        if first and trim_lines:
            lines = data.splitlines(keepends=True)
            data = b"".join(lines[-trim_lines:])
        first = False
        out.write(data)
        out.flush()
    return 0


def _client_alloc(ctx: Context, a: pb.Allocation) -> alloc_pb2_grpc.ClientAllocStub:
    """The ClientAlloc service of the agent running `a`."""
    if not a.node_id:
        raise CliError(f'allocation "{short(a.id)}" is not placed on a node')
    node = ctx.client.nodes.Get(node_pb2.NodeGetRequest(node_id=a.node_id), timeout=30).node
    if not node.http_addr:
        raise CliError(f'node "{short(node.id)}" does not advertise an address to reach its agent')
    return ctx.client.client_alloc(node.http_addr)


def _task_of(a: pb.Allocation, task: str) -> str:
    """`task` when the alloc has it (Nomad's validateTaskExistsInAllocation)."""
    names = sorted(a.task_resources) or sorted(a.task_states)
    if task and names and task not in names:
        found = "\n".join(f"  {n}" for n in names)
        raise CliError(f"Could not find task named: {task}, found:\n{found}")
    return task


def cmd_signal(args: argparse.Namespace, ctx: Context) -> int:
    a = get_alloc(ctx, args.alloc)
    task = _task_of(a, args.task_flag or args.task)
    try:
        _client_alloc(ctx, a).Signal(
            alloc_pb2.AllocSignalRequest(alloc_id=a.id, task=task, signal=args.signal), timeout=60
        )
    except grpc.RpcError as exc:
        raise CliError(f"Error signalling allocation: {exc.details()}") from None  # type: ignore[attr-defined]
    return 0


def cmd_restart(args: argparse.Namespace, ctx: Context) -> int:
    task = args.task_flag or args.task
    if args.all_tasks and task:
        raise CliError("The -all-tasks option is not allowed when restarting a specific task.")
    a = get_alloc(ctx, args.alloc)
    task = _task_of(a, task)
    try:
        _client_alloc(ctx, a).Restart(
            alloc_pb2.AllocRestartRequest(alloc_id=a.id, task=task, all_tasks=args.all_tasks),
            timeout=120,
        )
    except grpc.RpcError as exc:
        target = "task" if task else "allocation"
        raise CliError(f"Failed to restart {target}:\n\n{exc.details()}") from None  # type: ignore[attr-defined]
    return 0
