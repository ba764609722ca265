"""ClientAlloc over a real gRPC server (port 0): Logs on a task's files —
positions and origins, and bad ones refused with INVALID_ARGUMENT naming
the field (the fuzz test found a negative offset, or -2**63 from the end,
answered INTERNAL: a negative seek, an int64 overflow) — and Stats'
NOT_FOUND answers."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from corral.runtime.server import GrpcServer
from corral.security import transport
from corral.testing import mock
from corral.v1 import alloc_pb2, alloc_pb2_grpc
from services.agent.allocdir import AllocDir
from services.agent.drivers.mock import MockDriver
from services.agent.handlers import ClientAllocServicer
from services.agent.runner import AllocRunner

ALLOC = "0b7e1c9a-5d2f-4c4e-9a55-2f4d8e6b1a00"


@pytest.fixture
async def logs(tmp_path: Path) -> AsyncIterator[alloc_pb2_grpc.ClientAllocAsyncStub]:
    job = mock.job()
    alloc = mock.alloc(job, mock.node())
    alloc.id = ALLOC
    runner = AllocRunner(alloc, job, {"mock": MockDriver()}, tmp_path, lambda r: None)
    log = AllocDir.of(tmp_path, ALLOC).task("web").log_path("stdout")
    log.parent.mkdir(parents=True)
    log.write_bytes(b"0123456789")
    server = GrpcServer("127.0.0.1:0", name="agent")
    server.add(
        alloc_pb2_grpc.add_ClientAllocServicer_to_server,
        ClientAllocServicer(tmp_path, server.shutting_down, {ALLOC: runner}.get),
        alloc_pb2.DESCRIPTOR.services_by_name["ClientAlloc"].full_name,
    )
    await server.start()
    try:
        async with transport.dial(server.bound_address) as ch:
            yield alloc_pb2_grpc.ClientAllocStub(ch)
    finally:
        await server.stop(0)


async def _read(stub: alloc_pb2_grpc.ClientAllocAsyncStub, **kw: object) -> bytes:
    request = alloc_pb2.AllocLogsRequest(alloc_id=ALLOC, **kw)  # type: ignore[arg-type]
    return b"".join([c.data async for c in stub.Logs(request)])


async def test_offsets_count_from_the_start_or_the_end(
    logs: alloc_pb2_grpc.ClientAllocAsyncStub,
) -> None:
    assert await _read(logs) == b"0123456789"
    assert await _read(logs, offset=7) == b"789"
    assert await _read(logs, offset=3, origin="end") == b"789"
    assert await _read(logs, offset=2**63 - 1) == b""
    assert await _read(logs, offset=2**63 - 1, origin="end") == b"0123456789"


@pytest.mark.parametrize(
    ("kw", "problem"),
    [
        ({"offset": -5}, "offset: must not be negative"),
        ({"offset": -(2**63), "origin": "end"}, "offset: must not be negative"),
        ({"origin": "middle"}, "origin: must be start or end"),
        ({"type": "stdin"}, "type: must be stdout or stderr"),
    ],
)
async def test_bad_positions_are_invalid_arguments(
    logs: alloc_pb2_grpc.ClientAllocAsyncStub, kw: dict[str, object], problem: str
) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await _read(logs, **kw)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, err.value.details()
    assert (err.value.details() or "").startswith(problem), err.value.details()


async def test_stats_of_an_alloc_this_node_does_not_run_or_a_missing_task(
    logs: alloc_pb2_grpc.ClientAllocAsyncStub,
) -> None:
    usage = await logs.Stats(alloc_pb2.AllocStatsRequest(alloc_id=ALLOC))
    assert dict(usage.usage.tasks) == {}  # its task is not running: nothing measured
    for request, problem in (
        (
            alloc_pb2.AllocStatsRequest(alloc_id="elsewhere"),
            "alloc 'elsewhere' is not on this node",
        ),
        (alloc_pb2.AllocStatsRequest(alloc_id=ALLOC, task="db"), "task 'db' not found"),
    ):
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await logs.Stats(request)
        assert err.value.code() == grpc.StatusCode.NOT_FOUND
        assert (err.value.details() or "").startswith(problem), err.value.details()


async def test_signal_and_restart_refuse_what_they_cannot_do(
    logs: alloc_pb2_grpc.ClientAllocAsyncStub,
) -> None:
    """The alloc's task was never started here: nothing to signal or restart."""
    cases: list[tuple[object, grpc.StatusCode, str]] = [
        (
            logs.Signal(alloc_pb2.AllocSignalRequest(alloc_id=ALLOC, signal="SIGNOPE")),
            grpc.StatusCode.INVALID_ARGUMENT,
            "signal: unknown signal 'SIGNOPE'",
        ),
        (
            logs.Signal(alloc_pb2.AllocSignalRequest(alloc_id=ALLOC, task="db", signal="HUP")),
            grpc.StatusCode.NOT_FOUND,
            "task 'db' not found",
        ),
        (
            logs.Signal(alloc_pb2.AllocSignalRequest(alloc_id=ALLOC, task="web")),
            grpc.StatusCode.FAILED_PRECONDITION,
            "task 'web' is not running",
        ),
        (
            logs.Restart(alloc_pb2.AllocRestartRequest(alloc_id=ALLOC, task="web", all_tasks=True)),
            grpc.StatusCode.INVALID_ARGUMENT,
            "task: task name cannot be set when restarting all tasks",
        ),
        (
            logs.Restart(alloc_pb2.AllocRestartRequest(alloc_id=ALLOC, task="web")),
            grpc.StatusCode.FAILED_PRECONDITION,
            "task 'web' is not running",
        ),
        (
            logs.Restart(alloc_pb2.AllocRestartRequest(alloc_id="elsewhere")),
            grpc.StatusCode.NOT_FOUND,
            "alloc 'elsewhere' is not on this node",
        ),
    ]
    for call, code, problem in cases:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await call  # type: ignore[misc]
        assert err.value.code() == code, err.value.details()
        assert (err.value.details() or "").startswith(problem), err.value.details()
