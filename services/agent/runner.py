"""Running an alloc's tasks on the client (Nomad's allocrunner and
taskrunner): task lifecycle order, restart policy, kills (leader first,
sidecars last, then poststop tasks), shutdown delays and kill timeouts,
signals and restarts asked for, the task events, and the alloc's client
status derived from its task states. Everything a task runner decides is
written to the client state (services/agent/state_db.py) before it acts,
so that a restarted agent rebuilds the runners and adopts the runs still
going (`AllocRunner.restore`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

from opentelemetry import trace

from corral.domain import services, structs
from corral.domain.dispatch import payload_file_problem
from corral.domain.errors import ConfigError, InvalidArgument, NotFound
from corral.domain.jobspec.duration import format_duration
from corral.domain.lifecycle import DEFAULT_LOG_MAX_FILE_SIZE_MB, DEFAULT_LOG_MAX_FILES
from corral.domain.structs import ClientStatus, DesiredStatus, TaskStateName, copy_msg
from corral.domain.template import block as template_block
from corral.runtime import telemetry
from corral.security import transport
from corral.v1 import structs_pb2 as pb
from services.agent import metrics, taskenv, volume_hook
from services.agent.alloc_services import AllocServices
from services.agent.allocdir import (
    CHROOT_ALLOC_DIR,
    CHROOT_LOCAL_DIR,
    CHROOT_SECRETS_DIR,
    AllocDir,
)
from services.agent.artifacts import ArtifactError, Getter, artifact_key
from services.agent.checks import Checker
from services.agent.cpuset import Compute
from services.agent.drivers.base import (
    Driver,
    DriverError,
    ExitResult,
    TaskConfig,
    TaskHandle,
    TaskResources,
    parse_signal,
    task_config,
)
from services.agent.drivers.exec import DEFAULT_USER as EXEC_DEFAULT_USER
from services.agent.health import HealthWatch
from services.agent.identity import IdentityError, Signer, TaskIdentities
from services.agent.lifecycle import Coordinator, Stage, is_sidecar, stage_of
from services.agent.restarts import (
    KILLED,
    NOT_RESTARTING,
    RESTARTING,
    RestartTracker,
    restarting_message,
    restarts_on_success,
)
from services.agent.service_sync import ServiceSync
from services.agent.state_db import StateDB, StoredAlloc, StoredTask
from services.agent.stats import TaskStats, alloc_usage
from services.agent.task_api import TaskAPI, TaskSocket, socket_env
from services.agent.template_data import TemplateClient
from services.agent.template_hook import (
    TaskNotRunning as TaskNotRunning,  # the handlers' and tests' name for it
)
from services.agent.template_hook import (
    TaskPaths,
    TemplateFailed,
    TemplateHook,
    TemplateHookError,
    TemplateManager,
    client_variables,
)

#: drivers whose tasks see their directories at the root of their own file
#: system (Nomad's chroot file system isolation)
CHROOT_DRIVERS = ("exec",)
#: Nomad's default kill_timeout and the client's max_kill_timeout
DEFAULT_KILL_TIMEOUT = 5.0
DEFAULT_MAX_KILL_TIMEOUT = 30.0
#: task events kept per task (Nomad keeps 10)
MAX_EVENTS = 10

log = logging.getLogger(__name__)
tracer = telemetry.tracer("corral.agent")


async def _first(*waits: Awaitable[Any]) -> int:
    """Index of the first of `waits` to finish; the others are cancelled."""
    tasks = [asyncio.ensure_future(w) for w in waits]
    try:
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        return next(i for i, t in enumerate(tasks) if t in done)
    finally:
        for t in tasks:
            if not t.done():
                t.cancel()
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t


class TaskRunner:
    """One task of an alloc: its run loop (Nomad's TaskRunner.Run) from the
    start condition through restarts to dead, and then, until the alloc is
    done, waiting in case the whole alloc is restarted."""

    def __init__(
        self,
        ar: AllocRunner,
        task: pb.Task,
        driver: Driver,
        *,
        state_dir: Path,
        stored: StoredTask | None = None,
    ) -> None:
        """`state_dir` is where the task's executor keeps its files;
        `stored` the task's client state after an agent restart."""
        self.ar = ar
        self.task = task
        self.driver = driver
        self.task_dir = ar.alloc_dir.task(task.name)
        self.dir = self.task_dir.dir
        self.state_dir = state_dir
        self.state = pb.TaskState(state=TaskStateName.PENDING)
        #: what only the client keeps: the run's handle state, the restart
        #: counters, whether the run loop finished (Nomad's LocalState)
        self.local: dict[str, Any] = {}
        self.stage = stage_of(task)
        #: the environment of the current run (its workload identities'
        #: tokens and its templates' variables included), for alloc exec
        self.started_env: taskenv.TaskEnv | None = None
        #: the task's workload identities, when it exposes any; their files
        #: belong to the user the task runs as
        owner = task.user or (EXEC_DEFAULT_USER if task.driver == "exec" else "")
        self.identities = (
            TaskIdentities(ar.sign, ar.alloc.id, task, self.dir, owner=owner)
            if ar.sign is not None
            else None
        )
        self.owner = owner
        self._api_socket: TaskSocket | None = None
        #: an adopted task's hooks running again (see _adopted_hooks)
        self._adopting: asyncio.Task[None] | None = None
        self._renewing: asyncio.Task[None] | None = None
        #: a restart under way (one at a time: check_restart asks again and again)
        self._restarting = False
        self.compute = Compute(ar.node.node_resources.cpu, ar.node.node_resources.total_cores)
        self._handle: TaskHandle | None = None
        #: how a run recovered after a restart ended while the agent was away
        self._recovered_exit: ExitResult | None = None
        #: the current run's resource readings (None when not running)
        self.stats: TaskStats | None = None
        self._ran = False
        self._kill = asyncio.Event()  # Nomad's killCtx
        self._restart = asyncio.Event()  # Nomad's restartCh (a dead task runs again)
        self.done = asyncio.Event()  # Nomad's waitCh
        self.started = asyncio.Event()  # the first start attempt returned (or never will)
        tg = structs.task_group(ar.job, ar.alloc.task_group)
        policy = (
            task.restart_policy
            if task.HasField("restart_policy")
            else (tg.restart_policy if tg else pb.RestartPolicy())
        )
        lifecycle = task.lifecycle if task.HasField("lifecycle") else None
        self.restarts = RestartTracker(policy, restarts_on_success(ar.job.type, lifecycle))
        if stored is not None:
            if stored.state is not None:
                self.state.CopyFrom(stored.state)
            self.local = dict(stored.local)
            self.restarts.load(self.local.get("restarts") or {})
        #: Nomad's template hook (None without template blocks)
        self.templates = (
            TemplateHook(self._template_manager, render_on_restart=policy.render_templates)
            if task.templates
            else None
        )

    # ---------------------------------------------------------------- identity

    @property
    def alloc(self) -> pb.Allocation:
        return self.ar.alloc

    @property
    def job(self) -> pb.Job:
        return self.ar.job

    @property
    def name(self) -> str:
        return self.task.name

    @property
    def is_leader(self) -> bool:
        return self.task.leader

    @property
    def is_poststop(self) -> bool:
        return self.stage is Stage.POSTSTOP

    @property
    def is_sidecar(self) -> bool:
        return is_sidecar(self.task)

    @property
    def running(self) -> bool:
        return self._handle is not None

    @property
    def handle(self) -> TaskHandle | None:
        """The current run's (None between runs)."""
        return self._handle

    def kill_timeout(self) -> float:
        """The task's kill_timeout, at most the client's max_kill_timeout."""
        asked = self.task.kill_timeout / 1e9 if self.task.kill_timeout else DEFAULT_KILL_TIMEOUT
        return min(asked, self.ar.max_kill_timeout)

    def kill_signal(self) -> int:
        """The task's kill_signal (SIGTERM by default, and for a name this
        node does not know, as Nomad's executor falls back)."""
        try:
            return parse_signal(self.task.kill_signal or "SIGTERM")
        except ValueError:
            return parse_signal("SIGTERM")

    # ---------------------------------------------------------------- state

    def _persist_state(self) -> None:
        if self.ar.db is not None:
            self.ar.db.put_task_state(self.alloc.id, self.name, self.state)

    def _persist_local(self) -> None:
        if self.ar.db is not None:
            self.local["restarts"] = self.restarts.dump()
            self.ar.db.put_task_local(self.alloc.id, self.name, self.local)

    def event(
        self,
        kind: str,
        display: str = "",
        details: dict[str, str] | None = None,
        *,
        at: int = 0,
        **fields: Any,
    ) -> None:
        """Append a task event (Nomad's EmitEvent: the last ten are kept; a
        failing event fails the task; a Restarting one counts a restart),
        write it to the client state and tell the alloc runner."""
        when = at or time.time_ns()
        event = self.state.events.add(type=kind, time=when, display_message=display, **fields)
        event.details.update(details or {})
        del self.state.events[:-MAX_EVENTS]
        if event.fails_task:
            self.state.failed = True
        if kind == RESTARTING:
            self.state.restarts += 1
            self.state.last_restart = when
            metrics.TASK_RESTARTS.labels(self.task.driver).inc()
        self._persist_state()
        self.ar.task_state_updated()

    def set_state(self, state: str, *, at: int = 0) -> None:
        """Move to pending, running or dead (Nomad's UpdateState)."""
        old, self.state.state = self.state.state, state
        if state == TaskStateName.RUNNING and old != TaskStateName.RUNNING:
            self.state.started_at = at or time.time_ns()
        if state == TaskStateName.DEAD and not self.state.finished_at:
            self.state.finished_at = at or time.time_ns()
        self._persist_state()
        self.ar.task_state_updated()

    # ---------------------------------------------------------------- the run

    def resources(self) -> pb.Resources:
        """What the scheduler allocated to this task (its memory_max_mb is
        set only where memory oversubscription is enabled); the task's ask
        for an alloc placed without per-task resources."""
        if self.name in self.alloc.task_resources:
            return self.alloc.task_resources[self.name]
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
            self.ar.node,
            dirs=dirs,
            home=str(self.dir),
            resources=self.resources(),
            region=transport.current().region,
        )

    def group(self) -> pb.TaskGroup:
        return structs.task_group(self.job, self.alloc.task_group) or pb.TaskGroup()

    def task_config(self, env: taskenv.TaskEnv) -> TaskConfig:
        r = self.resources()
        logs = self.task.log_config
        mounts = volume_hook.mounts(self.alloc, self.group(), self.task, self.ar.node, env)
        return TaskConfig(
            alloc_id=self.alloc.id,
            name=self.name,
            driver_config=env.config(task_config(self.task)),
            env=env.env,
            task_dir=self.task_dir,
            state_dir=self.state_dir,
            resources=TaskResources(
                cpu_mhz=r.cpu, cores=r.cores, memory_mb=r.memory_mb, memory_max_mb=r.memory_max_mb
            ),
            user=self.task.user,
            log_max_files=logs.max_files or DEFAULT_LOG_MAX_FILES,
            log_max_file_size_mb=logs.max_file_size_mb or DEFAULT_LOG_MAX_FILE_SIZE_MB,
            logs_disabled=logs.disabled,
            mounts=mounts,
        )

    async def fetch_artifacts(self, env: taskenv.TaskEnv) -> None:
        """Nomad's artifact hook, before every start until each artifact was
        fetched once ("Downloading Artifacts"; the ones fetched are kept in
        the client state, so an adopted task's restart does not fetch them
        again); ArtifactError when one fails."""
        fetched = set(self.local.get("artifacts_fetched") or [])
        if all(artifact_key(a) in fetched for a in self.task.artifacts):
            return
        self.event("Downloading Artifacts", "Client is downloading artifacts")
        try:
            await self.ar.getter.fetch_all(
                list(self.task.artifacts),
                env,
                self.task_dir,
                user=self.owner,
                staging=self.state_dir / "artifacts",
                done=fetched,
            )
        finally:
            self.local["artifacts_fetched"] = sorted(fetched)
            self._persist_local()

    # ---------------------------------------------------------------- templates

    def _template_manager(self) -> TemplateManager:
        if self.ar.template_client is None or self.identities is None:
            raise TemplateHookError("this agent has no connection to read templates with")
        identities = self.identities
        env = self.task_env()
        return TemplateManager(
            self.task.templates,
            data=self.ar.template_client.data(identities.default_token),
            lifecycle=self,
            env=lambda: self.task_env().env,
            paths=TaskPaths(
                alloc_dir=str(self.ar.alloc_dir.dir),
                task_dir=str(self.dir),
                shared_dir=str(self.ar.alloc_dir.shared),
                variables=client_variables(env.variables, self.task_dir),
            ),
            namespace=self.alloc.namespace or structs.DEFAULT_NAMESPACE,
        )

    async def _prestart_templates(self) -> dict[str, str] | None:
        """The template hook's prestart, given up when the task is killed
        meanwhile (None)."""
        assert self.templates is not None
        render = asyncio.ensure_future(self.templates.prestart())
        killed = asyncio.ensure_future(self._kill.wait())
        try:
            await asyncio.wait({render, killed}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            killed.cancel()
        if not render.done():
            render.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await render
            return None
        return render.result()

    # the template manager's view of its task (template_hook.TaskLifecycle)

    def emit(self, kind: str, display: str, *, fails_task: bool = False) -> None:
        self.event(kind, display, fails_task=fails_task)

    def is_running(self) -> bool:
        return self._handle is not None and self.state.state == TaskStateName.RUNNING

    async def restart_task(self, reason: str) -> None:
        """A restart that is not a failure (a template changed): the task
        stops and starts again at once, its restart policy untouched."""
        if self._kill.is_set() or not self.is_running():
            return
        with contextlib.suppress(TaskNotRunning):
            await self.restart(reason)

    async def signal_task(self, name: str) -> None:
        handle = self._handle
        if handle is None or not self.is_running():
            raise TaskNotRunning(f"task {self.name!r} is not running")
        number = template_block.signal_number(name)
        if number is None:  # refused when the job was submitted
            raise ValueError(f"unknown signal {name!r}")
        self.event("Signaling", "Template re-rendered", {"signal": name}, task_signal=name)
        await handle.signal(number)

    async def kill_task(self, display: str) -> None:
        """Fail the task for good (Nomad's Kill with a failing Killing
        event); the run loop ends it (and the alloc runner the others)."""
        if self._kill.is_set():
            return
        self.event("Killing", display, fails_task=True)
        self._kill.set()

    async def exec_in_task(self, command: Sequence[str], timeout: float) -> int:
        raise DriverError(f"the {self.task.driver} driver cannot run commands in its tasks")

    async def _open_task_api(self, env: taskenv.TaskEnv) -> None:
        """Nomad's api hook: the socket once per task (a failure is only
        logged, as Nomad's: a task that needs it fails on its own), and
        NOMAD_UNIX_ADDR where the task has its identity in its environment."""
        if self.ar.task_api is None:
            return
        if self._api_socket is None:
            try:
                self._api_socket = await self.ar.task_api.open(self.task_dir.secrets, self.owner)
            except (OSError, ConfigError) as exc:
                log.warning("task %s: no Task API socket: %s", self.task.name, exc)
                return
        if self.identities is not None and any(w.env for w in self.identities.wanted):
            env.env.update(socket_env(env.env["NOMAD_SECRETS_DIR"]))

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

    async def restore(self) -> None:
        """After an agent restart, before `run`: find the run the stored
        handle names (Nomad's Restore and RecoverTask). A run still going
        is adopted; one that ended meanwhile is processed as its exit;
        nothing found means nothing was started, and the task starts as
        its state says."""
        recorded = self.local.get("handle") or self.local.get("launching")
        if not recorded:
            return
        try:
            found = await self.driver.recover(dict(recorded.get("state") or {}))
        except Exception:
            log.exception("recovering task %s of alloc %s", self.name, self.alloc.id)
            found = None
        if isinstance(found, ExitResult):
            self._recovered_exit = found
        elif found is not None:
            self._handle = found
            self.stats = TaskStats(self.compute)
            self.local.pop("launching", None)
            self.local["handle"] = {"driver": self.driver.name, "state": found.state}
            log.info("reattached task %s of alloc %s (pid %d)", self.name, self.alloc.id, found.pid)
        else:
            self.local.pop("handle", None)
            self.local.pop("launching", None)
            if self.state.state == TaskStateName.RUNNING:
                self.state.state = TaskStateName.PENDING
        self._persist_local()

    async def run(self) -> None:
        self._ran = True
        try:
            await self._run()
        except Exception:
            log.exception("task runner %s of alloc %s", self.name, self.alloc.id)
            raise
        finally:
            self.started.set()
            if self._renewing is not None:
                self._renewing.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await self._renewing
            if self._adopting is not None:
                self._adopting.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await self._adopting
            if self.templates is not None:
                await self.templates.stop()
            if self._api_socket is not None:
                await self._api_socket.close()
                self._api_socket = None
            self.done.set()

    @property
    def services(self) -> AllocServices | None:
        return self.ar.services

    def _renew_identities(self, *, adopted: bool = False) -> None:
        """Keep the TTL identities fresh while the task runs (an adopted
        task's are signed again first: their expiry was not kept)."""
        if self.identities is None or not self.identities.wanted or self._renewing is not None:
            return
        identities = self.identities

        async def renew() -> None:
            if adopted:
                try:
                    await identities.refresh()
                except IdentityError as exc:
                    log.warning("re-signing the identities of task %s: %s", self.name, exc)
            await identities.renew()

        self._renewing = asyncio.create_task(renew(), name=f"identities-{self.name}")

    async def _run(self) -> None:
        dead = (
            self.state.state == TaskStateName.DEAD
            and self._handle is None
            and self._recovered_exit is None
        )
        if dead:
            self.ar.task_state_updated()
            if self.local.get("run_complete"):
                return
        elif not self.state.events:
            self.event("Received", "Task received by client")
        while True:
            if not dead:
                await self._main()
                self.set_state(TaskStateName.DEAD)
            if self.is_poststop:
                break  # a poststop task never runs again
            # the alloc may be restarted as a whole while it is not done:
            # wait for that, or for the kill that ends this runner
            if await _first(self._kill.wait(), self._restart.wait()) == 0:
                break
            self._restart.clear()
            if self.restarts.decide().kind != RESTARTING:
                continue
            dead = False
            self.state.finished_at = 0
            self.set_state(TaskStateName.PENDING)
        self.local["run_complete"] = True
        self._persist_local()

    def _adopted_hooks(self) -> None:
        """An adopted task's Task API socket is listened on again (the last
        agent's went with it) and its templates are rendered again and
        watched (Nomad runs these hooks on restore), in the background: its
        run is watched meanwhile. What they render the first time changes
        nothing in the running task (its files only)."""
        if self._adopting is not None:
            return

        async def hooks() -> None:
            await self._open_task_api(self.task_env())
            if self.templates is None:
                return
            try:
                await self._prestart_templates()
            except (TemplateFailed, TemplateHookError) as exc:
                log.warning("templates of adopted task %s: %s", self.name, exc)

        self._adopting = asyncio.create_task(hooks(), name=f"adopted-{self.name}")

    def _should_stop(self) -> bool:
        """The alloc is over for this task (Nomad's shouldShutdown): a
        poststop task still runs after the servers stopped the alloc."""
        return not self.is_poststop and self.alloc.desired_status != DesiredStatus.RUN

    async def _main(self) -> None:
        """Start, wait, decide on a restart, until the task stays dead
        (Nomad's MAIN loop)."""
        while True:
            result, self._recovered_exit = self._recovered_exit, None
            if result is None and self._handle is None:
                if self._kill.is_set() or self._should_stop():
                    return
                if await _first(self.ar.coordinator.wait(self.task), self._kill.wait()) == 1:
                    return
                if not self._setup():
                    return
                if self._kill.is_set() or self._should_stop():
                    return
                if not await self._start():
                    if await self._after(self.restarts.decide()):
                        continue
                    return
            elif self._handle is not None:
                # adopted after an agent restart: no Started event, its
                # services wanted again by this agent
                if self.state.state != TaskStateName.RUNNING:
                    self.set_state(TaskStateName.RUNNING)
                if self.services is not None:
                    self.services.task_started(self.name)
                self._renew_identities(adopted=True)
                self._adopted_hooks()
            self.started.set()
            if result is None:
                result = await self._wait()
            self._terminated(result)
            self.restarts.exited(result)
            if not await self._after(self.restarts.decide()):
                return

    def _setup(self) -> bool:
        """The task directory and the dispatch payload (Nomad's task dir and
        dispatch hooks: their event once per task); a failure fails the
        task for good."""
        if not self.local.get("setup_done"):
            self.event("Task Setup", "Building Task Directory", message="Building Task Directory")
        try:
            self.ar.alloc_dir.build()
            self.task_dir.build()
            self.write_payload()
            volume_hook.check(
                self.alloc, self.group(), self.task, self.ar.node, self.driver.capabilities
            )
        except volume_hook.VolumeError as exc:
            self.event("Setup Failure", str(exc), fails_task=True)
            return False
        except (OSError, ValueError) as exc:
            self.event("Setup Failure", f"failed to set up the task: {exc}", fails_task=True)
            return False
        if not self.local.get("setup_done"):
            self.local["setup_done"] = True
            self._persist_local()
        return True

    async def _start(self) -> bool:
        """One start through the driver, its intent and then its handle
        written to the client state first (Nomad's runDriver)."""
        self.local.pop("handle", None)
        self.local["launching"] = {
            "driver": self.driver.name,
            "state": {"state_dir": str(self.state_dir)},
        }
        self._persist_local()
        try:
            env = self.task_env()
            if self.identities is not None and self.identities.wanted:
                env.env.update(await self.identities.setup())
                self._renew_identities()
            await self.fetch_artifacts(env)  # before templates, as Nomad's hooks
            await self._open_task_api(env)
            if self.templates is not None:
                rendered = await self._prestart_templates()
                if rendered is None:  # killed while its templates waited
                    self.local.pop("launching", None)
                    self._persist_local()
                    self.restarts.killed()
                    return False
                env.env.update(rendered)  # template env overrides the task's, as Nomad's
            self.started_env = env  # what alloc exec runs commands with
            with tracer.start_as_current_span("agent.start_task") as span:
                span.set_attribute("task", self.name)
                span.set_attribute("driver", self.task.driver)
                handle = await self.driver.start(self.task_config(env))
        except TemplateFailed as exc:
            self.started.set()
            self.local.pop("launching", None)
            self._persist_local()
            await self.kill_task(str(exc))
            self.restarts.killed()
            return False
        except ArtifactError as exc:
            # Nomad's recoverable error: a failed start for the restart policy
            self.started.set()
            self.local.pop("launching", None)
            self._persist_local()
            self.event("Failed Artifact Download", str(exc), download_error=str(exc))
            self.restarts.start_failed(str(exc))
            return False
        except TemplateHookError as exc:
            # Nomad's failed prestart hook: recoverable, the restart policy decides
            self.started.set()
            self.local.pop("launching", None)
            self._persist_local()
            self.event("Task hook failed", f"template: {exc}")
            self.restarts.start_failed(str(exc))
            return False
        except IdentityError as exc:
            self.started.set()
            self.local.pop("launching", None)
            self._persist_local()
            self.event("Setup Failure", f"workload identity: {exc}", fails_task=True)
            self.restarts.start_failed(str(exc))
            return False
        except Exception as exc:
            self.started.set()
            if not isinstance(exc, DriverError | OSError | ValueError):
                log.exception("starting task %s of alloc %s", self.name, self.alloc.id)
            self.local.pop("launching", None)
            self._persist_local()
            self.event("Driver Failure", str(exc), fails_task=True)
            metrics.DRIVER_ERRORS.labels(self.task.driver).inc()
            self.restarts.start_failed(str(exc))
            return False
        self._handle = handle
        self.local.pop("launching", None)
        self.local["handle"] = {"driver": self.driver.name, "state": handle.state}
        self._persist_local()
        metrics.TASK_STARTS.labels(self.task.driver).inc()
        self.stats = TaskStats(self.compute)
        self.set_state(TaskStateName.RUNNING)
        self.event("Started", "Task started by client")
        if self.services is not None:
            self.services.task_started(self.name)
        first_scripts = self.templates.poststart() if self.templates is not None else None
        if first_scripts is not None:
            asyncio.ensure_future(first_scripts)
        return True

    async def _wait(self) -> ExitResult:
        """Until the run ends, or ends because it was killed."""
        handle = self._handle
        assert handle is not None
        exited = asyncio.ensure_future(handle.wait())
        killed = asyncio.ensure_future(self._kill.wait())
        try:
            await asyncio.wait({exited, killed}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            killed.cancel()
        if not exited.done():
            exited.cancel()
            return await self._handle_kill()
        await self._release()
        return exited.result()

    async def _release(self) -> None:
        if self.services is not None:
            self.services.task_stopped(self.name)
        handle, self._handle = self._handle, None
        self.stats = None
        if handle is not None:
            await handle.destroy()
        self.local.pop("handle", None)
        self._persist_local()

    async def _handle_kill(self) -> ExitResult:
        """Nomad's handleKill: the task's services go, the task's
        shutdown_delay passes (unless the alloc was stopped without it or
        the task exits first), then the kill signal and, after the kill
        timeout, SIGKILL."""
        handle = self._handle
        assert handle is not None
        exited = asyncio.ensure_future(handle.wait())
        if self.services is not None:
            self.services.task_stopped(self.name)  # Nomad's preKill: the services go first
        delay = self.task.shutdown_delay / 1e9
        if delay:
            text = format_duration(self.task.shutdown_delay)
            if self.ar.no_shutdown_delay.is_set():
                self.event(
                    "Skipping shutdown delay",
                    f"Skipping shutdown_delay of {text} before killing the task.",
                )
            else:
                self.set_state(TaskStateName.PENDING)
                self.event(
                    "Waiting for shutdown delay",
                    f"Waiting for shutdown_delay of {text} before killing the task.",
                )
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(
                        _first(asyncio.shield(exited), self.ar.no_shutdown_delay.wait()), delay
                    )
        self.restarts.killed()
        if not exited.done():
            await handle.stop(self.kill_signal(), self.kill_timeout())
        result = await exited
        await self._release()
        return result

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
                self.name,
            ).inc()
        self.event(
            "Terminated",
            ", ".join(parts),
            {"oom_killed": str(result.oom_killed).lower()},
            at=result.finished_at,
            message=message,
            exit_code=result.exit_code,
            signal=result.signal,
        )

    async def _after(self, decision: Any) -> bool:
        """Act on the restart tracker's decision (Nomad's shouldRestart and
        the restart delay); True when the task runs again."""
        if decision.kind == KILLED:
            self.event(KILLED, "Task successfully killed")
            return False
        if decision.kind == NOT_RESTARTING:
            self.event(
                NOT_RESTARTING,
                decision.reason or "Task exceeded restart policy",
                {"restart_reason": decision.reason},
                restart_reason=decision.reason,
                fails_task=True,
            )
            return False
        if decision.kind != RESTARTING:
            return False  # terminated: done for good
        self._persist_local()
        self.set_state(TaskStateName.PENDING)
        self.event(
            RESTARTING,
            restarting_message(decision),
            {"restart_reason": decision.reason} if decision.reason else {},
            restart_reason=decision.reason,
            restart_reason_delay=int(decision.delay * 1e9),
        )
        if decision.delay > 0:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._kill.wait(), decision.delay)
        return not self._kill.is_set()

    # ---------------------------------------------------------------- asked from outside

    async def kill(self, event: tuple[str, str, dict[str, Any]] | None = None) -> None:
        """Stop the task for good and wait for its runner to end (Nomad's
        Kill): `event` (type, display, fields) is recorded first unless the
        task already finished."""
        if event is not None and not self.state.finished_at:
            kind, display, fields = event
            self.event(kind, display, **fields)
        self._kill.set()
        if self._ran:
            await self.done.wait()

    def killing_event(self) -> tuple[str, str, dict[str, Any]]:
        """Nomad's Killing event with the kill timeout it will wait."""
        timeout = self.kill_timeout()
        text = format_duration(int(timeout * 1e9))
        return (
            "Killing",
            f"Sent interrupt. Waiting {text} before force killing",
            {"kill_timeout": int(timeout * 1e9), "details": {"kill_timeout": text}},
        )

    async def signal(self, sig: int, name: str) -> None:
        handle = self._handle
        if handle is None:
            raise TaskNotRunning(f"task {self.name!r} is not running")
        self.event(
            "Signaling",
            f"Task being sent signal {name}",
            {"signal": name},
            task_signal=name,
        )
        await handle.signal(sig)

    async def restart(self, reason: str, *, failure: bool = False, force: bool = False) -> None:
        """Restart the running task (Nomad's Restart), or with `force` a
        dead one whose runner still waits (ForceRestart, for restarting a
        whole alloc). A restart asked for by a person (`failure` False)
        does not count against the restart policy. Returns once the old
        run ended."""
        dead = self.state.state == TaskStateName.DEAD
        if self.state.state == TaskStateName.PENDING or (
            dead and (not force or self.done.is_set())
        ):
            raise TaskNotRunning(f"task {self.name!r} is not running")
        if self._restarting:
            return  # one restart at a time
        self.event("Restart Signaled", reason, {"restart_reason": reason}, restart_reason=reason)
        self.restarts.restart_asked(failure=failure)
        if dead:
            self._restart.set()
            return
        handle = self._handle
        if handle is None:
            return
        self._restarting = True
        try:
            if self.services is not None:
                self.services.task_stopped(self.name)  # Nomad's preKill
            await handle.stop(self.kill_signal(), self.kill_timeout())
            await handle.wait()
        finally:
            self._restarting = False

    # ---------------------------------------------------------------- resource usage

    def sample_usage(self) -> pb.TaskResourceUsage | None:
        """A fresh reading of the running task's resources (None when it is
        not running or cannot be measured)."""
        handle, stats = self._handle, self.stats
        if handle is None or stats is None or self.state.state != TaskStateName.RUNNING:
            return None
        usage = handle.usage()
        return stats.sample(usage) if usage is not None else None


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
        db: StateDB | None = None,
        max_kill_timeout: float = DEFAULT_MAX_KILL_TIMEOUT,
        stored: StoredAlloc | None = None,
        sign: Signer | None = None,
        sync: ServiceSync | None = None,
        checker: Checker | None = None,
        templates: TemplateClient | None = None,
        task_api: TaskAPI | None = None,
        getter: Getter | None = None,
    ) -> None:
        """`node` is the client's own node: its attributes and meta resolve
        `${node.*}`, `${attr.*}` and `${meta.*}` in the tasks' specs. `db`
        is the client state every change is written to; `stored` what it
        held for this alloc when the agent restarted. `sign` gets the
        tasks' workload identities from the state; `sync` and `checker`
        are the agent's: with them the group's Nomad-provider services are
        registered and checked. `templates` and `task_api` are the agent's
        too (the tasks' templates and Task API sockets), and `getter` (what
        fetches the tasks' artifacts)."""
        self.alloc = alloc
        self.job = job
        self.node = node if node is not None else pb.Node(id=alloc.node_id)
        self.db = db
        self.max_kill_timeout = max_kill_timeout
        self.sign = sign
        #: the tasks' templates read the cluster through this; `task_api`
        #: serves their Task API sockets
        self.template_client = templates
        self.task_api = task_api
        self.getter = getter or Getter()
        self.alloc_dir = AllocDir.of(data_dir, alloc.id)
        self.dir = self.alloc_dir.dir
        self.on_change = on_change
        self.tasks: list[TaskRunner] = []
        self.error = ""
        #: set when the servers stop the alloc with no_shutdown_delay
        self.no_shutdown_delay = asyncio.Event()
        if alloc.desired_transition.no_shutdown_delay:
            self.no_shutdown_delay.set()
        tg = structs.task_group(job, alloc.task_group)
        self.services: AllocServices | None = None
        if tg is not None and sync and checker and services.group_services(tg):
            self.services = AllocServices(
                lambda: self.alloc,
                lambda: self.job,
                self.node,
                sync,
                checker,
                self._env_of,
                self.check_restart,
            )
        self.health = HealthWatch(
            lambda: self.alloc,
            lambda: self.job,
            lambda: [t.state for t in self.tasks],
            self._health_changed,
            checks=self._check_results,
        )
        if stored is not None and stored.health.get("deployment_id"):
            self.health.deployment_id = str(stored.health["deployment_id"])
            healthy = stored.health.get("healthy")
            self.health.healthy = healthy if isinstance(healthy, bool) else None
            self.health.timestamp = int(stored.health.get("timestamp") or 0)
        self._health_task: asyncio.Task[None] | None = None
        self._task: asyncio.Task[None] | None = None
        self._states_changed = asyncio.Event()
        self._killing: asyncio.Task[None] | None = None
        self._stopping = False
        self._detached = False
        if tg is None:
            self.error = (
                f"task group {alloc.task_group!r} not in job {job.id} version {job.version}"
            )
            self.coordinator = Coordinator([])
            return
        for task in tg.tasks:
            driver = drivers.get(task.driver)
            if driver is None:
                self.error = f"driver {task.driver!r} is not available on this node"
                break
            self.tasks.append(
                TaskRunner(
                    self,
                    task,
                    driver,
                    state_dir=data_dir / "executor" / f"{alloc.id}.{task.name}",
                    stored=stored.tasks.get(task.name) if stored is not None else None,
                )
            )
        self.coordinator = Coordinator([t.task for t in self.tasks])

    # ---------------------------------------------------------------- identity

    @property
    def namespace(self) -> str:
        return self.alloc.namespace or structs.DEFAULT_NAMESPACE

    def task_names(self) -> list[str]:
        return [t.name for t in self.tasks]

    def kept_dirs(self) -> list[Path]:
        """What the node keeps for this alloc on disk: its directory and
        each task's executor state (handle, executor log, artifact
        staging). Destroying the alloc removes them (services/agent/gc.py)."""
        return [self.alloc_dir.dir, *(t.state_dir for t in self.tasks)]

    def task(self, name: str) -> TaskRunner | None:
        return next((t for t in self.tasks if t.name == name), None)

    def logs_disabled(self, task: str) -> bool:
        runner = self.task(task)
        return runner is not None and runner.task.log_config.disabled

    @property
    def job_id(self) -> str:
        return self.alloc.job_id

    def exec_target(self, task: str) -> tuple[Driver, TaskHandle, TaskConfig]:
        """What `alloc exec` runs a command with: the task's driver, its
        running handle and its config (Nomad's checks and codes: an unknown
        task is a bad request, one not started or not running not found).
        A task adopted after an agent restart has no started environment
        kept: its command gets the task's environment built again."""
        runner = self.task(task)
        if runner is None:
            raise InvalidArgument("task", f"unknown task name {task!r}")
        if not runner.state.started_at:
            raise NotFound(f"task {task!r} not started yet.")
        handle = runner.handle
        if handle is None or runner.state.state != TaskStateName.RUNNING:
            raise NotFound(f"task {task!r} is not running.")
        return runner.driver, handle, runner.task_config(runner.started_env or runner.task_env())

    def task_spec(self, task: str) -> pb.Task | None:
        runner = self.task(task)
        return runner.task if runner is not None else None

    # ---------------------------------------------------------------- services

    def _env_of(self, task: str) -> taskenv.TaskEnv:
        """A task's environment, or the alloc's ("": no task of its own,
        what group services and checks are interpolated with)."""
        runner = self.task(task) if task else None
        if runner is not None:
            return runner.task_env()
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

    def check_restart(self, task: str, reason: str) -> None:
        """check_restart: restart one task ("": every task of the alloc)
        counted as a failure by its restart policy (Nomad's Restart with
        failure true)."""

        async def one(t: TaskRunner) -> None:
            with contextlib.suppress(TaskNotRunning):
                await t.restart(reason, failure=True)

        for t in self.tasks:
            if (not task or t.name == task) and t.state.state == TaskStateName.RUNNING:
                asyncio.get_running_loop().create_task(one(t), name=f"check-restart-{t.name}")

    # ---------------------------------------------------------------- starting

    async def restore(self) -> None:
        """After an agent restart, before `start`: adopt the runs still
        going, and put the lifecycle coordinator where the task states say
        (Nomad's AllocRunner.Restore)."""
        await asyncio.gather(*(t.restore() for t in self.tasks))
        self.coordinator.restore({t.name: t.state for t in self.tasks})

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
        watcher = asyncio.create_task(
            self._watch_states(), name=f"alloc-states-{self.alloc.id[:8]}"
        )
        try:
            await self._run_tasks()
        finally:
            self._states_changed.set()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher
            if self.services is not None:
                if self._detached:
                    await self.services.halt()  # registered still: the next agent has them
                else:
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

    # ---------------------------------------------------------------- task states

    def task_state_updated(self) -> None:
        """A task's state or events changed (Nomad's TaskStateUpdated): the
        watcher looks at all of them, outside the caller."""
        self._states_changed.set()

    async def _watch_states(self) -> None:
        """Nomad's handleTaskStateUpdates: kill the live tasks when a task
        failed, the leader died or only sidecars are left; release the
        dead ones from waiting for an alloc restart once nothing lives;
        move the lifecycle coordinator; report."""
        while True:
            await self._states_changed.wait()
            self._states_changed.clear()
            done = all(t.done.is_set() for t in self.tasks)
            if not self._detached:
                await self._react()
            self.coordinator.update({t.name: t.state for t in self.tasks})
            self.on_change(self)
            if done:
                return

    async def _react(self) -> None:
        live = [t for t in self.tasks if not t.is_poststop and t.state.state != TaskStateName.DEAD]
        reason: tuple[str, str, dict[str, Any]] | None = None
        for t in self.tasks:
            if t.is_poststop or t.state.state != TaskStateName.DEAD:
                continue
            if t.state.failed:
                if reason is None:
                    reason = (
                        "Sibling Task Failed",
                        f'Task\'s sibling "{t.name}" failed',
                        {"failed_sibling": t.name, "details": {"failed_sibling": t.name}},
                    )
            elif t.is_leader:
                reason = ("Leader Task Dead", "Leader Task in Group dead", {})
        if live:
            if reason is None and all(t.is_sidecar for t in live):
                reason = ("Main Tasks Dead", "Main tasks in the group died", {})
            if reason is not None and self._killing is None:
                for t in live:
                    if not t.state.finished_at:
                        kind, display, fields = reason
                        t.event(kind, display, **fields)
                self.kill_all()
            return
        for t in self.tasks:
            if not t.is_poststop and not t.done.is_set():
                t._kill.set()  # dead already: only ends its wait for an alloc restart

    # ---------------------------------------------------------------- stopping

    def kill_all(self) -> asyncio.Task[None]:
        """Kill the tasks (once: every later ask waits for the same kill)."""
        if self._killing is None:
            self._killing = asyncio.create_task(
                self.kill_tasks(), name=f"alloc-kill-{self.alloc.id[:8]}"
            )
        return self._killing

    async def kill_tasks(self) -> None:
        """Nomad's killTasks: the group's shutdown_delay first, then the
        leader, then the other main and ephemeral tasks together, then the
        sidecars; poststop tasks are left to run once the others are dead."""
        await self._group_shutdown_delay()
        leader = [t for t in self.tasks if t.is_leader]
        rest = [t for t in self.tasks if not t.is_leader and not t.is_poststop]
        for group in (
            leader,
            [t for t in rest if not t.is_sidecar],
            [t for t in rest if t.is_sidecar],
        ):
            await asyncio.gather(*(t.kill(t.killing_event()) for t in group))

    async def _group_shutdown_delay(self) -> None:
        """Nomad's group service hook's PreKill: the group's (and tasks')
        services are deregistered, then the tasks keep running for the
        group's shutdown_delay, unless it was stopped with no_shutdown_delay."""
        if self.services is not None:
            await self.services.deregister()  # first the services go
        tg = structs.task_group(self.job, self.alloc.task_group)
        delay = tg.shutdown_delay / 1e9 if tg is not None else 0.0
        if not delay or self.no_shutdown_delay.is_set() or self.done:
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.no_shutdown_delay.wait(), delay)

    async def stop(self) -> None:
        """The servers stopped the alloc (or it was garbage collected): kill
        its tasks in Nomad's order and wait for them, the poststop tasks
        included."""
        self._stopping = True
        if self._health_task is not None:
            self._health_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._health_task
        if not self.error:
            await self.kill_all()
        if self._task is not None:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task

    async def detach(self) -> None:
        """The agent shuts down and leaves the tasks running for the next
        agent to adopt (Nomad's AllocRunner.Shutdown)."""
        self._detached = True
        if self._health_task is not None:
            self._health_task.cancel()
        if self._task is not None:
            self._task.cancel()
        for t in (self._health_task, self._task):
            if t is not None:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await t

    def updated(self, alloc: pb.Allocation, job: pb.Job | None) -> None:
        """The server's newer copy of the alloc (and its job version when it
        moved to a newer one in place)."""
        self.alloc = alloc
        if job is not None:
            self.job = job
            tg = structs.task_group(job, alloc.task_group)
            for t in self.tasks:  # the next start runs the new version (Nomad's tr.Update)
                task = next((x for x in tg.tasks if x.name == t.name), None) if tg else None
                if task is not None:
                    t.task = task
        if alloc.desired_transition.no_shutdown_delay:
            self.no_shutdown_delay.set()
        if self.services is not None:
            self.services.refresh()
        if self.db is not None:
            if job is not None:
                self.db.put_alloc(alloc, job)
            else:
                self.db.put_server_alloc(alloc)

    def _health_changed(self) -> None:
        if self.db is not None:
            self.db.put_health(
                self.alloc.id,
                {
                    "deployment_id": self.health.deployment_id,
                    "healthy": self.health.healthy,
                    "timestamp": self.health.timestamp,
                },
            )
        self.on_change(self)

    # ---------------------------------------------------------------- asked from outside

    async def signal(self, task: str, name: str) -> None:
        """Nomad's AllocRunner.Signal: one task, or every task ("")."""
        sig = parse_signal(name)
        if task:
            runner = self.task(task)
            if runner is None:
                raise KeyError(task)
            await runner.signal(sig, name)
            return
        problems = []
        for t in self.tasks:
            try:
                await t.signal(sig, name)
            except TaskNotRunning as exc:
                problems.append(str(exc))
        if len(problems) == len(self.tasks):
            raise TaskNotRunning("; ".join(problems) or "no task is running")

    async def restart(self, task: str = "", *, all_tasks: bool = False) -> None:
        """Nomad's RestartTask, RestartRunning and RestartAll; returns once
        the old runs ended."""
        if self.done or self._stopping or self.alloc.desired_status != DesiredStatus.RUN:
            raise TaskNotRunning("restart of an alloc that should not run")
        if task:
            runner = self.task(task)
            if runner is None:
                raise KeyError(task)
            await runner.restart("User requested task to restart")
            return
        if all_tasks:
            self.coordinator.restart()
            reason = "User requested all tasks to restart"
        else:
            reason = "User requested running tasks to restart"

        async def one(t: TaskRunner) -> None:
            with contextlib.suppress(TaskNotRunning):
                await t.restart(reason, force=all_tasks)

        await asyncio.gather(*(one(t) for t in self.tasks))

    # ---------------------------------------------------------------- resource usage

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
            if task and t.name != task:
                continue
            latest = t.stats.latest if t.stats is not None else None
            latest = latest or t.sample_usage()
            if latest is not None:
                readings[t.name] = latest
        return alloc_usage(readings)

    # ---------------------------------------------------------------- status

    @property
    def done(self) -> bool:
        return bool(self.error) or all(t.state.state == TaskStateName.DEAD for t in self.tasks)

    def client_status(self) -> tuple[str, str]:
        """Nomad's getClientStatus over the task states."""
        if self.error:
            return ClientStatus.FAILED, self.error
        states = [t.state for t in self.tasks]
        if any(s.state == TaskStateName.DEAD and s.failed for s in states):
            return ClientStatus.FAILED, "Failed tasks"
        if any(s.state == TaskStateName.RUNNING for s in states):
            return ClientStatus.RUNNING, "Tasks are running"
        if any(s.state == TaskStateName.PENDING for s in states):
            return ClientStatus.PENDING, "No tasks have started"
        if states:
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
            out.task_states[t.name].CopyFrom(t.state)
        self.health.report(out)
        return out
