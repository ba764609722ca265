"""What the agent serves at its address (Node.http_addr): `ClientAlloc`
(a task's stdout/stderr, from the start or the end, optionally followed
across rotated files; an alloc's resource usage; the latest results of its
service checks; signals and restarts of its tasks; a command run in a task,
`Exec`; destroying a finished alloc, `GarbageCollect`), `ClientFS` (the
files of an alloc's directory), `ClientStats` (the host's) and `ClientNode`
(the node's dynamic metadata, destroying every finished alloc)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any, Protocol, TypeVar

import grpc

from corral.domain import actions, task_exec
from corral.domain.errors import (
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    ResourceExhausted,
    Unavailable,
)
from corral.security import access
from corral.v1 import alloc_pb2, alloc_pb2_grpc, node_pb2, node_pb2_grpc
from corral.v1 import structs_pb2 as pb
from services.agent import logs
from services.agent.allocdir import AllocDir
from services.agent.allocfs import AllocFS, Escape, SecretFile
from services.agent.drivers.base import (
    FS_NONE,
    Driver,
    DriverError,
    ExecSession,
    TaskConfig,
    TaskHandle,
    parse_signal,
)
from services.agent.node_meta import NodeMeta
from services.agent.runner import TaskNotRunning

T = TypeVar("T")
log = logging.getLogger(__name__)

#: Nomad's capability for signals and restarts
ALLOC_LIFECYCLE = "alloc-lifecycle"
#: Nomad's CLI sends SIGKILL when no signal is named
DEFAULT_SIGNAL = "SIGKILL"


class AllocView(Protocol):
    """An alloc this agent runs, as its handlers need it (AllocRunner)."""

    @property
    def namespace(self) -> str: ...

    def task_names(self) -> list[str]: ...

    def usage(self, task: str = "") -> pb.AllocResourceUsage: ...

    def check_results(self) -> list[pb.CheckResult]: ...

    @property
    def job_id(self) -> str: ...

    def exec_target(self, task: str) -> tuple[Driver, TaskHandle, TaskConfig]:
        """The running task's driver, handle and config (`alloc exec`)."""
        ...

    def task_spec(self, task: str) -> pb.Task | None:
        """The task as the job version the alloc runs defines it (its
        actions), None for a task the alloc does not have."""
        ...

    def logs_disabled(self, task: str) -> bool: ...

    async def signal(self, task: str, name: str) -> None: ...

    async def restart(self, task: str = "", *, all_tasks: bool = False) -> None: ...


