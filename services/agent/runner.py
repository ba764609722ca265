"""Running an alloc's tasks on the client, with Nomad's restart policy and
task events, and the alloc's client status derived from its task states
(Nomad's allocrunner/taskrunner, much reduced)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from opentelemetry import trace

from corral.domain import services, structs
from corral.domain.dispatch import payload_file_problem
from corral.domain.structs import ClientStatus, JobType, TaskStateName, copy_msg
from corral.runtime import telemetry
from corral.security import transport
from corral.v1 import structs_pb2 as pb
from services.agent import metrics, taskenv
from services.agent.alloc_services import AllocServices
from services.agent.allocdir import (
    CHROOT_ALLOC_DIR,
    CHROOT_LOCAL_DIR,
    CHROOT_SECRETS_DIR,
    AllocDir,
)
from services.agent.checks import Checker
from services.agent.cpuset import Compute
from services.agent.drivers import (
    Driver,
    DriverError,
    ExitResult,
    TaskConfig,
    TaskHandle,
    TaskResources,
    task_config,
)
from services.agent.drivers.exec import DEFAULT_USER as EXEC_DEFAULT_USER
from services.agent.health import HealthWatch
from services.agent.identity import IdentityError, Signer, TaskIdentities
from services.agent.service_sync import ServiceSync
from services.agent.stats import TaskStats, alloc_usage

#: drivers whose tasks see their directories at the root of their own file
#: system (Nomad's chroot file system isolation)
CHROOT_DRIVERS = ("exec",)

log = logging.getLogger(__name__)
tracer = telemetry.tracer("corral.agent")


class RestartTracker:
    """Nomad's restart policy: `attempts` restarts within `interval`, `delay`
    apart; then mode `fail` gives up, mode `delay` waits out the interval."""

    def __init__(self, policy: pb.RestartPolicy, batch: bool) -> None:
        self.policy = policy
        self.batch = batch
        self._starts: list[float] = []

    def next(self, result: ExitResult) -> float | None:
        """Seconds to wait before restarting, or None to stop for good."""
        if self.batch and result.successful:
            return None  # a batch task that succeeded is done
        now = time.monotonic()
        interval = self.policy.interval / 1e9
        if interval > 0:
            self._starts = [t for t in self._starts if now - t < interval]
        if len(self._starts) < self.policy.attempts:
            self._starts.append(now)
            return self.policy.delay / 1e9
        if self.policy.mode == "delay" and interval > 0:
            wait = interval - (now - self._starts[0]) if self._starts else interval
            self._starts = []
            return max(wait, self.policy.delay / 1e9)
        return None


class TaskRunner:
    def __init__(
        self,
        alloc: pb.Allocation,
        job: pb.Job,
        task: pb.Task,
        driver: Driver,
        alloc_dir: AllocDir,
        on_change: Callable[[], None],
        node: pb.Node,
        *,
        state_dir: Path,
        sign: Signer | None = None,
    ) -> None:
        """`state_dir` is where the task's executor keeps its files."""
        self.alloc = alloc
        self.job = job
        self.task = task
        self.node = node
        self.driver = driver
        self.alloc_dir = alloc_dir
        self.task_dir = alloc_dir.task(task.name)
        self.dir = self.task_dir.dir
        self.state_dir = state_dir
        #: the task's workload identities, when it exposes any; their files
        #: belong to the user the task runs as
        owner = task.user or (EXEC_DEFAULT_USER if task.driver == "exec" else "")
        self.identities = (
            TaskIdentities(sign, alloc.id, task, self.dir, owner=owner)
            if sign is not None
            else None
        )
        self.on_change = on_change
        self.state = pb.TaskState(state=TaskStateName.PENDING)
        self._handle: TaskHandle | None = None
        self.compute = Compute(node.node_resources.cpu, node.node_resources.total_cores)
        #: the current run's resource readings (None when not running)
        self.stats: TaskStats | None = None
        self._killing = False
        #: why the running task is being restarted (check_restart), "" if it is not
        self._restart_reason = ""
        #: the alloc's services (None: the group has none)
        self.services: AllocServices | None = None
        self.started = asyncio.Event()  # the first start attempt returned (or never will)
        tg = structs.task_group(job, alloc.task_group)
        policy = (
            task.restart_policy
            if task.HasField("restart_policy")
            else (tg.restart_policy if tg else pb.RestartPolicy())
        )
        self.restarts = RestartTracker(policy, job.type in (JobType.BATCH, JobType.SYSBATCH))

    def _event(
        self, kind: str, display: str = "", details: dict[str, str] | None = None, **kw: object
    ) -> None:
        """A task event (the last ten are kept); `display` is what people read."""
        event = self.state.events.add(type=kind, time=time.time_ns(), display_message=display, **kw)  # type: ignore[arg-type]
        event.details.update(details or {})
        del self.state.events[:-10]
        self.on_change()

    def resources(self) -> pb.Resources:
        """What the scheduler allocated to this task (its memory_max_mb is
        set only where memory oversubscription is enabled); the task's ask
        for an alloc placed without per-task resources."""
        if self.task.name in self.alloc.task_resources:
            return self.alloc.task_resources[self.task.name]
        asked = copy_msg(self.task.resources)
        asked.memory_max_mb = 0
        return asked

    def task_env(self) -> taskenv.TaskEnv:
        """Built for every start: the alloc (its name, node) may have been
        updated by the server since the last one. Directories are named as
        the task sees them: inside its own root for the exec driver."""
        td = self.task_dir
        if self.task.driver in CHROOT_DRIVERS:
            dirs = taskenv.TaskDirs(CHROOT_ALLOC_DIR, CHROOT_LOCAL_DIR, CHROOT_SECRETS_DIR)
        else:
            dirs = taskenv.TaskDirs(str(td.alloc_dir), str(td.local), str(td.secrets))
        return taskenv.build(
            self.alloc,
            self.job,
            self.task,
            self.node,
            dirs=dirs,
            home=str(self.dir),
            resources=self.resources(),
            region=transport.current().region,
        )

    def task_config(self, env: taskenv.TaskEnv) -> TaskConfig:
        r = self.resources()
        return TaskConfig(
            alloc_id=self.alloc.id,
            name=self.task.name,
            driver_config=env.config(task_config(self.task)),
            env=env.env,
            task_dir=self.task_dir,
            state_dir=self.state_dir,
            resources=TaskResources(
                cpu_mhz=r.cpu, cores=r.cores, memory_mb=r.memory_mb, memory_max_mb=r.memory_max_mb
            ),
            user=self.task.user,
        )

    def write_payload(self) -> None:
        """A dispatched job's payload into the file its task asked for
        (`dispatch_payload`), under the task's local dir, before it starts."""
        if not self.job.dispatched or not self.task.HasField("dispatch_payload"):
            return
        problem = payload_file_problem(self.task.dispatch_payload.file)
        if problem is not None:
            raise ValueError(f"dispatch_payload.file: {problem}")
        path = self.task_dir.local / self.task.dispatch_payload.file
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(self.job.payload)

    async def run(self) -> None:
        self._event("Received", "Task received by client")
        self._event("Task Setup", "Building Task Directory")
        try:
            self.alloc_dir.build()
            self.task_dir.build()
        except OSError as exc:
            self._setup_failed(f"failed to build the task directory: {exc}")
        try:
            self.write_payload()
        except (OSError, ValueError) as exc:
            self._setup_failed(f"failed to write the dispatch payload: {exc}")
        renewing: asyncio.Task[None] | None = None
        while not self._killing:
            try:
                env = self.task_env()
                if self.identities is not None and self.identities.wanted:
                    env.env.update(await self.identities.setup())
                    if renewing is None:
                        renewing = asyncio.create_task(self.identities.renew())
                with tracer.start_as_current_span("agent.start_task") as span:
                    span.set_attribute("task", self.task.name)
                    span.set_attribute("driver", self.task.driver)
                    self._handle = await self.driver.start(self.task_config(env))
            except IdentityError as exc:
                self.started.set()
                result = ExitResult(exit_code=-1, error=str(exc))
                self._event("Setup Failure", f"workload identity: {exc}", fails_task=True)
            except Exception as exc:
                self.started.set()
                if not isinstance(exc, DriverError | OSError | ValueError):
                    log.exception("starting task %s of alloc %s", self.task.name, self.alloc.id)
                result = ExitResult(exit_code=-1, error=str(exc))
                self._event("Driver Failure", str(exc), fails_task=True)
                metrics.DRIVER_ERRORS.labels(self.task.driver).inc()
            else:
                self.started.set()
                metrics.TASK_STARTS.labels(self.task.driver).inc()
                self.stats = TaskStats(self.compute)
                self.state.state = TaskStateName.RUNNING
                if not self.state.started_at:
                    self.state.started_at = time.time_ns()
                self._event("Started", "Task started by client")
                if self.services is not None:
                    self.services.task_started(self.task.name)
                result = await self._handle.wait()
                if self.services is not None:
                    self.services.task_stopped(self.task.name)
                self.stats = None
                await self._handle.destroy()
                self._terminated(result)
            if self._killing:
                break
            if self._restart_reason:
                # check_restart: a failure for the restart policy (Nomad's
                # Restart with failure = true)
                result = ExitResult(exit_code=result.exit_code, error=self._restart_reason)
                self._restart_reason = ""
            elif result.killed:
                break
            delay = self.restarts.next(result)
            if delay is None:
                self.state.failed = not result.successful
                if self.state.failed:
                    self._event("Not Restarting", "Exceeded allowed attempts", fails_task=True)
                break
            self.state.restarts += 1
            metrics.TASK_RESTARTS.labels(self.task.driver).inc()
            self.state.last_restart = time.time_ns()
            self.state.state = TaskStateName.PENDING
            self._event(
                "Restarting",
                f"Task restarting in {delay:.0f}s",
                restart_reason_delay=int(delay * 1e9),
            )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wait_killed(), delay)
        self.started.set()
        if renewing is not None:
            renewing.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await renewing
        self.state.state = TaskStateName.DEAD
        self.state.finished_at = time.time_ns()
        self.on_change()

    def _setup_failed(self, message: str) -> None:
        if not self.state.failed:
            self._event("Setup Failure", message, fails_task=True)
        self.state.failed = True
        self._killing = True

    def _terminated(self, result: ExitResult) -> None:
        """Nomad's Terminated event; an OOM kill says so (as Nomad's
        drivers report it: the exit message "OOM Killed" and the detail
        oom_killed=true)."""
        parts = [f"Exit Code: {result.exit_code}"]
        if result.signal:
            parts.append(f"Signal: {result.signal}")
        message = "OOM Killed" if result.oom_killed else result.error
        if message:
            parts.append(f'Exit Message: "{message}"')
        if result.oom_killed:
            metrics.OOM_KILLED.labels(
                self.alloc.namespace or structs.DEFAULT_NAMESPACE,
                self.alloc.job_id,
                self.alloc.task_group,
                self.task.name,
            ).inc()
        self._event(
            "Terminated",
            ", ".join(parts),
            {"oom_killed": str(result.oom_killed).lower()},
            message=message,
            exit_code=result.exit_code,
            signal=result.signal,
        )

    def sample_usage(self) -> pb.TaskResourceUsage | None:
        """A fresh reading of the running task's resources (None when it is
        not running or cannot be measured)."""
        handle, stats = self._handle, self.stats
        if handle is None or stats is None or self.state.state != TaskStateName.RUNNING:
            return None
        usage = handle.usage()
        return stats.sample(usage) if usage is not None else None

    async def _wait_killed(self) -> None:
        while not self._killing:
            await asyncio.sleep(0.05)

    def request_restart(self, reason: str) -> None:
        """Restart the running task (check_restart): it is stopped, then the
        restart policy decides, counting the restart as a failure."""
        if self._killing or self._handle is None or self.state.state != TaskStateName.RUNNING:
            return
        if self._restart_reason:
            return
        self._restart_reason = reason
        self._event("Restart Signaled", reason)
        sig = getattr(signal, self.task.kill_signal or "SIGTERM", signal.SIGTERM)
        handle = self._handle
        asyncio.get_running_loop().create_task(
            handle.stop(sig, (self.task.kill_timeout or 5 * 10**9) / 1e9)
        )

    async def _shutdown_delay(self) -> None:
        """Nomad's task shutdown_delay: with its services gone, the task
        keeps running this long before it is killed (unless the alloc was
        stopped with no_shutdown_delay, or the task exits first)."""
        delay = self.task.shutdown_delay / 1e9
        if not delay or self.state.state != TaskStateName.RUNNING:
            return
        if self.alloc.desired_transition.no_shutdown_delay:
            self._event(
                "Skipping shutdown delay",
                f"Skipping shutdown_delay of {delay:g}s before killing the task.",
            )
            return
        self._event(
            "Waiting for shutdown delay",
            f"Waiting for shutdown_delay of {delay:g}s before killing the task.",
        )
        deadline = time.monotonic() + delay
        while self.state.state == TaskStateName.RUNNING and time.monotonic() < deadline:
            await asyncio.sleep(min(0.05, max(0.0, deadline - time.monotonic())))

    async def kill(self) -> None:
        self._killing = True
        if self.services is not None:
            self.services.task_stopped(self.task.name)
        await self._shutdown_delay()
        if self._handle is not None and self.state.state == TaskStateName.RUNNING:
            self._event("Killing", "Sent interrupt")
            sig = getattr(signal, self.task.kill_signal or "SIGTERM", signal.SIGTERM)
            await self._handle.stop(sig, (self.task.kill_timeout or 5 * 10**9) / 1e9)
            self._event("Killed", "Task successfully killed")


