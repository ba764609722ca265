"""The template manager of a task (services/agent/template_hook.py) over a
real alloc directory: the first render waits for every dependency (with
Nomad's "Missing" event), files are written atomically with their perms
and owner inside the alloc directory only, a change re-renders and acts by
change_mode (restart, signal, script, noop) after the splay, `wait`
coalesces changes, env templates feed the environment, `once` templates
stay as first rendered, failures fail the task with Nomad's messages.

The cluster here is a fetcher answering from a dictionary, blocking like
the state's queries; the gRPC fetcher against a real state is tested in
tests/integration/state_api/test_templates_and_task_api.py."""

from __future__ import annotations

import asyncio
import os
import random
import stat
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import grpc
import pytest

from corral.domain.template import block
from corral.domain.template.nomad import (
    Dependency,
    NomadService,
    NomadVariable,
    ServiceQuery,
    VarGet,
)
from corral.v1 import structs_pb2 as pb
from services.agent.allocdir import AllocDir
from services.agent.template_data import Answer, GrpcFetcher, QueryError, Retry, TemplateData
from services.agent.template_hook import (
    RESTART_REASON,
    TaskNotRunning,
    TaskPaths,
    TemplateFailed,
    TemplateHook,
    TemplateHookError,
    TemplateManager,
    client_variables,
)
from tests.wait import until

S = 1_000_000_000


class Cluster:
    """Variables and services by dependency, each with an index; `fetch`
    blocks until the dependency's index passes the one asked for."""

    def __init__(self) -> None:
        self.values: dict[Dependency, tuple[Any, int]] = {}
        self.errors: dict[Dependency, QueryError] = {}
        self.changed = asyncio.Condition()
        #: what a dependency never set answers (a table's index): writes come after it
        self.index = 1
        self.fetches = 0

    async def set(self, dep: Dependency, value: Any) -> None:
        async with self.changed:
            self.index += 1
            self.values[dep] = (value, self.index)
            self.changed.notify_all()

    async def var(self, path: str, **items: str) -> None:
        self.index += 1
        await self.set(VarGet(path), NomadVariable(path, items, modify_index=self.index))

    async def fetch(self, dep: Dependency, index: int) -> Answer:
        self.fetches += 1
        if dep in self.errors:
            raise self.errors[dep]
        async with self.changed:
            await self.changed.wait_for(lambda: self.values.get(dep, (None, 1))[1] > index)
            value, at = self.values.get(dep, (None, 1))
        return Answer(value, repr(_plain(value)).encode(), at)


def _plain(value: Any) -> Any:
    if isinstance(value, NomadVariable):
        return (value.Path, {k: v.Value for k, v in value.Items.items()})
    if isinstance(value, list):
        return [(s.ID, s.Address, s.Port) for s in value]
    return value


class Task:
    """The task's side: what the manager did to it."""

    def __init__(self) -> None:
        self.events: list[tuple[str, str, bool]] = []
        self.restarts: list[str] = []
        self.signals: list[str] = []
        self.killed: list[str] = []
        self.execs: list[list[str]] = []
        self.exec_code = 0
        self.running = True

    def emit(self, kind: str, display: str, *, fails_task: bool = False) -> None:
        self.events.append((kind, display, fails_task))

    def is_running(self) -> bool:
        return self.running

    async def restart_task(self, reason: str) -> None:
        self.restarts.append(reason)

    async def signal_task(self, name: str) -> None:
        if not self.running:
            raise TaskNotRunning(name)
        self.signals.append(name)

    async def kill_task(self, display: str) -> None:
        self.killed.append(display)

    async def exec_in_task(self, command: Sequence[str], timeout: float) -> int:
        self.execs.append(list(command))
        return self.exec_code

    def displays(self, kind: str) -> list[str]:
        return [d for k, d, _ in self.events if k == kind]


