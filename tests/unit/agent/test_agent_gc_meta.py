"""The agent's dynamic node metadata (Nomad's NodeMeta) and its alloc
garbage collection (Nomad's AllocGarbageCollector): what is kept across a
restart, what a collection removes, and what it refuses."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

import pytest

from corral.domain.errors import FailedPrecondition, InvalidArgument, NotFound
from corral.security import transport
from corral.testing import mock
from corral.v1 import node_pb2
from corral.v1 import structs_pb2 as pb
from services.agent import gc
from services.agent.allocdir import AllocDir
from services.agent.client import Agent
from services.agent.node_meta import NodeMeta, validate
from services.agent.state_db import StateDB
from tests.unit.agent.test_agent_client import agent_settings
from tests.wait import until


def test_meta_keys_must_be_dotted_identifiers() -> None:
    validate({"rack": "r1", "a.b_c-d": None, "_x": "", "ünï": "ok"})
    for bad in ("", "1rack", "a..b", "a b", "a.", "$x", "a/b"):
        with pytest.raises(InvalidArgument):
            validate({bad: "v"})
    with pytest.raises(InvalidArgument, match="missing required Meta object"):
        validate({})


def test_unsetting_a_static_key_is_remembered_a_dynamic_one_forgotten() -> None:
    meta = NodeMeta({"rack": "r1", "zone": "z1"})
    dynamic = meta.applied({"rack": "r2", "team": "t", "zone": None})
    assert dynamic == {"rack": "r2", "team": "t", "zone": None}
    meta = NodeMeta(meta.static, dynamic)
    assert meta.merged() == {"rack": "r2", "team": "t"}
    dynamic = meta.applied({"team": None, "rack": None})
    # rack is static: unset stays recorded; team was only dynamic: gone
    assert dynamic == {"rack": None, "zone": None}
    assert NodeMeta(meta.static, dynamic).merged() == {}


def test_mounts_below_a_directory() -> None:
    info = (
        "22 1 8:1 / / rw - ext4 /dev/sda1 rw\n"
        "90 22 8:1 /srv /data/allocs/a1/web/vol rw - ext4 /dev/sda1 rw\n"
        "91 22 8:1 /srv /data/allocs/a10 rw - ext4 /dev/sda1 rw\n"
        "92 22 8:1 /srv /data/allocs/a1\\040x rw - ext4 /dev/sda1 rw\n"
    )
    assert gc.mounts_below(Path("/data/allocs/a1"), info) == ["/data/allocs/a1/web/vol"]
    assert gc.mounts_below(Path("/data/allocs/a1 x"), info) == ["/data/allocs/a1 x"]


def test_thresholds_in_nomads_order() -> None:
    usage = gc.DiskUsage(used_percent=85, inodes_used_percent=90)
    assert "disk usage of 85" in gc.over_threshold(usage, 1, disk=80, inodes=70, max_allocs=50)
    assert "inode usage of 90" in gc.over_threshold(usage, 1, disk=90, inodes=70, max_allocs=50)
    assert "number of allocations (51)" in gc.over_threshold(
        usage, 51, disk=90, inodes=95, max_allocs=50
    )
    assert gc.over_threshold(usage, 50, disk=90, inodes=95, max_allocs=50) == ""


async def test_dynamic_meta_survives_a_restart_and_is_registered(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Applied metadata is kept in the client state before the node is
    registered again; a servers' refusal leaves it for the heartbeat loop;
    a new agent on the same data dir registers the merged meta."""
    settings = agent_settings(tmp_path, monkeypatch, "--meta", "rack=r1", "--meta", "zone=z1")
    agent = Agent(settings)
    assert dict(agent.node.meta) == {"rack": "r1", "zone": "z1"}
    agent._channel = transport.dial("127.0.0.1:1")  # no server: registration fails
    try:
        meta = await agent.apply_meta({"rack": "r2", "team": "t"})
        assert meta.merged() == {"rack": "r2", "zone": "z1", "team": "t"}
        assert agent._node_stale  # the heartbeat loop registers it once it can
        await agent.apply_meta({"zone": None})
        assert dict(agent.node.meta) == {"rack": "r2", "team": "t"}
        with pytest.raises(InvalidArgument):
            await agent.apply_meta({"not valid": "x"})
    finally:
        await agent._channel.close()
        agent.db.close()
    again = Agent(settings)
    try:
        assert dict(again.node.meta) == {"rack": "r2", "team": "t"}
        assert again.meta.dynamic == {"rack": "r2", "team": "t", "zone": None}
        assert again.meta.static == {"rack": "r1", "zone": "z1"}
    finally:
        again.db.close()


async def _finished_and_running(agent: Agent) -> tuple[list[pb.Allocation], pb.Allocation]:
    job = mock.batch_job(job_id="gc", count=1)
    job.task_groups[0].tasks[0].config.update({"run_for": "0.01s"})
    forever = mock.job(job_id="forever", count=1)
    for j in (job, forever):
        agent.jobs[(j.namespace, j.id, j.version)] = j
    done = [mock.alloc(job, agent.node, client_status="pending") for _ in range(3)]
    running = mock.alloc(forever, agent.node, client_status="pending")
    for i, a in enumerate([*done, running]):
        a.modify_index = 10 + i
    allocs = [*done, running]
    await agent._reconcile(
        node_pb2.NodeClientAllocsResponse(
            index=20, allocs={a.id: a.modify_index for a in allocs}, full_allocs=allocs
        )
    )
    await until(lambda: all(agent.runners[a.id].done for a in done), what="the batch allocs done")
    await until(
        lambda: agent.runners[running.id].client_status()[0] == "running", what="one running"
    )
    return done, running


