"""The agent's client (issue 26): raw_exec is off unless configured
(finding 7: it runs tasks as the agent's own user without isolation, and
Nomad ships it off outside `-dev`); a driver the agent does not have is
refused at start, not silently left out; and the agent forgets the job
versions no alloc of its node runs any more (the soak)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from corral.runtime.settings import load
from corral.testing import mock
from corral.v1 import node_pb2
from corral.v1 import structs_pb2 as pb
from services.agent.client import Agent, heartbeat_interval
from services.agent.config import AgentSettings
from tests.wait import until


def agent_settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *argv: str) -> AgentSettings:
    monkeypatch.delenv("CORRAL_AGENT_DRIVERS", raising=False)
    settings, _ = load(
        AgentSettings,
        [
            "--state-addr",
            "127.0.0.1:1",
            "--data-dir",
            str(tmp_path / "agent"),
            "--cgroup-version",
            "off",  # a unit test creates no cgroups on the machine
            *argv,
        ],
        prog="agent",
    )
    return settings


def test_an_agent_offers_no_raw_exec_unless_configured(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = agent_settings(tmp_path, monkeypatch)
    assert settings.drivers == ["exec", "mock"]
    node = Agent(settings).node
    assert "raw_exec" not in node.drivers
    assert "driver.raw_exec" not in node.attributes
    assert "mock" in node.drivers


def test_raw_exec_when_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    node = Agent(agent_settings(tmp_path, monkeypatch, "--drivers", "raw_exec,mock")).node
    assert node.drivers["raw_exec"].detected and node.attributes["driver.raw_exec"] == "1"


def test_an_unknown_driver_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        agent_settings(tmp_path, monkeypatch, "--drivers", "mock,docker")
    assert "unknown drivers docker" in capsys.readouterr().err


async def test_the_agent_forgets_job_versions_no_alloc_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 26's soak: every job version ever placed on a node stayed in
    its agent's memory. Once the server has collected an alloc, the job
    versions no remaining alloc runs are dropped too."""
    agent = Agent(agent_settings(tmp_path, monkeypatch))
    jobs = [mock.job(job_id=f"churn-{i}", count=1) for i in range(3)]
    allocs = [mock.alloc(j, agent.node, client_status="pending") for j in jobs]
    first = node_pb2.NodeClientAllocsResponse(
        index=10, allocs={a.id: 10 for a in allocs}, full_allocs=allocs, jobs=jobs
    )
    for j in first.jobs:
        agent.jobs[(j.namespace, j.id, j.version)] = j
    await agent._reconcile(first)
    assert len(agent.runners) == 3 and len(agent.jobs) == 3
    # two allocs were garbage-collected on the server: only one job is left
    later = node_pb2.NodeClientAllocsResponse(index=20, allocs={allocs[0].id: 10})
    await agent._reconcile(later)
    assert list(agent.runners) == [allocs[0].id]
    assert list(agent.jobs) == [(jobs[0].namespace, jobs[0].id, jobs[0].version)]
    await agent._reconcile(node_pb2.NodeClientAllocsResponse(index=30))
    assert not agent.runners and not agent.jobs


async def test_runners_keep_nothing_else_of_the_response_they_came_in(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 26's soak: a message taken out of a parsed response keeps the
    whole response alive (one upb arena). Each runner held the alloc of the
    response that started it, so runners held every response: the agent
    grew 160 MB in 11 minutes of churn. Here each response also carries an
    alloc with 2 MB the agent never keeps; 60 runners later the
    process has not grown by their 120 MB."""
    agent = Agent(agent_settings(tmp_path, monkeypatch))
    job = mock.job(job_id="churn", count=1)
    agent.jobs[(job.namespace, job.id, job.version)] = job
    gone = mock.alloc(job, agent.node, client_status="complete")
    gone.client_description = "x" * (2**21 + 1)
    blob = gone.SerializeToString()
    assert len(blob) > 2**21  # 2 MiB

    def rss() -> int:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    before = rss()
    allocs: dict[str, int] = {}
    for i in range(60):
        new = mock.alloc(job, agent.node, client_status="pending")
        allocs[new.id] = i + 1
        resp = node_pb2.NodeClientAllocsResponse(index=i + 1, allocs=allocs)
        resp.full_allocs.append(new)
        resp.full_allocs.append(pb.Allocation.FromString(blob))  # terminal: skipped
        await agent._reconcile(
            node_pb2.NodeClientAllocsResponse.FromString(resp.SerializeToString())
        )
        del resp
    assert len(agent.runners) == 60
    grown = (rss() - before) / 2**20
    assert grown < 60, f"the agent grew {grown:.0f} MB holding 60 allocs"


async def test_finished_allocs_past_gc_max_allocs_are_destroyed_oldest_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Nomad's client alloc GC by count: the hour's soak showed the agent
    keeping a runner for every finished alloc the servers still held
    (+150%). Past gc_max_allocs the finished ones the servers know finished
    are forgotten, oldest first; running ones, and finished ones the
    servers do not know yet, are kept."""
    agent = Agent(agent_settings(tmp_path, monkeypatch, "--gc-max-allocs", "3"))
    job = mock.batch_job(job_id="gc", count=1)
    job.task_groups[0].tasks[0].config.update({"run_for": "0.01s"})
    forever = mock.job(job_id="forever", count=1)
    for j in (job, forever):
        agent.jobs[(j.namespace, j.id, j.version)] = j
    done = [mock.alloc(job, agent.node, client_status="pending") for _ in range(4)]
    running = mock.alloc(forever, agent.node, client_status="pending")
    for i, a in enumerate(done):
        a.modify_index = 10 + i
    allocs = [*done, running]
    index = {a.id: a.modify_index for a in allocs}
    await agent._reconcile(
        node_pb2.NodeClientAllocsResponse(index=20, allocs=index, full_allocs=allocs)
    )
    await until(lambda: all(agent.runners[a.id].done for a in done), what="the batch allocs done")
    assert len(agent.runners) == 5
    # the servers learn that three of them finished (the newest does not yet)
    synced = []
    for a in done[:3]:
        copy = pb.Allocation()
        copy.CopyFrom(a)
        copy.client_status = "complete"
        copy.modify_index += 100
        synced.append(copy)
    agent._dirty.clear()
    await agent._reconcile(
        node_pb2.NodeClientAllocsResponse(
            index=30, allocs={**index, **{a.id: a.modify_index for a in synced}}, full_allocs=synced
        )
    )
    # 5 allocs, at most 3 kept: the two oldest synced ones go
    assert set(agent.runners) == {done[2].id, done[3].id, running.id}
    for t in list(agent._stops.values()):
        await t
    assert {s.alloc.id for s in agent.db.load()} == set(agent.runners)
    # destroyed: their directories are gone too (Nomad's AllocRunner.Destroy)
    allocs_dir = tmp_path / "agent" / "allocs"
    assert {p.name for p in allocs_dir.iterdir()} == set(agent.runners)
    await agent.runners[running.id].stop()


def test_the_heartbeat_interval_grows_with_the_ttl_the_servers_give() -> None:
    """Half the TTL with no cap: at 5,000 nodes the servers give a TTL of
    100–200 s (50 heartbeats/s by default), and a client heartbeating every
    10 s regardless sent them 500 a second."""
    assert heartbeat_interval(15.0, 0) == 7.5
    assert heartbeat_interval(150.0, 0) == 75.0
    # after failures: retry soon, whatever the TTL
    assert heartbeat_interval(150.0, 1) == 2.0
    assert heartbeat_interval(150.0, 9) == 10.0
