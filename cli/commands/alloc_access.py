"""`corral alloc exec` and `corral alloc fs`: a command run in a task, and
the files of an alloc's directory, straight from the agent running it
(its ClientAlloc.Exec and ClientFS, as `alloc logs` reads its logs).

exec follows Nomad's `alloc exec`: `-i` (default true) forwards stdin, `-t`
(default: whether stdin is a terminal) runs the command on a terminal —
the local terminal is put in raw mode, its size sent and kept up to date,
restored at the end; `-e` is the escape character (`~.` at the start of a
line closes the session, `none` disables it); the exit code is the
command's."""

from __future__ import annotations

import argparse
import os
import queue
import random
import signal
import sys
import termios
import threading
import tty
from collections.abc import Iterator
from types import FrameType
from typing import Any

import grpc

from cli.allocs import get_alloc
from cli.context import CliError, Context, common
from cli.jobs import resolve_job
from cli.output import fmt_bytes, fmt_time, print_json, short, table
from corral.domain.structs import ClientStatus
from corral.v1 import alloc_pb2, job_pb2, node_pb2, query_pb2
from corral.v1 import structs_pb2 as pb

#: bytes read from stdin at a time (Nomad's api reads 2 KiB)
STDIN_BYTES = 2048
#: what `-tail -n N` reads per line before trimming (Nomad's bytesToLines)
BYTES_PER_LINE = 120


class BoolFlag(argparse.Action):
    """Nomad's boolean flags: `-i`, `-i=true`, `-i=false` (and `-it`)."""

    def __init__(self, option_strings: list[str], dest: str, value: bool, **kw: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, **kw)
        self.value = value

    def __call__(self, parser: Any, namespace: Any, values: Any, option: Any = None) -> None:
        for dest in self.dest.split(","):
            setattr(namespace, dest, self.value)


#: the exec parser, for `separate_command`
_EXEC_PARSER: list[argparse.ArgumentParser] = []


def separate_command(args: list[str]) -> list[str]:
    """`alloc exec [flags] ALLOC COMMAND ARGS...` with a `--` after ALLOC:
    argparse would otherwise read the command's own flags (`sh -c`) as its
    options. Go's flag package, Nomad's, stops at the first argument that
    is not a flag; this does the same."""
    if args[:2] != ["alloc", "exec"] or not _EXEC_PARSER:
        return args
    takes_value = {
        option
        for action in _EXEC_PARSER[0]._actions
        if action.nargs != 0
        for option in action.option_strings
    }
    i = 2
    while i < len(args):
        arg = args[i]
        if arg == "--":
            return args  # separated already
        if arg.startswith("-") and arg != "-":
            i += 2 if arg in takes_value else 1
            continue
        return [*args[: i + 1], "--", *args[i + 1 :]]
    return args


def register(allocs: Any) -> None:
    p = allocs.add_parser(
        "exec",
        help="Run a command in a running task (its namespaces and root for exec)",
        description="Run COMMAND inside the environment of a task of ALLOC (or, with -job, "
        "of a random running alloc of JOB). Exits with the command's exit code.",
    )
    p.add_argument("-task", "--task", dest="task", default="", help="the task to run it in")
    p.add_argument(
        "-job", "--job", dest="job", action="store_true", help="the first argument is a job id"
    )
    p.add_argument("-group", "--group", dest="group", default="", help="with -job: this group")
    terminal_flags(p)
    p.add_argument("alloc", metavar="ALLOC|JOB", help="alloc id or prefix (a job id with -job)")
    p.add_argument("command", nargs=argparse.REMAINDER, help="the command and its arguments")
    p.set_defaults(func=cmd_exec)
    common(p)
    _EXEC_PARSER[:] = [p]

    p = allocs.add_parser("fs", help="List, stat or read the files of an allocation")
    p.add_argument("alloc")
    p.add_argument("path", nargs="?", default="/", help="inside the alloc directory (default /)")
    p.add_argument("-stat", "--stat", dest="stat", action="store_true", help="show file details")
    p.add_argument("-f", "-follow", "--follow", dest="follow", action="store_true")
    p.add_argument("-tail", "--tail", dest="tail", action="store_true", help="from the end")
    p.add_argument("-n", "--lines", dest="lines", type=int, default=10, help="lines with -tail")
    p.add_argument("-c", "--bytes", dest="bytes", type=int, default=0, help="bytes with -tail")
    p.add_argument("-H", dest="machine", action="store_true", help="sizes in bytes")
    p.add_argument(
        "-job", "--job", dest="job", action="store_true", help="the first argument is a job id"
    )
    p.set_defaults(func=cmd_fs)
    common(p, json=True, verbose=True)


