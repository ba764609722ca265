"""What the agent serves at its address (Node.http_addr): `ClientAlloc`
(a task's stdout/stderr, from the start or the end, optionally followed
across rotated files; an alloc's resource usage; the latest results of its
service checks; signals and restarts of its tasks) and `ClientStats` (the
host's)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any, Protocol

from corral.domain.errors import FailedPrecondition, InvalidArgument, NotFound
from corral.security import access
from corral.v1 import alloc_pb2, alloc_pb2_grpc, node_pb2, node_pb2_grpc
from corral.v1 import structs_pb2 as pb
from services.agent import logs
from services.agent.allocdir import AllocDir
from services.agent.drivers.base import parse_signal
from services.agent.runner import TaskNotRunning

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
    ) -> None:
        self.data_dir = data_dir
        self.stopping = stopping
        self.lookup = lookup

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


class ClientStatsServicer(node_pb2_grpc.ClientStatsServicer):
    """`host` answers this node's id and its latest host stats."""

    def __init__(self, host: Callable[[], tuple[str, pb.HostStats]]) -> None:
        self.host = host

    async def Stats(
        self, request: node_pb2.ClientStatsRequest, context: Any
    ) -> node_pb2.ClientStatsResponse:
        node_id, stats = self.host()
        return node_pb2.ClientStatsResponse(stats=stats, node_id=node_id)
