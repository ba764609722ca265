"""The per-placement ledger (issue 30): what one placement costs in
messages, bytes, protobuf work and SQL, next to its CPU.

Every role serves Prometheus `/metrics` (the bench starts them with
`--metrics-listen`). A workload's `Window` scrapes each role before and
after the load, and the ledger is the difference:

* **RPCs by method**: the roles' own `grpc_server_started_total` (each
  call counted once, by the process that served it) and
  `grpc_client_started_total` (which role made it; calls no role made come
  from the simulated clients or the benchmark driver: "outside");
* **bytes by method**: the protobuf payloads each server read and wrote
  (`corral_ledger_grpc_bytes_total{side="server"}`; gRPC's own framing
  and HTTP/2 headers are not in them);
* **protobuf encodes and decodes** by role and message type, **SQL
  statements** by role and statement
  (`bench/ledger_site/corral_ledger_probe.py`, loaded into the roles by
  PYTHONPATH; PostgreSQL's pg_stat_statements would be the other source,
  but the embedded server does not ship it);
* **plans per eval**: the planner's plans applied and partial, its commits
  (transactions), and the indexes written per eval, from the workload's
  own figures; the worker loops' placement claims by outcome
  (`corral_worker_placement_claims_total`: claimed, conflict, forced).

The bench's own polls (`PROBE_METHODS`: broker and planner stats while it
waits for quiet) are counted apart and left out of the totals. Everything
here but `scrape` is pure.
"""

from __future__ import annotations

import urllib.request
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

#: RPCs the benchmark driver itself makes while it waits for a workload to
#: finish; not part of any placement's cost
PROBE_METHODS = frozenset({"/corral.v1.Eval/Stats", "/corral.v1.Plan/Stats"})
#: calls to a role that no role made: the simulated clients or the driver
OUTSIDE = "outside"
#: rows of the per-method and per-statement tables in the Markdown summary
TOP_METHODS = 12
TOP_STATEMENTS = 6
TOP_TYPES = 12


@dataclass
class Scrape:
    """One process's counters at one moment (or the difference of two)."""

    rpc_server: dict[str, float] = field(default_factory=dict)  # method -> calls
    rpc_client: dict[str, float] = field(default_factory=dict)
    #: (side, direction, method) -> [messages, bytes]
    grpc: dict[tuple[str, str, str], list[float]] = field(default_factory=dict)
    #: (op, type) -> [count, bytes]
    protobuf: dict[tuple[str, str], list[float]] = field(default_factory=dict)
    sql: dict[str, float] = field(default_factory=dict)
    #: the worker's placement claims by outcome (claimed, conflict, forced)
    claims: dict[str, float] = field(default_factory=dict)
    probe: bool = False


def _full_method(labels: Mapping[str, str]) -> str:
    return f"/{labels.get('grpc_service', '')}/{labels.get('grpc_method', '')}"


def parse(text: str) -> Scrape:
    """The ledger's counters in a `/metrics` page."""
    out = Scrape()
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            name, labels, value = s.name, s.labels, float(s.value)
            if name == "grpc_server_started_total":
                m = _full_method(labels)
                out.rpc_server[m] = out.rpc_server.get(m, 0.0) + value
            elif name == "grpc_client_started_total":
                m = _full_method(labels)
                out.rpc_client[m] = out.rpc_client.get(m, 0.0) + value
            elif name in ("corral_ledger_grpc_messages_total", "corral_ledger_grpc_bytes_total"):
                key = (labels["side"], labels["direction"], labels["method"])
                slot = out.grpc.setdefault(key, [0.0, 0.0])
                slot[0 if name == "corral_ledger_grpc_messages_total" else 1] += value
            elif name in ("corral_ledger_protobuf_total", "corral_ledger_protobuf_bytes_total"):
                pkey = (labels["op"], labels["type"])
                pslot = out.protobuf.setdefault(pkey, [0.0, 0.0])
                pslot[0 if name == "corral_ledger_protobuf_total" else 1] += value
            elif name == "corral_ledger_sql_statements_total":
                stmt = labels["statement"]
                out.sql[stmt] = out.sql.get(stmt, 0.0) + value
            elif name == "corral_worker_placement_claims_total":
                outcome = labels.get("outcome", "")
                out.claims[outcome] = out.claims.get(outcome, 0.0) + value
            elif name == "corral_ledger_probe":
                out.probe = value > 0
    return out