class Setup:
    def __init__(self, tmp_path: Path) -> None:
        self.alloc = AllocDir.of(tmp_path, "a1")
        self.alloc.build()
        self.task_dir = self.alloc.task("web")
        self.task_dir.build()
        self.cluster = Cluster()
        self.task = Task()
        self.env: dict[str, str] = {"NOMAD_ALLOC_ID": "a1", "GREETING": "hello"}
        self.data: TemplateData | None = None

    def manager(self, *templates: pb.Template, retry: Retry | None = None) -> TemplateManager:
        task = pb.Task(name="web", templates=templates)
        block.canonicalize(task)
        self.data = TemplateData(self.cluster, retry=retry or Retry(), file_interval=0.05)
        return TemplateManager(
            task.templates,
            data=self.data,
            lifecycle=self.task,
            env=lambda: self.env,
            paths=TaskPaths(
                alloc_dir=str(self.alloc.dir),
                task_dir=str(self.task_dir.dir),
                shared_dir=str(self.alloc.shared),
                variables=client_variables(self.env, self.task_dir),
            ),
            namespace="default",
            rng=random.Random(1),
            event_rate=0.05,
        )

    def read(self, rel: str) -> str:
        return (self.task_dir.dir / rel).read_text()


@pytest.fixture
def setup(tmp_path: Path) -> Setup:
    return Setup(tmp_path)


DB = '{{ with nomadVar "nomad/jobs/web" }}password={{ .password }}{{ end }}\n'


def tmpl(data: str = DB, dest: str = "local/db.conf", **kw: Any) -> pb.Template:
    return pb.Template(embedded_tmpl=data, dest_path=dest, **kw)


async def test_first_render_waits_for_the_variable_and_says_what_is_missing(
    setup: Setup,
) -> None:
    m = setup.manager(tmpl(perms="0640", splay=0))
    first = asyncio.create_task(m.render_first())
    missing = await until(lambda: setup.task.displays("Template"))
    assert missing == ["Missing: nomad.var.block(nomad/jobs/web@default.global)"]
    assert not first.done()
    assert not (setup.task_dir.dir / "local/db.conf").exists()
    await setup.cluster.var("nomad/jobs/web", password="s3cret")
    assert await asyncio.wait_for(first, 10) == {}
    assert setup.read("local/db.conf") == "password=s3cret\n"
    mode = os.stat(setup.task_dir.dir / "local/db.conf").st_mode
    assert stat.S_IMODE(mode) == 0o640
    await m.stop()


async def test_a_change_re_renders_and_restarts(setup: Setup) -> None:
    await setup.cluster.var("nomad/jobs/web", password="one")
    m = setup.manager(tmpl(splay=0))
    await m.render_first()
    m.start()
    await setup.cluster.var("nomad/jobs/web", password="two")
    await until(lambda: setup.task.restarts)
    assert setup.task.restarts == [RESTART_REASON]
    assert setup.read("local/db.conf") == "password=two\n"
    # the same value written again changes nothing
    before = setup.cluster.fetches
    await setup.cluster.var("nomad/jobs/web", password="two")
    await until(lambda: setup.cluster.fetches >= before + 1)
    assert setup.task.restarts == [RESTART_REASON]
    await m.stop()


async def test_signal_script_and_noop(setup: Setup) -> None:
    await setup.cluster.var("nomad/jobs/web", password="one")
    m = setup.manager(
        tmpl(dest="local/a", change_mode="signal", change_signal="SIGUSR1", splay=0),
        tmpl(dest="local/b", change_mode="noop", splay=0),
        tmpl(
            dest="local/c",
            change_mode="script",
            change_script=pb.ChangeScript(command="/bin/reload", args=["-q", "now"]),
            splay=0,
        ),
    )
    await m.render_first()
    m.start()
    await setup.cluster.var("nomad/jobs/web", password="two")
    await until(lambda: setup.task.execs)
    assert setup.task.signals == ["SIGUSR1"]
    assert setup.task.execs == [["/bin/reload", "-q", "now"]]
    assert setup.task.displays("Task hook message") == [
        "Template successfully ran script /bin/reload with arguments: [-q now]. Exit code: 0"
    ]
    assert setup.task.restarts == []
    assert all(setup.read(f"local/{n}") == "password=two\n" for n in "abc")

    # a signal to a task that is not running is skipped, not a failure
    setup.task.running = False
    await setup.cluster.var("nomad/jobs/web", password="three")
    await until(lambda: len(setup.task.displays("Task hook message")) == 3)
    assert "Template skipped signal SIGUSR1: task is not running" in setup.task.displays(
        "Task hook message"
    )
    assert setup.task.killed == []
    await m.stop()