def _dir(agent: Agent, alloc_id: str) -> Path:
    return AllocDir.of(agent.settings.data_dir, alloc_id).dir


async def test_collecting_on_demand_destroys_finished_allocs_and_refuses_running_ones(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    agent = Agent(agent_settings(tmp_path, monkeypatch))
    done, running = await _finished_and_running(agent)
    try:
        assert all(_dir(agent, a.id).is_dir() for a in [*done, running])
        with pytest.raises(FailedPrecondition, match="not eligible for garbage collection"):
            await agent.collect(running.id)
        with pytest.raises(NotFound):
            await agent.collect("no-such-alloc")
        # what an executor-run task keeps beside the alloc (the mock driver has none)
        (executor,) = [t.state_dir for t in agent.runners[done[0].id].tasks]
        executor.mkdir(parents=True)
        (executor / "executor.log").write_text("ran\n")
        await agent.collect(done[0].id)
        # its directory, its tasks' executor state, its client state and its
        # runner are gone; its last status still goes to the servers
        assert not _dir(agent, done[0].id).exists() and not executor.exists()
        assert done[0].id not in agent.runners
        assert done[0].id not in {s.alloc.id for s in agent.db.load()}
        assert agent._final[done[0].id].client_status == "complete"
        # the servers send it again (still listed, finished): never run again
        await agent._reconcile(
            node_pb2.NodeClientAllocsResponse(
                index=30,
                allocs={a.id: a.modify_index + 100 for a in [*done, running]},
                full_allocs=[done[0]],
            )
        )
        assert done[0].id not in agent.runners
        collected = await agent.collect_all()
        assert sorted(collected) == sorted(a.id for a in done[1:])
        assert not any(_dir(agent, a.id).exists() for a in done)
        assert set(agent.runners) == {running.id} and _dir(agent, running.id).is_dir()
    finally:
        await agent.runners[running.id].stop()
        agent.db.close()


async def test_periodic_collection_over_the_disk_threshold(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Over gc_disk_usage_threshold (0 here: always over) the periodic
    collection destroys every finished alloc the servers know finished,
    oldest first, and nothing running or not yet reported."""
    agent = Agent(agent_settings(tmp_path, monkeypatch, "--gc-disk-usage-threshold", "0"))
    done, running = await _finished_and_running(agent)
    try:
        agent._dirty.clear()
        # the servers hold the first two as complete; the third is not reported yet
        synced = []
        for a in done[:2]:
            copy = pb.Allocation()
            copy.CopyFrom(a)
            copy.client_status = "complete"
            copy.modify_index += 100
            synced.append(copy)
        index = {a.id: a.modify_index for a in [*done, running]}
        await agent._reconcile(
            node_pb2.NodeClientAllocsResponse(
                index=30,
                allocs={**index, **{a.id: a.modify_index for a in synced}},
                full_allocs=synced,
            )
        )
        await agent.keep_usage_below_threshold()
        assert set(agent.runners) == {done[2].id, running.id}
        assert not _dir(agent, done[0].id).exists() and not _dir(agent, done[1].id).exists()
        assert _dir(agent, done[2].id).is_dir() and _dir(agent, running.id).is_dir()
    finally:
        await agent.runners[running.id].stop()
        agent.db.close()


async def test_the_periodic_loop_collects_every_gc_interval(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The agent's GC loop (Nomad's AllocGarbageCollector.Run) runs the
    collection every gc_interval and ends when the agent stops."""
    agent = Agent(
        agent_settings(
            tmp_path, monkeypatch, "--gc-interval", "0.1", "--gc-disk-usage-threshold", "0"
        )
    )
    done, running = await _finished_and_running(agent)
    loop = asyncio.create_task(agent._gc_loop())
    try:
        synced = []
        for a in done:
            copy = pb.Allocation()
            copy.CopyFrom(a)
            copy.client_status = "complete"
            copy.modify_index += 100
            synced.append(copy)
        agent._dirty.clear()
        index = {a.id: a.modify_index for a in [running, *synced]}
        await agent._reconcile(
            node_pb2.NodeClientAllocsResponse(index=30, allocs=index, full_allocs=synced)
        )
        await until(
            lambda: not any(_dir(agent, a.id).exists() for a in done), what="the dirs removed"
        )
        assert set(agent.runners) == {running.id}
    finally:
        agent._stop.set()
        await asyncio.wait_for(loop, 5)
        await agent.runners[running.id].stop()
        agent.db.close()


def test_a_client_state_of_schema_1_gains_the_node_meta_table(tmp_path: Path) -> None:
    """An agent upgraded in place opens the state file an older one wrote."""
    (tmp_path / "client").mkdir()
    old = sqlite3.connect(tmp_path / "client" / "state.db")
    old.execute("CREATE TABLE allocs (id TEXT PRIMARY KEY, alloc BLOB NOT NULL, job BLOB NOT NULL)")
    old.execute("PRAGMA user_version=1")
    old.commit()
    old.close()
    db = StateDB(tmp_path)
    try:
        assert db.load_node_meta() == {}
        db.put_node_meta({"rack": "r1", "zone": None})
        assert db.load_node_meta() == {"rack": "r1", "zone": None}
    finally:
        db.close()