class ClientAllocServicer(alloc_pb2_grpc.ClientAllocServicer):
    """`lookup` finds an alloc this agent runs (None for one it does not):
    reading its logs takes read-logs in its namespace, its stats and check
    results read-job, signalling or restarting its tasks alloc-lifecycle."""

    def __init__(
        self,
        data_dir: Path,
        stopping: asyncio.Event,
        lookup: Callable[[str], AllocView | None],
        *,
        exec_disabled: bool = False,
        collect: Callable[[str], Awaitable[None]] | None = None,
    ) -> None:
        """`collect` destroys a finished alloc (the agent's GC)."""
        self.data_dir = data_dir
        self.stopping = stopping
        self.lookup = lookup
        self.exec_disabled = exec_disabled
        self.collect = collect
        self.exec_sessions = 0

    def _alloc(self, alloc_id: str) -> AllocView:
        view = self.lookup(alloc_id) if alloc_id else None
        if view is None:
            raise NotFound(f"alloc {alloc_id!r} is not on this node")
        return view

    async def Logs(
        self, request: alloc_pb2.AllocLogsRequest, context: Any
    ) -> AsyncIterator[alloc_pb2.AllocLogsChunk]:
        kind = request.type or "stdout"
        if kind not in ("stdout", "stderr"):
            raise InvalidArgument("type", "must be stdout or stderr")
        origin = request.origin or "start"
        if origin not in ("start", "end"):
            raise InvalidArgument("origin", "must be start or end")
        if request.offset < 0:
            raise InvalidArgument("offset", "must not be negative (count from the end: origin end)")
        view = self._alloc(request.alloc_id)
        alloc_dir = AllocDir.of(self.data_dir, request.alloc_id)
        if not alloc_dir.dir.is_dir():
            raise NotFound(f"alloc {request.alloc_id!r} has no files on this node")
        access.require_namespace(view.namespace, "read-logs")
        tasks = sorted(view.task_names())
        task = request.task or (tasks[0] if len(tasks) == 1 else "")
        if task not in tasks:
            raise InvalidArgument("task", f"name one of: {', '.join(tasks)}")
        if view.logs_disabled(task):
            raise FailedPrecondition(
                f"log collection is disabled for task {task!r} (its logs block)"
            )
        stream = logs.stream(
            alloc_dir.task(task).log_dir,
            task,
            kind,
            origin=origin,
            offset=request.offset,
            follow=request.follow,
            stopping=self.stopping.is_set,
        )
        async for chunk in stream:
            yield alloc_pb2.AllocLogsChunk(data=chunk.data, offset=chunk.offset, file=chunk.file)

    async def Stats(
        self, request: alloc_pb2.AllocStatsRequest, context: Any
    ) -> alloc_pb2.AllocStatsResponse:
        view = self._alloc(request.alloc_id)
        access.require_namespace(view.namespace, access.READ_JOB)
        if request.task and request.task not in view.task_names():
            raise NotFound(f"task {request.task!r} not found in alloc {request.alloc_id!r}")
        return alloc_pb2.AllocStatsResponse(usage=view.usage(request.task))

    async def Checks(
        self, request: alloc_pb2.AllocChecksRequest, context: Any
    ) -> alloc_pb2.AllocChecksResponse:
        """Nomad's /v1/client/allocation/:id/checks: the alloc's checks as
        this client last ran them (none once the alloc stopped)."""
        view = self._alloc(request.alloc_id)
        access.require_namespace(view.namespace, access.READ_JOB)
        return alloc_pb2.AllocChecksResponse(results=view.check_results())

    def _lifecycle_target(self, alloc_id: str, task: str) -> AllocView:
        view = self._alloc(alloc_id)
        access.require_namespace(view.namespace, ALLOC_LIFECYCLE)
        if task and task not in view.task_names():
            raise NotFound(f"task {task!r} not found in alloc {alloc_id!r}")
        return view

    async def Signal(
        self, request: alloc_pb2.AllocSignalRequest, context: Any
    ) -> alloc_pb2.AllocSignalResponse:
        name = request.signal or DEFAULT_SIGNAL
        try:
            parse_signal(name)
        except ValueError:
            raise InvalidArgument("signal", f"unknown signal {name!r}") from None
        view = self._lifecycle_target(request.alloc_id, request.task)
        try:
            await view.signal(request.task, name)
        except TaskNotRunning as exc:
            raise FailedPrecondition(str(exc)) from None
        return alloc_pb2.AllocSignalResponse()

    async def Restart(
        self, request: alloc_pb2.AllocRestartRequest, context: Any
    ) -> alloc_pb2.AllocRestartResponse:
        if request.all_tasks and request.task:
            raise InvalidArgument("task", "task name cannot be set when restarting all tasks")
        view = self._lifecycle_target(request.alloc_id, request.task)
        try:
            await view.restart(request.task, all_tasks=request.all_tasks)
        except TaskNotRunning as exc:
            raise FailedPrecondition(str(exc)) from None
        return alloc_pb2.AllocRestartResponse()

    async def GarbageCollect(
        self, request: alloc_pb2.AllocGCRequest, context: Any
    ) -> alloc_pb2.AllocGCResponse:
        """Nomad's ClientAllocations.GarbageCollect: submit-job in the
        alloc's namespace; a running alloc is refused."""
        view = self._alloc(request.alloc_id)
        access.require_namespace(view.namespace, access.SUBMIT_JOB)
        if self.collect is None:
            raise FailedPrecondition("this agent does not garbage collect allocs")
        await self.collect(request.alloc_id)
        return alloc_pb2.AllocGCResponse()

    async def Exec(
        self, requests: AsyncIterator[alloc_pb2.AllocExecRequest], context: Any
    ) -> AsyncIterator[alloc_pb2.AllocExecResponse]:
        """Nomad's Allocations.Exec (see alloc.proto): checks in Nomad's
        order, then one command relayed until it exits or the caller goes."""
        it = aiter(requests)
        first = await anext(it, None)
        if first is None or first.WhichOneof("message") != "setup":
            raise InvalidArgument("setup", "the first message must be the exec setup")
        setup = first.setup
        command = list(setup.command)
        view = self._alloc(setup.alloc_id)
        if self.exec_disabled:
            raise PermissionDenied("Permission denied: remote exec is disabled on this node")
        access.require_namespace(view.namespace, "alloc-exec")
        if not setup.task:
            raise InvalidArgument("task", "must provide task name")
        if setup.job_id and setup.job_id != view.job_id:
            raise InvalidArgument(
                "job_id", f"job {setup.job_id} does not have allocation {setup.alloc_id}"
            )
        if setup.action:
            command = self._action_command(view, setup)
        problem = task_exec.command_problem(command)
        if problem:
            raise InvalidArgument("command", problem)
        driver, handle, cfg = view.exec_target(setup.task)
        if not driver.capabilities.exec:
            raise FailedPrecondition(
                f"the {driver.name} driver runs no process: alloc exec is not supported for it"
            )
        if driver.capabilities.fs_isolation == FS_NONE:
            # the command would run on the node itself (Nomad asks for both)
            access.require_namespace(view.namespace, "alloc-node-exec")
        if self.exec_sessions >= MAX_EXEC_SESSIONS:
            raise ResourceExhausted(
                f"this node already runs {MAX_EXEC_SESSIONS} exec sessions; try again later"
            )
        self.exec_sessions += 1
        try:
            try:
                session = await driver.exec_task(handle, cfg, command, setup.tty)
            except DriverError as exc:
                raise FailedPrecondition(str(exc)) from None
            # the caller may now send stdin (corral/domain/task_exec.py says why it waits)
            await context.send_initial_metadata(((task_exec.EXEC_STARTED, "1"),))
            log.info(
                "task exec session starting",
                extra={
                    "alloc_id": setup.alloc_id,
                    "task": setup.task,
                    "tty": setup.tty,
                    "action": setup.action,
                },
            )
            relay = asyncio.create_task(_relay_input(it, session))
            try:
                async for stream, data in session.output():
                    io = alloc_pb2.ExecIO(data=data)
                    if stream == "stderr":
                        yield alloc_pb2.AllocExecResponse(stderr=io)
                    else:
                        yield alloc_pb2.AllocExecResponse(stdout=io)
                code = await session.wait()
                yield alloc_pb2.AllocExecResponse(exited=True, exit_code=code)
            finally:
                relay.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await relay
                await session.close()
        finally:
            self.exec_sessions -= 1

    @staticmethod
    def _action_command(view: AllocView, setup: alloc_pb2.ExecSetup) -> list[str]:
        """The command of the task's action `setup.action` in the job
        version the alloc runs (Nomad's client looks it up the same way)."""
        spec = view.task_spec(setup.task)
        if spec is None:
            raise InvalidArgument("", f"task {setup.task} not found in allocation {setup.alloc_id}")
        action = actions.find(spec, setup.action)
        if action is None:  # Nomad's sentences, which name the field themselves
            raise InvalidArgument("", f"action {setup.action} not found in task {setup.task}")
        return [action.command, *action.args]


