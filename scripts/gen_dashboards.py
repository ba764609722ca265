"""Write the Grafana dashboards in deploy/observability/dashboards/.

The dashboards are data: one list of panels (title, PromQL, unit) per
dashboard, turned into Grafana's JSON here, so a query is written once and
the JSON stays consistent (ids, grid, the datasource variable).
`tests/unit/test_observability.py` checks that every query names metrics
the code exports and that the committed JSON is what this script writes;
`--check` fails when it is stale.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "deploy" / "observability" / "dashboards"
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}


@dataclass(frozen=True)
class Panel:
    title: str
    queries: tuple[tuple[str, str], ...]  # (PromQL, legend)
    unit: str = "short"
    description: str = ""


def q(expr: str, legend: str = "") -> tuple[str, str]:
    return expr, legend


def of_role(expr: str, role: str) -> str:
    """Keep the series of one role's processes (their `corral_build_info`
    says which), whatever labels the scrape adds."""
    return f'({expr}) and on (instance) corral_build_info{{role="{role}"}}'


def rpc_panels(role: str) -> list[Panel]:
    """Requests, errors and latency of the RPCs a role serves and makes."""
    handled = of_role("rate(grpc_server_handled_total[5m])", role)
    client = of_role("rate(grpc_client_handled_total[5m])", role)
    errors = of_role('rate(grpc_server_handled_total{grpc_code!="OK"}[5m])', role)
    latency = of_role('rate(grpc_server_handling_seconds_bucket{grpc_type="unary"}[5m])', role)
    return [
        Panel(
            "RPCs served per second",
            (q(f"sum by (grpc_service, grpc_method) ({handled})", "{{grpc_method}}"),),
            "reqps",
        ),
        Panel(
            "RPC errors per second by status",
            (
                q(
                    f"sum by (grpc_method, grpc_code) ({errors})",
                    "{{grpc_method}} {{grpc_code}}",
                ),
            ),
            "reqps",
        ),
        Panel(
            "RPC latency p99 (unary)",
            (
                q(
                    f"histogram_quantile(0.99, sum by (le, grpc_method) ({latency}))",
                    "{{grpc_method}}",
                ),
            ),
            "s",
            "Long-polls (Eval.Dequeue, node watches) and streams last as long as they wait.",
        ),
        Panel(
            "Calls to other roles per second by status",
            (q(f"sum by (grpc_service, grpc_code) ({client})", "{{grpc_service}} {{grpc_code}}"),),
            "reqps",
        ),
        Panel(
            "Leader",
            (q(f'max(corral_leader{{role="{role}"}})', "leader held"),),
            description="1 while one of this role's processes holds the leader lock.",
        ),
    ]


def pipeline() -> list[Panel]:
    return [
        Panel(
            "Evals processed per second",
            (q("sum by (outcome) (rate(corral_worker_evals_total[1m]))", "{{outcome}}"),),
            "ops",
        ),
        Panel(
            "Broker queues",
            (
                q("max(corral_broker_total_ready)", "ready"),
                q("max(corral_broker_total_unacked)", "unacked"),
                q("max(corral_broker_total_pending)", "pending"),
                q("max(corral_broker_total_waiting)", "waiting (delayed)"),
                q("max(corral_broker_total_failed)", "failed"),
            ),
        ),
        Panel(
            "Blocked evals",
            (
                q("max(corral_broker_total_blocked)", "blocked"),
                q("max(corral_broker_total_escaped)", "escaped"),
            ),
        ),
        Panel("Plan queue depth", (q("max(corral_plan_queue_depth)", "queued plans"),)),
        Panel(
            "Plan apply latency",
            (
                q(
                    "histogram_quantile(0.5, sum by (le) "
                    "(rate(corral_plan_apply_seconds_bucket[5m])))",
                    "p50",
                ),
                q(
                    "histogram_quantile(0.99, sum by (le) "
                    "(rate(corral_plan_apply_seconds_bucket[5m])))",
                    "p99",
                ),
            ),
            "s",
        ),
        Panel(
            "Placements per second",
            (
                q("sum(rate(corral_plan_allocs_placed_total[1m]))", "placed"),
                q("sum(rate(corral_plan_allocs_stopped_total[1m]))", "stopped"),
            ),
            "ops",
        ),
        Panel(
            "Plan rejections",
            (
                q("sum(rate(corral_plan_node_rejected_total[5m]))", "nodes rejected/s"),
                q(
                    'sum(rate(corral_plan_results_total{outcome=~"partial|failed"}[5m])) '
                    "by (outcome)",
                    "plans {{outcome}}/s",
                ),
            ),
            "ops",
        ),
        Panel(
            "Scheduler time p99 by eval type",
            (
                q(
                    "histogram_quantile(0.99, sum by (le, type) "
                    "(rate(corral_worker_invoke_scheduler_seconds_bucket[5m])))",
                    "{{type}}",
                ),
            ),
            "s",
        ),
    ]


def nodes() -> list[Panel]:
    return [
        Panel("Nodes by status", (q("sum by (status) (corral_nodes)", "{{status}}"),)),
        Panel("Heartbeat timers", (q("sum(corral_heartbeat_active)", "active"),)),
        Panel(
            "Missed heartbeats",
            (q("sum by (status) (increase(corral_heartbeat_missed_total[5m]))", "{{status}}"),),
        ),
        Panel(
            "Node status changes",
            (
                q(
                    "sum by (status) (increase(corral_node_status_changes_total[5m]))",
                    "to {{status}}",
                ),
            ),
        ),
        Panel(
            "Allocs on clients by status",
            (q("sum by (status) (corral_client_allocs)", "{{status}}"),),
        ),
        Panel(
            "Task starts and driver errors",
            (
                q(
                    "sum by (driver) (rate(corral_client_task_starts_total[5m]))",
                    "starts {{driver}}",
                ),
                q(
                    "sum by (driver) (rate(corral_client_task_restarts_total[5m]))",
                    "restarts {{driver}}",
                ),
                q(
                    "sum by (driver) (rate(corral_client_driver_errors_total[5m]))",
                    "driver errors {{driver}}",
                ),
            ),
            "ops",
        ),
        Panel("Jobs by status", (q("sum by (status) (corral_jobs)", "{{status}}"),)),
        Panel(
            "Job summary (allocs by state)",
            (q("sum by (state) (corral_job_summary)", "{{state}}"),),
        ),
    ]


def state() -> list[Panel]:
    return [
        *rpc_panels("state"),
        Panel(
            "Write lock wait and hold p99",
            (
                q(
                    "histogram_quantile(0.99, sum by (le) "
                    "(rate(corral_state_write_lock_wait_seconds_bucket[5m])))",
                    "lock wait",
                ),
                q(
                    "histogram_quantile(0.99, sum by (le) "
                    "(rate(corral_state_write_hold_seconds_bucket[5m])))",
                    "hold",
                ),
            ),
            "s",
        ),
        Panel(
            "Node writes per batch (p50)",
            (
                q(
                    "histogram_quantile(0.5, sum by (le) "
                    "(rate(corral_state_write_batch_ops_bucket[5m])))",
                    "ops per batch",
                ),
            ),
        ),
    ]


def broker() -> list[Panel]:
    return [
        *rpc_panels("broker"),
        Panel(
            "Evals by scheduler and state",
            (q("max by (scheduler, state) (corral_broker_evals)", "{{scheduler}} {{state}}"),),
        ),
        Panel(
            "Replica lag",
            (q('max(corral_replica_lag_seconds{replica="broker"})', "lag"),),
            "s",
        ),
    ]


def planner() -> list[Panel]:
    return [
        *rpc_panels("planner"),
        Panel(
            "Plan stages p99",
            tuple(
                q(
                    "histogram_quantile(0.99, sum by (le) "
                    f"(rate(corral_plan_{stage}_seconds_bucket[5m])))",
                    stage,
                )
                for stage in ("submit", "wait_for_index", "evaluate", "apply")
            ),
            "s",
        ),
        Panel(
            "Plans by outcome",
            (q("sum by (outcome) (rate(corral_plan_results_total[5m]))", "{{outcome}}"),),
            "ops",
        ),
        Panel(
            "Outstanding applies and group commit size",
            (
                q("max(corral_plan_outstanding_apply)", "outstanding"),
                q(
                    "histogram_quantile(0.5, sum by (le) "
                    "(rate(corral_plan_group_commit_size_bucket[5m])))",
                    "plans per commit (p50)",
                ),
            ),
        ),
    ]


def worker() -> list[Panel]:
    return [
        *rpc_panels("worker"),
        Panel(
            "Worker stages p99",
            tuple(
                q(
                    "histogram_quantile(0.99, sum by (le) "
                    f"(rate(corral_worker_{stage}_seconds_bucket[5m])))",
                    stage,
                )
                for stage in ("dequeue_eval", "wait_for_index", "submit_plan")
            ),
            "s",
        ),
        Panel(
            "Evals nacked for a lagging replica",
            (q("sum(rate(corral_worker_behind_state_total[5m]))", "behind"),),
            "ops",
        ),
        Panel(
            "Replica lag",
            (q('max(corral_replica_lag_seconds{replica!="broker"}) by (replica)', "{{replica}}"),),
            "s",
        ),
    ]


def agent() -> list[Panel]:
    return [
        *rpc_panels("agent"),
        Panel(
            "Allocs by status",
            (q("sum by (status) (corral_client_allocs)", "{{status}}"),),
        ),
        Panel(
            "Task starts, restarts and driver errors",
            (
                q(
                    "sum by (driver) (rate(corral_client_task_starts_total[5m]))",
                    "starts {{driver}}",
                ),
                q(
                    "sum by (driver) (rate(corral_client_task_restarts_total[5m]))",
                    "restarts {{driver}}",
                ),
                q(
                    "sum by (driver) (rate(corral_client_driver_errors_total[5m]))",
                    "driver errors {{driver}}",
                ),
            ),
            "ops",
        ),
    ]


def gateway() -> list[Panel]:
    requests = of_role("rate(corral_http_requests_total[5m])", "gateway")
    errors = of_role('rate(corral_http_requests_total{code=~"5.."}[5m])', "gateway")
    latency = of_role(
        'rate(corral_http_request_seconds_bucket{route!~".*stream.*"}[5m])', "gateway"
    )
    client = of_role("rate(grpc_client_handled_total[5m])", "gateway")
    return [
        Panel(
            "HTTP requests per second by route",
            (q(f"sum by (route) ({requests})", "{{route}}"),),
            "reqps",
        ),
        Panel(
            "HTTP answers per second by status code",
            (q(f"sum by (code) ({requests})", "{{code}}"),),
            "reqps",
        ),
        Panel(
            "HTTP 5xx per second by route",
            (q(f"sum by (route, code) ({errors})", "{{route}} {{code}}"),),
            "reqps",
        ),
        Panel(
            "HTTP latency p99 by route",
            (q(f"histogram_quantile(0.99, sum by (le, route) ({latency}))", "{{route}}"),),
            "s",
            "Blocking queries count their whole wait; the event stream is left out.",
        ),
        Panel(
            "Calls to the state, broker and planner per second by status",
            (q(f"sum by (grpc_service, grpc_code) ({client})", "{{grpc_service}} {{grpc_code}}"),),
            "reqps",
        ),
    ]


DASHBOARDS = {
    "corral-pipeline": ("Corral / Pipeline overview", pipeline),
    "corral-nodes": ("Corral / Nodes", nodes),
    "corral-state": ("Corral / State", state),
    "corral-broker": ("Corral / Broker", broker),
    "corral-planner": ("Corral / Planner", planner),
    "corral-worker": ("Corral / Worker", worker),
    "corral-agent": ("Corral / Agent", agent),
    "corral-gateway": ("Corral / Gateway (HTTP API)", gateway),
}


def dashboard(uid: str, title: str, panels: list[Panel]) -> dict[str, Any]:
    out: list[dict[str, Any]] = []
    for i, p in enumerate(panels):
        out.append(
            {
                "id": i + 1,
                "type": "timeseries",
                "title": p.title,
                "description": p.description,
                "datasource": DATASOURCE,
                "gridPos": {"x": (i % 2) * 12, "y": (i // 2) * 8, "w": 12, "h": 8},
                "fieldConfig": {"defaults": {"unit": p.unit}, "overrides": []},
                "options": {"legend": {"displayMode": "list", "placement": "bottom"}},
                "targets": [
                    {"refId": chr(ord("A") + j), "expr": expr, "legendFormat": legend}
                    for j, (expr, legend) in enumerate(p.queries)
                ],
            }
        )
    return {
        "uid": uid,
        "title": title,
        "tags": ["corral"],
        "timezone": "browser",
        "schemaVersion": 39,
        "version": 1,
        "editable": True,
        "refresh": "10s",
        "time": {"from": "now-1h", "to": "now"},
        "templating": {
            "list": [
                {
                    "name": "datasource",
                    "label": "Prometheus",
                    "type": "datasource",
                    "query": "prometheus",
                }
            ]
        },
        "panels": out,
    }


def render() -> dict[str, str]:
    """File name -> JSON text of every dashboard."""
    return {
        f"{uid}.json": json.dumps(dashboard(uid, title, build()), indent=2) + "\n"
        for uid, (title, build) in DASHBOARDS.items()
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--check", action="store_true", help="fail if the files are stale")
    args = parser.parse_args(argv)
    stale = []
    for name, text in render().items():
        path = OUT / name
        if args.check:
            if not path.exists() or path.read_text() != text:
                stale.append(str(path.relative_to(ROOT)))
        else:
            OUT.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
    if stale:
        print("stale dashboards (run scripts/gen_dashboards.py): " + ", ".join(stale))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
