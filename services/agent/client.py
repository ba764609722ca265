"""The client agent (Nomad's client/client.go): fingerprint, register,
heartbeat, pull allocations with a blocking query, run them, report their
status — three independent loops over the three client RPCs of seed 003.

After a network cut the agent keeps its tasks running. `Node.UpdateAlloc`
is refused until the node is ready again, so pending status updates are
kept and retried after the next successful heartbeat (seed 003's order).

The client state (services/agent/state_db.py) outlives the agent: at
start-up, before it registers, the agent rebuilds a runner for every alloc
it holds and adopts the tasks still running (Nomad's restoreState); the
first answer from the servers then stops what they stopped meanwhile and
forgets what they garbage collected. A graceful stop leaves the tasks
running for the next agent, as Nomad's does, unless the agent is told to
stop them (`--stop-tasks-on-shutdown`, what `corral dev` asks).

Finished allocs are destroyed (their directory and client state removed)
by the agent's garbage collection (services/agent/gc.py): periodically
past the disk, inode and alloc-count thresholds, on demand through
ClientNode.GarbageCollectAll and ClientAlloc.GarbageCollect, and when the
servers garbage collected them. The node's dynamic metadata
(services/agent/node_meta.py) is kept in the client state and merged into
the node the agent registers.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import platform
import socket
import time
import uuid
from collections.abc import Sequence

import grpc
import psutil

from corral.domain import structs
from corral.domain.errors import FailedPrecondition, InvalidArgument, NotFound
from corral.domain.structs import DesiredStatus, NodeStatus
from corral.security import transport
from corral.security.acl_resolve import RemoteResolver
from corral.security.private_files import private_dir, write_private
from corral.v1 import node_pb2, node_pb2_grpc, service_pb2, service_pb2_grpc
from corral.v1 import structs_pb2 as pb
from services.agent import gc, metrics, node_meta
from services.agent.artifacts import Getter, getter_settings
from services.agent.cgroups import CgroupManager, Detected, Version, detect
from services.agent.checks import Checker
from services.agent.config import AgentSettings
from services.agent.cpuset import Compute
from services.agent.drivers.base import Driver
from services.agent.drivers.build import build as build_drivers
from services.agent.node_meta import NodeMeta
from services.agent.runner import AllocRunner
from services.agent.service_sync import ServiceSync
from services.agent.state_db import StateDB
from services.agent.stats import HostStats
from services.agent.task_api import TaskAPI
from services.agent.template_data import TemplateClient

log = logging.getLogger(__name__)


def host_compute() -> Compute:
    """The machine's CPU: cores times their MHz (2,000 where unknown)."""
    cores = psutil.cpu_count(logical=True) or 1
    freq = psutil.cpu_freq()
    mhz = int(freq.max or freq.current) if freq and (freq.max or freq.current) else 2000
    return Compute(mhz * cores, cores)


def fingerprint(
    settings: AgentSettings, drivers: dict[str, Driver], http_addr: str = ""
) -> pb.Node:
    """What this machine offers, in Nomad's attribute names. A driver that
    is not detected and healthy here is listed with its reason and gets no
    `driver.<name>` attribute: the scheduler places nothing needing it."""
    compute = host_compute()
    cores, mhz = compute.cores, compute.mhz_per_core
    mem = psutil.virtual_memory().total // (1024 * 1024)
    private_dir(settings.data_dir)
    disk = psutil.disk_usage(str(settings.data_dir)).free // (1024 * 1024)
    try:
        ip = socket.gethostbyname(socket.gethostname())
    except OSError:
        ip = "127.0.0.1"
    attrs = {
        "kernel.name": platform.system().lower(),
        "kernel.version": platform.release(),
        "os.name": platform.system().lower(),
        "cpu.arch": platform.machine(),
        "arch": platform.machine(),
        "cpu.numcores": str(cores),
        "cpu.frequency": str(mhz),
        "cpu.totalcompute": str(mhz * cores),
        "memory.totalbytes": str(mem * 1024 * 1024),
        "unique.hostname": socket.gethostname(),
        "unique.network.ip-address": ip,
        "nomad.version": "1.5.0",
        "corral.version": "0.1.0",
    }
    node = pb.Node(
        name=settings.name,
        datacenter=settings.datacenter,
        node_pool=settings.node_pool,
        node_class=settings.node_class,
        attributes=attrs,
        meta=settings.meta,
        http_addr=http_addr,
        status=NodeStatus.INITIALIZING,
        node_resources=pb.NodeResources(
            cpu=mhz * cores,
            total_cores=cores,
            memory_mb=int(mem),
            disk_mb=int(disk),
            min_dynamic_port=20000,
            max_dynamic_port=32000,
        ),
        reserved_resources=pb.NodeReservedResources(
            cpu=settings.reserved_cpu, memory_mb=settings.reserved_memory_mb
        ),
    )
    for name, driver in drivers.items():
        info = driver.fingerprint()
        node.drivers[name].CopyFrom(info)
        if info.detected and info.healthy:
            node.attributes[f"driver.{name}"] = "1"
    for volume in settings.host_volumes():
        node.host_volumes[volume.name].CopyFrom(
            pb.ClientHostVolumeConfig(
                name=volume.name, path=volume.path, read_only=volume.read_only
            )
        )
    return node