def scrape(address: str, timeout: float = 5.0) -> Scrape:
    """GET http://`address`/metrics and parse it."""
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=timeout) as resp:  # noqa: S310 - a role's own metrics
        return parse(resp.read().decode())


def _sub(after: dict[Any, float], before: dict[Any, float]) -> dict[Any, float]:
    return {k: v - before.get(k, 0.0) for k, v in after.items() if v - before.get(k, 0.0) > 0}


def _sub_pairs(
    after: dict[Any, list[float]], before: dict[Any, list[float]]
) -> dict[Any, list[float]]:
    out = {}
    for k, (n, b) in after.items():
        n0, b0 = before.get(k, [0.0, 0.0])
        if n - n0 > 0:
            out[k] = [n - n0, b - b0]
    return out


def diff(before: Scrape, after: Scrape) -> Scrape:
    """What happened between two scrapes of one process."""
    return Scrape(
        rpc_server=_sub(after.rpc_server, before.rpc_server),
        rpc_client=_sub(after.rpc_client, before.rpc_client),
        grpc=_sub_pairs(after.grpc, before.grpc),
        protobuf=_sub_pairs(after.protobuf, before.protobuf),
        sql=_sub(after.sql, before.sql),
        claims={k: v - before.claims.get(k, 0.0) for k, v in after.claims.items()},
        probe=after.probe,
    )


# ------------------------------------------------------------------ the ledger


def _role(process: str) -> str:
    return "workers" if process.startswith("worker") else process


def _per(value: float, count: float, digits: int = 3) -> float:
    return round(value / count, digits) if count > 0 else 0.0


def _by_role(values: Iterable[tuple[str, float]]) -> dict[str, float]:
    out: dict[str, float] = {}
    for process, v in values:
        role = _role(process)
        out[role] = out.get(role, 0.0) + v
    return out


def plans(workload: Mapping[str, Any]) -> dict[str, Any]:
    """Plans, partial plans and commits per eval from a workload's figures:
    `plans_per_eval` is 1 when no eval had to re-plan, `partial_share` the
    partial plans ÷ plans applied (issue 30's target: ≤ 10% in W2),
    `commits_per_eval` the indexes written ÷ evals (every write in the
    window, the clients' alloc updates too), `plan_commits_per_eval` the
    indexes holding a plan result ÷ evals (1 when no eval re-planned),
    `planner_commits_per_eval` the planner's transactions ÷ evals (a
    transaction may hold several plans)."""
    evals = float(workload.get("evals") or 0)
    applied = float(workload.get("plans_applied") or 0)
    partial = float(workload.get("plans_partial") or 0)
    by_status = workload.get("evals_by_status") or {}
    out: dict[str, Any] = {
        "evals": int(evals),
        "evals_failed": int(by_status.get("failed", 0)),
        "plans_applied": int(applied),
        "plans_partial": int(partial),
        "node_plans_rejected": int(workload.get("plans_rejected") or 0),
        "plans_per_eval": _per(applied, evals, 2),
        "partial_share": _per(partial, applied, 3),
        "commits_per_eval": _per(float(workload.get("indexes") or 0), evals, 2),
        "planner_commits_per_eval": _per(float(workload.get("commits") or 0), evals, 2),
    }
    placed = float(workload.get("placements") or 0)
    if workload.get("nodes_used") is not None and placed:
        # packing: nodes the placements went to per 1,000 of them
        out["nodes_per_1000_allocs"] = round(float(workload["nodes_used"]) * 1000 / placed, 1)
    kinds = workload.get("commit_kinds")
    if isinstance(kinds, Mapping):
        out["commits_by_kind"] = dict(kinds)
        out["plan_commits_per_eval"] = _per(float(kinds.get("plan", 0)), evals, 2)
    return out


