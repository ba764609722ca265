"""The per-placement ledger (bench/ledger.py), its counters inside a process
(bench/ledger_site/corral_ledger_probe.py), its report sections and the
A/B summary (bench/ab.py), on hand-made scrapes and runs whose figures are
worked out by hand."""

from __future__ import annotations

import importlib.util
import subprocess
from pathlib import Path
from types import ModuleType
from typing import Any

import grpc
import pytest
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from prometheus_client import CollectorRegistry, generate_latest

from bench import ab, ledger, measure, report
from bench.cluster import LEDGER_SITE, role_paths

ROOT = Path(__file__).resolve().parents[2]


def fresh_probe() -> ModuleType:
    """A private copy of the probe module (its counters start empty)."""
    spec = importlib.util.spec_from_file_location(
        f"probe_{id(object())}", LEDGER_SITE / "corral_ledger_probe.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# ------------------------------------------------------------------ the probe


def thing_class() -> Any:
    """A message class of its own descriptor pool, so patching it touches
    no class the rest of the suite uses."""
    fdp = descriptor_pb2.FileDescriptorProto(name="ledger_test.proto", package="ledgertest")
    msg = fdp.message_type.add(name="Thing")
    msg.field.add(
        name="x",
        number=1,
        type=descriptor_pb2.FieldDescriptorProto.TYPE_STRING,
        label=descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL,
    )
    inner = msg.nested_type.add(name="Inner")
    inner.field.add(
        name="y",
        number=1,
        type=descriptor_pb2.FieldDescriptorProto.TYPE_INT32,
        label=descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL,
    )
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fdp)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("ledgertest.Thing"))


def test_probe_counts_each_encode_and_decode_once_with_its_bytes() -> None:
    probe = fresh_probe()
    cls = thing_class()
    probe.patch_message_class(cls)
    probe.patch_message_class(cls)  # a second patch is a no-op
    data = cls(x="abc").SerializeToString()  # 5 bytes: tag, length, 3 chars
    assert cls.FromString(data).x == "abc"
    cls().ParseFromString(data)
    cls().MergeFromString(data)
    assert probe.PROTOBUF[("encode", "ledgertest.Thing")] == [1, 5]
    assert probe.PROTOBUF[("decode", "ledgertest.Thing")] == [3, 15]
    cls.Inner(y=1).SerializeToString()  # nested types are patched too
    assert probe.PROTOBUF[("encode", "ledgertest.Thing.Inner")][0] == 1


def test_probe_counts_server_messages_by_method_and_never_twice() -> None:
    probe = fresh_probe()
    handler = grpc.unary_unary_rpc_method_handler(
        lambda req, ctx: req, request_deserializer=bytes.upper, response_serializer=bytes.lower
    )
    handlers = {"Get": handler}
    probe.wrap_server_handlers("pkg.Svc", handlers)
    probe.wrap_server_handlers("pkg.Svc", handlers)  # already counting: left alone
    wrapped: Any = handlers["Get"]
    assert wrapped.request_deserializer(b"ab") == b"AB"
    assert wrapped.response_serializer(b"XYZ") == b"xyz"
    assert probe.GRPC[("server", "request", "/pkg.Svc/Get")] == [1, 2]
    assert probe.GRPC[("server", "response", "/pkg.Svc/Get")] == [1, 3]
    # a handler rebuilt with the counted deserializer and a serializer of
    # its own (the state's pass-through Subscribe) gets the serializer counted
    rebuilt = {
        "Get": grpc.unary_stream_rpc_method_handler(
            lambda req, ctx: iter(()),
            request_deserializer=wrapped.request_deserializer,
            response_serializer=lambda b: b,
        )
    }
    probe.wrap_server_handlers("pkg.Svc", rebuilt)
    again: Any = rebuilt["Get"]
    assert again.request_deserializer is wrapped.request_deserializer
    assert again.response_serializer(b"pass") == b"pass"
    assert probe.GRPC[("server", "response", "/pkg.Svc/Get")] == [2, 7]