def terminal_flags(p: argparse.ArgumentParser) -> None:
    """Nomad's `-i`, `-t` and `-e` of a command run in a task."""
    for name, dest in (("i", "stdin"), ("t", "tty")):
        p.add_argument(f"-{name}", f"-{name}=true", dest=dest, action=BoolFlag, value=True)
        p.add_argument(
            f"-{name}=false", dest=dest, action=BoolFlag, value=False, help=argparse.SUPPRESS
        )
    p.add_argument("-it", "-ti", dest="stdin,tty", action=BoolFlag, value=True, help="-i -t")
    p.add_argument(
        "-e",
        "--escape",
        dest="escape",
        default="~",
        help="escape character of a terminal session (~. closes it; 'none' disables it)",
    )
    p.set_defaults(stdin=True, tty=None)


def terminal_options(args: argparse.Namespace) -> tuple[bool, str]:
    """Whether to run on a terminal (`-t`, default: stdin is one) and the
    escape character, checked as Nomad checks them."""
    use_tty = sys.stdin.isatty() if args.tty is None else bool(args.tty)
    if use_tty and not args.stdin:
        raise CliError("-i must be enabled if running with tty")
    escape = "" if args.escape == "none" else str(args.escape)
    if len(escape) > 1:
        raise CliError("-e requires 'none' or a single character")
    return use_tty, escape


# ------------------------------------------------------------ finding the alloc


def random_job_alloc(ctx: Context, job_id: str, group: str = "") -> pb.Allocation:
    """Nomad's getRandomJobAlloc: any running alloc of the job (and group)."""
    job = resolve_job(ctx, job_id)
    resp: job_pb2.JobAllocationsResponse = ctx.client.jobs.Allocations(
        job_pb2.JobGetRequest(job_id=job.id, query=query_pb2.QueryOptions(namespace=job.namespace)),
        timeout=30,
    )
    running = [
        a
        for a in resp.allocs
        if a.client_status == ClientStatus.RUNNING and (not group or a.task_group == group)
    ]
    if not running:
        where = f" in group {group!r}" if group else ""
        raise CliError(f"no running allocations found for job {job.id}{where}")
    return get_alloc(ctx, random.choice(running).id)


def alloc_agent(ctx: Context, a: pb.Allocation) -> str:
    if not a.node_id:
        raise CliError(f'allocation "{short(a.id)}" is not placed on a node')
    node = ctx.client.nodes.Get(node_pb2.NodeGetRequest(node_id=a.node_id), timeout=30).node
    if not node.http_addr:
        raise CliError(f'node "{short(node.id)}" does not advertise an address for its agent')
    return node.http_addr


def alloc_task(a: pb.Allocation, task: str) -> str:
    names = sorted(a.task_states) or sorted(a.task_resources)
    if task:
        if names and task not in names:
            raise CliError(f'could not find task named "{task}" in allocation "{short(a.id)}"')
        return task
    if len(names) == 1:
        return names[0]
    raise CliError(
        f'allocation "{short(a.id)}" has {len(names)} tasks ({", ".join(names)}); '
        "name one with -task"
    )


# ------------------------------------------------------------ exec


class _Escape:
    """Nomad's escapingio: the escape character at the start of a line
    followed by '.' ends the session; followed by anything else both pass."""

    def __init__(self, char: str) -> None:
        self.char = char.encode() if char else b""
        self.line_start = True
        self.pending = False

    def feed(self, data: bytes) -> tuple[bytes, bool]:
        """What to send of `data`, and whether to close."""
        if not self.char:
            return data, False
        out = bytearray()
        for byte in data:
            b = bytes([byte])
            if self.pending:
                self.pending = False
                if b == b".":
                    return bytes(out), True
                out += self.char
                if b == self.char:
                    self.line_start = False
                    continue
            elif self.line_start and b == self.char:
                self.pending = True
                continue
            out += b
            self.line_start = b in (b"\r", b"\n")
        return bytes(out), False


def cmd_exec(args: argparse.Namespace, ctx: Context) -> int:
    if not args.command:
        raise CliError("a command is required (corral alloc exec ALLOC COMMAND [ARGS...])")
    if not args.job and len(args.alloc) == 1:
        raise CliError("alloc id must contain at least two characters")
    use_tty, escape = terminal_options(args)
    a = random_job_alloc(ctx, args.alloc, args.group) if args.job else get_alloc(ctx, args.alloc)
    task = alloc_task(a, args.task)
    address = alloc_agent(ctx, a)
    setup = alloc_pb2.ExecSetup(alloc_id=a.id, task=task, command=args.command, tty=use_tty)
    session = ExecSession(setup, stdin=args.stdin, tty=use_tty, escape=escape)
    return session.run(ctx.client.client_alloc(address))


