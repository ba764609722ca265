"""A task's `template` blocks on the client (Nomad's template hook and
TaskTemplateManager, with consul-template's runner inside).

Before the task starts (`TemplateHook.prestart`) every template is
rendered — with the task's environment and, through its workload
identity, the Variables and services it reads — and written to its
destination inside the alloc directory; the start waits until every
dependency is known, emitting Nomad's "Missing: ..." event while it
waits. `env = true` templates become the task's environment. Then the
manager watches what the templates read and renders them again when it
changes, honouring `wait`, and acts on a changed file by its `change_mode`
after a random `splay`: restart the task, send it `change_signal`, run
`change_script` in it, or nothing. The environment of a task restarted
this way holds the new values of its env templates. Events are Nomad's:
"Template" (Missing: ...), "Killing" ("Template failed: ...", the task
fails), "Restart Signaled", "Signaling", "Task hook message", "Task hook
failed". `once` templates render before the start only."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import posixpath
import random
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from corral.domain.template import block
from corral.domain.template.errors import TemplateError
from corral.domain.template.nomad import Dependency
from corral.domain.template.render import NomadTemplate, RenderResult
from corral.v1 import structs_pb2 as pb
from services.agent import alloc_sandbox, taskenv
from services.agent.template_data import TemplateData

log = logging.getLogger(__name__)

#: Nomad's DefaultMaxTemplateEventRate: at most one "Missing" event this often
MAX_EVENT_RATE = 3.0
#: dependencies a "Missing" event names before "and N more"
MISSING_DEP_EVENT_LIMIT = 3
#: the largest template source or destination read back (the library's own
#: bound on output)
MAX_FILE = 16 * 1024 * 1024

TEMPLATE_EVENT = "Template"
KILLING = "Killing"
HOOK_MESSAGE = "Task hook message"
HOOK_FAILED = "Task hook failed"
RESTART_REASON = "Template with change_mode restart re-rendered"


class TemplateFailed(Exception):
    """The templates cannot be rendered: the task is killed and fails with
    this message (the display of Nomad's Killing event)."""


class TemplateHookError(Exception):
    """The templates cannot be set up (a path escaping the alloc directory,
    a source that cannot be read or parsed): as Nomad's failed prestart
    hook, a "Task hook failed" event and a failed start the restart policy
    decides on."""


class TaskNotRunning(Exception):
    """A signal or restart for a task that is not running (Nomad's
    ErrTaskNotRunning); a template's signal is then dropped: the task will
    start with the latest files anyway."""


class TaskLifecycle(Protocol):
    """What the template manager may do to its task (Nomad's TaskLifecycle
    and EventEmitter)."""

    def emit(self, kind: str, display: str, *, fails_task: bool = False) -> None:
        """Record a task event."""
        ...

    def is_running(self) -> bool: ...

    async def restart_task(self, reason: str) -> None:
        """Restart the running task, not as a failure (a "Restart Signaled"
        event with `reason`)."""
        ...

    async def signal_task(self, name: str) -> None:
        """Send the signal `name` (a "Signaling" event saying "Template
        re-rendered"); TaskNotRunning when there is no run to signal."""
        ...

    async def kill_task(self, display: str) -> None:
        """Kill the task and fail it (a "Killing" event with `display`)."""
        ...

    async def exec_in_task(self, command: Sequence[str], timeout: float) -> int:
        """Run `command` in the task (as the driver runs `alloc exec`) and
        answer its exit code; OSError, TimeoutError or DriverError when it
        cannot run or does not finish in time."""
        ...


@dataclass(frozen=True)
class TaskPaths:
    """Where a task's templates may read and write: the alloc directory is
    the sandbox (Nomad chroots its renderer into it); `variables` resolve
    `${...}` in `source` and `destination` with the host's paths (Nomad's
    TaskEnv.ClientPath)."""

    alloc_dir: str
    task_dir: str
    shared_dir: str
    variables: Mapping[str, str]

    def _escapes(self, path: str) -> bool:
        return not any(
            path == base or path.startswith(base.rstrip("/") + "/")
            for base in (self.task_dir, self.shared_dir)
        )

    def resolve(self, raw: str, *, destination: bool) -> str:
        """`raw` as a path relative to the alloc directory (Nomad's
        ClientPath): a relative path is the task directory's, and so is an
        absolute destination outside the task and shared directories; what
        still lies outside them escapes (TemplateHookError)."""
        path = taskenv.interpolate(raw, self.variables)
        if not path.startswith("/") or (destination and self._escapes(posixpath.normpath(path))):
            path = self.task_dir.rstrip("/") + "/" + path  # Go's filepath.Join
        path = posixpath.normpath(path)
        if self._escapes(path):
            what = "destination" if destination else "source"
            raise TemplateHookError(f"template {what} path escapes alloc directory")
        return posixpath.relpath(path, self.alloc_dir)


@dataclass
class _Template:
    """One template block and what the manager knows of it."""

    spec: pb.Template
    dest: str  # relative to the alloc directory
    compiled: NomadTemplate | None = None
    #: the last output written (or found already there), None before the first
    output: str | None = None
    deps: frozenset[Dependency] = frozenset()
    #: wait: when a change first and last reached it since its last render
    first_dirty: float = 0.0
    last_dirty: float = 0.0

    @property
    def wait(self) -> tuple[float, float] | None:
        """(min, max) seconds of quiescence, None without a wait block
        (consul-template: max defaults to four times min)."""
        if not self.spec.HasField("wait"):
            return None
        w = self.spec.wait
        low = w.min / 1e9 if w.HasField("min") else 0.0
        high = w.max / 1e9 if w.HasField("max") else 4 * low
        return low, max(low, high)


class TemplateManager:
    """The templates of one task (see the module doc). `env` gives the
    task's environment for the `env` function; `namespace` is the job's."""

    def __init__(
        self,
        templates: Iterable[pb.Template],
        *,
        data: TemplateData,
        lifecycle: TaskLifecycle,
        env: Callable[[], Mapping[str, str]],
        paths: TaskPaths,
        namespace: str,
        rng: random.Random | None = None,
        event_rate: float = MAX_EVENT_RATE,
    ) -> None:
        self.data = data
        self.lifecycle = lifecycle
        self.env = env
        self.paths = paths
        self.namespace = namespace
        self.rng = rng or random.Random()
        self.event_rate = event_rate
        self.templates = [
            _Template(t, paths.resolve(t.dest_path, destination=True)) for t in templates
        ]
        #: environment variables of the env templates, as last rendered
        self.template_env: dict[str, str] = {}
        self._watching: asyncio.Task[None] | None = None
        self._first_scripts: list[pb.ChangeScript] = []

    # ---------------------------------------------------------------- rendering

    def _compile(self, t: _Template) -> NomadTemplate:
        if t.compiled is not None:
            return t.compiled
        spec = t.spec
        if spec.source_path:
            source = self.paths.resolve(spec.source_path, destination=False)
            try:
                raw = alloc_sandbox.read(self.paths.alloc_dir, source, block.MAX_TEXT)
            except (OSError, ValueError) as exc:
                raise TemplateHookError(
                    f"failed to read template {spec.source_path!r}: "
                    f"{getattr(exc, 'strerror', None) or exc}"
                ) from None
            text = raw.decode("utf-8", "replace")
        else:
            text = spec.embedded_tmpl
        try:
            t.compiled = NomadTemplate(
                text,
                left_delimiter=spec.left_delim or block.LEFT_DELIM,
                right_delimiter=spec.right_delim or block.RIGHT_DELIM,
                error_on_missing_key=spec.err_missing_key,
            )
        except TemplateError as exc:
            raise TemplateHookError(str(exc)) from None
        return t.compiled

    async def _render(self, t: _Template) -> RenderResult:
        compiled = t.compiled or self._compile(t)
        env = dict(self.env())
        try:
            # off the event loop: a large template may take a while (bounded)
            return await asyncio.to_thread(
                compiled.render,
                env=env,
                data=self.data,
                namespace=self.namespace,
                sandbox_dir=self.paths.task_dir,
            )
        except TemplateError as exc:
            raise TemplateFailed(f"Template failed: {exc}") from None

    def _on_disk(self, t: _Template) -> str | None:
        try:
            raw = alloc_sandbox.read(self.paths.alloc_dir, t.dest, MAX_FILE)
        except (OSError, ValueError):
            return None
        return raw.decode("utf-8", "replace")

    def _write(self, t: _Template, output: str) -> bool:
        """Write `output` unless the file already holds it (consul-template's
        "would render" without "did render"); True when written."""
        if t.output is None and self._on_disk(t) == output:
            t.output = output
            return False
        spec = t.spec
        try:
            alloc_sandbox.write(
                self.paths.alloc_dir,
                t.dest,
                output.encode(),
                mode=block.perms_mode(spec.perms or block.DEFAULT_PERMS),
                uid=spec.uid if spec.HasField("uid") else -1,
                gid=spec.gid if spec.HasField("gid") else -1,
            )
        except (OSError, ValueError) as exc:
            raise TemplateFailed(
                f"Template failed: failed writing {spec.dest_path!r}: "
                f"{getattr(exc, 'strerror', None) or exc}"
            ) from None
        t.output = output
        return True

    def _load_env(self) -> None:
        env: dict[str, str] = {}
        for t in self.templates:
            if t.spec.envvars and t.output is not None:
                try:
                    env.update(block.parse_env(t.output))
                except block.EnvParseError as exc:
                    raise TemplateFailed(
                        f"Template failed to read environment variables: error parsing env "
                        f"template {t.spec.dest_path!r}: {exc}"
                    ) from None
        self.template_env = env

    # ---------------------------------------------------------------- first render

    async def render_first(self) -> dict[str, str]:
        """Render every template, fetching what they read, until all are
        complete; write them; answer the env templates' variables. Raises
        TemplateHookError or TemplateFailed. Nomad's handleFirstRender: while dependencies are
        missing, a "Missing: ..." event at most every three seconds."""
        for t in self.templates:
            self._compile(t)  # a source read once, as consul-template does
        missing_shown: frozenset[str] = frozenset()
        missing_since = 0.0
        while True:
            if self.data.failed:
                raise TemplateFailed(f"Template failed: {self.data.failed}")
            self.data.changed.clear()
            results = [await self._render(t) for t in self.templates]
            for t, r in zip(self.templates, results, strict=True):
                t.deps = r.used | r.missing
            self.data.watch(d for t in self.templates for d in t.deps)
            missing = frozenset(str(d) for r in results for d in r.missing)
            if not missing:
                break
            now = time.monotonic()
            if missing != missing_shown:
                missing_shown, missing_since = missing, now
            wait = None
            if missing_since:
                wait = max(0.0, missing_since + self.event_rate - now)
                if wait == 0.0:
                    self.lifecycle.emit(TEMPLATE_EVENT, f"Missing: {_missing_list(missing)}")
                    missing_since = 0.0
                    wait = None
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.data.changed.wait(), wait)
        for t, r in zip(self.templates, results, strict=True):
            self._write(t, r.output)
        self._load_env()
        self._first_scripts = [
            t.spec.change_script
            for t in self.templates
            if t.spec.change_mode == block.CHANGE_SCRIPT
            and t.spec.change_script.run_on_first_render
        ]
        # once templates are done; the others are watched from now on
        self.data.watch(d for t in self._watched for d in t.deps)
        return dict(self.template_env)

    @property
    def _watched(self) -> list[_Template]:
        return [t for t in self.templates if not t.spec.once]

    # ---------------------------------------------------------------- watching

    def start(self) -> None:
        """Watch for changes (after `render_first`) until `stop`."""
        if self._watching is None and self._watched:
            self._watching = asyncio.create_task(self._watch(), name="templates")

    async def stop(self) -> None:
        if self._watching is not None:
            self._watching.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watching
            self._watching = None
        await self.data.stop()

    async def run_first_render_scripts(self) -> None:
        """change_script blocks with run_on_first_render, once the task runs
        (Nomad's Poststart)."""
        scripts, self._first_scripts = self._first_scripts, []
        await asyncio.gather(*(self._script(s) for s in scripts))

    async def _watch(self) -> None:
        try:
            while True:
                due = await self._next_due()
                changed = await self._render_again(due)
                if changed:
                    await self._act(changed)
        except TemplateFailed as exc:
            await self.lifecycle.kill_task(str(exc))
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # never a silent stop: fail the task, as Nomad's runner errors
            log.exception("template manager")
            await self.lifecycle.kill_task(f"Template failed: {exc}")

    async def _next_due(self) -> list[_Template]:
        """Wait for a change, then for the templates' `wait` windows; the
        templates to render now."""
        watched = self._watched
        while True:
            if self.data.failed:
                raise TemplateFailed(f"Template failed: {self.data.failed}")
            now = time.monotonic()
            due, next_at = [], None
            for t in watched:
                if not t.first_dirty:
                    continue
                w = t.wait
                at = now if w is None else min(t.last_dirty + w[0], t.first_dirty + w[1])
                if at <= now:
                    due.append(t)
                else:
                    next_at = at if next_at is None else min(next_at, at)
            if due:
                return due
            timeout = None if next_at is None else max(0.0, next_at - now)
            try:
                await asyncio.wait_for(self.data.changed.wait(), timeout)
            except TimeoutError:
                continue
            self.data.changed.clear()
            now = time.monotonic()
            for t in watched:
                t.first_dirty = t.first_dirty or now
                t.last_dirty = now

    async def _render_again(self, due: list[_Template]) -> list[_Template]:
        """Render `due`; write those complete with a new output (the others
        keep their file until their dependencies are back); the written."""
        written: list[_Template] = []
        results = []
        for t in due:
            t.first_dirty = t.last_dirty = 0.0
            results.append(await self._render(t))
        for t, r in zip(due, results, strict=True):
            t.deps = r.used | r.missing
        self.data.watch(d for t in self._watched for d in t.deps)
        for t, r in zip(due, results, strict=True):
            if r.complete and r.output != t.output and self._write(t, r.output):
                written.append(t)
        if any(t.spec.envvars for t in written):
            self._load_env()
        return written

    async def _act(self, changed: list[_Template]) -> None:
        """Nomad's onTemplateRendered: restart wins over signals and
        scripts; the largest splay of the changed templates first."""
        modes = {t.spec.change_mode for t in changed}
        if modes <= {block.CHANGE_NOOP}:
            return
        splay = max(t.spec.splay for t in changed) / 1e9
        if splay > 0:
            await asyncio.sleep(self.rng.uniform(0, splay))
        if block.CHANGE_RESTART in modes:
            await self.lifecycle.restart_task(RESTART_REASON)
            return
        signals = sorted(
            {t.spec.change_signal for t in changed if t.spec.change_mode == block.CHANGE_SIGNAL}
        )
        failed = []
        for name in signals:
            try:
                await self.lifecycle.signal_task(name)
            except TaskNotRunning:
                self.lifecycle.emit(
                    HOOK_MESSAGE, f"Template skipped signal {name}: task is not running"
                )
            except Exception as exc:
                failed.append(f"{name}: {exc}")
        if failed:
            await self.lifecycle.kill_task(
                f"Template failed to send signals [{' '.join(signals)}]: {'; '.join(failed)}"
            )
            return
        scripts = [
            t.spec.change_script for t in changed if t.spec.change_mode == block.CHANGE_SCRIPT
        ]
        await asyncio.gather(*(self._script(s) for s in scripts))

    async def _script(self, script: pb.ChangeScript) -> None:
        """Nomad's processScript: events in its words; a failure kills the
        task only with fail_on_error."""
        args = f"[{' '.join(script.args)}]"
        timeout = (script.timeout or block.DEFAULT_SCRIPT_TIMEOUT) / 1e9
        try:
            code = await self.lifecycle.exec_in_task([script.command, *script.args], timeout)
        except Exception as exc:
            message = str(exc) or type(exc).__name__
            if isinstance(exc, TimeoutError):
                message = f"timed out after {timeout:g}s"
            await self._script_failed(
                script,
                f"Template failed to run script {script.command} with arguments {args} on "
                f"change: {message}. Exit code: -1",
            )
            return
        if code != 0:
            await self._script_failed(
                script,
                f"Template ran script {script.command} with arguments {args} on change but it "
                f"exited with code: {code}",
            )
            return
        self.lifecycle.emit(
            HOOK_MESSAGE,
            f"Template successfully ran script {script.command} with arguments: {args}. "
            "Exit code: 0",
        )

    async def _script_failed(self, script: pb.ChangeScript, message: str) -> None:
        self.lifecycle.emit(HOOK_FAILED, message)
        if script.fail_on_error:
            await self.lifecycle.kill_task("Template script failed, task is being killed")