async def test_a_failing_script_fails_the_task_only_with_fail_on_error(setup: Setup) -> None:
    await setup.cluster.var("nomad/jobs/web", password="one")
    script = pb.ChangeScript(command="/bin/check", fail_on_error=True)
    m = setup.manager(tmpl(change_mode="script", change_script=script, splay=0))
    await m.render_first()
    m.start()
    setup.task.exec_code = 3
    await setup.cluster.var("nomad/jobs/web", password="two")
    await until(lambda: setup.task.killed)
    assert setup.task.displays("Task hook failed") == [
        "Template ran script /bin/check with arguments [] on change but it exited with code: 3"
    ]
    assert setup.task.killed == ["Template script failed, task is being killed"]
    await m.stop()


async def test_first_render_scripts_run_once_the_task_runs(setup: Setup) -> None:
    await setup.cluster.var("nomad/jobs/web", password="one")
    script = pb.ChangeScript(command="/bin/init", run_on_first_render=True)
    hook = TemplateHook(lambda: setup.manager(tmpl(change_mode="script", change_script=script)))
    await hook.prestart()
    assert setup.task.execs == []
    first = hook.poststart()
    assert first is not None
    await first
    assert setup.task.execs == [["/bin/init"]]
    await hook.stop()


async def test_env_templates_feed_the_environment(setup: Setup) -> None:
    await setup.cluster.var("nomad/jobs/web", password="one")
    env_tmpl = tmpl(
        data='DB_PASSWORD={{ with nomadVar "nomad/jobs/web" }}{{ .password }}{{ end }}\n'
        'GREETING="{{ env "GREETING" }} world"\n',
        dest="secrets/app.env",
        envvars=True,
        splay=0,
    )
    hook = TemplateHook(lambda: setup.manager(env_tmpl))
    assert await hook.prestart() == {"DB_PASSWORD": "one", "GREETING": "hello world"}
    await setup.cluster.var("nomad/jobs/web", password="two")
    await until(lambda: setup.task.restarts)
    # the restarted task gets the new values; nothing is rendered again
    assert await hook.prestart() == {"DB_PASSWORD": "two", "GREETING": "hello world"}
    await hook.stop()


async def test_render_templates_renders_again_before_a_restart(setup: Setup) -> None:
    await setup.cluster.var("nomad/jobs/web", password="one")
    hook = TemplateHook(lambda: setup.manager(tmpl(splay=0)), render_on_restart=True)
    await hook.prestart()
    first = hook.manager
    await hook.prestart()
    assert hook.manager is not first
    assert setup.read("local/db.conf") == "password=one\n"
    await hook.stop()


async def test_wait_coalesces_quick_changes(setup: Setup) -> None:
    await setup.cluster.var("nomad/jobs/web", password="one")
    # min is the quiet time after the last change: long enough that three
    # writes on a loaded machine still fall inside it (0.4 s flaked)
    waiting = tmpl(splay=0, wait=pb.TemplateWaitConfig(min=2 * S, max=10 * S))
    m = setup.manager(waiting)
    await m.render_first()
    m.start()
    for value in ("two", "three", "four"):
        await setup.cluster.var("nomad/jobs/web", password=value)
        await asyncio.sleep(0.05)
    assert setup.read("local/db.conf") == "password=one\n"  # still inside min
    await until(lambda: setup.read("local/db.conf") == "password=four\n")
    assert setup.task.restarts == [RESTART_REASON]
    await m.stop()


