"""ClientFS over a real gRPC server on a real alloc directory: ls, stat and
reads confined to the alloc directory (`..` and symlinks out refused, a
relative symlink inside followed), secrets listed but never read, device
nodes never opened, and streams with offsets, limits, origins and follow
(appends, truncation, deletion)."""

from __future__ import annotations

import asyncio
import os
import stat
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from corral.runtime.server import GrpcServer
from corral.security import transport
from corral.testing import mock
from corral.v1 import alloc_pb2, alloc_pb2_grpc
from services.agent.allocdir import AllocDir
from services.agent.allocfs import go_file_mode, sniff_content_type
from services.agent.drivers.mock import MockDriver
from services.agent.handlers import ClientFSServicer
from services.agent.runner import AllocRunner
from tests.wait import until

ALLOC = "3f1e2d4c-5b6a-4978-8c9d-0e1f2a3b4c5d"


@pytest.fixture
async def fs(tmp_path: Path) -> AsyncIterator[tuple[alloc_pb2_grpc.ClientFSAsyncStub, Path]]:
    data = tmp_path / "data"
    job = mock.job()
    alloc = mock.alloc(job, mock.node())
    alloc.id = ALLOC
    runner = AllocRunner(alloc, job, {"mock": MockDriver()}, data, lambda r: None)
    alloc_dir = AllocDir.of(data, ALLOC)
    alloc_dir.build()
    td = alloc_dir.task("web")
    td.build()
    (td.local / "app.conf").write_text("port = 80\n")
    (td.secrets / "token").write_text("s3cr3t")
    (td.local / "to-conf").symlink_to("app.conf")
    (td.local / "to-secret").symlink_to("../secrets/token")
    (td.local / "etc").symlink_to("/etc")
    (td.local / "up").symlink_to("../../../..")
    (tmp_path / "outside.txt").write_text("not yours")
    server = GrpcServer("127.0.0.1:0", name="agent")
    server.add(
        alloc_pb2_grpc.add_ClientFSServicer_to_server,
        ClientFSServicer(data, server.shutting_down, {ALLOC: runner}.get),
        alloc_pb2.DESCRIPTOR.services_by_name["ClientFS"].full_name,
    )
    await server.start()
    try:
        async with transport.dial(server.bound_address) as ch:
            yield alloc_pb2_grpc.ClientFSStub(ch), alloc_dir.dir
    finally:
        await server.stop(0)


async def cat(stub: alloc_pb2_grpc.ClientFSAsyncStub, path: str, **kw: object) -> bytes:
    request = alloc_pb2.FsStreamRequest(alloc_id=ALLOC, path=path, **kw)  # type: ignore[arg-type]
    return b"".join([f.data async for f in stub.Stream(request)])


async def refused(call: object, code: grpc.StatusCode) -> str:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await call  # type: ignore[misc]
    assert err.value.code() == code, err.value.details()
    return err.value.details() or ""


async def test_ls_and_stat(fs: tuple[alloc_pb2_grpc.ClientFSAsyncStub, Path]) -> None:
    stub, root = fs
    top = await stub.List(alloc_pb2.FsListRequest(alloc_id=ALLOC, path="/"))
    assert [(f.name, f.is_dir) for f in top.files] == [("alloc", True), ("web", True)]
    local = await stub.List(alloc_pb2.FsListRequest(alloc_id=ALLOC, path="web/local"))
    by_name = {f.name: f for f in local.files}
    assert by_name["app.conf"].size == 10 and by_name["app.conf"].file_mode == "-rw-r--r--"
    assert by_name["to-conf"].file_mode.startswith("L")  # listed as the link it is
    assert by_name["app.conf"].mod_time == (root / "web/local/app.conf").stat().st_mtime_ns
    # secrets are listed, as in Nomad
    secrets = await stub.List(alloc_pb2.FsListRequest(alloc_id=ALLOC, path="web/secrets"))
    assert [f.name for f in secrets.files] == ["token"]
    info = (await stub.Stat(alloc_pb2.FsStatRequest(alloc_id=ALLOC, path="web/local/to-conf"))).info
    assert (info.name, info.size, info.content_type) == (
        "to-conf",
        10,
        "text/plain; charset=utf-8",
    )
    tmp = (await stub.Stat(alloc_pb2.FsStatRequest(alloc_id=ALLOC, path="web/tmp"))).info
    assert tmp.is_dir and tmp.file_mode == "dtrwxrwxrwx"


async def test_reads_follow_links_inside_but_never_out(
    fs: tuple[alloc_pb2_grpc.ClientFSAsyncStub, Path],
) -> None:
    stub, _ = fs
    assert await cat(stub, "web/local/to-conf") == b"port = 80\n"
    assert await cat(stub, "alloc/../web/local/app.conf") == b"port = 80\n"
    for path in ("../outside.txt", "web/../../outside.txt", "web/local/up/outside.txt"):
        details = await refused(cat(stub, path), grpc.StatusCode.INVALID_ARGUMENT)
        assert "escapes the alloc directory" in details, path
    for path in ("web/local/etc/passwd", "web/local/etc"):
        details = await refused(cat(stub, path), grpc.StatusCode.INVALID_ARGUMENT)
        assert "escapes the alloc directory" in details, path
    details = await refused(
        stub.List(alloc_pb2.FsListRequest(alloc_id=ALLOC, path="web/local/etc")),
        grpc.StatusCode.INVALID_ARGUMENT,
    )
    assert "escapes" in details