def _missing_list(missing: Iterable[str]) -> str:
    names = sorted(missing)
    if len(names) > MISSING_DEP_EVENT_LIMIT:
        names = [
            *names[:MISSING_DEP_EVENT_LIMIT],
            f"and {len(names) - MISSING_DEP_EVENT_LIMIT} more",
        ]
    return ", ".join(names)


# --------------------------------------------------------------------------- the hook


class TemplateHook:
    """The task runner's side (Nomad's template hook): one manager for the
    task's life, made again before a restart only with the restart
    policy's `render_templates`."""

    def __init__(
        self, make_manager: Callable[[], TemplateManager], *, render_on_restart: bool = False
    ) -> None:
        self._make = make_manager
        self.render_on_restart = render_on_restart
        self.manager: TemplateManager | None = None

    async def prestart(self) -> dict[str, str]:
        """Before every start: the first time (or with render_templates) the
        first render, which blocks until it is complete; the environment
        variables the env templates give the task. Raises TemplateHookError
        or TemplateFailed."""
        if self.manager is not None:
            if not self.render_on_restart:
                return dict(self.manager.template_env)
            log.info("re-rendering templates on task restart")
            await self.manager.stop()
            self.manager = None
        manager = self._make()
        try:
            env = await manager.render_first()
        except BaseException:
            await manager.stop()
            raise
        self.manager = manager
        manager.start()
        return env

    def poststart(self) -> Awaitable[None] | None:
        """The first-render scripts, to run once the task is running."""
        if self.manager is None:
            return None
        return self.manager.run_first_render_scripts()

    async def stop(self) -> None:
        if self.manager is not None:
            await self.manager.stop()
            self.manager = None


def client_variables(variables: Mapping[str, str], task_dir: Any) -> dict[str, str]:
    """A task's `${...}` variables with its directories as the host names
    them (what a template's source and destination are resolved with)."""
    return {
        **variables,
        "NOMAD_ALLOC_DIR": str(task_dir.alloc_dir),
        "NOMAD_TASK_DIR": str(task_dir.local),
        "NOMAD_SECRETS_DIR": str(task_dir.secrets),
    }