async def test_splay_delays_the_action(setup: Setup) -> None:
    await setup.cluster.var("nomad/jobs/web", password="one")
    m = setup.manager(tmpl(splay=int(0.6 * S)))
    await m.render_first()
    m.start()
    await setup.cluster.var("nomad/jobs/web", password="two")
    await until(lambda: setup.read("local/db.conf") == "password=two\n")
    assert setup.task.restarts == []  # random.Random(1) draws about 0.08 of 0.6 s first
    await until(lambda: setup.task.restarts, timeout=5)
    await m.stop()


async def test_once_templates_are_not_watched(setup: Setup) -> None:
    await setup.cluster.var("nomad/jobs/web", password="one")
    m = setup.manager(tmpl(dest="local/once", once=True, splay=0), tmpl(splay=0))
    await m.render_first()
    m.start()
    await setup.cluster.var("nomad/jobs/web", password="two")
    await until(lambda: setup.read("local/db.conf") == "password=two\n")
    assert setup.read("local/once") == "password=one\n"
    await m.stop()


async def test_services_go_and_come_back(setup: Setup) -> None:
    data = '{{ range nomadService "db" }}{{ .Address }}:{{ .Port }}\n{{ else }}none\n{{ end }}'
    db = ServiceQuery("db")
    await setup.cluster.set(db, [NomadService("id1", "db", "10.0.0.1", 5432)])
    m = setup.manager(tmpl(data=data, change_mode="noop", splay=0))
    await m.render_first()
    m.start()
    assert setup.read("local/db.conf") == "10.0.0.1:5432\n"
    await setup.cluster.set(db, [])
    await until(lambda: setup.read("local/db.conf") == "none\n")
    await m.stop()


async def test_an_unchanged_file_is_not_written_again(setup: Setup) -> None:
    await setup.cluster.var("nomad/jobs/web", password="one")
    dest = setup.task_dir.dir / "local/db.conf"
    dest.write_text("password=one\n")
    os.utime(dest, ns=(1, 1))
    m = setup.manager(tmpl(splay=0))
    await m.render_first()
    assert dest.stat().st_mtime_ns == 1
    await m.stop()


async def test_symlinks_a_task_planted_resolve_inside_the_alloc_dir(
    setup: Setup, tmp_path: Path
) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "target").write_text("keep")
    (setup.task_dir.local / "out").symlink_to(outside)
    (setup.task_dir.local / "link").symlink_to(outside / "target")
    (setup.task_dir.local / "hostfile").symlink_to("/etc/hostname")
    # a directory symlink out of the alloc dir leads nowhere (Nomad's chroot:
    # /tmp/... does not exist inside it)
    into_dir = setup.manager(tmpl(data="x", dest="local/out/f"))
    with pytest.raises(TemplateFailed, match="failed writing 'local/out/f'"):
        await into_dir.render_first()
    await into_dir.stop()
    assert not (outside / "f").exists()
    # a file symlink is replaced, never followed
    onto_link = setup.manager(tmpl(data="x", dest="local/link", uid=65534, gid=65534))
    await onto_link.render_first()
    await onto_link.stop()
    assert (outside / "target").read_text() == "keep"
    link = setup.task_dir.local / "link"
    assert not link.is_symlink() and link.read_text() == "x"
    if os.geteuid() == 0:
        assert (link.stat().st_uid, link.stat().st_gid) == (65534, 65534)
    # a source read through a symlink out finds the alloc dir's /etc, not the host's
    src = setup.manager(pb.Template(source_path="local/hostfile", dest_path="local/copy"))
    with pytest.raises(TemplateHookError, match="failed to read template"):
        await src.render_first()


