"""raw_exec is off on an agent unless configured (issue 26, finding 7): it
runs tasks as the agent's own user without isolation, and Nomad ships it
off outside `-dev`. A driver the agent does not have is refused at start,
not silently left out."""

from __future__ import annotations

from pathlib import Path

import pytest

from corral.domain.errors import ConfigError
from corral.runtime.settings import load
from services.agent.client import Agent
from services.agent.config import AgentSettings


def agent_settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *argv: str) -> AgentSettings:
    monkeypatch.delenv("CORRAL_AGENT_DRIVERS", raising=False)
    settings, _ = load(
        AgentSettings,
        ["--state-addr", "127.0.0.1:1", "--data-dir", str(tmp_path / "agent"), *argv],
        prog="agent",
    )
    return settings


def test_an_agent_offers_no_raw_exec_unless_configured(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    node = Agent(agent_settings(tmp_path, monkeypatch)).node
    assert "raw_exec" not in node.drivers
    assert "driver.raw_exec" not in node.attributes
    assert "mock" in node.drivers


def test_raw_exec_when_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    node = Agent(agent_settings(tmp_path, monkeypatch, "--drivers", "raw_exec,mock")).node
    assert node.drivers["raw_exec"].detected and node.attributes["driver.raw_exec"] == "1"


def test_an_unknown_driver_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigError, match="unknown driver 'docker'"):
        Agent(agent_settings(tmp_path, monkeypatch, "--drivers", "mock,docker"))
