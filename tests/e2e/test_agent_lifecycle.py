"""Client agents as real processes (issue 7): a raw_exec job's output, a
killed agent's node going down with its alloc replaced, a disconnect and
reconnect with max_client_disconnect (seed 003) — the timeout eval canceled,
every reconnect eval complete, no third alloc — and a drain."""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Callable
from functools import partial
from pathlib import Path

import grpc

from corral.security import transport
from corral.v1 import job_pb2, job_pb2_grpc, node_pb2, node_pb2_grpc
from corral.v1 import structs_pb2 as pb
from tests.cluster import Cluster
from tests.wait import until

TTL = ["--heartbeat-min-ttl", "1", "--heartbeat-grace", "1", "--heartbeats-per-second", "1000"]
BROKER = ["--nack-timeout", "5", "--initial-nack-delay", "0.2", "--subsequent-nack-delay", "0.5"]


def start(c: Cluster, tmp: Path, agents: int) -> None:
    c.start("state", *TTL)
    c.start("broker", *BROKER)
    c.start("planner")
    c.start("worker", "--num-schedulers", "2")
    for i in range(agents):
        c.start(
            "agent",
            "--data-dir",
            str(tmp / f"agent{i}"),
            "--name",
            f"agent{i}",
            "--drivers",
            "raw_exec,mock",  # raw_exec is off unless named
            name=f"agent{i}",
        )


async def allocs(c: Cluster, job_id: str) -> list[pb.Allocation]:
    async with transport.dial(c.state_addr) as ch:
        resp = await job_pb2_grpc.JobStub(ch).Allocations(
            job_pb2.JobGetRequest(job_id=job_id, all=True)
        )
    return list(resp.allocs)


async def nodes(c: Cluster) -> dict[str, node_pb2.NodeListStub]:
    async with transport.dial(c.state_addr) as ch:
        resp = await node_pb2_grpc.NodeStub(ch).List(node_pb2.NodeListRequest())
    return {n.name: n for n in resp.nodes}


async def register(c: Cluster, job: pb.Job) -> None:
    async with transport.dial(c.state_addr) as ch:
        await job_pb2_grpc.JobStub(ch).Register(job_pb2.JobRegisterRequest(job=job))


def service(job_id: str, *, count: int = 1, run_for: str = "") -> pb.Job:
    task = pb.Task(name="main", driver="mock", resources=pb.Resources(cpu=50, memory_mb=32))
    if run_for:
        task.config.update({"run_for": run_for})
    return pb.Job(
        id=job_id,
        type="service",
        datacenters=["dc1"],
        task_groups=[pb.TaskGroup(name="g", count=count, tasks=[task])],
    )


def running(a: list[pb.Allocation]) -> list[pb.Allocation]:
    return [x for x in a if x.desired_status == "run" and x.client_status == "running"]


async def test_raw_exec_job_writes_a_file(
    make_cluster: Callable[..., Cluster], tmp_path: Path
) -> None:
    c = make_cluster()
    start(c, tmp_path, 1)
    out = tmp_path / "written.txt"
    task = pb.Task(name="write", driver="raw_exec", resources=pb.Resources(cpu=50, memory_mb=32))
    task.config.update(
        {"command": "/bin/sh", "args": ["-c", f'echo "alloc $NOMAD_ALLOC_ID" > {out}']}
    )
    job = pb.Job(
        id="writer",
        type="batch",
        datacenters=["dc1"],
        task_groups=[pb.TaskGroup(name="g", count=1, tasks=[task])],
    )
    await register(c, job)
    await until(lambda: out.exists() and out.read_text().startswith("alloc "))
    await until(lambda: _client_status(c, "writer", "complete"))
    placed = await allocs(c, "writer")
    assert out.read_text().strip() == f"alloc {placed[0].id}"


async def _client_status(c: Cluster, job_id: str, status: str) -> bool:
    return any(a.client_status == status for a in await allocs(c, job_id))


async def test_killed_agent_goes_down_and_its_alloc_is_replaced(
    make_cluster: Callable[..., Cluster], tmp_path: Path
) -> None:
    c = make_cluster()
    start(c, tmp_path, 2)
    await until(lambda: _ready(c, 2))
    await register(c, service("web"))
    await until(lambda: _count_running(c, "web", 1))
    first = running(await allocs(c, "web"))[0]
    victim = next(n for n in (await nodes(c)).values() if n.id == first.node_id)
    c.kill(victim.name)
    await until(lambda: _node_status(c, victim.name, "down"))
    # not "one running alloc": the lost original satisfies that until the
    # scheduler stops it
    await until(lambda: _replaced(c, "web", first.id, lost=True))
    now = await allocs(c, "web")
    (replacement,) = running(now)
    assert replacement.node_id != victim.id and replacement.previous_allocation == first.id
    lost = next(a for a in now if a.id == first.id)
    assert lost.client_status == "lost" and lost.desired_status == "stop"