def setup_cgroups(settings: AgentSettings, compute: Compute) -> CgroupManager:
    """The cgroups tasks will run in, created at start-up; turned off (with
    the reason, for the exec driver's health) when that fails."""
    detected = detect(settings.cgroup_version)
    manager = CgroupManager(detected, compute, settings.cgroup_parent)
    try:
        manager.init()
    except OSError as exc:
        log.warning("cgroups %s unusable: %s", detected.version, exc)
        off = Detected(Version.OFF, detected.mounts, reason=f"initialising cgroups failed: {exc}")
        return CgroupManager(off, compute, settings.cgroup_parent)
    log.info(
        "cgroups: %s%s",
        manager.version,
        f" ({detected.reason})" if detected.reason else "",
    )
    return manager


def heartbeat_interval(ttl: float, failures: int) -> float:
    """Seconds until the next heartbeat: half the TTL the servers gave,
    which grows with the cluster (at least nodes / `--heartbeats-per-second`),
    so the servers see at most twice that rate however many nodes there
    are (a cap of 10 s made 5,000 nodes send 500 a second; Nomad's client
    waits the whole TTL, its grace covering the latency); after failures,
    a retry within 2 s per failure, at most 10 s."""
    if failures:
        return min(2.0 * failures, 10.0)
    return ttl / 2