def test_probe_counts_sql_statements_by_text() -> None:
    probe = fresh_probe()

    class Cursor:
        def execute(self, query: Any, params: Any = None) -> str:
            return "ran"

        def executemany(self, query: Any, seq: Any) -> str:
            return "ran many"

    fake = ModuleType("psycopg_fake")
    fake.Cursor = Cursor  # type: ignore[attr-defined]
    probe._hook_psycopg(fake)
    cur = Cursor()
    query = "SELECT 1\n   FROM t WHERE id = %s"
    assert cur.execute(query, (1,)) == "ran"
    cur.execute(query, (2,))
    cur.executemany("INSERT INTO t VALUES (%s)", [(1,), (2,)])
    cur.execute(b"SELECT 2")
    assert probe.sql_totals() == {
        "SELECT 1 FROM t WHERE id = %s": 2,
        "INSERT INTO t VALUES (%s)": 1,
        "SELECT 2": 1,
    }
    assert probe.statement_key(object()) == "<object>"


def test_probe_metrics_read_back_by_the_ledger() -> None:
    probe = fresh_probe()
    probe.PROTOBUF[("encode", "corral.v1.types.Job")] = [3, 300]
    probe.GRPC[("server", "response", "/corral.v1.State/Subscribe")] = [4, 4000]
    probe.SQL["SELECT 1"] = [7, 0]
    registry = CollectorRegistry()
    registry.register(probe.LedgerCollector())
    scraped = ledger.parse(generate_latest(registry).decode())
    assert scraped.probe
    assert scraped.protobuf == {("encode", "corral.v1.types.Job"): [3.0, 300.0]}
    assert scraped.grpc == {("server", "response", "/corral.v1.State/Subscribe"): [4.0, 4000.0]}
    assert scraped.sql == {"SELECT 1": 7.0}


def test_the_roles_load_the_probe_from_their_pythonpath() -> None:
    env = role_paths(True, None)
    code = (
        "import sys, prometheus_client; "
        "print('corral_ledger_probe' in sys.modules, "
        "b'corral_ledger_probe 1.0' in prometheus_client.generate_latest())"
    )
    out = subprocess.run(
        [ROOT / ".venv" / "bin" / "python", "-c", code],
        env={"PATH": "/usr/bin:/bin", **env},
        capture_output=True,
        text=True,
        check=True,
        cwd="/",
    ).stdout
    assert out.split() == ["True", "True"]


def test_role_paths_put_the_old_tree_first_and_the_working_directory_off() -> None:
    assert role_paths(False, None) == {}
    assert role_paths(True, None, "/x") == {"PYTHONPATH": f"{LEDGER_SITE}:/x"}
    old = Path("/tmp/old-tree")
    assert role_paths(True, old) == {
        "PYTHONSAFEPATH": "1",
        "PYTHONPATH": f"/tmp/old-tree:{LEDGER_SITE}",
    }


# ------------------------------------------------------------------ the ledger

METRICS = """\
# TYPE grpc_server_started_total counter
grpc_server_started_total{grpc_type="unary",grpc_service="corral.v1.Plan",grpc_method="Submit"} 12.0
grpc_server_started_total{grpc_type="unary",grpc_service="corral.v1.Plan",grpc_method="Stats"} 40.0
# TYPE grpc_client_started_total counter
grpc_client_started_total{grpc_type="unary",grpc_service="corral.v1.State",\
grpc_method="ApplyPlans"} 3.0
# TYPE corral_worker_placement_claims_total counter
corral_worker_placement_claims_total{outcome="conflict"} 2.0
# TYPE corral_ledger_probe gauge
corral_ledger_probe 1.0
"""


def test_parse_and_diff_a_metrics_page() -> None:
    s = ledger.parse(METRICS)
    assert s.rpc_server == {"/corral.v1.Plan/Submit": 12.0, "/corral.v1.Plan/Stats": 40.0}
    assert s.rpc_client == {"/corral.v1.State/ApplyPlans": 3.0}
    assert s.claims == {"conflict": 2.0}
    assert s.probe
    later = ledger.parse(METRICS.replace('Submit"} 12.0', 'Submit"} 20.0'))
    d = ledger.diff(s, later)
    assert d.rpc_server == {"/corral.v1.Plan/Submit": 8.0}  # unchanged ones drop out
    assert d.rpc_client == {}