#: exec sessions one agent runs at once
MAX_EXEC_SESSIONS = 64
#: the largest stdin message
MAX_STDIN_BYTES = 1024 * 1024


async def _relay_input(
    requests: AsyncIterator[alloc_pb2.AllocExecRequest], session: ExecSession
) -> None:
    """The caller's messages after the setup: stdin, terminal sizes,
    heartbeats (nothing set). A broken or oversized message ends the
    relay; the command keeps what it was sent."""
    try:
        async for msg in requests:
            kind = msg.WhichOneof("message")
            if kind == "stdin":
                if len(msg.stdin.data) > MAX_STDIN_BYTES:
                    log.warning("exec: stdin message over %d bytes refused", MAX_STDIN_BYTES)
                    return
                if msg.stdin.data:
                    await session.write(msg.stdin.data)
                if msg.stdin.close:
                    await session.close_stdin()
            elif kind == "tty_size":
                size = msg.tty_size
                session.resize(max(0, min(size.height, 65535)), max(0, min(size.width, 65535)))
            elif kind == "setup":
                log.warning("exec: a second setup message ignored")
    except (OSError, grpc.aio.AioRpcError):
        return


class ClientStatsServicer(node_pb2_grpc.ClientStatsServicer):
    """`host` answers this node's id and its latest host stats."""

    def __init__(self, host: Callable[[], tuple[str, pb.HostStats]]) -> None:
        self.host = host

    async def Stats(
        self, request: node_pb2.ClientStatsRequest, context: Any
    ) -> node_pb2.ClientStatsResponse:
        node_id, stats = self.host()
        return node_pb2.ClientStatsResponse(stats=stats, node_id=node_id)