class Agent:
    def __init__(
        self,
        settings: AgentSettings,
        *,
        http_addr: str = "",
        resolver: RemoteResolver | None = None,
    ) -> None:
        """`http_addr` is where this node serves ClientAlloc (logs, stats);
        `resolver` checks the tokens tasks send to their Task API (without
        it, or without `gateway_addr`, tasks get no Task API socket)."""
        self.settings = settings
        self.compute = host_compute()
        self.cgroups = setup_cgroups(settings, self.compute)
        self.drivers = build_drivers(settings.drivers, self.cgroups, settings.exec_settings())
        self.node = fingerprint(settings, self.drivers, http_addr)
        self.host_stats = HostStats(settings.data_dir, self.compute)
        self.getter = Getter(getter_settings(settings))
        self.node.id, self.node.secret_id = self._identity()
        self.db = StateDB(settings.data_dir)
        # the node's meta: the configuration's, with the dynamic keys kept in the client state
        self.meta = NodeMeta(dict(settings.meta), self.db.load_node_meta())
        self._set_node_meta()
        self._meta_lock = asyncio.Lock()
        #: a metadata change the servers have not taken yet (re-registered by the heartbeat loop)
        self._node_stale = False
        self.runners: dict[str, AllocRunner] = {}
        #: allocs destroyed here that the servers still list (Nomad keeps the
        #: destroyed runner until then): never run again
        self._collected: set[str] = set()
        #: the last status of destroyed allocs not yet sent to the servers
        self._final: dict[str, pb.Allocation] = {}
        #: stops of allocs under way (the servers stopped or forgot them)
        self._stops: dict[str, asyncio.Task[None]] = {}
        # the node's side of the service catalog, and the checks' HTTP clients
        self.service_sync = ServiceSync(self._upsert_services, self._deregister_services)
        self.checker = Checker()
        self.jobs: dict[tuple[str, str, int], pb.Job] = {}
        self._dirty: set[str] = set()
        self._dirty_event = asyncio.Event()
        self._ready = asyncio.Event()
        self._stop = asyncio.Event()
        self._ttl = 10.0
        self._channel: grpc.aio.Channel | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self.resolver = resolver
        #: the tasks' templates read the cluster over the agent's channel
        self.templates: TemplateClient | None = None
        self.task_api: TaskAPI | None = None

    def _identity(self) -> tuple[str, str]:
        """The node id and secret survive restarts (data_dir/client.json,
        0600 in a 0700 directory, as Nomad's client state directory)."""
        path = private_dir(self.settings.data_dir) / "client.json"
        if path.exists():
            data = json.loads(path.read_text())
            return str(data["node_id"]), str(data["secret_id"])
        ident = {"node_id": str(uuid.uuid4()), "secret_id": str(uuid.uuid4())}
        write_private(path, json.dumps(ident))
        return ident["node_id"], ident["secret_id"]

    # ------------------------------------------------------------ dynamic metadata

    @property
    def node_id(self) -> str:
        return self.node.id

    def _set_node_meta(self) -> None:
        self.node.meta.clear()
        self.node.meta.update(self.meta.merged())

    async def apply_meta(self, changes: dict[str, str | None]) -> NodeMeta:
        """Set (or, with None, unset) dynamic metadata keys (Nomad's
        NodeMeta.Apply): the node is registered again with them before
        this returns, so the next evaluation sees them, then they are kept
        in the client state (a restarted agent registers with them). A
        node the servers refuse (the state's bounds on meta) changes
        nothing; servers out of reach get it from the heartbeat loop once
        they answer."""
        node_meta.validate(changes)
        async with self._meta_lock:
            meta = NodeMeta(self.meta.static, self.meta.applied(changes))
            node = structs.copy_msg(self.node)
            node.meta.clear()
            node.meta.update(meta.merged())
            stale = False
            try:
                await self.stub.Register(node_pb2.NodeRegisterRequest(node=node), timeout=10)
            except grpc.aio.AioRpcError as exc:
                if exc.code() == grpc.StatusCode.INVALID_ARGUMENT:
                    raise InvalidArgument("", f"the servers refused: {exc.details()}") from None
                log.warning("node metadata kept; registering it failed (%s)", exc.details())
                stale = True
            self.db.put_node_meta(meta.dynamic)
            self.meta = meta
            self._set_node_meta()
            self._node_stale = self._node_stale or stale
        return self.meta

    # ------------------------------------------------------------ resource usage

    async def _stats_loop(self) -> None:
        """Sample the host and every running task each `stats_interval`
        (Nomad's collection_interval): CPU percentages are between samples."""
        while not self._stop.is_set():
            try:
                self.host_stats.sample()
                for runner in list(self.runners.values()):
                    runner.sample_usage()
            except Exception:  # a stats failure must not stop the agent
                log.exception("sampling resource usage")
            await asyncio.sleep(self.settings.stats_interval)

    def task_samples(self) -> list[metrics.TaskSample]:
        """The latest reading of every running task (Prometheus gauges)."""
        out = []
        for runner in list(self.runners.values()):
            a = runner.alloc
            for t in runner.tasks:
                latest = t.stats.latest if t.stats is not None else None
                if latest is None:
                    continue
                r = t.resources()
                out.append(
                    metrics.TaskSample(
                        namespace=a.namespace or "default",
                        job=a.job_id,
                        task_group=a.task_group,
                        alloc_id=a.id,
                        task=t.task.name,
                        usage=latest,
                        allocated_mhz=r.cpu + r.cores * self.compute.mhz_per_core,
                        allocated_memory_bytes=r.memory_mb * 1024 * 1024,
                    )
                )
        return out

    def host_sample(self) -> pb.HostStats | None:
        return self.host_stats.latest

    def _alloc_statuses(self) -> list[str]:
        """The client status of every alloc held (corral_client_allocs)."""
        return [r.client_status()[0] for r in list(self.runners.values())]

    @property
    def stub(self) -> node_pb2_grpc.NodeAsyncStub:
        assert self._channel is not None
        return node_pb2_grpc.NodeStub(self._channel)

    def _runner(self, alloc: pb.Allocation, job: pb.Job, **kw: object) -> AllocRunner:
        return AllocRunner(
            alloc,
            job,
            self.drivers,
            self.settings.data_dir,
            self._mark,
            node=self.node,
            db=self.db,
            max_kill_timeout=self.settings.max_kill_timeout,
            sign=self.sign_identities,
            sync=self.service_sync,
            checker=self.checker,
            templates=self.templates,
            task_api=self.task_api,
            getter=self.getter,
            **kw,  # type: ignore[arg-type]
        )

    async def restore(self) -> None:
        """Rebuild a runner for every alloc of the client state and adopt
        its tasks (Nomad's Client.restoreState); each reports its state
        once the servers answered."""
        for stored in self.db.load():
            alloc, job = stored.alloc, stored.job
            self.jobs[(job.namespace, job.id, job.version)] = job
            runner = self._runner(alloc, job, stored=stored)
            await runner.restore()
            self.runners[alloc.id] = runner
            adopted = sum(t.running for t in runner.tasks)
            log.info(
                "restored alloc %s (%s): %d of %d tasks running",
                alloc.id,
                alloc.name,
                adopted,
                len(runner.tasks),
                extra={"alloc_id": alloc.id},
            )
            runner.start()

    @property
    def catalog(self) -> service_pb2_grpc.ServiceRegistrationAsyncStub:
        assert self._channel is not None
        return service_pb2_grpc.ServiceRegistrationStub(self._channel)

    async def _upsert_services(self, regs: Sequence[pb.ServiceRegistration]) -> None:
        await self.catalog.Upsert(
            service_pb2.ServiceUpsertRequest(
                node_id=self.node.id, secret_id=self.node.secret_id, registrations=regs
            ),
            timeout=10,
        )

    async def _deregister_services(self, namespace: str, ids: Sequence[str]) -> None:
        await self.catalog.Deregister(
            service_pb2.ServiceDeregisterRequest(
                node_id=self.node.id, secret_id=self.node.secret_id, namespace=namespace, ids=ids
            ),
            timeout=10,
        )

    async def start(self) -> None:
        self._channel = transport.dial(self.settings.state_addr)
        self.templates = TemplateClient(
            self._channel,
            retry=self.settings.template_retry(),
            region=self.settings.security.region,
        )
        if self.settings.gateway_addr and self.resolver is not None:
            self.task_api = TaskAPI(
                self.settings.gateway_addr, self.resolver, security=self.settings.security
            )
        await self.restore()
        await self._register()
        self.service_sync.start()
        metrics.ALLOCS.add_source(self._alloc_statuses)
        metrics.USAGE.add_source(self)
        self._tasks = [
            asyncio.create_task(self._heartbeat_loop(), name="heartbeat"),
            asyncio.create_task(self._watch_loop(), name="watch-allocs"),
            asyncio.create_task(self._update_loop(), name="alloc-updates"),
            asyncio.create_task(self._stats_loop(), name="stats"),
            asyncio.create_task(self._gc_loop(), name="alloc-gc"),
        ]

    async def stop(self) -> None:
        """Stop reporting. The tasks keep running for the next agent to
        adopt, unless `stop_tasks_on_shutdown` (a dev agent leaves nothing
        behind)."""
        self._stop.set()
        metrics.ALLOCS.remove_source(self._alloc_statuses)
        metrics.USAGE.remove_source(self)
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        if self.settings.stop_tasks_on_shutdown:
            await asyncio.gather(*(r.stop() for r in self.runners.values()))
            await asyncio.gather(*self._stops.values(), return_exceptions=True)
        else:
            for t in self._stops.values():
                t.cancel()
            await asyncio.gather(*self._stops.values(), return_exceptions=True)
            await asyncio.gather(*(r.detach() for r in self.runners.values()))
        await self.service_sync.flush(5.0)  # what the stops deregistered reaches the catalog
        await self.service_sync.stop()
        await self.checker.close()
        if self.task_api is not None:
            await self.task_api.close()
        self.db.close()
        if self._channel is not None:
            await self._channel.close()

    # ------------------------------------------------------------ register / heartbeat

    async def _register(self) -> None:
        backoff = 0.5
        while not self._stop.is_set():
            try:
                resp = await self.stub.Register(
                    node_pb2.NodeRegisterRequest(node=self.node), timeout=10
                )
                self._ttl = resp.heartbeat_ttl_ms / 1000
                log.info(
                    "registered node %s (%s), ttl %.1fs", self.node.id, self.node.name, self._ttl
                )
                return
            except grpc.aio.AioRpcError as exc:
                log.warning("registration failed (%s); retrying", exc.details())
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 10.0)

    async def _heartbeat_loop(self) -> None:
        failures = 0
        last_ok = time.monotonic()
        while not self._stop.is_set():
            if self._node_stale:  # a metadata change the servers missed
                self._node_stale = False
                await self._register()
            gap = time.monotonic() - last_ok
            try:
                resp = await self.stub.UpdateStatus(
                    node_pb2.NodeUpdateStatusRequest(
                        node_id=self.node.id, status=NodeStatus.READY, secret_id=self.node.secret_id
                    ),
                    timeout=10,
                )
                self._ttl = max(1.0, resp.heartbeat_ttl_ms / 1000)
                if failures or gap > self._ttl:
                    # we may have been marked down/disconnected: the server
                    # waits for our alloc states before the node is ready
                    # again (seed 003), so push all of them
                    log.info("heartbeat restored after %.1fs; resyncing alloc states", gap)
                    self._dirty.update(self.runners)
                    self.service_sync.resync()
                last_ok = time.monotonic()
                failures = 0
                self._ready.set()
                self._dirty_event.set()  # retry updates refused while we were away
            except grpc.aio.AioRpcError as exc:
                failures += 1
                self._ready.clear()
                if exc.code() == grpc.StatusCode.NOT_FOUND:
                    await self._register()  # the server lost us (state reset, GC)
                else:
                    log.warning("heartbeat failed: %s", exc.details())
            await asyncio.sleep(heartbeat_interval(self._ttl, failures))

    # ------------------------------------------------------------ allocations

    async def _watch_loop(self) -> None:
        index = 0
        while not self._stop.is_set():
            try:
                resp = await self.stub.GetClientAllocs(
                    node_pb2.NodeClientAllocsRequest(
                        node_id=self.node.id,
                        min_index=index,
                        wait_ms=30_000,
                        secret_id=self.node.secret_id,
                    ),
                    timeout=60,
                )
            except grpc.aio.AioRpcError as exc:
                log.debug("alloc watch failed: %s", exc.details())
                index = 0  # start over: the server skips terminal allocs for us (seed 003)
                await asyncio.sleep(1.0)
                continue
            for job in resp.jobs:
                key = (job.namespace, job.id, job.version)
                if key not in self.jobs:  # a version never changes
                    self.jobs[key] = structs.copy_msg(job)  # see _reconcile
            await self._reconcile(resp, starting_over=index == 0)
            index = resp.index

    async def _reconcile(
        self, resp: node_pb2.NodeClientAllocsResponse, *, starting_over: bool = False
    ) -> None:
        """Run what is new, stop what the servers stopped, forget what they
        garbage collected. `starting_over`: the answer to a query from index
        0, which leaves out allocs the servers hold as finished (so a client
        without them never runs them again): one this agent still runs
        ended on the servers' side (lost while the agent was away) and is
        stopped.

        What a runner keeps is copied out of `resp`: a message taken from a
        parsed response keeps the whole response alive (one upb arena), so
        runners holding allocs of many responses held all of them: the agent
        grew by 160 MB in 11 minutes of churn (issue 26's soak)."""
        sent = set()
        for alloc in resp.full_allocs:
            sent.add(alloc.id)
            runner = self.runners.get(alloc.id)
            if structs.alloc_server_terminal(alloc) or alloc.desired_status != DesiredStatus.RUN:
                if runner is not None:
                    if alloc.modify_index != runner.alloc.modify_index:
                        runner.updated(structs.copy_msg(alloc), None)
                    if not runner.done:
                        log.info("stopping alloc %s (%s)", alloc.id, alloc.desired_description)
                        self._stop_alloc(runner)
                continue
            if runner is None:
                if structs.alloc_client_terminal(alloc) or alloc.id in self._collected:
                    continue  # finished before; nothing to run again
                job = self.jobs.get((alloc.namespace, alloc.job_id, alloc.job_version))
                if job is None:
                    log.warning("alloc %s: job version %d unknown", alloc.id, alloc.job_version)
                    continue
                alloc = structs.copy_msg(alloc)
                self.db.put_alloc(alloc, job)  # before anything runs
                runner = self._runner(alloc, job)
                self.runners[alloc.id] = runner
                log.info(
                    "starting alloc %s (%s)", alloc.id, alloc.name, extra={"alloc_id": alloc.id}
                )
                runner.start()
            elif alloc.modify_index != runner.alloc.modify_index:  # changed since
                # an in-place update moves the alloc to a newer job version
                newer = self.jobs.get((alloc.namespace, alloc.job_id, alloc.job_version))
                runner.updated(
                    structs.copy_msg(alloc),
                    newer if newer is not None and newer is not runner.job else None,
                )
        if starting_over:
            for alloc_id, runner in list(self.runners.items()):
                if alloc_id in resp.allocs and alloc_id not in sent and not runner.done:
                    log.info("stopping alloc %s: finished on the servers", alloc_id)
                    self._stop_alloc(runner)
            self._dirty.update(self.runners)  # tell the servers where every alloc is
            self._dirty_event.set()
        gone = set(self.runners) - set(resp.allocs)
        for alloc_id in gone:  # garbage collected on the servers
            self._stop_alloc(self.runners.pop(alloc_id), forget=True)
        self._collected.intersection_update(resp.allocs)
        self._collect_finished()
        # the job versions no alloc of this node runs any more: every version
        # ever placed here was kept before, growing the agent under churn
        wanted = {
            (r.alloc.namespace, r.alloc.job_id, r.alloc.job_version) for r in self.runners.values()
        }
        for key in [k for k in self.jobs if k not in wanted]:
            del self.jobs[key]

    def _collect_finished(self) -> None:
        """Nomad's client alloc GC by count (gc_max_allocs), right after the
        servers' answer: past the limit, destroy finished allocs, oldest
        first, whose end the servers already hold (they keep them until
        their own GC, which with Nomad's thresholds is hours: an agent
        keeping a runner for each grew by 200 MB in an hour of churn). A
        destroyed alloc's logs and files are gone, as in Nomad."""
        excess = len(self.runners) - self.settings.gc_max_allocs
        if excess <= 0:
            return
        for runner in self._gc_candidates(reported=True)[:excess]:
            self._destroy(runner, "number of allocations is over the limit")

    def _gc_candidates(self, *, reported: bool) -> list[AllocRunner]:
        """Finished allocs, oldest first: every one whose tasks are all dead
        (what Nomad's GC queue holds), or with `reported` only those the
        servers already know finished (the periodic collection must not
        race the agent's own status update)."""
        return sorted(
            (
                r
                for r in self.runners.values()
                if r.done
                and r.alloc.id not in self._stops
                and (
                    not reported
                    or (structs.alloc_client_terminal(r.alloc) and r.alloc.id not in self._dirty)
                )
            ),
            key=lambda r: r.alloc.modify_index,
        )

    def _destroy(self, runner: AllocRunner, reason: str) -> asyncio.Task[None]:
        """Destroy a finished alloc (Nomad's AllocRunner.Destroy): forget it,
        remove its directory and client state. Its last status still goes
        to the servers if it has not yet."""
        alloc_id = runner.alloc.id
        log.info("garbage collecting alloc %s: %s", alloc_id, reason, extra={"alloc_id": alloc_id})
        self.runners.pop(alloc_id, None)
        self._collected.add(alloc_id)
        if alloc_id in self._dirty:
            self._final[alloc_id] = runner.update()
        return self._stop_alloc(runner, forget=True)

    async def collect(self, alloc_id: str) -> None:
        """Destroy one finished alloc now (Nomad's ClientAllocations.GarbageCollect)."""
        runner = self.runners.get(alloc_id)
        if runner is None:
            raise NotFound(f"No such allocation on client: {alloc_id!r}")
        if not runner.done or alloc_id in self._stops:
            raise FailedPrecondition(
                f"allocation {alloc_id} is not terminal: its tasks still run "
                "(stop it first); it is not eligible for garbage collection"
            )
        await self._destroy(runner, "forced collection")

    async def collect_all(self) -> list[str]:
        """Destroy every finished alloc now (Nomad's GarbageCollectAll)."""
        runners = self._gc_candidates(reported=False)
        await asyncio.gather(*(self._destroy(r, "forced full node collection") for r in runners))
        return [r.alloc.id for r in runners]

    async def keep_usage_below_threshold(self) -> None:
        """Nomad's periodic client GC: while the data dir's file system is
        over its disk or inode threshold, or the node holds more than
        gc_max_allocs allocs, destroy the oldest finished alloc."""
        s = self.settings
        while not self._stop.is_set():
            usage = await asyncio.to_thread(gc.disk_usage, s.data_dir)
            reason = gc.over_threshold(
                usage,
                len(self.runners),
                disk=s.gc_disk_usage_threshold,
                inodes=s.gc_inode_usage_threshold,
                max_allocs=s.gc_max_allocs,
            )
            if not reason:
                return
            candidates = self._gc_candidates(reported=True)
            if not candidates:
                log.debug("garbage collection skipped, no finished allocs: %s", reason)
                return
            await self._destroy(candidates[0], reason)

    async def _gc_loop(self) -> None:
        while not self._stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), self.settings.gc_interval)
            if self._stop.is_set():
                return
            try:
                await self.keep_usage_below_threshold()
            except Exception:  # a failed collection must not stop the agent
                log.exception("garbage collecting allocs")

    def _stop_alloc(self, runner: AllocRunner, *, forget: bool = False) -> asyncio.Task[None]:
        """Stop an alloc's tasks in the background (a shutdown_delay must
        not hold up the other allocs); `forget` then destroys it: its
        directory and its client state go."""
        alloc_id = runner.alloc.id
        if alloc_id in self._stops and not forget:
            return self._stops[alloc_id]

        async def stop() -> None:
            await runner.stop()
            if forget:
                for path in runner.kept_dirs():
                    await asyncio.to_thread(gc.remove_dir, path)
                self.db.delete_alloc(alloc_id)

        task = asyncio.create_task(stop(), name=f"stop-alloc-{alloc_id[:8]}")
        self._stops[alloc_id] = task

        def finished(t: asyncio.Task[None]) -> None:
            if self._stops.get(alloc_id) is t:
                del self._stops[alloc_id]
            if not t.cancelled() and t.exception() is not None:
                log.error("stopping alloc %s", alloc_id, exc_info=t.exception())

        task.add_done_callback(finished)
        return task

    def _mark(self, runner: AllocRunner) -> None:
        self._dirty.add(runner.alloc.id)
        self._dirty_event.set()

    async def _update_loop(self) -> None:
        """Batch client updates; keep them while the node is not ready."""
        while not self._stop.is_set():
            await self._dirty_event.wait()
            await asyncio.sleep(self.settings.update_interval)
            self._dirty_event.clear()
            if not self._dirty:
                continue
            # take the set before sending: a task that changes during the RPC
            # marks its alloc dirty again and goes out in the next batch
            ids = list(self._dirty)
            self._dirty.clear()
            updates = []
            for i in ids:
                runner = self.runners.get(i)
                if runner is not None:
                    updates.append(runner.update())
                elif i in self._final:  # destroyed before its last status went out
                    updates.append(self._final[i])
            if not updates:
                continue
            try:
                await self.stub.UpdateAlloc(
                    node_pb2.NodeUpdateAllocRequest(allocs=updates, secret_id=self.node.secret_id),
                    timeout=10,
                )
                for i in ids:
                    self._final.pop(i, None)
            except grpc.aio.AioRpcError as exc:
                self._dirty.update(ids)
                # FAILED_PRECONDITION: not ready yet (after a disconnect) —
                # the next successful heartbeat sets the event again
                log.info("alloc update deferred: %s", exc.details())

    async def sign_identities(
        self, alloc_id: str, task: str, names: Sequence[str]
    ) -> node_pb2.NodeSignIdentitiesResponse:
        """Workload identities of one of our tasks, signed by the state."""
        resp: node_pb2.NodeSignIdentitiesResponse = await self.stub.SignIdentities(
            node_pb2.NodeSignIdentitiesRequest(
                node_id=self.node.id,
                secret_id=self.node.secret_id,
                identities=[
                    node_pb2.WorkloadIdentityRequest(alloc_id=alloc_id, task=task, identity=n)
                    for n in names
                ],
            ),
            timeout=30,
        )
        return resp