def scrape(**kw: Any) -> ledger.Scrape:
    return ledger.Scrape(probe=True, **kw)


def hand_made_deltas() -> dict[str, ledger.Scrape]:
    submit, apply_, sub = (
        "/corral.v1.Plan/Submit",
        "/corral.v1.State/ApplyPlans",
        ("/corral.v1.State/Subscribe"),
    )
    register, stats = "/corral.v1.Job/Register", "/corral.v1.Eval/Stats"
    return {
        "state": scrape(
            rpc_server={apply_: 4.0, register: 10.0, stats: 99.0},
            grpc={
                ("server", "request", apply_): [4.0, 40_000.0],
                ("server", "response", apply_): [4.0, 400.0],
                ("server", "request", register): [10.0, 5_000.0],
                ("server", "response", sub): [30.0, 60_000.0],  # a stream from before
            },
            protobuf={("encode", "T"): [50.0, 0.0], ("decode", "T"): [30.0, 0.0]},
            sql={"SELECT 1": 40.0, "INSERT x": 10.0},
        ),
        "planner": scrape(
            rpc_server={submit: 12.0},
            rpc_client={apply_: 4.0},
            grpc={("server", "request", submit): [12.0, 24_000.0]},
            protobuf={("decode", "T"): [10.0, 0.0]},
            sql={"SELECT pg_try_advisory_lock(%s)": 2.0},
        ),
        "worker0": scrape(
            rpc_client={submit: 7.0},
            protobuf={("encode", "U"): [5.0, 0.0]},
            claims={"claimed": 90.0, "conflict": 3.0, "forced": 0.0},
        ),
        "worker1": scrape(rpc_client={submit: 5.0}),
    }


WORKLOAD = {
    "placements": 100,
    "nodes_used": 30,
    "evals": 10,
    "evals_by_status": {"complete": 9, "failed": 1},
    "plans_applied": 12,
    "plans_partial": 3,
    "plans_rejected": 40,
    "indexes": 25,
    "commits": 4,
    "commit_kinds": {"plan": 12, "job": 2, "client update": 11, "shared": 5},
}


def test_build_the_ledger_of_a_workload() -> None:
    lg = ledger.build(hand_made_deltas(), 100, WORKLOAD)
    # 4 ApplyPlans + 10 Register + 12 Submit; the 99 stats polls left out
    assert lg["rpcs"]["total"] == 26 and lg["rpcs"]["per_placement"] == 0.26
    assert lg["rpcs"]["excluded"] == {"/corral.v1.Eval/Stats": 99}
    assert lg["rpcs"]["by_server_role"] == {"planner": 12, "state": 14}
    by = lg["by_method"]
    assert list(by)[:3] == [
        "/corral.v1.Plan/Submit",
        "/corral.v1.Job/Register",
        "/corral.v1.State/ApplyPlans",
    ]
    assert by["/corral.v1.Plan/Submit"]["callers"] == {"workers": 12}
    assert by["/corral.v1.Plan/Submit"]["bytes_per_placement"] == 240.0
    assert by["/corral.v1.Job/Register"]["callers"] == {"outside": 10}  # no role calls it
    assert by["/corral.v1.State/ApplyPlans"]["callers"] == {"planner": 4}
    assert by["/corral.v1.State/ApplyPlans"]["bytes_per_placement"] == 404.0
    stream = by["/corral.v1.State/Subscribe"]
    assert stream["calls"] == 0 and stream["messages"] == 30 and stream["server"] == "state"
    # 24,000 + 40,400 + 5,000 + 60,000 bytes over 100 placements
    assert lg["bytes"] == {"total": 129_400, "per_placement": 1294.0}
    pbuf = lg["protobuf"]
    assert (pbuf["encodes"], pbuf["decodes"]) == (55, 40)
    assert pbuf["by_role"]["workers"] == {"encodes": 5, "decodes": 0, "per_placement": 0.05}
    assert pbuf["by_type"]["T"] == {"encodes": 50, "decodes": 40, "bytes": 0, "per_placement": 0.9}
    sql = lg["sql"]
    assert sql["statements"] == 52 and sql["per_placement"] == 0.52
    assert sql["by_role"] == {"planner": 2, "state": 50}
    assert sql["top"][0] == {
        "role": "state",
        "statement": "SELECT 1",
        "calls": 40,
        "per_placement": 0.4,
    }
    assert lg["claims"] == {"claimed": 90, "conflict": 3, "forced": 0}
    assert lg["plans"] == {
        "evals": 10,
        "evals_failed": 1,
        "plans_applied": 12,
        "plans_partial": 3,
        "node_plans_rejected": 40,
        "plans_per_eval": 1.2,
        "partial_share": 0.25,
        "commits_per_eval": 2.5,
        "planner_commits_per_eval": 0.4,
        "nodes_per_1000_allocs": 300.0,
        "commits_by_kind": WORKLOAD["commit_kinds"],
        "plan_commits_per_eval": 1.2,
    }


