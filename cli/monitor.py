"""`job run` / `job stop` / `job scale` progress: follow an evaluation to
its end (Nomad's eval monitor), then show, per task group, how many allocs
are desired, placed, running, complete and failed until the placements have
finished (no alloc of the new version is still pending on its client).

Exit codes: 0 when everything was placed and started; 2 when the scheduler
could not place everything (as Nomad's monitor); 1 when an eval failed or an
alloc failed on its client. Everything is driven by blocking queries, so the
view updates as soon as the state changes and costs nothing while idle."""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import TextIO

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from cli.client import Client
from cli.context import CliError
from cli.output import now_stamp, short
from corral.domain.structs import ClientStatus, DesiredStatus, EvalStatus, JobType
from corral.v1 import eval_pb2, job_pb2, operator_pb2, query_pb2
from corral.v1 import structs_pb2 as pb

TERMINAL_EVAL = (EvalStatus.COMPLETE, EvalStatus.FAILED, EvalStatus.CANCELED)
BLOCK_MS = 2000
RPC_TIMEOUT = BLOCK_MS / 1000 + 15
NOT_FOUND_GRACE = 10.0
#: an eval still pending after this long makes the monitor check that an
#: eval broker leader and a worker are there to take it, and every this
#: often again while it stays pending
STALL_CHECK_S = 5.0
PROBE_TIMEOUT = 2.0


@dataclass
class GroupProgress:
    desired: int = 0
    placed: int = 0
    running: int = 0
    complete: int = 0
    failed: int = 0
    pending: int = 0
    lost: int = 0

    def row(self, name: str) -> tuple[str, int, int, int, int, int, int]:
        return (
            name,
            self.desired,
            self.placed,
            self.pending,
            self.running,
            self.complete,
            self.failed,
        )


@dataclass
class MonitorResult:
    exit_code: int = 0
    placement_failures: dict[str, pb.AllocMetric] = field(default_factory=dict)


def _log(out: TextIO, text: str, *, top: bool = False) -> None:
    prefix = "==>" if top else "   "
    out.write(f"{prefix} {now_stamp()}: {text}\n")
    out.flush()


def monitor_eval(
    client: Client, eval_id: str, out: TextIO, *, verbose: bool = False, min_index: int = 0
) -> MonitorResult:
    """Follow one evaluation (and its immediate follow-ups) to a terminal status.

    `min_index` is the index the eval was written at: the first read is a
    blocking query for it, so a read replica that has not caught up yet
    waits instead of answering "not found"."""
    result = MonitorResult()
    _log(out, f'Monitoring evaluation "{short(eval_id, verbose)}"', top=True)
    seen_allocs: set[str] = set()
    status = ""
    index = max(0, min_index - 1)
    announced = False
    not_found_until = time.monotonic() + NOT_FOUND_GRACE
    current = eval_id
    stall_check_at = time.monotonic() + STALL_CHECK_S
    while True:
        if status == EvalStatus.PENDING and time.monotonic() >= stall_check_at:
            cause = stalled_cause(client)
            if cause:
                raise CliError(
                    f'{cause}; evaluation "{short(current, verbose)}" is still pending '
                    "(the job is registered and will be scheduled once one runs)"
                )
            stall_check_at = time.monotonic() + STALL_CHECK_S
        try:
            resp: eval_pb2.EvalGetResponse = client.evals.Get(
                eval_pb2.EvalGetRequest(
                    eval_id=current,
                    include_related=True,
                    query=query_pb2.QueryOptions(min_index=index, wait_ms=BLOCK_MS),
                ),
                timeout=RPC_TIMEOUT,
            )
        except grpc.RpcError as exc:
            if exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
                continue
            if exc.code() == grpc.StatusCode.NOT_FOUND and time.monotonic() < not_found_until:
                time.sleep(0.2)  # written, but not yet visible where this read was served
                continue
            raise
        ev = resp.eval
        index = max(index, resp.meta.index)
        if not announced:
            what = f'node "{short(ev.node_id, verbose)}"' if ev.node_id else f'job "{ev.job_id}"'
            _log(out, f"Evaluation triggered by {what} ({ev.triggered_by})")
            announced = True
        for a in resp.allocs:
            if a.id in seen_allocs:
                continue
            seen_allocs.add(a.id)
            _log(
                out,
                f'Allocation "{short(a.id, verbose)}" created: node "{short(a.node_id, verbose)}", '
                f'group "{a.task_group}"',
            )
        if ev.status != status:
            if status:
                _log(out, f'Evaluation status changed: "{status}" -> "{ev.status}"')
            elif ev.status == EvalStatus.PENDING:
                _log(out, 'Evaluation status is "pending"')
            status = ev.status
        if ev.status not in TERMINAL_EVAL:
            continue
        for tg, metric in ev.failed_tg_allocs.items():
            result.placement_failures[tg] = metric
        if ev.next_eval and not ev.failed_tg_allocs and ev.status == EvalStatus.COMPLETE:
            nxt = next((r for r in resp.related if r.id == ev.next_eval), None)
            wait_s = 0.0
            if nxt is not None and nxt.wait_until:
                wait_s = max(0.0, nxt.wait_until / 1e9 - time.time())
            if wait_s <= 10:
                _log(out, f'Monitoring next evaluation "{short(ev.next_eval, verbose)}"')
                current, status, announced = ev.next_eval, "", True
                continue
            _log(out, f'Next evaluation "{short(ev.next_eval, verbose)}" in {int(wait_s)}s')
        if ev.blocked_eval:
            _log(
                out,
                f'Evaluation "{short(ev.blocked_eval, verbose)}" waiting for additional capacity '
                "to place remainder",
            )
        if result.placement_failures:
            out.write(
                f'==> {now_stamp()}: Evaluation "{short(current, verbose)}" finished with '
                f'status "{ev.status}" but failed to place all allocations:\n'
            )
            for tg, metric in sorted(result.placement_failures.items()):
                write_placement_failure(out, tg, metric)
            result.exit_code = 2
        else:
            _log(
                out,
                f'Evaluation "{short(current, verbose)}" finished with status "{ev.status}"',
                top=True,
            )
            if ev.status == EvalStatus.FAILED:
                out.write(f"    {ev.status_description}\n")
                result.exit_code = 1
        return result