class AllocRunner:
    """Runs every task of one alloc; reports through `on_change`."""

    def __init__(
        self,
        alloc: pb.Allocation,
        job: pb.Job,
        drivers: dict[str, Driver],
        data_dir: Path,
        on_change: Callable[[AllocRunner], None],
        *,
        node: pb.Node | None = None,
        sign: Signer | None = None,
        sync: ServiceSync | None = None,
        checker: Checker | None = None,
    ) -> None:
        """`node` is the client's own node: its attributes and meta resolve
        `${node.*}`, `${attr.*}` and `${meta.*}` in the tasks' specs;
        `sign` gets the tasks' workload identities from the state. `sync`
        and `checker` are the agent's: with them the group's Nomad-provider
        services are registered and checked."""
        self.alloc = alloc
        self.job = job
        self.alloc_dir = AllocDir.of(data_dir, alloc.id)
        self.dir = self.alloc_dir.dir
        self.on_change = on_change
        self.node = node if node is not None else pb.Node(id=alloc.node_id)
        tg = structs.task_group(job, alloc.task_group)
        self.tasks: list[TaskRunner] = []
        self.error = ""
        self.services: AllocServices | None = None
        if tg is not None and sync and checker and services.group_services(tg):
            self.services = AllocServices(
                lambda: self.alloc,
                lambda: self.job,
                self.node,
                sync,
                checker,
                self._env_of,
                self.restart,
            )
        self.health = HealthWatch(
            lambda: self.alloc,
            lambda: self.job,
            lambda: [t.state for t in self.tasks],
            lambda: self.on_change(self),
            checks=self._check_results,
        )
        self._health_task: asyncio.Task[None] | None = None
        if tg is None:
            self.error = (
                f"task group {alloc.task_group!r} not in job {job.id} version {job.version}"
            )
            return
        for task in tg.tasks:
            driver = drivers.get(task.driver)
            if driver is None:
                self.error = f"driver {task.driver!r} is not available on this node"
                break
            self.tasks.append(
                TaskRunner(
                    alloc,
                    job,
                    task,
                    driver,
                    self.alloc_dir,
                    lambda: self.on_change(self),
                    self.node,
                    state_dir=data_dir / "executor" / f"{alloc.id}.{task.name}",
                    sign=sign,
                )
            )
            self.tasks[-1].services = self.services
        self._task: asyncio.Task[None] | None = None

    def _env_of(self, task: str) -> taskenv.TaskEnv:
        """A task's environment, or the alloc's ("": no task of its own,
        what group services and checks are interpolated with)."""
        for t in self.tasks:
            if t.task.name == task:
                return t.task_env()
        shared = str(self.alloc_dir.shared)
        return taskenv.build(
            self.alloc,
            self.job,
            pb.Task(),
            self.node,
            dirs=taskenv.TaskDirs(shared, shared, shared),
            home=str(self.dir),
        )

    def check_results(self) -> list[pb.CheckResult]:
        """The latest result of every check of the alloc's services."""
        return self.services.results() if self.services is not None else []

    def _check_results(self) -> list[pb.CheckResult] | None:
        """The latest check results, None when the group has no checks."""
        if self.services is None or not self.services.has_checks:
            return None
        return self.services.results()

    def restart(self, task: str, reason: str) -> None:
        """check_restart: restart one task ("": every task of the alloc)."""
        for t in self.tasks:
            if not task or t.task.name == task:
                t.request_restart(reason)

    def updated(self) -> None:
        """The server changed the alloc or moved it to a newer job version."""
        if self.services is not None:
            self.services.refresh()

    def start(self) -> None:
        if self.services is not None and not self.error:
            self.services.start()
        self._task = asyncio.create_task(self._run(), name=f"alloc-{self.alloc.id[:8]}")
        if not self.error:
            self._health_task = asyncio.create_task(
                self.health.run(), name=f"alloc-health-{self.alloc.id[:8]}"
            )

    async def _run(self) -> None:
        if self.error:
            self.on_change(self)
            return
        try:
            await self._run_tasks()
        finally:
            if self.services is not None:
                await self.services.stop()  # every task is done: nothing stays registered

    async def _run_tasks(self) -> None:
        if not (telemetry.tracing_enabled() and self.alloc.traceparent):
            await asyncio.gather(*(t.run() for t in self.tasks))
            return
        # the alloc's start joins the trace of the plan that placed it; it
        # ends once every task's first start returned (the tasks run on)
        span = tracer.start_span(
            "agent.start_alloc",
            context=telemetry.context_from_traceparent(self.alloc.traceparent),
        )
        span.set_attribute("alloc.id", self.alloc.id)
        span.set_attribute("eval.id", self.alloc.eval_id)
        with trace.use_span(span):
            runs = asyncio.gather(*(t.run() for t in self.tasks))
        started: asyncio.Future[Any] = asyncio.ensure_future(
            asyncio.gather(*(t.started.wait() for t in self.tasks))
        )
        waits: set[asyncio.Future[Any]] = {runs, started}
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            started.cancel()
            span.end()
        await runs

    async def stop(self) -> None:
        if self._health_task is not None:
            self._health_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._health_task
        if self.services is not None:
            await self.services.deregister()
        await self._group_shutdown_delay()
        await asyncio.gather(*(t.kill() for t in self.tasks))
        if self._task is not None:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
        if self.services is not None:
            await self.services.stop()

    async def _group_shutdown_delay(self) -> None:
        """Nomad's group shutdown_delay: the group's services are gone, its
        tasks keep running this long (not with no_shutdown_delay)."""
        tg = structs.task_group(self.job, self.alloc.task_group)
        delay = tg.shutdown_delay / 1e9 if tg is not None else 0.0
        if not delay or self.alloc.desired_transition.no_shutdown_delay or self.done:
            return
        deadline = time.monotonic() + delay
        while not self.done and time.monotonic() < deadline:
            await asyncio.sleep(min(0.05, max(0.0, deadline - time.monotonic())))

    @property
    def namespace(self) -> str:
        return self.alloc.namespace or structs.DEFAULT_NAMESPACE

    def task_names(self) -> list[str]:
        return [t.task.name for t in self.tasks]

    def sample_usage(self) -> None:
        """Read every running task's resources (the agent's stats loop)."""
        for t in self.tasks:
            t.sample_usage()

    def usage(self, task: str = "") -> pb.AllocResourceUsage:
        """The latest readings of the running tasks (of `task` only when
        named), summed as Nomad's AllocResourceUsage; a task not read yet
        is read now."""
        readings: dict[str, pb.TaskResourceUsage] = {}
        for t in self.tasks:
            if task and t.task.name != task:
                continue
            latest = t.stats.latest if t.stats is not None else None
            latest = latest or t.sample_usage()
            if latest is not None:
                readings[t.task.name] = latest
        return alloc_usage(readings)

    @property
    def done(self) -> bool:
        return bool(self.error) or all(t.state.state == TaskStateName.DEAD for t in self.tasks)

    def client_status(self) -> tuple[str, str]:
        """Nomad's getClientStatus over the task states."""
        if self.error:
            return ClientStatus.FAILED, self.error
        states = [t.state for t in self.tasks]
        if any(s.state == TaskStateName.RUNNING for s in states):
            if all(s.state == TaskStateName.RUNNING for s in states):
                return ClientStatus.RUNNING, "Tasks are running"
            return ClientStatus.RUNNING, "Some tasks are running"
        if states and all(s.state == TaskStateName.DEAD for s in states):
            if any(s.failed for s in states):
                return ClientStatus.FAILED, "Failed tasks"
            return ClientStatus.COMPLETE, "All tasks have completed"
        return ClientStatus.PENDING, "No tasks have started"

    def update(self) -> pb.Allocation:
        status, description = self.client_status()
        out = pb.Allocation(
            id=self.alloc.id,
            node_id=self.alloc.node_id,
            client_status=status,
            client_description=description,
        )
        for t in self.tasks:
            out.task_states[t.task.name].CopyFrom(t.state)
        self.health.report(out)
        return out