async def _replacement_running(c: Cluster, job_id: str, original_id: str) -> bool:
    """An alloc that names `original_id` as its previous allocation runs."""
    return any(x.previous_allocation == original_id for x in running(await allocs(c, job_id)))


async def _replaced(c: Cluster, job_id: str, original_id: str, *, lost: bool = False) -> bool:
    """The original alloc is stopped (and lost, if asked) and an alloc that
    names it as its previous allocation runs on another node: the state a
    replacement means, which the original alone can never satisfy."""
    a = await allocs(c, job_id)
    original = next((x for x in a if x.id == original_id), None)
    if original is None or original.desired_status != "stop":
        return False
    if lost and original.client_status != "lost":
        return False
    return any(
        x.previous_allocation == original_id and x.node_id != original.node_id for x in running(a)
    )


async def _ready(c: Cluster, n: int) -> bool:
    return sum(1 for x in (await nodes(c)).values() if x.status == "ready") >= n


async def _count_running(c: Cluster, job_id: str, n: int) -> bool:
    return len(running(await allocs(c, job_id))) == n


async def _node_status(c: Cluster, name: str, status: str) -> bool:
    node = (await nodes(c)).get(name)
    return node is not None and node.status == status


async def test_disconnect_keeps_one_of_the_pair_on_reconnect(
    make_cluster: Callable[..., Cluster], tmp_path: Path
) -> None:
    c = make_cluster()
    start(c, tmp_path, 2)
    await until(lambda: _ready(c, 2))
    job = service("edge")
    job.task_groups[0].max_client_disconnect = 120 * 10**9
    job.task_groups[0].reschedule_policy.CopyFrom(
        pb.ReschedulePolicy(unlimited=True, delay=10**9, delay_function="constant")
    )
    await register(c, job)
    await until(lambda: _count_running(c, "edge", 1))
    original = running(await allocs(c, "edge"))[0]
    cut = next(n for n in (await nodes(c)).values() if n.id == original.node_id)
    pid = c.procs[cut.name].popen.pid  # type: ignore[union-attr]
    secret = json.loads((tmp_path / cut.name / "client.json").read_text())["secret_id"]
    os.kill(pid, signal.SIGSTOP)  # the network cut: no heartbeats, no updates
    try:
        await until(lambda: _node_status(c, cut.name, "disconnected"))
        await until(lambda: _status_of(c, "edge", original.id, "unknown"))
        await until(lambda: _replacement_running(c, "edge", original.id))
        # seed 003: an alloc update sent before the node's heartbeat is refused
        code = await _update_alloc(c, original, secret)
        assert code == grpc.StatusCode.FAILED_PRECONDITION
    finally:
        os.kill(pid, signal.SIGCONT)  # back: heartbeat, then alloc update (seed 003)
    await until(lambda: _node_status(c, cut.name, "ready"))
    assert await _update_alloc(c, original, secret) == grpc.StatusCode.OK
    await until(lambda: _pair_resolved(c, "edge"))
    final = await allocs(c, "edge")
    assert len([a for a in final if a.desired_status == "run"]) == 1


async def test_reconnect_cancels_the_disconnect_timeout_and_every_eval_completes(
    make_cluster: Callable[..., Cluster], tmp_path: Path
) -> None:
    """Seed 003 with the agent doing its own resync after the cut: the
    unknown alloc's max-disconnect-timeout eval is canceled when the client
    reports it, the reconnect eval completes (the node is still initializing
    then: nothing may be planned there), one of the pair keeps running and
    no third alloc is ever placed."""
    c = make_cluster()
    start(c, tmp_path, 2)
    await until(lambda: _ready(c, 2))
    job = service("edge2")
    job.task_groups[0].disconnect.lost_after = 120 * 10**9
    job.task_groups[0].reschedule_policy.CopyFrom(
        pb.ReschedulePolicy(unlimited=True, delay=10**9, delay_function="constant")
    )
    await register(c, job)
    await until(lambda: _count_running(c, "edge2", 1))
    original = running(await allocs(c, "edge2"))[0]
    cut = next(n for n in (await nodes(c)).values() if n.id == original.node_id)
    pid = c.procs[cut.name].popen.pid  # type: ignore[union-attr]
    os.kill(pid, signal.SIGSTOP)
    try:
        await until(lambda: _status_of(c, "edge2", original.id, "unknown"))
        await until(lambda: _count_running(c, "edge2", 1))
        timeout = next(
            e for e in await evals(c, "edge2") if e.triggered_by == "max-disconnect-timeout"
        )
        assert timeout.status == "pending"
    finally:
        os.kill(pid, signal.SIGCONT)
    await until(lambda: _node_status(c, cut.name, "ready"))
    await until(lambda: _pair_resolved(c, "edge2"))
    await until(lambda: _eval_status(c, "edge2", timeout.id, "canceled"))
    await until(lambda: _settled(c, "edge2"))
    final_evals = await evals(c, "edge2")
    assert [e for e in final_evals if e.triggered_by == "reconnect"]
    assert not [e for e in final_evals if e.status == "failed"], [
        (e.triggered_by, e.status_description) for e in final_evals
    ]
    assert len(await allocs(c, "edge2")) == 2  # the original and one replacement