class ExecSession:
    def __init__(self, setup: alloc_pb2.ExecSetup, *, stdin: bool, tty: bool, escape: str) -> None:
        self.setup = setup
        self.stdin = stdin
        self.tty = tty
        self.escape = _Escape(escape if tty else "")
        self.inbox: queue.Queue[alloc_pb2.AllocExecRequest | None] = queue.Queue()
        self.closed_by_escape = False

    def _requests(self) -> Iterator[alloc_pb2.AllocExecRequest]:
        yield alloc_pb2.AllocExecRequest(setup=self.setup)
        while (item := self.inbox.get()) is not None:
            yield item

    def _send_size(self, *_: object) -> None:
        try:
            size = os.get_terminal_size(sys.stdout.fileno())
        except OSError:
            return
        self.inbox.put(
            alloc_pb2.AllocExecRequest(
                tty_size=alloc_pb2.TerminalSize(height=size.lines, width=size.columns)
            )
        )

    def _read_stdin(self, call: Any) -> None:
        fd = sys.stdin.fileno()
        while True:
            try:
                data = os.read(fd, STDIN_BYTES)
            except OSError:
                data = b""
            if not data:
                self.inbox.put(alloc_pb2.AllocExecRequest(stdin=alloc_pb2.ExecIO(close=True)))
                return
            data, close = self.escape.feed(data)
            if data:
                self.inbox.put(alloc_pb2.AllocExecRequest(stdin=alloc_pb2.ExecIO(data=data)))
            if close:
                self.closed_by_escape = True
                call.cancel()
                return

    def run(self, stub: Any) -> int:
        fd = sys.stdin.fileno()
        saved = termios.tcgetattr(fd) if self.tty and os.isatty(fd) else None
        old_winch: Any = None
        call = stub.Exec(self._requests())
        try:
            if saved is not None:
                tty.setraw(fd)
            if self.tty:
                self._send_size()
                old_winch = signal.signal(signal.SIGWINCH, self._on_winch)
            if self.stdin:
                threading.Thread(target=self._read_stdin, args=(call,), daemon=True).start()
            else:
                self.inbox.put(alloc_pb2.AllocExecRequest(stdin=alloc_pb2.ExecIO(close=True)))
            return self._relay(call)
        finally:
            self.inbox.put(None)
            if old_winch is not None:
                signal.signal(signal.SIGWINCH, old_winch)
            if saved is not None:
                termios.tcsetattr(fd, termios.TCSADRAIN, saved)
            if self.closed_by_escape:
                sys.stderr.write("\nConnection closed\n")

    def _on_winch(self, signum: int, frame: FrameType | None) -> None:
        self._send_size()

    def _relay(self, call: Any) -> int:
        out, err = sys.stdout.buffer, sys.stderr.buffer
        try:
            for resp in call:
                if resp.exited:
                    return int(resp.exit_code)
                if resp.HasField("stdout") and resp.stdout.data:
                    out.write(resp.stdout.data)
                    out.flush()
                elif resp.HasField("stderr") and resp.stderr.data:
                    err.write(resp.stderr.data)
                    err.flush()
        except grpc.RpcError as exc:
            if self.closed_by_escape:
                return 0
            if exc.code() == grpc.StatusCode.PERMISSION_DENIED:
                raise
            raise CliError(f"failed to exec into task: {exc.details()}") from None
        except KeyboardInterrupt:
            call.cancel()
            return 130
        raise CliError("failed to exec into task: the session ended without an exit code")


# ------------------------------------------------------------ fs


def cmd_fs(args: argparse.Namespace, ctx: Context) -> int:
    a = random_job_alloc(ctx, args.alloc) if args.job else get_alloc(ctx, args.alloc)
    fs = ctx.client.client_fs(alloc_agent(ctx, a))
    info = fs.Stat(alloc_pb2.FsStatRequest(alloc_id=a.id, path=args.path), timeout=30).info
    size = (lambda n: str(n)) if args.machine else fmt_bytes
    if args.stat:
        if args.json:
            print_json(info, ctx.out)
            return 0
        table(
            ("Mode", "Size", "Modified Time", "Content Type", "Name"),
            [
                (
                    info.file_mode,
                    size(info.size),
                    fmt_time(info.mod_time),
                    info.content_type,
                    info.name,
                )
            ],
            ctx.out,
        )
        return 0
    if info.is_dir:
        files = fs.List(alloc_pb2.FsListRequest(alloc_id=a.id, path=args.path), timeout=30).files
        if args.json:
            print_json(list(files), ctx.out)
            return 0
        rows = [
            (f.file_mode, size(f.size), fmt_time(f.mod_time), f.name + ("/" if f.is_dir else ""))
            for f in files
        ]
        table(("Mode", "Size", "Modified Time", "Name"), rows, ctx.out)
        return 0
    request = alloc_pb2.FsStreamRequest(alloc_id=a.id, path=args.path, follow=args.follow)
    trim = 0
    if args.tail:
        request.origin = "end"
        if args.bytes:
            request.offset = args.bytes
        else:
            request.offset = args.lines * BYTES_PER_LINE
            trim = args.lines
    elif args.bytes or args.lines != 10:
        raise CliError("-n and -c need -tail")
    out = sys.stdout.buffer
    first = True
    stream = fs.Stream(request, timeout=None if args.follow else 60)
    try:
        for frame in stream:
            data = frame.data
            if frame.file_event == "file deleted":
                sys.stderr.write(f"\n{args.path}: file deleted\n")
            if not data:
                continue
            if first and trim:
                data = b"".join(data.splitlines(keepends=True)[-trim:])
            first = False
            out.write(data)
            out.flush()
    except KeyboardInterrupt:
        stream.cancel()
    return 0
