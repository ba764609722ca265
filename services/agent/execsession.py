"""The agent's side of an `alloc exec` session: start the session process
(services/agent/executor/session.py) with the command's spec and, for an
isolated task, a pidfd of the task's init; relay stdin, the terminal size
and the output; learn the exit code. Closing the session closes the control
socket, and the session process kills the command.

Why a process of its own: entering a task's namespaces changes the
calling process for good (and its mount namespace only when it is single
threaded), and the agent is a multi-threaded server that must not fork.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import json
import os
import socket
import struct
import subprocess
import sys
import termios
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from services.agent.drivers.base import DriverError
from services.agent.drivers.executor_handle import executor_env
from services.agent.executor.session import ExecSpec

#: how long the session process may take to start the command
START_TIMEOUT = 30.0
#: once the command exited, how long output its leftover children still
#: hold open is waited for before the session ends anyway
DRAIN_S = 1.0
#: bytes per read of the command's output
READ_BYTES = 32 * 1024
#: how long the session process may take to go once told to
STOP_TIMEOUT = 5.0
#: the end-of-file character a terminal turns into EOF (Ctrl-D)
EOT = b"\x04"


def _first_answer(sock: socket.socket) -> tuple[dict[str, Any], list[int], bytes]:
    """The first JSON line (and any fds sent with it), and what followed it
    (blocking: run in a thread)."""
    buf = b""
    fds: list[int] = []
    while b"\n" not in buf:
        data, got, _, _ = socket.recv_fds(sock, 65536, 4)
        fds.extend(got)
        if not data:
            break
        buf += data
    line, _, rest = buf.partition(b"\n")
    try:
        answer: dict[str, Any] = json.loads(line) if line else {}
    except ValueError:
        answer = {}
    return answer, fds, rest


class HelperSession:
    """A command run by a session process (see the module doc)."""

    def __init__(
        self,
        proc: subprocess.Popen[bytes],
        control: socket.socket,
        stdio: _Stdio,
        leftover: bytes,
    ) -> None:
        self.proc = proc
        self.control = control
        self.stdio = stdio
        self._exit: asyncio.Future[int] = asyncio.ensure_future(self._read_exit(leftover))
        self._closed = False

    @classmethod
    async def start(cls, spec: ExecSpec, pidfd: int | None) -> HelperSession:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        args = [
            sys.executable,
            "-m",
            "services.agent.executor.session",
            "--control",
            str(theirs.fileno()),
        ]
        pass_fds = [theirs.fileno()]
        if pidfd is not None:
            args += ["--pidfd", str(pidfd)]
            pass_fds.append(pidfd)
        stdio = _Stdio.make(spec.tty)
        try:
            # the standard library's, not the event loop's: it closes every
            # descriptor but the ones passed (a uvloop child inherits them)
            proc = subprocess.Popen(
                args,
                stdin=stdio.child[0],
                stdout=stdio.child[1],
                stderr=stdio.child[2],
                pass_fds=pass_fds,
                close_fds=True,
                env=executor_env(),
                start_new_session=True,
            )
        except OSError as exc:
            ours.close()
            stdio.close()
            raise DriverError(f"starting the exec session: {exc}") from None
        finally:
            theirs.close()
            stdio.close_child()
        try:
            ours.sendall(spec.to_json().encode() + b"\n")
            answer, fds, rest = await asyncio.wait_for(
                asyncio.to_thread(_first_answer, ours), START_TIMEOUT
            )
        except (OSError, TimeoutError) as exc:
            ours.close()
            await _reap(proc)
            why = _tail(stdio.err) or str(exc) or "timed out"
            stdio.close()
            raise DriverError(f"the exec session did not start: {why}") from None
        if "pid" not in answer:
            for fd in fds:
                os.close(fd)
            ours.close()
            await _reap(proc)
            why = str(answer.get("error") or _tail(stdio.err) or "the exec session failed")
            stdio.close()
            raise DriverError(why)
        if fds:
            stdio.master = fds[0]
            os.set_blocking(fds[0], False)
            for fd in fds[1:]:
                os.close(fd)
        ours.setblocking(False)
        return cls(proc, ours, stdio, rest)

    async def _read_exit(self, buf: bytes) -> int:
        loop = asyncio.get_running_loop()
        while b"\n" not in buf:
            try:
                data = await loop.sock_recv(self.control, 4096)
            except OSError:
                data = b""
            if not data:
                return -1  # the session process died without an answer
            buf += data
        try:
            return int(json.loads(buf.partition(b"\n")[0]).get("exit_code", -1))
        except (ValueError, AttributeError):
            return -1

    # ------------------------------------------------------------ input

    async def write(self, data: bytes) -> None:
        fd = self.stdio.master if self.stdio.master is not None else self.stdio.stdin
        if fd is not None:
            await _write_fd(fd, data)

    async def close_stdin(self) -> None:
        """EOF on the command's stdin (on a terminal: Ctrl-D, which a
        terminal reads as the end of input)."""
        if self.stdio.master is not None:
            await _write_fd(self.stdio.master, EOT)
        else:
            self.stdio.close_stdin()

    def resize(self, height: int, width: int) -> None:
        if self.stdio.master is not None:
            with contextlib.suppress(OSError):
                fcntl.ioctl(
                    self.stdio.master,
                    termios.TIOCSWINSZ,
                    struct.pack("HHHH", height, width, 0, 0),
                )

    # ------------------------------------------------------------ output

    async def output(self) -> AsyncIterator[tuple[str, bytes]]:
        queue: asyncio.Queue[tuple[str, bytes] | None] = asyncio.Queue(maxsize=8)
        sources = (
            [("stdout", self.stdio.master)]
            if self.stdio.master is not None
            else [("stdout", self.stdio.out), ("stderr", self.stdio.err)]
        )
        pumps = [
            asyncio.create_task(_pump_fd(fd, name, queue)) for name, fd in sources if fd is not None
        ]
        open_pumps = len(pumps)
        try:
            while open_pumps:
                item: tuple[str, bytes] | None
                if self._exit.done():
                    try:
                        item = await asyncio.wait_for(queue.get(), DRAIN_S)
                    except TimeoutError:
                        return  # output held open by what the command left behind
                else:
                    getter = asyncio.ensure_future(queue.get())
                    waits: set[asyncio.Future[Any]] = {getter, self._exit}
                    await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
                    if not getter.done():
                        getter.cancel()
                        continue
                    item = getter.result()
                if item is None:
                    open_pumps -= 1
                    continue
                yield item
        finally:
            for pump in pumps:
                pump.cancel()
            # their readers go before the descriptors can be closed
            await asyncio.gather(*pumps, return_exceptions=True)

    async def wait(self) -> int:
        return await asyncio.shield(self._exit)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._exit.cancel()
        await asyncio.gather(self._exit, return_exceptions=True)
        self.control.close()  # the session process kills the command
        self.stdio.close()
        await _reap(self.proc)


@dataclass
class _Stdio:
    """The command's standard streams: pipes (the parent's ends
    non-blocking), or with a terminal nothing until the master arrives."""

    child: tuple[int, int, int]
    stdin: int | None = None
    out: int | None = None
    err: int | None = None
    master: int | None = None
    _child_open: bool = True

    @classmethod
    def make(cls, tty: bool) -> _Stdio:
        if tty:
            null = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
            return cls((null, null, null))
        in_r, in_w = os.pipe2(os.O_CLOEXEC)
        out_r, out_w = os.pipe2(os.O_CLOEXEC)
        err_r, err_w = os.pipe2(os.O_CLOEXEC)
        for fd in (in_w, out_r, err_r):
            os.set_blocking(fd, False)
        return cls((in_r, out_w, err_w), stdin=in_w, out=out_r, err=err_r)

    def close_child(self) -> None:
        if self._child_open:
            self._child_open = False
            for fd in set(self.child):
                os.close(fd)

    def close_stdin(self) -> None:
        if self.stdin is not None:
            os.close(self.stdin)
            self.stdin = None

    def close(self) -> None:
        self.close_child()
        self.close_stdin()
        for name in ("out", "err", "master"):
            fd = getattr(self, name)
            if fd is not None:
                with contextlib.suppress(OSError):
                    os.close(fd)
                setattr(self, name, None)


def _tail(fd: int | None, limit: int = 2000) -> str:
    """What a session process that died at once said on its stderr."""
    if fd is None:
        return ""
    try:
        data = os.read(fd, 65536)
    except OSError:
        return ""
    return data.decode(errors="replace")[-limit:].strip()


async def _reap(proc: subprocess.Popen[bytes]) -> None:
    try:
        await asyncio.to_thread(proc.wait, STOP_TIMEOUT)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()  # its command dies with it (parent-death signal)
        await asyncio.to_thread(proc.wait)


async def _pump_fd(fd: int, name: str, queue: asyncio.Queue[tuple[str, bytes] | None]) -> None:
    try:
        while data := await _read_fd(fd):
            await queue.put((name, data))
    finally:
        await queue.put(None)


async def _read_fd(fd: int) -> bytes:
    """The next bytes of a non-blocking fd; b"" at its end (a terminal's
    master reads EIO once nothing holds its other side open)."""
    loop = asyncio.get_running_loop()
    while True:
        try:
            return os.read(fd, READ_BYTES)
        except BlockingIOError:
            pass
        except OSError as exc:
            if exc.errno == errno.EIO:
                return b""
            raise
        ready: asyncio.Future[None] = loop.create_future()
        loop.add_reader(fd, _wake, ready)
        try:
            await ready
        finally:
            loop.remove_reader(fd)


async def _write_fd(fd: int, data: bytes) -> None:
    loop = asyncio.get_running_loop()
    view = memoryview(data)
    while view:
        try:
            view = view[os.write(fd, view) :]
            continue
        except BlockingIOError:
            pass
        ready: asyncio.Future[None] = loop.create_future()
        loop.add_writer(fd, _wake, ready)
        try:
            await ready
        finally:
            loop.remove_writer(fd)


def _wake(ready: asyncio.Future[None]) -> None:
    if not ready.done():
        ready.set_result(None)