def test_a_ledger_without_the_probe_keeps_rpcs_and_plans_only() -> None:
    deltas = {"state": ledger.Scrape(rpc_server={"/corral.v1.Job/Register": 5.0})}
    lg = ledger.build(deltas, 50, WORKLOAD)
    assert lg["probe"] == [] and lg["rpcs"]["per_placement"] == 0.1
    assert "protobuf" not in lg and "sql" not in lg and "bytes" not in lg
    figures = ledger.figures("W1", lg)
    assert figures["W1 RPCs/placement"] == 0.1 and "W1 SQL/placement" not in figures
    assert ledger.method_figures("W1", lg) == {"W1 Job/Register calls/placement": 0.1}


def test_ledger_figures_and_the_report() -> None:
    lg = ledger.build(hand_made_deltas(), 100, WORKLOAD)
    f = ledger.figures("W2", lg)
    assert f["W2 partial plans %"] == 25.0
    assert f["W2 plans/eval"] == 1.2 and f["W2 plan commits/eval"] == 1.2
    assert f["W2 pb encodes/placement"] == 0.55 and f["W2 SQL/placement"] == 0.52
    assert ledger.method_figures("W2", lg)["W2 Plan/Submit bytes/placement"] == 240.0

    run = {"profile": "quick", "workloads": {"W2": {**WORKLOAD, "ledger": lg}}}
    text = report.markdown(run)
    assert "## Per-placement ledger" in text
    assert "### W2: RPCs by method" in text and "State/Subscribe" in text
    assert "### Commits by kind" in text and "### Top SQL statements" in text
    assert "W2 90 claimed, 3 conflicts (selected again), 0 forced" in text
    old = {"profile": "quick", "workloads": {"W2": {"placements": 100, "ledger": lg}}}
    new_lg = ledger.build({"planner": scrape(rpc_server={"/corral.v1.Plan/Submit": 6.0})}, 100, {})
    new = {"profile": "quick", "workloads": {"W2": {"placements": 100, "ledger": new_lg}}}
    rows = {r[0]: r for r in report.compare(old, new)}
    assert rows["W2 RPCs/placement"][1:] == ["0.26", "0.06", "-77%"]
    methods = {r[0]: r for r in report.compare_methods(old, new)}
    assert methods["W2 Plan/Submit calls/placement"][1:] == ["0.120", "0.060", "-50%"]
    assert methods["W2 Job/Register calls/placement"][1:] == ["0.100", "0.000", "-100%"]
    assert "### Ledger by method, old → new" in report.markdown(new, old, "old.json")


def test_commit_kinds_by_the_events_of_a_batch() -> None:
    assert measure.commit_kind({"PlanResult", "EvaluationUpdated"}) == "plan"
    assert measure.commit_kind({"JobRegistered", "EvaluationUpdated"}) == "job"
    assert measure.commit_kind({"NodeAllocUpdate", "AllocationUpdated"}) == "client update"
    assert measure.commit_kind({"EvaluationUpdated"}) == "eval"
    assert measure.commit_kind({"NodeRegistration"}) == "node"
    assert measure.commit_kind({"SchedulerConfigUpdated"}) == "other"


