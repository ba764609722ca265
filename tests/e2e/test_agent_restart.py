"""A client agent killed and brought back later, on a cluster of real
processes (issue 29, part B): what the servers decided while it was down
is done when it returns. One job is stopped meanwhile, and the node goes
down (its heartbeat TTL passes) so the other job's alloc is lost: the
returning agent kills both runs it would otherwise have adopted, and
starts neither again; a graceful stop (SIGTERM) of an agent that does not
stop its tasks leaves them running, and the next agent adopts them."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from corral.security import transport
from corral.v1 import job_pb2, job_pb2_grpc, node_pb2, node_pb2_grpc
from corral.v1 import structs_pb2 as pb
from tests.cluster import Cluster
from tests.wait import until

TTL = ["--heartbeat-min-ttl", "1", "--heartbeat-grace", "1", "--heartbeats-per-second", "1000"]
BROKER = ["--nack-timeout", "5", "--initial-nack-delay", "0.2", "--subsequent-nack-delay", "0.5"]


def sleeper(job_id: str, pids: Path) -> pb.Job:
    """A raw_exec service that writes its pid (one line a run) and sleeps."""
    task = pb.Task(name="t", driver="raw_exec", resources=pb.Resources(cpu=20, memory_mb=16))
    task.config.update({"command": "/bin/sh", "args": ["-c", f"echo $$ >> {pids}; exec sleep 600"]})
    return pb.Job(
        id=job_id,
        type="service",
        datacenters=["dc1"],
        task_groups=[
            pb.TaskGroup(
                name="g",
                count=1,
                tasks=[task],
                restart_policy=pb.RestartPolicy(attempts=0, mode="fail"),
                reschedule_policy=pb.ReschedulePolicy(attempts=0),
            )
        ],
    )


def start(c: Cluster, data_dir: Path, **env: str) -> None:
    c.start("state", *TTL)
    c.start("broker", *BROKER)
    c.start("planner")
    c.start("worker", "--num-schedulers", "2")
    c.start(
        "agent",
        "--data-dir",
        str(data_dir),
        "--name",
        "a0",
        "--drivers",
        "raw_exec,mock",  # raw_exec is off unless named
        env=env,
    )


async def allocs(c: Cluster, job_id: str) -> list[pb.Allocation]:
    async with transport.dial(c.state_addr) as ch:
        resp = await job_pb2_grpc.JobStub(ch).Allocations(
            job_pb2.JobGetRequest(job_id=job_id, all=True)
        )
    return list(resp.allocs)


async def node_status(c: Cluster) -> str:
    async with transport.dial(c.state_addr) as ch:
        nodes = (await node_pb2_grpc.NodeStub(ch).List(node_pb2.NodeListRequest())).nodes
    return nodes[0].status if nodes else ""


async def running(c: Cluster, job_id: str) -> bool:
    return any(
        a.client_status == "running" and a.desired_status == "run" for a in await allocs(c, job_id)
    )


def pids(path: Path) -> list[int]:
    return [int(x) for x in path.read_text().split()] if path.exists() else []


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[1][0] not in "ZX"
    except OSError:
        return False


async def test_what_the_servers_decided_while_the_agent_was_down_is_done(
    make_cluster: Callable[..., Cluster], tmp_path: Path
) -> None:
    c = make_cluster()
    start(c, tmp_path / "agent")
    await until(lambda: node_status(c), what="a node")
    stopped_pids, lost_pids = tmp_path / "stopped", tmp_path / "lost"
    async with transport.dial(c.state_addr) as ch:
        jobs = job_pb2_grpc.JobStub(ch)
        await jobs.Register(job_pb2.JobRegisterRequest(job=sleeper("stopped", stopped_pids)))
        await jobs.Register(job_pb2.JobRegisterRequest(job=sleeper("lost", lost_pids)))
    await until(lambda: _both_running(c), what="both running")
    await until(lambda: pids(stopped_pids) and pids(lost_pids), what="their pids")
    (stopped_pid,), (lost_pid,) = pids(stopped_pids), pids(lost_pids)

    c.kill("agent")  # SIGKILL to its process group: the tasks run on
    assert alive(stopped_pid) and alive(lost_pid)
    async with transport.dial(c.state_addr) as ch:
        await job_pb2_grpc.JobStub(ch).Deregister(job_pb2.JobDeregisterRequest(job_id="stopped"))
    await until(lambda: _desired_stop(c, "stopped"), what="the stopped job's alloc to stop")
    await until(lambda: _node_is(c, "down"), what="the node down")
    await until(lambda: _lost(c, "lost"), what="the other alloc lost")

    c.restart("agent")
    await until(lambda: not alive(stopped_pid) and not alive(lost_pid), what="both runs killed")
    assert pids(stopped_pids) == [stopped_pid]  # never started again
    # the lost original was not run again by the returning agent (a
    # replacement the scheduler places once the node is back is a new alloc)
    lost = [a for a in await allocs(c, "lost") if a.client_status == "lost"]
    assert lost and all(a.desired_status == "stop" for a in lost)


async def _both_running(c: Cluster) -> bool:
    return await running(c, "stopped") and await running(c, "lost")


async def _desired_stop(c: Cluster, job_id: str) -> bool:
    return all(a.desired_status == "stop" for a in await allocs(c, job_id))


async def _node_is(c: Cluster, status: str) -> bool:
    return await node_status(c) == status


async def _lost(c: Cluster, job_id: str) -> bool:
    return any(a.client_status == "lost" for a in await allocs(c, job_id))


async def test_a_gracefully_stopped_agent_leaves_its_tasks_to_the_next(
    make_cluster: Callable[..., Cluster], tmp_path: Path
) -> None:
    c = make_cluster()
    start(c, tmp_path / "agent", CORRAL_AGENT_STOP_TASKS_ON_SHUTDOWN="false")
    await until(lambda: node_status(c), what="a node")
    path = tmp_path / "pids"
    async with transport.dial(c.state_addr) as ch:
        await job_pb2_grpc.JobStub(ch).Register(
            job_pb2.JobRegisterRequest(job=sleeper("kept", path))
        )
    await until(lambda: pids(path), what="the task's pid")
    (pid,) = pids(path)
    assert c.stop("agent") == 0  # SIGTERM: a clean exit
    assert alive(pid)
    c.restart("agent")
    async with transport.dial(c.state_addr) as ch:
        await job_pb2_grpc.JobStub(ch).Deregister(job_pb2.JobDeregisterRequest(job_id="kept"))
    # the new agent adopted it: the stop reaches the same process
    await until(lambda: not alive(pid), what="the adopted task stopped")
    assert pids(path) == [pid]  # never started twice
    await until(lambda: _client_complete(c, "kept"), what="the alloc complete")


async def _client_complete(c: Cluster, job_id: str) -> bool:
    return all(a.client_status == "complete" for a in await allocs(c, job_id))
