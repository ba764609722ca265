"""deploy/observability/ against the code: every metric a dashboard or a
rule names is one the code exports (the registry after importing every
module of corral/ and services/), recording rules are named
`level:metric:operations`, and the committed dashboards are what
scripts/gen_dashboards.py writes. (`make test` also runs `promtool check
rules` and `promtool test rules`; tests here need no promtool.)"""

from __future__ import annotations

import importlib
import json
import pkgutil
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import REGISTRY, Metric

import corral
import services
from cli import dev_metrics

ROOT = Path(__file__).resolve().parents[2]
OBS = ROOT / "deploy" / "observability"
DASHBOARDS = ("corral-pipeline", "corral-nodes") + tuple(
    f"corral-{role}" for role in dev_metrics.ROLES
)

_SUFFIXES = {
    "counter": ("_total", "_created"),
    "histogram": ("_bucket", "_count", "_sum", "_created"),
    "summary": ("", "_count", "_sum", "_created"),
    "gauge": ("",),
    "info": ("_info",),
    "unknown": ("",),
}
_KEYWORDS = {
    "and",
    "or",
    "unless",
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "bool",
    "offset",
    "inf",
    "nan",
}


def _import_all() -> None:
    for package in (corral, services):
        for mod in pkgutil.walk_packages(package.__path__, f"{package.__name__}."):
            if not mod.name.endswith("__main__") and ".migrations" not in mod.name:
                importlib.import_module(mod.name)


def _families() -> Iterator[Metric]:
    from services.agent.metrics import ALLOCS
    from services.state.metrics import CLUSTER

    yield from REGISTRY.collect()
    yield from CLUSTER.describe()
    yield from ALLOCS.describe()


@pytest.fixture(scope="module")
def exported() -> set[str]:
    _import_all()
    names: set[str] = set()
    for family in _families():
        names.update(family.name + suffix for suffix in _SUFFIXES[family.type])
    return names


def metric_names(expr: str) -> set[str]:
    """The metric (and recorded series) names a PromQL expression reads."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    text = re.sub(r"\{[^}]*\}", "", text)
    text = re.sub(r"\[[^\]]*\]", "", text)
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text)
    names = set()
    for match in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", text):
        word = match.group(0)
        following = text[match.end() :].lstrip()[:1]
        if following == "(" or word.lower() in _KEYWORDS:
            continue
        names.add(word)
    return names


def test_metric_names_are_read_from_promql() -> None:
    expr = (
        'histogram_quantile(0.99, sum by (le) (rate(a_seconds_bucket{x="y(z)"}[5m]))) '
        'and on (instance) b_info{role="s"} > 1 or sum(c) by (d) / ignoring(e) f:g:h'
    )
    assert metric_names(expr) == {"a_seconds_bucket", "b_info", "c", "f:g:h"}


def _rules() -> list[dict[str, Any]]:
    rules: list[dict[str, Any]] = []
    for path in sorted((OBS / "rules").glob("*.yml")):
        for group in yaml.safe_load(path.read_text())["groups"]:
            rules.extend(group["rules"])
    return rules


def _dashboard_queries() -> list[tuple[str, str, str]]:
    out = []
    for path in sorted((OBS / "dashboards").glob("*.json")):
        board = json.loads(path.read_text())
        for panel in board["panels"]:
            for target in panel["targets"]:
                out.append((path.name, panel["title"], target["expr"]))
    return out


def test_rules_name_only_exported_metrics(exported: set[str]) -> None:
    rules = _rules()
    recorded = {r["record"] for r in rules if "record" in r}
    assert recorded and all(name.count(":") == 2 for name in recorded), recorded
    unknown = {
        (r.get("alert") or r.get("record"), name)
        for r in rules
        for name in metric_names(r["expr"])
        if name not in exported and name not in recorded
    }
    assert not unknown, f"rules read metrics the code does not export: {sorted(unknown)}"
    assert {r["alert"] for r in rules if "alert" in r} >= {
        "CorralNoLeader",
        "CorralBrokerBacklogGrowing",
        "CorralPlanRejectionsHigh",
        "CorralNodesFlapping",
        "CorralHeartbeatMisses",
        "CorralEvalFailures",
    }


def test_dashboards_name_only_exported_metrics(exported: set[str]) -> None:
    queries = _dashboard_queries()
    assert {board for board, _, _ in queries} == {f"{name}.json" for name in DASHBOARDS}
    unknown = {
        (board, title, name)
        for board, title, expr in queries
        for name in metric_names(expr)
        if name not in exported
    }
    assert not unknown, f"dashboards read metrics the code does not export: {sorted(unknown)}"


def test_every_dashboard_and_rule_query_reads_some_metric() -> None:
    for board, title, expr in _dashboard_queries():
        assert metric_names(expr), (board, title, expr)
    for rule in _rules():
        assert metric_names(rule["expr"]), rule


def test_committed_dashboards_are_generated() -> None:
    script = ROOT / "scripts" / "gen_dashboards.py"
    proc = subprocess.run(
        [sys.executable, str(script), "--check"], capture_output=True, text=True, check=False
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_dev_scrape_config_names_every_role(tmp_path: Path) -> None:
    targets = {role: f"127.0.0.1:{port}" for role, port in dev_metrics.metrics_ports(9646).items()}
    path = dev_metrics.write_scrape_config(tmp_path, targets)
    config = yaml.safe_load(path.read_text())
    static = config["scrape_configs"][0]["static_configs"]
    assert {(s["labels"]["role"], s["targets"][0]) for s in static} == {
        ("state", "127.0.0.1:9646"),
        ("broker", "127.0.0.1:9647"),
        ("planner", "127.0.0.1:9648"),
        ("worker", "127.0.0.1:9649"),
        ("agent", "127.0.0.1:9650"),
        ("gateway", "127.0.0.1:9651"),
    }
    assert config["rule_files"] == [f"{OBS / 'rules'}/*.yml"]
    assert dev_metrics.base_port(None, 0) == 0
    assert dev_metrics.base_port(None, 4646) == dev_metrics.DEFAULT_METRICS_PORT
    assert dev_metrics.base_port(7000, 0) == 7000