def stalled_cause(client: Client) -> str:
    """Why a pending eval cannot make progress, or '': no eval broker that
    answers, or no worker that answers (Operator.Members names them;
    a gRPC health check tells a running one from a registration that has
    not expired yet)."""
    members = client.operator.Members(operator_pb2.MembersRequest(), timeout=10).members
    brokers = [m for m in members if m.role == "broker"]
    # the leader first: while one answers, the others need no probe
    brokers.sort(key=lambda m: not m.leader)
    if not any(_answers(client, m.address) for m in brokers):
        seen = f"{len(brokers)} registered, none answers" if brokers else "none registered"
        return f"no eval broker is running ({seen}; see `corral operator members`)"
    workers = [m for m in members if m.role == "worker"]
    if not any(_answers(client, m.address) for m in workers):
        seen = f"{len(workers)} registered, none answers" if workers else "none registered"
        return f"no scheduler worker is running ({seen}; see `corral operator members`)"
    return ""


def _answers(client: Client, address: str) -> bool:
    try:
        health_pb2_grpc.HealthStub(client.channel(address)).Check(
            health_pb2.HealthCheckRequest(), timeout=PROBE_TIMEOUT
        )
    except grpc.RpcError:
        return False
    return True


def write_placement_failure(out: TextIO, tg: str, m: pb.AllocMetric, indent: str = "    ") -> None:
    """Nomad's 'Task Group "x" (failed to place N allocations)' explanation."""
    n = m.coalesced_failures + 1
    out.write(
        f'{indent}Task Group "{tg}" (failed to place {n} allocation{"s" if n != 1 else ""}):\n'
    )
    inner = indent + "  * "
    if m.nodes_evaluated == 0:
        out.write(f"{inner}No nodes were eligible for evaluation\n")
    if m.nodes_in_pool == 0 and m.node_pool:
        out.write(
            f'{inner}No nodes are ready in node pool "{m.node_pool}" (in the job\'s datacenters)\n'
        )
    for dc, count in sorted(m.nodes_available.items()):
        if count == 0:
            out.write(f'{inner}No nodes are available in datacenter "{dc}"\n')
    for cls, count in sorted(m.class_filtered.items()):
        out.write(f'{inner}Class "{cls}": {count} nodes excluded by filter\n')
    for constraint, count in sorted(m.constraint_filtered.items()):
        out.write(f'{inner}Constraint "{constraint}": {count} nodes excluded by filter\n')
    if m.nodes_exhausted:
        out.write(f"{inner}Resources exhausted on {m.nodes_exhausted} nodes\n")
    for cls, count in sorted(m.class_exhausted.items()):
        out.write(f'{inner}Class "{cls}" exhausted on {count} nodes\n')
    for dim, count in sorted(m.dimension_exhausted.items()):
        out.write(f'{inner}Dimension "{dim}" exhausted on {count} nodes\n')
    for q in m.quota_exhausted:
        out.write(f"{inner}Quota limit hit {q!r}\n")