def build(
    deltas: Mapping[str, Scrape], placements: int, workload: Mapping[str, Any]
) -> dict[str, Any]:
    """The ledger of one workload from each process's counters over its
    window (`diff`), its placements and its other figures."""
    p = float(placements)
    servers: dict[str, dict[str, float]] = {}  # method -> process -> calls
    clients: dict[str, dict[str, float]] = {}
    excluded: dict[str, float] = {}
    for process, d in deltas.items():
        for m, n in d.rpc_server.items():
            if m in PROBE_METHODS:
                excluded[m] = excluded.get(m, 0.0) + n
                continue
            servers.setdefault(m, {})[process] = n
        for m, n in d.rpc_client.items():
            if m not in PROBE_METHODS:
                clients.setdefault(m, {})[process] = n
    # method -> [request messages, response messages, request bytes, response bytes]
    wire: dict[str, list[float]] = {}
    wire_servers: dict[str, set[str]] = {}
    for process, d in deltas.items():
        for (side, direction, m), (n, b) in d.grpc.items():
            if side != "server" or m in PROBE_METHODS:
                continue
            slot = wire.setdefault(m, [0.0, 0.0, 0.0, 0.0])
            slot[0 if direction == "request" else 1] += n
            slot[2 if direction == "request" else 3] += b
            wire_servers.setdefault(m, set()).add(process)
    by_method: dict[str, dict[str, Any]] = {}
    # a stream opened before the window has no call in it, only messages
    for m in sorted(set(servers) | set(wire)):
        by_server = servers.get(m, {})
        calls = sum(by_server.values())
        callers = {_role(c): 0.0 for c in clients.get(m, {})}
        for c, n in clients.get(m, {}).items():
            callers[_role(c)] += n
        if not callers and calls > 0:
            # no role called it: the simulated clients or the driver did
            # (where roles did, a difference is calls in flight at a scrape)
            callers[OUTSIDE] = calls
        req_n, resp_n, req, resp = wire.get(m, [0.0, 0.0, 0.0, 0.0])
        by_method[m] = {
            "calls": int(calls),
            "per_placement": _per(calls, p, 4),
            "server": "/".join(
                sorted({_role(s) for s in set(by_server) | wire_servers.get(m, set())})
            ),
            "callers": {k: int(v) for k, v in sorted(callers.items()) if v > 0},
            "messages": int(req_n + resp_n),
            "request_bytes": int(req),
            "response_bytes": int(resp),
            "bytes_per_placement": _per(req + resp, p, 1),
        }
    by_method = dict(
        sorted(
            by_method.items(),
            key=lambda kv: (-kv[1]["calls"], -kv[1]["request_bytes"] - kv[1]["response_bytes"]),
        )
    )
    rpc_total = sum(m["calls"] for m in by_method.values())
    bytes_total = sum(m["request_bytes"] + m["response_bytes"] for m in by_method.values())
    probed = sorted(name for name, d in deltas.items() if d.probe)
    ledger: dict[str, Any] = {
        "placements": placements,
        "processes": sorted(deltas),
        "probe": probed,
        "rpcs": {
            "total": rpc_total,
            "per_placement": _per(rpc_total, p, 3),
            "by_server_role": {
                r: int(v)
                for r, v in sorted(
                    _by_role((proc, n) for by in servers.values() for proc, n in by.items()).items()
                )
            },
            "excluded": {m: int(n) for m, n in sorted(excluded.items())},
        },
        "by_method": by_method,
        "plans": plans(workload),
    }
    claims: dict[str, float] = {}
    for d in deltas.values():
        for outcome, n in d.claims.items():
            claims[outcome] = claims.get(outcome, 0.0) + n
    if claims:
        # the worker loops' claims (services/worker/scheduler/feasible/inflight.py)
        ledger["claims"] = {k: int(v) for k, v in sorted(claims.items())}
    if probed:
        ledger["bytes"] = {"total": bytes_total, "per_placement": _per(bytes_total, p, 1)}
        ledger["protobuf"] = _protobuf(deltas, p)
        ledger["sql"] = _sql(deltas, p)
    return ledger


