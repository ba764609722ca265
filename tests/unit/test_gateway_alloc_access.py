"""The gateway's alloc exec, job action and fs routes without a cluster:
which endpoint each path reaches (ahead of the 501 catch-all), Nomad's exec
frames both ways, and AllocFileInfo as Nomad's JSON."""

from __future__ import annotations

import base64
import json

import pytest
from starlette.routing import Match

from corral.v1 import alloc_pb2
from services.gateway.app import routes
from services.gateway.http import NomadError
from services.gateway.routes import alloc_exec, fs


@pytest.mark.parametrize(
    ("kind", "path", "endpoint"),
    [
        ("http", "/v1/client/fs/ls/abc", "ls"),
        ("http", "/v1/client/fs/stat/abc", "stat"),
        ("http", "/v1/client/fs/cat/abc", "cat"),
        ("http", "/v1/client/fs/readat/abc", "readat"),
        ("http", "/v1/client/fs/stream/abc", "stream"),
        ("http", "/v1/client/fs/logs/abc", "logs"),
        ("websocket", "/v1/client/allocation/abc/exec", "exec_socket"),
        ("websocket", "/v1/job/abc/action", "action_socket"),
        ("websocket", "/v1/job/a/periodic-1/action", "action_socket"),
        ("http", "/v1/job/abc/actions", "job_actions"),
        # a plain request to the action: the job route answers 400 (upgrade)
        ("http", "/v1/job/abc/action", "job"),
    ],
)
def test_routes_reach_their_endpoints(kind: str, path: str, endpoint: str) -> None:
    scope = {"type": kind, "method": "GET", "path": path, "root_path": ""}
    for route in routes():
        match, _ = route.matches(scope)
        if match is Match.FULL:
            assert route.endpoint.__name__ == endpoint, route  # type: ignore[attr-defined]
            return
    raise AssertionError(f"no route for {path}")


def test_exec_input_frames() -> None:
    data = base64.b64encode(b"ls\n").decode()
    msg = alloc_exec._input(json.dumps({"stdin": {"data": data}}))
    assert msg == alloc_pb2.AllocExecRequest(stdin=alloc_pb2.ExecIO(data=b"ls\n"))
    msg = alloc_exec._input('{"stdin": {"close": true}}')
    assert msg == alloc_pb2.AllocExecRequest(stdin=alloc_pb2.ExecIO(close=True))
    msg = alloc_exec._input('{"tty_size": {"height": 40, "width": 100000}}')
    assert msg == alloc_pb2.AllocExecRequest(
        tty_size=alloc_pb2.TerminalSize(height=40, width=65535)
    )
    assert alloc_exec._input("{}") is None  # a heartbeat
    for bad in ("[1]", "not json", '{"stdin": {"data": "***"}}', '{"tty_size": {"height": "x"}}'):
        with pytest.raises(NomadError) as err:
            alloc_exec._input(bad)
        assert err.value.status == 400


def test_exec_output_frames() -> None:
    out = alloc_exec._output(alloc_pb2.AllocExecResponse(stdout=alloc_pb2.ExecIO(data=b"hi")))
    assert out == {"stdout": {"data": base64.b64encode(b"hi").decode()}}
    out = alloc_exec._output(alloc_pb2.AllocExecResponse(stderr=alloc_pb2.ExecIO(close=True)))
    assert out == {"stderr": {"close": True}}
    out = alloc_exec._output(alloc_pb2.AllocExecResponse(exited=True, exit_code=3))
    assert out == {"exited": True, "result": {"exit_code": 3}}


def test_close_reasons_fit_a_close_frame() -> None:
    reason = alloc_exec._reason("é" * 500)
    assert len(reason.encode()) <= alloc_exec.MAX_REASON_BYTES
    assert alloc_exec._ws_code(500) == 1011 and alloc_exec._ws_code(403) == 1008


def test_file_info_is_nomads() -> None:
    info = alloc_pb2.AllocFileInfo(
        name="a.txt", size=3, file_mode="-rw-r--r--", mod_time=1_700_000_000_123_456_789
    )
    assert fs.file_info(info) == {
        "Name": "a.txt",
        "IsDir": False,
        "Size": 3,
        "FileMode": "-rw-r--r--",
        "ModTime": "2023-11-14T22:13:20.123456789Z",
        "ContentType": "",
    }
