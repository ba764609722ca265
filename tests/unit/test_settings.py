"""Role settings (corral/runtime/settings.py): flags beat the environment, which
beats the defaults; every flag and variable name that predates the models
still works; a bad setting is one usage line naming the flag, exit 2."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from corral.runtime.settings import Settings, load, settings_of
from services.agent.config import AgentSettings
from services.agent.sim import SimSettings
from services.broker.config import BrokerProcessSettings
from services.gateway.config import GatewaySettings
from services.planner.config import PlannerProcessSettings
from services.state.config import StateSettings
from services.worker.config import WorkerSettings

BROKER_ARGS = ["--dsn", "postgresql://x/y", "--state-addr", "127.0.0.1:1"]


def _clear_env(monkeypatch: pytest.MonkeyPatch, model: type[Settings]) -> None:
    for setting in settings_of(model):
        monkeypatch.delenv(setting.env, raising=False)


def test_a_flag_beats_the_environment_which_beats_the_default(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _clear_env(monkeypatch, BrokerProcessSettings)
    settings, _ = load(BrokerProcessSettings, BROKER_ARGS, prog="broker")
    assert settings.broker.nack_timeout == 60.0  # the default

    monkeypatch.setenv("CORRAL_BROKER_NACK_TIMEOUT", "7.5")
    monkeypatch.setenv("CORRAL_BROKER_DELIVERY_LIMIT", "5")
    settings, _ = load(BrokerProcessSettings, BROKER_ARGS, prog="broker")
    assert settings.broker.nack_timeout == 7.5
    assert settings.broker.delivery_limit == 5

    settings, _ = load(BrokerProcessSettings, [*BROKER_ARGS, "--nack-timeout", "2"], prog="broker")
    assert settings.broker.nack_timeout == 2.0  # the flag
    assert settings.broker.delivery_limit == 5  # the environment, same group


def test_required_settings_come_from_the_environment_too(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _clear_env(monkeypatch, WorkerSettings)
    monkeypatch.setenv("CORRAL_STATE_ADDR", "s:1")
    monkeypatch.setenv("CORRAL_BROKER_ADDR", "b:1,b:2")
    monkeypatch.setenv("CORRAL_PLANNER_ADDR", "p:1")
    monkeypatch.setenv("CORRAL_WORKER_SCHEDULERS", "service,_core")
    settings, _ = load(WorkerSettings, ["--num-schedulers", "3"], prog="worker")
    assert settings.state_addr == "s:1"
    assert settings.broker_addrs == ["b:1", "b:2"]
    assert settings.planner_addrs == ["p:1"]
    assert settings.enabled_schedulers == ["service", "_core"]
    assert settings.num_schedulers == 3


def test_an_empty_variable_counts_as_unset(monkeypatch: pytest.MonkeyPatch) -> None:
    _clear_env(monkeypatch, BrokerProcessSettings)
    monkeypatch.setenv("CORRAL_BROKER_LISTEN", "")
    settings, _ = load(BrokerProcessSettings, BROKER_ARGS, prog="broker")
    assert settings.listen == "127.0.0.1:0"


def test_repeated_key_value_flags_and_commands(monkeypatch: pytest.MonkeyPatch) -> None:
    _clear_env(monkeypatch, AgentSettings)
    settings, _ = load(
        AgentSettings,
        ["--state-addr", "s:1", "--meta", "rack=r1", "--meta", "zone=a=b"],
        prog="agent",
    )
    assert settings.meta == {"rack": "r1", "zone": "a=b"}
    assert settings.data_dir.is_absolute()

    _clear_env(monkeypatch, StateSettings)
    state, command = load(
        StateSettings, ["migrate", "--dsn", "x"], prog="state", commands=("serve", "migrate")
    )
    assert (command, state.dsn) == ("migrate", "x")
    _, command = load(StateSettings, ["--dsn", "x"], prog="state", commands=("serve", "migrate"))
    assert command == "serve"


@pytest.mark.parametrize(
    ("argv", "env", "needle"),
    [
        ([], {}, "--dsn (or CORRAL_DSN) is required"),
        (["--nack-timeout", "0"], {}, "--nack-timeout (or CORRAL_BROKER_NACK_TIMEOUT): "),
        ([], {"CORRAL_BROKER_DELIVERY_LIMIT": "many"}, "--delivery-limit (or CORRAL_BROKER"),
        (["--log-format", "xml"], {}, "--log-format (or CORRAL_LOG_FORMAT): "),
    ],
)
def test_a_bad_setting_is_one_usage_error_naming_the_flag(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    argv: list[str],
    env: dict[str, str],
    needle: str,
) -> None:
    _clear_env(monkeypatch, BrokerProcessSettings)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    args = argv if needle.startswith("--dsn") else [*BROKER_ARGS, *argv]
    with pytest.raises(SystemExit) as exit_info:
        load(BrokerProcessSettings, args, prog="broker")
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert needle in err
    assert "Traceback" not in err


#: every flag and variable the roles took before their settings were models
#: (corral dev, tests/cluster.py, bench/cluster.py, deploy/ use them)
HISTORICAL: dict[type[Settings], list[tuple[str, str]]] = {
    StateSettings: [
        ("--dsn", "CORRAL_DSN"),
        ("--listen", "CORRAL_STATE_LISTEN"),
        ("--metrics-listen", "CORRAL_STATE_METRICS_LISTEN"),
        ("--ready-file", "CORRAL_STATE_READY_FILE"),
        ("--log-retention", "CORRAL_STATE_LOG_RETENTION"),
        ("--advertise", "CORRAL_ADVERTISE_ADDR"),
        ("--heartbeat-min-ttl", "CORRAL_HEARTBEAT_MIN_TTL"),
        ("--heartbeat-grace", "CORRAL_HEARTBEAT_GRACE"),
        ("--heartbeat-failover-ttl", "CORRAL_HEARTBEAT_FAILOVER_TTL"),
        ("--heartbeats-per-second", "CORRAL_HEARTBEATS_PER_SECOND"),
    ],
    BrokerProcessSettings: [
        ("--dsn", "CORRAL_DSN"),
        ("--state-addr", "CORRAL_STATE_ADDR"),
        ("--listen", "CORRAL_BROKER_LISTEN"),
        ("--advertise", "CORRAL_ADVERTISE_ADDR"),
        ("--metrics-listen", "CORRAL_BROKER_METRICS_LISTEN"),
        ("--ready-file", "CORRAL_BROKER_READY_FILE"),
        ("--nack-timeout", "CORRAL_BROKER_NACK_TIMEOUT"),
        ("--delivery-limit", "CORRAL_BROKER_DELIVERY_LIMIT"),
        ("--initial-nack-delay", "CORRAL_BROKER_INITIAL_NACK_DELAY"),
        ("--subsequent-nack-delay", "CORRAL_BROKER_SUBSEQUENT_NACK_DELAY"),
        ("--failed-followup-delay", "CORRAL_BROKER_FAILED_FOLLOWUP_DELAY"),
        ("--failed-followup-jitter", "CORRAL_BROKER_FAILED_FOLLOWUP_JITTER"),
        ("--reaper-interval", "CORRAL_BROKER_REAPER_INTERVAL"),
        ("--core-gc-interval", "CORRAL_BROKER_CORE_GC_INTERVAL"),
        ("--unblock-failed-interval", "CORRAL_BROKER_UNBLOCK_FAILED_INTERVAL"),
    ],
    PlannerProcessSettings: [
        ("--dsn", "CORRAL_DSN"),
        ("--state-addr", "CORRAL_STATE_ADDR"),
        ("--broker-addr", "CORRAL_BROKER_ADDR"),
        ("--listen", "CORRAL_PLANNER_LISTEN"),
        ("--metrics-listen", "CORRAL_PLANNER_METRICS_LISTEN"),
        ("--ready-file", "CORRAL_PLANNER_READY_FILE"),
        ("--pipeline-depth", "CORRAL_PLANNER_PIPELINE_DEPTH"),
        ("--max-batch", "CORRAL_PLANNER_MAX_BATCH"),
        ("--max-batch-allocs", "CORRAL_PLANNER_MAX_BATCH_ALLOCS"),
        ("--fault", "CORRAL_PLANNER_FAULT"),
    ],
    WorkerSettings: [
        ("--state-addr", "CORRAL_STATE_ADDR"),
        ("--broker-addr", "CORRAL_BROKER_ADDR"),
        ("--planner-addr", "CORRAL_PLANNER_ADDR"),
        ("--listen", "CORRAL_WORKER_LISTEN"),
        ("--advertise", "CORRAL_ADVERTISE_ADDR"),
        ("--metrics-listen", "CORRAL_WORKER_METRICS_LISTEN"),
        ("--ready-file", "CORRAL_WORKER_READY_FILE"),
        ("--num-schedulers", "CORRAL_WORKER_NUM_SCHEDULERS"),
        ("--schedulers", "CORRAL_WORKER_SCHEDULERS"),
        ("--sync-limit", "CORRAL_WORKER_SYNC_LIMIT"),
        ("--slow-catchup", "CORRAL_WORKER_SLOW_CATCHUP"),
        ("--scheduler-version", "CORRAL_WORKER_SCHEDULER_VERSION"),
        ("--fault", "CORRAL_WORKER_FAULT"),
    ],
    AgentSettings: [
        ("--state-addr", "CORRAL_STATE_ADDR"),
        ("--data-dir", "CORRAL_AGENT_DATA_DIR"),
        ("--datacenter", "CORRAL_AGENT_DATACENTER"),
        ("--node-class", "CORRAL_AGENT_NODE_CLASS"),
        ("--node-pool", "CORRAL_AGENT_NODE_POOL"),
        ("--name", "CORRAL_AGENT_NODE_NAME"),
        ("--drivers", "CORRAL_AGENT_DRIVERS"),
        ("--listen", "CORRAL_AGENT_LISTEN"),
        ("--metrics-listen", "CORRAL_AGENT_METRICS_LISTEN"),
        ("--ready-file", "CORRAL_AGENT_READY_FILE"),
    ],
    SimSettings: [
        ("--state-addr", "CORRAL_STATE_ADDR"),
        ("--ready-file", "CORRAL_SIM_READY_FILE"),
    ],
    GatewaySettings: [
        ("--listen", "CORRAL_GATEWAY_LISTEN"),
        ("--metrics-listen", "CORRAL_GATEWAY_METRICS_LISTEN"),
        ("--ready-file", "CORRAL_GATEWAY_READY_FILE"),
        ("--state-addr", "CORRAL_STATE_ADDR"),
        ("--broker-addr", "CORRAL_BROKER_ADDR"),
        ("--planner-addr", "CORRAL_PLANNER_ADDR"),
        ("--http-cert-file", "CORRAL_GATEWAY_HTTP_CERT_FILE"),
        ("--http-key-file", "CORRAL_GATEWAY_HTTP_KEY_FILE"),
        ("--http-verify-clients", "CORRAL_GATEWAY_HTTP_VERIFY_CLIENTS"),
        ("--ui-trace-url", "CORRAL_GATEWAY_UI_TRACE_URL"),
    ],
}
FLAGS_ONLY: dict[type[Settings], list[str]] = {
    AgentSettings: ["--meta"],
    SimSettings: [
        "--count",
        "--cpu",
        "--memory",
        "--classes",
        "--racks",
        "--datacenters",
        "--attr",
        "--fail-fraction",
        "--seed",
        "--register-rate",
        "--stats-interval",
    ],
}


@pytest.mark.parametrize("model", list(HISTORICAL), ids=lambda m: m.ROLE)
def test_every_historical_flag_and_variable_still_names_a_setting(
    model: type[Settings],
) -> None:
    names = {(s.flag, s.env) for s in settings_of(model)}
    missing = [pair for pair in HISTORICAL[model] if pair not in names]
    assert not missing
    flags = {s.flag for s in settings_of(model)}
    assert not [f for f in FLAGS_ONLY.get(model, []) if f not in flags]
    assert len(flags) == len(list(settings_of(model)))  # no two settings share a flag


def test_a_role_process_refuses_a_bad_setting_before_it_starts() -> None:
    """The real entry point: exit 2 and one error line, never a traceback."""
    proc = subprocess.run(
        [sys.executable, "-m", "services.planner", "--pipeline-depth", "0"],
        env={"CORRAL_DSN": "postgresql://unused/x", "PATH": ""},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 2
    error_lines = [line for line in proc.stderr.splitlines() if "error:" in line]
    assert error_lines == [
        "python -m services.planner: error: --state-addr (or CORRAL_STATE_ADDR) is required; "
        "--broker-addr (or CORRAL_BROKER_ADDR) is required; "
        "--pipeline-depth (or CORRAL_PLANNER_PIPELINE_DEPTH): "
        "Input should be greater than or equal to 1 (got '0')"
    ]
    assert "Traceback" not in proc.stderr


def test_every_variable_the_manifests_set_is_a_setting_of_some_role() -> None:
    """deploy/k8s sets roles' settings only through the environment: a
    renamed setting must not silently stop applying there."""
    deploy = Path(__file__).resolve().parents[2] / "deploy" / "k8s"
    known = {s.env for model in HISTORICAL for s in settings_of(model)}
    used = set()
    for manifest in deploy.rglob("*.yaml"):
        used |= set(re.findall(r"\b(CORRAL_[A-Z_]+)\b", manifest.read_text()))
    assert used, "no CORRAL_ variables found in deploy/k8s"
    assert sorted(used - known) == []