class NodeView(Protocol):
    """The agent as ClientNode needs it (services/agent/client.py's Agent)."""

    @property
    def node_id(self) -> str: ...

    @property
    def meta(self) -> NodeMeta: ...

    async def apply_meta(self, changes: dict[str, str | None]) -> NodeMeta: ...

    async def collect_all(self) -> list[str]: ...


def meta_response(meta: NodeMeta) -> node_pb2.NodeMetaResponse:
    return node_pb2.NodeMetaResponse(
        meta=meta.merged(),
        dynamic={k: v for k, v in meta.dynamic.items() if v is not None},
        dynamic_unset=sorted(k for k, v in meta.dynamic.items() if v is None),
        static=meta.static,
    )


class ClientNodeServicer(node_pb2_grpc.ClientNodeServicer):
    """Nomad's NodeMeta (Read: node:read; Apply: node:write, checked by the
    access table) and Allocations.GarbageCollectAll (node:write) of this
    node; `agent` answers None while the agent is still starting."""

    def __init__(self, agent: Callable[[], NodeView | None]) -> None:
        self.agent = agent

    def _node(self, node_id: str) -> NodeView:
        view = self.agent()
        if view is None:
            raise Unavailable("the agent is still starting")
        if node_id and node_id != view.node_id:
            raise NotFound(f"node {node_id!r} is not served by this agent")
        return view

    async def ReadMeta(
        self, request: node_pb2.NodeMetaReadRequest, context: Any
    ) -> node_pb2.NodeMetaResponse:
        return meta_response(self._node(request.node_id).meta)

    async def ApplyMeta(
        self, request: node_pb2.NodeMetaApplyRequest, context: Any
    ) -> node_pb2.NodeMetaResponse:
        view = self._node(request.node_id)
        both = set(request.meta) & set(request.unset)
        if both:
            raise InvalidArgument("unset", f"{sorted(both)[0]!r} is both set and unset")
        changes: dict[str, str | None] = dict(request.meta)
        changes.update(dict.fromkeys(request.unset))
        return meta_response(await view.apply_meta(changes))

    async def GarbageCollectAll(
        self, request: node_pb2.ClientGCRequest, context: Any
    ) -> node_pb2.ClientGCResponse:
        view = self._node(request.node_id)
        return node_pb2.ClientGCResponse(collected=await view.collect_all())


# ------------------------------------------------------------ alloc fs

#: bytes per stream frame (Nomad's streamFrameSize)
FRAME_BYTES = 64 * 1024
#: how often a followed file is looked at, and a heartbeat sent when idle
FOLLOW_POLL_S = 0.25
HEARTBEAT_S = 1.0
#: the longest path a request may name
MAX_PATH = 4096
FILE_DELETED = "file deleted"
FILE_TRUNCATED = "file truncated"


