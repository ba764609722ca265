"""`ClientAlloc.Logs`, served by the agent: a task's stdout/stderr file,
from the start or the end, optionally followed."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

from corral.domain.errors import InvalidArgument, NotFound
from corral.security import access
from corral.v1 import alloc_pb2, alloc_pb2_grpc

CHUNK = 64 * 1024


class ClientAllocServicer(alloc_pb2_grpc.ClientAllocServicer):
    """`namespace_of` names the namespace of an alloc this agent runs (None
    for one it does not): reading its logs takes read-logs there."""

    def __init__(
        self,
        data_dir: Path,
        stopping: asyncio.Event,
        namespace_of: Callable[[str], str | None],
    ) -> None:
        self.data_dir = data_dir
        self.stopping = stopping
        self.namespace_of = namespace_of

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
        namespace = self.namespace_of(request.alloc_id) if request.alloc_id else None
        alloc_dir = self.data_dir / "allocs" / request.alloc_id
        if namespace is None or not alloc_dir.is_dir():
            raise NotFound(f"alloc {request.alloc_id!r} has no files on this node")
        access.require_namespace(namespace, "read-logs")
        tasks = sorted(p.name for p in alloc_dir.iterdir() if p.is_dir() and p.name != "alloc")
        task = request.task or (tasks[0] if len(tasks) == 1 else "")
        if task not in tasks:
            raise InvalidArgument("task", f"name one of: {', '.join(tasks)}")
        path = alloc_dir / task / f"{kind}.log"
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