async def test_secrets_are_never_read(fs: tuple[alloc_pb2_grpc.ClientFSAsyncStub, Path]) -> None:
    stub, _ = fs
    for path in ("web/secrets/token", "web/local/to-secret", "web/./secrets/../secrets/token"):
        details = await refused(cat(stub, path), grpc.StatusCode.PERMISSION_DENIED)
        assert details == f"Reading secret file prohibited: {path}", path


@pytest.mark.skipif(os.geteuid() != 0, reason="making a device node needs root")
async def test_a_device_node_is_never_opened(
    fs: tuple[alloc_pb2_grpc.ClientFSAsyncStub, Path],
) -> None:
    stub, root = fs
    os.mknod(root / "web/local/disk", 0o600 | stat.S_IFCHR, os.makedev(1, 5))  # /dev/zero
    details = await refused(cat(stub, "web/local/disk"), grpc.StatusCode.INVALID_ARGUMENT)
    assert "not a regular file" in details
    info = (await stub.Stat(alloc_pb2.FsStatRequest(alloc_id=ALLOC, path="web/local/disk"))).info
    assert info.content_type == "application/octet-stream" and info.file_mode.startswith("Dc")


async def test_offsets_limits_and_origins(
    fs: tuple[alloc_pb2_grpc.ClientFSAsyncStub, Path],
) -> None:
    stub, _ = fs
    assert await cat(stub, "web/local/app.conf", offset=5) == b"= 80\n"
    assert await cat(stub, "web/local/app.conf", offset=3, origin="end") == b"80\n"
    assert await cat(stub, "web/local/app.conf", offset=2, limit=3) == b"rt "
    details = await refused(cat(stub, "web/local"), grpc.StatusCode.INVALID_ARGUMENT)
    assert "is a directory" in details
    await refused(cat(stub, "web/local/missing"), grpc.StatusCode.NOT_FOUND)
    await refused(cat(stub, "web/local/app.conf", offset=-1), grpc.StatusCode.INVALID_ARGUMENT)
    await refused(cat(stub, "x", origin="middle"), grpc.StatusCode.INVALID_ARGUMENT)
    await refused(cat(stub, "web/\x00x"), grpc.StatusCode.INVALID_ARGUMENT)
    await refused(cat(stub, "a/" * 3000), grpc.StatusCode.INVALID_ARGUMENT)
    await refused(
        stub.Stat(alloc_pb2.FsStatRequest(alloc_id="elsewhere", path="x")),
        grpc.StatusCode.NOT_FOUND,
    )


async def test_follow_sees_appends_truncation_and_deletion(
    fs: tuple[alloc_pb2_grpc.ClientFSAsyncStub, Path],
) -> None:
    stub, root = fs
    path = root / "alloc/logs/app.log"
    path.write_bytes(b"one\n")
    frames: list[alloc_pb2.FsStreamFrame] = []

    async def follow() -> None:
        request = alloc_pb2.FsStreamRequest(alloc_id=ALLOC, path="alloc/logs/app.log", follow=True)
        async for frame in stub.Stream(request):
            frames.append(frame)

    reader = asyncio.create_task(follow())
    data = lambda: b"".join(f.data for f in frames)  # noqa: E731
    await until(lambda: data() == b"one\n")
    with path.open("ab") as f:
        f.write(b"two\n")
    await until(lambda: data() == b"one\ntwo\n")
    assert frames[-1].offset == 8 and frames[-1].file == "alloc/logs/app.log"
    path.write_bytes(b"3\n")  # truncated, then written again
    await until(lambda: any(f.file_event == "file truncated" for f in frames))
    await until(lambda: data().endswith(b"3\n"))
    await until(lambda: any(f == alloc_pb2.FsStreamFrame() for f in frames))  # a heartbeat
    path.unlink()
    await asyncio.wait_for(reader, 10)
    assert frames[-1].file_event == "file deleted"


def test_go_file_modes_and_content_types() -> None:
    assert go_file_mode(stat.S_IFREG | 0o644) == "-rw-r--r--"
    assert go_file_mode(stat.S_IFDIR | 0o755) == "drwxr-xr-x"
    assert go_file_mode(stat.S_IFREG | stat.S_ISUID | 0o755) == "urwxr-xr-x"
    assert go_file_mode(stat.S_IFLNK | 0o777) == "Lrwxrwxrwx"
    assert go_file_mode(stat.S_IFIFO | 0o600) == "prw-------"
    assert sniff_content_type(b"\x89PNG\r\n\x1a\nrest", "x") == "image/png"
    assert sniff_content_type(b"  <html><body>", "x") == "text/html; charset=utf-8"
    assert sniff_content_type(b"hello", "x.json") == "application/json"
    assert sniff_content_type(b"\x00\x01binary", "x") == "application/octet-stream"
