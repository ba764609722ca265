"""ClientAlloc.Logs over a real gRPC server (port 0) on a task's files:
positions and origins, and bad ones refused with INVALID_ARGUMENT naming
the field (the fuzz test found a negative offset, or -2**63 from the end,
answered INTERNAL: a negative seek, an int64 overflow)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from corral.runtime.server import GrpcServer
from corral.security import transport
from corral.v1 import alloc_pb2, alloc_pb2_grpc
from services.agent.handlers import ClientAllocServicer

ALLOC = "0b7e1c9a-5d2f-4c4e-9a55-2f4d8e6b1a00"


@pytest.fixture
async def logs(tmp_path: Path) -> AsyncIterator[alloc_pb2_grpc.ClientAllocAsyncStub]:
    task_dir = tmp_path / "allocs" / ALLOC / "web"
    task_dir.mkdir(parents=True)
    (task_dir / "stdout.log").write_bytes(b"0123456789")
    server = GrpcServer("127.0.0.1:0", name="agent")
    server.add(
        alloc_pb2_grpc.add_ClientAllocServicer_to_server,
        ClientAllocServicer(
            tmp_path, server.shutting_down, lambda a: "default" if a == ALLOC else None
        ),
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