class ClientFSServicer(alloc_pb2_grpc.ClientFSServicer):
    """Nomad's FileSystem endpoint over an alloc's directory (`alloc fs`):
    read-fs in the alloc's namespace; the paths are confined to the alloc
    directory (services/agent/allocfs.py)."""

    def __init__(
        self,
        data_dir: Path,
        stopping: asyncio.Event,
        lookup: Callable[[str], AllocView | None],
    ) -> None:
        self.data_dir = data_dir
        self.stopping = stopping
        self.lookup = lookup

    def _fs(self, alloc_id: str, path: str) -> AllocFS:
        if len(path) > MAX_PATH:
            raise InvalidArgument("path", f"is longer than {MAX_PATH} characters")
        if "\x00" in path:
            raise InvalidArgument("path", "must not contain NUL characters")
        view = self.lookup(alloc_id) if alloc_id else None
        if view is None:
            raise NotFound(f"Unknown allocation {alloc_id!r}: not on this node")
        access.require_namespace(view.namespace, "read-fs")
        root = AllocDir.of(self.data_dir, alloc_id).dir
        if not root.is_dir():
            raise NotFound(f"alloc {alloc_id!r} has no files on this node")
        return AllocFS(root, view.task_names())

    async def List(
        self, request: alloc_pb2.FsListRequest, context: Any
    ) -> alloc_pb2.FsListResponse:
        fs = self._fs(request.alloc_id, request.path)
        files = await _fs_call(fs.list, request.path or "/")
        return alloc_pb2.FsListResponse(files=files)

    async def Stat(
        self, request: alloc_pb2.FsStatRequest, context: Any
    ) -> alloc_pb2.FsStatResponse:
        if not request.path:
            raise InvalidArgument("path", "must provide a file path")
        fs = self._fs(request.alloc_id, request.path)
        return alloc_pb2.FsStatResponse(info=await _fs_call(fs.stat, request.path))

    async def Stream(
        self, request: alloc_pb2.FsStreamRequest, context: Any
    ) -> AsyncIterator[alloc_pb2.FsStreamFrame]:
        if not request.path:
            raise InvalidArgument("path", "must provide a file path")
        origin = request.origin or "start"
        if origin not in ("start", "end"):
            raise InvalidArgument("origin", "origin must be start or end")
        if request.offset < 0:
            raise InvalidArgument("offset", "must not be negative (count from the end: origin end)")
        if request.limit < 0:
            raise InvalidArgument("limit", "must not be negative")
        fs = self._fs(request.alloc_id, request.path)
        fd, st = await _fs_call(fs.open, request.path)
        try:
            offset = max(st.st_size - request.offset, 0) if origin == "end" else request.offset
            async for frame in _stream_file(
                fd, request.path, offset, request.limit, request.follow, self.stopping
            ):
                yield frame
        finally:
            os.close(fd)


async def _fs_call(fn: Callable[[str], T], path: str) -> T:
    """A blocking AllocFS call in a thread, its failures as statuses."""
    try:
        return await asyncio.to_thread(fn, path)
    except Escape:
        raise InvalidArgument("path", "Path escapes the alloc directory") from None
    except SecretFile as exc:
        raise PermissionDenied(str(exc)) from None
    except FileNotFoundError:
        raise NotFound(f"stat {path}: no such file or directory") from None
    except (NotADirectoryError, IsADirectoryError) as exc:
        raise InvalidArgument("path", str(exc) or f"{path}: not a directory") from None
    except PermissionError:
        raise PermissionDenied(f"{path}: permission denied") from None
    except OSError as exc:  # a name too long, too many links, ...
        raise InvalidArgument("path", f"{path}: {exc.strerror or exc}") from None


async def _stream_file(
    fd: int, path: str, offset: int, limit: int, follow: bool, stopping: asyncio.Event
) -> AsyncIterator[alloc_pb2.FsStreamFrame]:
    """Nomad's streamFile: frames from `offset`, at most `limit` bytes; with
    `follow`, what is appended later, a "file truncated" frame (and reading
    from 0) when the file shrinks, "file deleted" (and the end) when it is
    removed, and a heartbeat each second nothing else is sent."""
    left = limit if limit > 0 else -1
    idle = 0.0
    event = ""
    while left != 0:
        want = FRAME_BYTES if left < 0 else min(FRAME_BYTES, left)
        data = await asyncio.to_thread(os.pread, fd, want, offset)
        if data or event:
            offset += len(data)
            left = left - len(data) if left > 0 else left
            yield alloc_pb2.FsStreamFrame(data=data, offset=offset, file=path, file_event=event)
            event, idle = "", 0.0
            continue
        if not follow or stopping.is_set():
            return
        st = os.fstat(fd)
        if st.st_nlink == 0:
            yield alloc_pb2.FsStreamFrame(offset=offset, file=path, file_event=FILE_DELETED)
            return
        if st.st_size < offset:
            offset, event = 0, FILE_TRUNCATED
            continue
        await asyncio.sleep(FOLLOW_POLL_S)
        idle += FOLLOW_POLL_S
        if idle >= HEARTBEAT_S:
            idle = 0.0
            yield alloc_pb2.FsStreamFrame()