@pytest.mark.parametrize(
    ("source", "dest", "problem"),
    [
        ("", "../../other", "template destination path escapes alloc directory"),
        ("/etc/passwd", "local/x", "template source path escapes alloc directory"),
        ("../../x", "local/x", "template source path escapes alloc directory"),
    ],
)
def test_paths_escaping_the_task_are_refused(
    setup: Setup, source: str, dest: str, problem: str
) -> None:
    with pytest.raises(TemplateHookError, match=problem):
        m = setup.manager(
            pb.Template(source_path=source, embedded_tmpl="" if source else "x", dest_path=dest)
        )
        m.paths.resolve(source or dest, destination=not source)


def test_destinations_as_nomad_resolves_them(setup: Setup) -> None:
    paths = setup.manager(tmpl()).paths
    assert paths.resolve("local/a", destination=True) == "web/local/a"
    assert paths.resolve("/etc/a", destination=True) == "web/etc/a"
    assert paths.resolve("../alloc/shared", destination=True) == "alloc/shared"
    assert paths.resolve("${NOMAD_SECRETS_DIR}/t", destination=True) == "web/secrets/t"
    assert paths.resolve("${NOMAD_TASK_DIR}/in.tpl", destination=False) == "web/local/in.tpl"


async def test_a_source_template_from_the_task_directory(setup: Setup) -> None:
    (setup.task_dir.local / "in.tpl").write_text('[[ env "GREETING" ]]')
    m = setup.manager(
        pb.Template(
            source_path="local/in.tpl", dest_path="local/out", left_delim="[[", right_delim="]]"
        )
    )
    await m.render_first()
    assert setup.read("local/out") == "hello"
    await m.stop()


async def test_a_bad_template_or_a_refused_query_fails(setup: Setup) -> None:
    bad = setup.manager(tmpl(data='{{ index . "x" 3 }}'))
    with pytest.raises(TemplateFailed, match=r"^Template failed: template: :1:3: executing"):
        await bad.render_first()
    await bad.stop()

    dep = VarGet("nomad/jobs/other")
    setup.cluster.errors[dep] = QueryError("403 (Permission denied)", permanent=True)
    refused = setup.manager(tmpl(data='{{ with nomadVar "nomad/jobs/other" }}{{ end }}'))
    with pytest.raises(TemplateFailed, match=r"Template failed: 403 \(Permission denied\)"):
        await asyncio.wait_for(refused.render_first(), 10)
    await refused.stop()


async def test_retries_then_the_task_fails_while_watching(setup: Setup) -> None:
    await setup.cluster.var("nomad/jobs/web", password="one")
    m = setup.manager(tmpl(splay=0), retry=Retry(attempts=2, backoff=0.01, max_backoff=0.02))
    await m.render_first()
    m.start()
    dep = VarGet("nomad/jobs/web")
    setup.cluster.errors[dep] = QueryError("the servers are unavailable")
    await setup.cluster.var("nomad/jobs/web", password="two")
    await until(lambda: setup.task.killed)
    assert setup.task.killed == ["Template failed: the servers are unavailable"]
    await m.stop()


async def test_a_query_naming_another_region_fails_before_asking() -> None:
    """A task's workload identity is its region's: a query for another
    region of a federation is refused for good, its own region's asked."""
    asked: list[str] = []

    async def token() -> str:
        asked.append("token")
        return "t"

    channel = grpc.aio.insecure_channel("127.0.0.1:1")
    try:
        fetcher = GrpcFetcher(channel, token, region="east")
        with pytest.raises(QueryError) as err:
            await fetcher.fetch(VarGet("app/db", region="west"), 0)
        assert err.value.permanent
        assert "a template reads its own region ('east') only; got 'west'" in str(err.value)
        assert asked == []
        # its own region (named or not) goes to the state: here unreachable
        for region in ("east", ""):
            with pytest.raises(QueryError) as err:
                await GrpcFetcher(channel, token, region="east", wait_ms=0).fetch(
                    VarGet("app/db", region=region), 0
                )
            assert "own region" not in str(err.value)
    finally:
        await channel.close()
