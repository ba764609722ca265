"""`python -m services.agent.sim` — thousands of simulated client nodes in
one process (the role nomad-nodesim plays for Nomad), for load tests and
the benchmarks.

Every node uses the real client RPCs: it registers, heartbeats at half its
TTL (jittered), watches its allocations with the `GetClientAllocs` blocking
query and reports mock tasks as running (or complete after `run_for`) with
`UpdateAlloc`. Updates from all nodes are batched per node every 200 ms,
like the real agent. SIGUSR1 makes `--fail-fraction` of the nodes stop
heartbeating at once (the node-failure benchmark); SIGUSR2 revives them.

Node ids derive from `--seed`; with `--data-dir` the nodes' secrets are kept
in `DIR/sim-nodes.json` (mode 0600) too, so a restarted simulator
re-registers the same nodes, as restarted agents would with their
`client.json` (the state refuses a known node id with another secret).

    python -m services.agent.sim --state-addr HOST:PORT --count 5000 \\
        [--cpu 4000] [--memory 8192] [--classes 5] [--racks 25] [--datacenters dc1,dc2] \\
        [--data-dir DIR]
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import random
import signal
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, ClassVar

import grpc
from pydantic import Field

from corral.domain import structs
from corral.runtime import runner
from corral.runtime.settings import CommaList, KeyValues, Option, ProcessSettings, StateAddr
from corral.security import transport
from corral.security.private_files import private_dir, write_private
from corral.v1 import node_pb2, node_pb2_grpc
from corral.v1 import structs_pb2 as pb
from services.agent.drivers.base import parse_duration, task_config

log = logging.getLogger("services.agent.sim")


class SimSettings(ProcessSettings):
    """Simulated client nodes in one process, for load tests and benchmarks."""

    ROLE: ClassVar[str] = "sim"

    state_addr: StateAddr
    count: int = Field(100, ge=1, description="simulated nodes")
    cpu: int = Field(4000, ge=1, description="MHz per node")
    memory: int = Field(8192, ge=1, description="MB per node")
    classes: int = Field(5, ge=0, description="node classes (class-0..N-1; 0 = none)")
    racks: int = Field(25, ge=0, description="meta.rack values (r0..rN-1; 0 = none)")
    datacenters: CommaList = Field(
        default_factory=lambda: ["dc1"], min_length=1, description="datacenters, round robin"
    )
    node_pool: str = Field(
        "default", min_length=1, description="the nodes' pool (created when it does not exist)"
    )
    attr: KeyValues = Field(
        default_factory=dict, description="extra node attribute key=value (repeat for more)"
    )
    fail_fraction: float = Field(0.1, ge=0, le=1, description="share of nodes SIGUSR1 fails")
    seed: int = Field(1, description="node ids derive from it (stable across runs)")
    register_rate: float = Field(500.0, gt=0, description="registrations per second at start")
    stats_interval: float = Field(10.0, gt=0, description="log stats every N seconds")
    data_dir: Annotated[Path | None, Option(shown_default="*none*: new secrets every run")] = Field(
        None,
        description="keep the nodes' secrets here (sim-nodes.json) so a restart "
        "re-registers the same nodes",
    )


SECRETS_FILE = "sim-nodes.json"


@dataclass
class SimStats:
    registered: int = 0
    heartbeats: int = 0
    heartbeat_errors: int = 0
    alloc_updates: int = 0
    allocs_running: int = 0
    dead_nodes: int = 0
    error_codes: dict[str, int] = field(default_factory=dict)
    started: float = field(default_factory=time.monotonic)


def load_secrets(data_dir: Path | None) -> dict[str, str]:
    """Node id → secret kept by an earlier run ({} without a data dir or file)."""
    if data_dir is None:
        return {}
    path = data_dir / SECRETS_FILE
    if not path.exists():
        return {}
    data = json.loads(path.read_text())
    return {str(k): str(v) for k, v in data.get("secrets", {}).items()}


def save_secrets(data_dir: Path | None, secrets: dict[str, str]) -> None:
    """Write node id → secret readable by the owner only, replaced atomically
    so a simulator killed mid-write leaves the previous file intact."""
    if data_dir is None:
        return
    write_private(private_dir(data_dir) / SECRETS_FILE, json.dumps({"secrets": secrets}))


class SimNode:
    def __init__(
        self, sim: Simulator, index: int, settings: SimSettings, secrets: dict[str, str]
    ) -> None:
        self.sim = sim
        self.node = self._node(index, settings)
        self.node.secret_id = secrets.setdefault(self.node.id, self.node.secret_id)
        self.failed = False
        self.known: dict[str, pb.Allocation] = {}
        self.pending: dict[str, pb.Allocation] = {}
        self.ttl = 10.0

    @staticmethod
    def _node(i: int, settings: SimSettings) -> pb.Node:
        dcs = settings.datacenters
        node_id = str(uuid.UUID(int=random.Random(f"{settings.seed}-{i}").getrandbits(128)))
        n = pb.Node(
            id=node_id,
            secret_id=str(uuid.uuid4()),
            name=f"sim-{i:05d}",
            datacenter=dcs[i % len(dcs)],
            node_pool=settings.node_pool,
            node_class=f"class-{i % settings.classes}" if settings.classes else "",
            status=structs.NodeStatus.INITIALIZING,
            attributes={
                "kernel.name": "linux",
                "os.name": "simulated",
                "cpu.arch": "amd64",
                "arch": "amd64",
                "unique.hostname": f"sim-{i:05d}",
                "driver.mock": "1",
                "driver.raw_exec": "1",
            },
            meta={"rack": f"r{i % settings.racks}"} if settings.racks else {},
            drivers={
                "mock": pb.DriverInfo(detected=True, healthy=True),
                "raw_exec": pb.DriverInfo(detected=True, healthy=True),
            },
            node_resources=pb.NodeResources(
                cpu=settings.cpu,
                total_cores=4,
                memory_mb=settings.memory,
                disk_mb=100 * 1024,
                min_dynamic_port=20000,
                max_dynamic_port=32000,
            ),
        )
        n.attributes.update(settings.attr)
        return n

    async def run(self) -> None:
        stub = self.sim.stub
        refused = False
        while True:
            try:
                resp = await stub.Register(node_pb2.NodeRegisterRequest(node=self.node), timeout=30)
                self.ttl = resp.heartbeat_ttl_ms / 1000
                break
            except grpc.aio.AioRpcError as exc:
                if not refused and exc.code() != grpc.StatusCode.UNAVAILABLE:
                    # once per node: e.g. a restart without the kept secrets
                    log.warning(
                        "node %s: registration refused (%s: %s); retrying",
                        self.node.name,
                        exc.code().name,
                        exc.details(),
                    )
                    refused = True
                await asyncio.sleep(1 + random.random())
        self.sim.stats.registered += 1
        try:
            await asyncio.gather(self._heartbeats(), self._watch())
        except asyncio.CancelledError:
            raise
        except Exception:
            # a simulated node must never die silently: it would look like a
            # server-side flap
            log.exception("simulated node %s stopped", self.node.name)
            self.sim.stats.dead_nodes += 1

    async def _heartbeats(self) -> None:
        await asyncio.sleep(random.uniform(0, min(self.ttl / 2, 5)))
        while True:
            if not self.failed:
                try:
                    resp = await self.sim.stub.UpdateStatus(
                        node_pb2.NodeUpdateStatusRequest(
                            node_id=self.node.id, status="ready", secret_id=self.node.secret_id
                        ),
                        timeout=30,
                    )
                    self.ttl = resp.heartbeat_ttl_ms / 1000
                    self.sim.stats.heartbeats += 1
                    if self.pending:
                        await self._flush()
                except grpc.aio.AioRpcError as exc:
                    self.sim.stats.heartbeat_errors += 1
                    self.sim.stats.error_codes[exc.code().name] = (
                        self.sim.stats.error_codes.get(exc.code().name, 0) + 1
                    )
                    # like Nomad's client: retry soon, not a whole half-TTL later
                    await asyncio.sleep(random.uniform(1.0, min(5.0, max(1.0, self.ttl / 4))))
                    continue
            await asyncio.sleep(max(0.5, self.ttl / 2 * random.uniform(0.8, 1.0)))

    async def _watch(self) -> None:
        index = 0
        while True:
            if self.failed:
                await asyncio.sleep(1)
                continue
            try:
                resp = await self.sim.stub.GetClientAllocs(
                    node_pb2.NodeClientAllocsRequest(
                        node_id=self.node.id,
                        min_index=index,
                        wait_ms=60_000,
                        secret_id=self.node.secret_id,
                    ),
                    timeout=90,
                )
            except grpc.aio.AioRpcError:
                await asyncio.sleep(1 + random.random())
                index = 0
                continue
            index = resp.index
            jobs = {(j.namespace, j.id, j.version): j for j in resp.jobs}
            for alloc in resp.full_allocs:
                self._track(alloc, jobs)
            if self.pending:
                await self._flush()

    def _track(self, alloc: pb.Allocation, jobs: dict[tuple[str, str, int], pb.Job]) -> None:
        if structs.alloc_server_terminal(alloc):
            if alloc.id in self.known and not structs.alloc_client_terminal(alloc):
                self._report(alloc, structs.ClientStatus.COMPLETE)
            self.known.pop(alloc.id, None)
            return
        if alloc.id in self.known or structs.alloc_client_terminal(alloc):
            return
        self.known[alloc.id] = alloc
        self._report(alloc, structs.ClientStatus.RUNNING)
        job = jobs.get((alloc.namespace, alloc.job_id, alloc.job_version))
        tg = structs.task_group(job, alloc.task_group) if job is not None else None
        run_for = 0.0
        if tg is not None and tg.tasks:
            with contextlib.suppress(ValueError):
                run_for = parse_duration(task_config(tg.tasks[0]).get("run_for"))
        if run_for > 0:
            asyncio.get_running_loop().call_later(run_for, self._finish, alloc.id)

    def _finish(self, alloc_id: str) -> None:
        alloc = self.known.pop(alloc_id, None)
        if alloc is not None:
            self._report(alloc, structs.ClientStatus.COMPLETE)
            asyncio.ensure_future(self._flush())

    def _report(self, alloc: pb.Allocation, status: str) -> None:
        upd = pb.Allocation(id=alloc.id, node_id=self.node.id, client_status=status)
        state = "running" if status == structs.ClientStatus.RUNNING else "dead"
        upd.task_states["main"].state = state
        self.pending[alloc.id] = upd

    async def _flush(self) -> None:
        if self.failed or not self.pending:
            return
        await asyncio.sleep(0.2)  # batch like the real agent
        updates, self.pending = list(self.pending.values()), {}
        try:
            await self.sim.stub.UpdateAlloc(
                node_pb2.NodeUpdateAllocRequest(allocs=updates, secret_id=self.node.secret_id),
                timeout=30,
            )
            self.sim.stats.alloc_updates += len(updates)
        except grpc.aio.AioRpcError:
            for u in updates:  # refused (not ready after a failure): retried after a heartbeat
                self.pending.setdefault(u.id, u)


class Simulator:
    def __init__(self, settings: SimSettings) -> None:
        self.settings = settings
        self.stats = SimStats()
        self.channel = transport.dial(
            settings.state_addr,
            options=[("grpc.max_receive_message_length", transport.MAX_MESSAGE_BYTES)],
        )
        self.stub = node_pb2_grpc.NodeStub(self.channel)
        secrets = load_secrets(settings.data_dir)
        self.nodes = [SimNode(self, i, settings, secrets) for i in range(settings.count)]
        # saved before any node registers: a secret the state has seen is on disk
        save_secrets(settings.data_dir, secrets)

    def fail(self) -> None:
        chosen = random.Random(self.settings.seed).sample(
            self.nodes, int(len(self.nodes) * self.settings.fail_fraction)
        )
        for n in chosen:
            n.failed = True
        log.warning("simulating the failure of %d nodes", len(chosen))

    def revive(self) -> None:
        for n in self.nodes:
            n.failed = False

    def snapshot(self) -> dict[str, object]:
        s = self.stats
        return {
            "nodes": len(self.nodes),
            "registered": s.registered,
            "heartbeats": s.heartbeats,
            "heartbeat_errors": s.heartbeat_errors,
            "dead_node_tasks": s.dead_nodes,
            "heartbeat_error_codes": s.error_codes,
            "alloc_updates": s.alloc_updates,
            "failed_nodes": sum(1 for n in self.nodes if n.failed),
            "uptime_s": round(time.monotonic() - s.started, 1),
        }


class SimProcess:
    """Registers every simulated node, then logs stats until stopped.
    SIGUSR1 fails `--fail-fraction` of the nodes, SIGUSR2 revives them."""

    def __init__(self, settings: SimSettings) -> None:
        self.settings = settings
        self.sim = Simulator(settings)
        self.stopping = asyncio.Event()
        self.tasks: list[asyncio.Task[None]] = []

    async def start(self) -> runner.Ready:
        sim, settings = self.sim, self.settings
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGUSR1, sim.fail)
        loop.add_signal_handler(signal.SIGUSR2, sim.revive)
        for i, node in enumerate(sim.nodes):
            self.tasks.append(asyncio.create_task(node.run()))
            if (i + 1) % max(1, int(settings.register_rate / 10)) == 0:
                await asyncio.sleep(0.1)
        while sim.stats.registered < len(sim.nodes):
            await asyncio.sleep(0.2)
        log.info("simulator: %d nodes registered", len(sim.nodes))
        self.tasks.append(asyncio.create_task(self._log_stats(), name="stats"))
        return runner.Ready(settings.state_addr, info={"nodes": len(sim.nodes)})

    async def _log_stats(self) -> None:
        while True:
            await asyncio.sleep(self.settings.stats_interval)
            log.info("simulator stats %s", json.dumps(self.sim.snapshot()))

    async def stop(self) -> None:
        for t in self.tasks:
            t.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        await self.sim.channel.close()


def main(argv: list[str] | None = None) -> int:
    return runner.main(SimSettings, SimProcess, doc=__doc__, argv=argv)


if __name__ == "__main__":
    sys.exit(main())