def _progress(job: pb.Job, allocs: list[pb.Allocation], version: int) -> dict[str, GroupProgress]:
    groups: dict[str, GroupProgress] = defaultdict(GroupProgress)
    for tg in job.task_groups:
        groups[tg.name].desired = tg.count
    system = job.type in (JobType.SYSTEM, JobType.SYSBATCH)
    for a in allocs:
        # Allocs that should run, whatever their version (a count-only change
        # may keep allocs at an older version), and this version's finished
        # batch work.
        wanted = a.desired_status == DesiredStatus.RUN
        if not wanted and not (
            a.client_status == ClientStatus.COMPLETE and a.job_version == version
        ):
            continue
        g = groups[a.task_group]
        g.placed += 1
        if a.client_status == ClientStatus.PENDING:
            g.pending += 1
        elif a.client_status == ClientStatus.RUNNING:
            g.running += 1
        elif a.client_status == ClientStatus.COMPLETE:
            g.complete += 1
        elif a.client_status == ClientStatus.FAILED:
            g.failed += 1
        elif a.client_status in (ClientStatus.LOST, ClientStatus.UNKNOWN):
            g.lost += 1
    if system:
        for g in groups.values():
            g.desired = g.placed
    return dict(groups)


HEADERS = ("Task Group", "Desired", "Placed", "Pending", "Running", "Complete", "Failed")


def _draw_table(
    out: TextIO, rows: tuple[tuple[str, int, int, int, int, int, int], ...], drawn: int
) -> int:
    """Print the progress table. On a terminal, redraw it in place (a live
    view); elsewhere (pipes, logs) print each new state below the last.
    Returns the number of lines drawn."""
    live = drawn > 0 and out.isatty()
    if live:
        out.write(f"\x1b[{drawn}F\x1b[J")  # back to the table's first line, clear below
    lines = [f"    {now_stamp()}:"]
    widths = [max(len(str(r[i])) for r in (HEADERS, *rows)) for i in range(len(HEADERS))]
    for r in (HEADERS, *rows):
        lines.append("    " + "  ".join(str(c).ljust(widths[i]) for i, c in enumerate(r)).rstrip())
    out.write("\n".join(lines) + "\n")
    out.flush()
    return len(lines)


def monitor_placements(
    client: Client,
    job_id: str,
    namespace: str,
    version: int,
    out: TextIO,
    *,
    expect_full: bool,
) -> int:
    """Show desired/placed/running/failed per group until no alloc that
    should run is pending on its client (and, when `expect_full`, every
    desired alloc is placed). Returns 1 when an alloc failed, else 0."""
    index = 0
    last: tuple[tuple[str, int, int, int, int, int, int], ...] | None = None
    drawn = 0
    _log(out, "Waiting for placements to start", top=True)
    while True:
        try:
            jresp = client.jobs.Get(
                job_pb2.JobGetRequest(
                    job_id=job_id, query=query_pb2.QueryOptions(namespace=namespace)
                ),
                timeout=RPC_TIMEOUT,
            )
            aresp = client.jobs.Allocations(
                job_pb2.JobGetRequest(
                    job_id=job_id,
                    all=True,
                    query=query_pb2.QueryOptions(
                        min_index=index, wait_ms=BLOCK_MS, namespace=namespace
                    ),
                ),
                timeout=RPC_TIMEOUT,
            )
        except grpc.RpcError as exc:
            if exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
                continue
            raise
        index = max(index, aresp.meta.index)
        groups = _progress(jresp.job, list(aresp.allocs), version)
        rows = tuple(groups[name].row(name) for name in sorted(groups))
        if rows != last:
            last = rows
            drawn = _draw_table(out, rows, drawn)
        pending = sum(g.pending for g in groups.values())
        short_of = any(g.placed < g.desired for g in groups.values())
        if pending == 0 and (not expect_full or not short_of):
            failed = sum(g.failed for g in groups.values())
            if failed:
                _log(
                    out,
                    f"{failed} allocation(s) failed; see `corral job status {job_id}`",
                    top=True,
                )
                return 1
            if expect_full:
                _log(out, "Placements finished", top=True)
            else:
                _log(
                    out,
                    "Placements finished, but not every allocation could be placed (see above)",
                    top=True,
                )
            return 0