# ------------------------------------------------------------------ A/B


def ab_run(rate: float, rpcs: float) -> dict[str, Any]:
    lg = {
        "rpcs": {"per_placement": rpcs},
        "by_method": {"/corral.v1.Plan/Submit": {"per_placement": rpcs}},
    }
    return {"workloads": {"W1": {"placements_per_s": rate, "ledger": lg}}}


def test_ab_summary_medians_spreads_and_noise() -> None:
    runs = {
        "old": [ab_run(100.0, 3.0), ab_run(120.0, 3.0), ab_run(110.0, 3.0)],
        "new": [ab_run(115.0, 1.5), ab_run(105.0, 1.5), ab_run(150.0, 1.5)],
    }
    rows = {r["figure"]: r for r in ab.summarize(runs)}
    rate = rows["W1 placements/s"]
    assert rate["old"] == {"median": 110.0, "min": 100.0, "max": 120.0, "rounds": 3}
    assert rate["new"]["median"] == 115.0
    assert rate["change"] == pytest.approx(5 / 110)
    assert rate["overlap"]  # 105–150 against 100–120: within the noise
    rpcs = rows["W1 RPCs/placement"]
    assert rpcs["change"] == -0.5 and not rpcs["overlap"]
    assert rows["W1 Plan/Submit calls/placement"]["by_method"]
    text = ab.markdown(ab.summarize(runs), "abc1234", "def5678", 3)
    assert "| W1 placements/s" in text and "110.0 [100.0–120.0]" in text and "+5% ~" in text
    assert "-50%" in text and "## The ledger by method" in text


def test_ab_alternates_which_side_goes_first() -> None:
    assert [ab.order(r) for r in range(3)] == [("old", "new"), ("new", "old"), ("old", "new")]


def test_ab_checks_out_a_revision_into_a_worktree_and_removes_it(tmp_path: Path) -> None:
    commit = ab.resolve("HEAD")
    assert len(commit) == 40
    with pytest.raises(ValueError):
        ab.resolve("no-such-revision-anywhere")
    tree = tmp_path / "old"
    ab.add_worktree(commit, tree)
    try:
        assert (tree / "services" / "state").is_dir()
        head = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=tree, capture_output=True, text=True, check=True
        )
        assert head.stdout.strip() == commit
    finally:
        ab.remove_worktree(tree)
    assert not tree.exists()
    listed = subprocess.run(
        ["git", "worktree", "list"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    assert str(tree) not in listed


def test_n1_reports_what_the_states_calls_cost_per_call() -> None:
    """N1 has no placements: the state's calls in the window (the probes
    left out) give its CPU-ms and SQL statements per call, and the figures
    reach the A/B comparison and the summary."""
    from bench.workloads import state_call_costs

    d = ledger.Scrape(
        rpc_server={
            "/corral.v1.Node/UpdateStatus": 300.0,
            "/corral.v1.Node/GetClientAllocs": 100.0,
            "/corral.v1.Eval/Stats": 50.0,  # the bench's own poll
        },
        sql={"UPDATE index_counter SET value = value + %s": 40.0, "SELECT 1": 20.0},
    )
    got = state_call_costs(d, cpu_s=0.8, elapsed_s=10.0)
    assert got == {
        "state_calls_per_s": 40.0,
        "state_calls_by_method": {"Node/UpdateStatus": 300, "Node/GetClientAllocs": 100},
        "state_cpu_ms_per_call": 2.0,
        "state_sql_per_call": 0.15,
    }
    run: dict[str, Any] = {"workloads": {"N1": {"name": "idle", **got}}}
    figures = report.figures(run)
    assert figures["N1 state_cpu_ms_per_call"] == 2.0
    assert figures["N1 state_sql_per_call"] == 0.15
    summary = report.markdown(run)
    assert "state CPU-ms per call 2.00" in summary
    assert "state calls Node/UpdateStatus 300, Node/GetClientAllocs 100" in summary
