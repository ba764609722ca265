"""What the agent serves at its address (Node.http_addr): `ClientAlloc`
(a task's stdout/stderr, from the start or the end, optionally followed;
an alloc's resource usage; the latest results of its service checks) and
`ClientStats` (the host's)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any, Protocol

from corral.domain.errors import InvalidArgument, NotFound
from corral.security import access
from corral.v1 import alloc_pb2, alloc_pb2_grpc, node_pb2, node_pb2_grpc
from corral.v1 import structs_pb2 as pb
from services.agent.allocdir import AllocDir

CHUNK = 64 * 1024


class AllocView(Protocol):
    """An alloc this agent runs, as its handlers need it (AllocRunner)."""

    @property
    def namespace(self) -> str: ...

    def task_names(self) -> list[str]: ...

    def usage(self, task: str = "") -> pb.AllocResourceUsage: ...

    def check_results(self) -> list[pb.CheckResult]: ...


class ClientAllocServicer(alloc_pb2_grpc.ClientAllocServicer):
    """`lookup` finds an alloc this agent runs (None for one it does not):
    reading its logs takes read-logs in its namespace, its stats and check
    results read-job."""

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

    async def Checks(
        self, request: alloc_pb2.AllocChecksRequest, context: Any
    ) -> alloc_pb2.AllocChecksResponse:
        """Nomad's /v1/client/allocation/:id/checks: the alloc's checks as
        this client last ran them (none once the alloc stopped)."""
        view = self._alloc(request.alloc_id)
        access.require_namespace(view.namespace, access.READ_JOB)
        return alloc_pb2.AllocChecksResponse(results=view.check_results())

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
        path = alloc_dir.task(task).log_path(kind)
        if not path.parent.is_dir():
            raise NotFound(f"task {task!r} has not started on this node")
        path.touch(exist_ok=True)
        with path.open("rb") as f:
            size = path.stat().st_size
            offset = max(0, size - request.offset) if origin == "end" else min(request.offset, size)
            f.seek(offset)
            while True:
                data = f.read(CHUNK)
                if data:
                    yield alloc_pb2.AllocLogsChunk(data=data, offset=offset)
                    offset += len(data)
                    continue
                if not request.follow or self.stopping.is_set():
                    return
                await asyncio.sleep(0.25)

    async def Stats(
        self, request: alloc_pb2.AllocStatsRequest, context: Any
    ) -> alloc_pb2.AllocStatsResponse:
        view = self._alloc(request.alloc_id)
        access.require_namespace(view.namespace, access.READ_JOB)
        if request.task and request.task not in view.task_names():
            raise NotFound(f"task {request.task!r} not found in alloc {request.alloc_id!r}")
        return alloc_pb2.AllocStatsResponse(usage=view.usage(request.task))


class ClientStatsServicer(node_pb2_grpc.ClientStatsServicer):
    """`host` answers this node's id and its latest host stats."""

    def __init__(self, host: Callable[[], tuple[str, pb.HostStats]]) -> None:
        self.host = host

    async def Stats(
        self, request: node_pb2.ClientStatsRequest, context: Any
    ) -> node_pb2.ClientStatsResponse:
        node_id, stats = self.host()
        return node_pb2.ClientStatsResponse(stats=stats, node_id=node_id)
