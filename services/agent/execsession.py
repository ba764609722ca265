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
import sys
import termios
from collections.abc import AsyncIterator
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
        proc: asyncio.subprocess.Process,
        control: socket.socket,
        master: int | None,
        leftover: bytes,
    ) -> None:
        self.proc = proc
        self.control = control
        self.master = master
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
        stdio = asyncio.subprocess.DEVNULL if spec.tty else asyncio.subprocess.PIPE
        try:
            proc = await asyncio.create_subprocess_exec(
                *args,
                stdin=stdio,
                stdout=stdio,
                stderr=stdio,
                pass_fds=pass_fds,
                env=executor_env(),
                start_new_session=True,
            )
        except OSError as exc:
            ours.close()
            raise DriverError(f"starting the exec session: {exc}") from None
        finally:
            theirs.close()
        try:
            ours.sendall(spec.to_json().encode() + b"\n")
            answer, fds, rest = await asyncio.wait_for(
                asyncio.to_thread(_first_answer, ours), START_TIMEOUT
            )
        except (OSError, TimeoutError) as exc:
            ours.close()
            await _reap(proc)
            raise DriverError(f"the exec session did not start: {exc or 'timed out'}") from None
        if "pid" not in answer:
            for fd in fds:
                os.close(fd)
            ours.close()
            await _reap(proc)
            raise DriverError(str(answer.get("error") or "the exec session failed to start"))
        master = fds[0] if fds else None
        for fd in fds[1:]:
            os.close(fd)
        if master is not None:
            os.set_blocking(master, False)
        ours.setblocking(False)
        return cls(proc, ours, master, rest)

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
        if self.master is not None:
            await _write_fd(self.master, data)
        elif self.proc.stdin is not None and not self.proc.stdin.is_closing():
            self.proc.stdin.write(data)
            with contextlib.suppress(ConnectionError):
                await self.proc.stdin.drain()

    async def close_stdin(self) -> None:
        """EOF on the command's stdin (on a terminal: Ctrl-D, which a
        terminal reads as the end of input)."""
        if self.master is not None:
            await _write_fd(self.master, EOT)
        elif self.proc.stdin is not None:
            self.proc.stdin.close()

    def resize(self, height: int, width: int) -> None:
        if self.master is not None:
            with contextlib.suppress(OSError):
                fcntl.ioctl(
                    self.master, termios.TIOCSWINSZ, struct.pack("HHHH", height, width, 0, 0)
                )

    # ------------------------------------------------------------ output

    async def output(self) -> AsyncIterator[tuple[str, bytes]]:
        queue: asyncio.Queue[tuple[str, bytes] | None] = asyncio.Queue(maxsize=8)
        pumps: list[asyncio.Task[None]] = []
        if self.master is not None:
            pumps.append(asyncio.create_task(_pump_fd(self.master, "stdout", queue)))
        else:
            for name, stream in (("stdout", self.proc.stdout), ("stderr", self.proc.stderr)):
                if stream is not None:
                    pumps.append(asyncio.create_task(_pump_stream(stream, name, queue)))
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

    async def wait(self) -> int:
        return await asyncio.shield(self._exit)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.control.close()  # the session process kills the command
        if self.master is not None:
            with contextlib.suppress(OSError):
                os.close(self.master)
            self.master = None
        self._exit.cancel()
        await _reap(self.proc)


async def _reap(proc: asyncio.subprocess.Process) -> None:
    try:
        await asyncio.wait_for(proc.wait(), STOP_TIMEOUT)
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()  # its command dies with it (parent-death signal)
        await proc.wait()


async def _pump_stream(
    stream: asyncio.StreamReader, name: str, queue: asyncio.Queue[tuple[str, bytes] | None]
) -> None:
    try:
        while data := await stream.read(READ_BYTES):
            await queue.put((name, data))
    finally:
        await queue.put(None)


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