def _protobuf(deltas: Mapping[str, Scrape], p: float) -> dict[str, Any]:
    roles: dict[str, dict[str, float]] = {}
    types: dict[str, dict[str, float]] = {}
    for process, d in deltas.items():
        r = roles.setdefault(_role(process), {"encodes": 0.0, "decodes": 0.0})
        for (op, t), (n, b) in d.protobuf.items():
            key = "encodes" if op == "encode" else "decodes"
            r[key] += n
            slot = types.setdefault(t, {"encodes": 0.0, "decodes": 0.0, "bytes": 0.0})
            slot[key] += n
            slot["bytes"] += b
    enc = sum(r["encodes"] for r in roles.values())
    dec = sum(r["decodes"] for r in roles.values())
    top = sorted(types.items(), key=lambda kv: -(kv[1]["encodes"] + kv[1]["decodes"]))
    return {
        "encodes": int(enc),
        "decodes": int(dec),
        "encodes_per_placement": _per(enc, p, 3),
        "decodes_per_placement": _per(dec, p, 3),
        "by_role": {
            role: {
                "encodes": int(v["encodes"]),
                "decodes": int(v["decodes"]),
                "per_placement": _per(v["encodes"] + v["decodes"], p, 3),
            }
            for role, v in sorted(roles.items())
        },
        "by_type": {
            t: {k: int(x) for k, x in v.items()}
            | {"per_placement": _per(v["encodes"] + v["decodes"], p, 3)}
            for t, v in top[:TOP_TYPES]
        },
    }


def _sql(deltas: Mapping[str, Scrape], p: float) -> dict[str, Any]:
    roles: dict[str, float] = {}
    statements: dict[tuple[str, str], float] = {}
    for process, d in deltas.items():
        role = _role(process)
        for stmt, n in d.sql.items():
            roles[role] = roles.get(role, 0.0) + n
            statements[(role, stmt)] = statements.get((role, stmt), 0.0) + n
    total = sum(roles.values())
    top = sorted(statements.items(), key=lambda kv: -kv[1])[: TOP_STATEMENTS * 2]
    return {
        "statements": int(total),
        "per_placement": _per(total, p, 3),
        "by_role": {r: int(v) for r, v in sorted(roles.items())},
        "top": [
            {"role": role, "statement": stmt, "calls": int(n), "per_placement": _per(n, p, 4)}
            for (role, stmt), n in top
        ],
    }


# ------------------------------------------------------------------ figures


def figures(label: str, ledger: Mapping[str, Any]) -> dict[str, float]:
    """The ledger's headline figures, flat, for `report.compare` and
    `bench.ab` (`W1 RPCs/placement`, `W2 partial plans %`, ...)."""
    out: dict[str, float] = {}

    def put(name: str, v: Any) -> None:
        if isinstance(v, int | float) and not isinstance(v, bool):
            out[f"{label} {name}"] = float(v)

    put("RPCs/placement", (ledger.get("rpcs") or {}).get("per_placement"))
    put("bytes/placement", (ledger.get("bytes") or {}).get("per_placement"))
    pbuf = ledger.get("protobuf") or {}
    put("pb encodes/placement", pbuf.get("encodes_per_placement"))
    put("pb decodes/placement", pbuf.get("decodes_per_placement"))
    put("SQL/placement", (ledger.get("sql") or {}).get("per_placement"))
    pl = ledger.get("plans") or {}
    put("plans/eval", pl.get("plans_per_eval"))
    if isinstance(pl.get("partial_share"), int | float):
        put("partial plans %", round(100 * float(pl["partial_share"]), 1))
    put("node-plans rejected", pl.get("node_plans_rejected"))
    put("commits/eval", pl.get("commits_per_eval"))
    put("plan commits/eval", pl.get("plan_commits_per_eval"))
    put("planner commits/eval", pl.get("planner_commits_per_eval"))
    put("evals failed", pl.get("evals_failed"))
    put("nodes per 1,000 allocs", pl.get("nodes_per_1000_allocs"))
    put("claim conflicts", (ledger.get("claims") or {}).get("conflict"))
    return out


def method_figures(label: str, ledger: Mapping[str, Any]) -> dict[str, float]:
    """Calls and bytes per placement of every method, flat
    (`W1 Plan/Submit calls/placement`)."""
    out: dict[str, float] = {}
    for m, f in (ledger.get("by_method") or {}).items():
        short = m.rsplit(".", 1)[-1]  # "Plan/Submit"
        out[f"{label} {short} calls/placement"] = float(f.get("per_placement") or 0.0)
        if ledger.get("probe"):
            out[f"{label} {short} bytes/placement"] = float(f.get("bytes_per_placement") or 0.0)
    return out