async def evals(c: Cluster, job_id: str) -> list[pb.Evaluation]:
    async with transport.dial(c.state_addr) as ch:
        resp = await job_pb2_grpc.JobStub(ch).Evaluations(job_pb2.JobGetRequest(job_id=job_id))
    return list(resp.evals)


async def _eval_status(c: Cluster, job_id: str, eval_id: str, status: str) -> bool:
    return any(e.id == eval_id and e.status == status for e in await evals(c, job_id))


async def _settled(c: Cluster, job_id: str) -> bool:
    """The reconnect evals have been processed (complete or failed)."""
    reconnects = [e for e in await evals(c, job_id) if e.triggered_by == "reconnect"]
    return bool(reconnects) and all(e.status in ("complete", "failed") for e in reconnects)


async def _update_alloc(c: Cluster, alloc: pb.Allocation, secret: str) -> grpc.StatusCode:
    """What the node's own client would send: its alloc, still running."""
    upd = pb.Allocation(id=alloc.id, node_id=alloc.node_id, client_status="running")
    upd.task_states["main"].state = "running"
    async with transport.dial(c.state_addr) as ch:
        try:
            await node_pb2_grpc.NodeStub(ch).UpdateAlloc(
                node_pb2.NodeUpdateAllocRequest(allocs=[upd], secret_id=secret), timeout=10
            )
        except grpc.aio.AioRpcError as exc:
            return exc.code()
    return grpc.StatusCode.OK


async def _status_of(c: Cluster, job_id: str, alloc_id: str, status: str) -> bool:
    return any(a.id == alloc_id and a.client_status == status for a in await allocs(c, job_id))


async def _pair_resolved(c: Cluster, job_id: str) -> bool:
    a = await allocs(c, job_id)
    return len([x for x in a if x.desired_status == "run"]) == 1 and len(running(a)) == 1


async def test_drain_migrates_allocs_off_a_node(
    make_cluster: Callable[..., Cluster], tmp_path: Path
) -> None:
    c = make_cluster()
    start(c, tmp_path, 2)
    await until(lambda: _ready(c, 2))
    await register(c, service("move", count=2))
    await until(lambda: _count_running(c, "move", 2))
    # drain a node that runs an alloc: with both on one node, draining the
    # other would pass without migrating anything
    before = running(await allocs(c, "move"))
    target = next(n for n in (await nodes(c)).values() if n.id == before[0].node_id)
    moved = [a.id for a in before if a.node_id == target.id]
    async with transport.dial(c.state_addr) as ch:
        await node_pb2_grpc.NodeStub(ch).UpdateDrain(
            node_pb2.NodeUpdateDrainRequest(
                node_id=target.id, drain_strategy=pb.DrainStrategy(deadline=3600 * 10**9)
            )
        )
    for alloc_id in moved:
        await until(partial(_replaced, c, "move", alloc_id))
    await until(lambda: _none_on(c, "move", target.id))
    await until(lambda: _count_running(c, "move", 2))
    assert all(a.node_id != target.id for a in running(await allocs(c, "move")))
    await until(lambda: _drain_done(c, target.name))


async def _none_on(c: Cluster, job_id: str, node_id: str) -> bool:
    return not any(
        a.node_id == node_id and a.desired_status == "run" for a in await allocs(c, job_id)
    )


async def _drain_done(c: Cluster, name: str) -> bool:
    n = (await nodes(c))[name]
    return not n.drain and n.scheduling_eligibility == "ineligible"
