"""`python -m services.agent.executor.session --control FD [--pidfd FD]`:
one `alloc exec` command (Nomad's executor ExecStreaming), started by the
agent for each session.

The agent sends an `ExecSpec` as one JSON line on the control socket. For
an isolated task (the exec driver) the session enters the task's
namespaces through a pidfd of the task's init (PID 1 of its namespace:
mount, UTS, IPC and PID, those it does not share with the host) and its
root; it joins the task's cgroups, becomes the task's user with the task's
capabilities and runs the command with the task's environment, as a child
of its own (a process joins a PID namespace only by being born in it). A
raw_exec task's command runs on the host, in the task's directory and
cgroup, as the task's user — as Nomad's raw_exec does.

With a terminal, the pseudo-terminal is opened inside the task's root (its
own devpts) and its master sent to the agent with the first answer
(SCM_RIGHTS); without one, the command's stdin, stdout and stderr are this
process's own (the agent's pipes). Answers, one JSON line each:
`{"pid": N}` once the command runs or `{"error": "..."}` when it could not
start, then `{"exit_code": N}` (128 + signal for a signal death). When the
agent closes the control socket (the caller went away, or the agent died)
the command is killed. Standard library only: one process per session,
started fresh.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import select
import signal
import socket
import sys
import termios
from dataclasses import asdict, dataclass, field

from services.agent.executor import launch, linux

#: the task's namespaces a session enters (when they are not the host's)
NAMESPACES = {
    "ipc": linux.CLONE_NEWIPC,
    "uts": linux.CLONE_NEWUTS,
    "pid": linux.CLONE_NEWPID,
    "mnt": linux.CLONE_NEWNS,
}


@dataclass
class ExecSpec:
    command: list[str]
    env: dict[str, str]
    cwd: str
    #: run as this user ("" = as the agent, root)
    user: str = ""
    #: the capability set (names without CAP_), None = as inherited
    capabilities: list[str] | None = None
    #: cgroup.procs files the command joins
    cgroup_procs: list[str] = field(default_factory=list)
    tty: bool = False
    #: enter the namespaces and root of the process `target_pid` (exec)
    isolated: bool = False
    target_pid: int = 0

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> ExecSpec:
        return cls(**json.loads(text))


def _send(sock: socket.socket, fds: list[int] | None = None, **message: object) -> None:
    line = (json.dumps(message) + "\n").encode()
    if fds:
        socket.send_fds(sock, [line], fds)
    else:
        sock.sendall(line)


def _read_line(sock: socket.socket, limit: int = 1 << 20) -> bytes:
    buf = b""
    while not buf.endswith(b"\n"):
        chunk = sock.recv(65536)
        if not chunk:
            break
        buf += chunk
        if len(buf) > limit:
            raise ValueError("the spec is too large")
    return buf


def _differs(pid: int, ns: str) -> bool:
    try:
        return os.stat(f"/proc/{pid}/ns/{ns}").st_ino != os.stat(f"/proc/self/ns/{ns}").st_ino
    except FileNotFoundError:
        return False


def enter(spec: ExecSpec, pidfd: int) -> None:
    """Into the task's namespaces and root (see the module doc)."""
    root = os.open(f"/proc/{spec.target_pid}/root", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        # the pidfd names the very process the agent looked at: if it is
        # gone, /proc/<pid> may already be someone else's
        signal.pidfd_send_signal(pidfd, 0)
        flags = 0
        for ns, flag in NAMESPACES.items():
            if _differs(spec.target_pid, ns):
                flags |= flag
        if flags:
            linux.setns(pidfd, flags)
        os.fchdir(root)
        os.chroot(".")
    finally:
        os.close(root)


def _child(
    spec: ExecSpec, user: launch.User | None, errors: int, slave: int | None, cgroups: list[int]
) -> None:
    try:
        os.setsid()
        if slave is not None:
            fcntl.ioctl(slave, termios.TIOCSCTTY, 0)
            for target in (0, 1, 2):
                os.dup2(slave, target)
            os.close(slave)
        launch.join_cgroups(cgroups)
        launch.become(user, spec.capabilities)
        # after the user change, which clears it: the command dies with us
        linux.prctl(linux.PR_SET_PDEATHSIG, signal.SIGKILL)
        launch.enter_workdir(spec.cwd)
        launch.restore_signals()
        os.execvpe(spec.command[0], spec.command, spec.env)
    except launch.SetupError as exc:
        launch.fail(errors, str(exc))
    except OSError as exc:
        launch.fail(errors, f"failed to execute {spec.command[0]!r}: {exc.strerror or exc}")


def _exit_code(status: int) -> int:
    if os.WIFSIGNALED(status):
        return 128 + os.WTERMSIG(status)
    return os.waitstatus_to_exitcode(status)


def run(sock: socket.socket, pidfd: int | None) -> int:
    spec = ExecSpec.from_json(_read_line(sock).decode())
    if not spec.command:
        _send(sock, error="command is not present")
        return 0
    try:
        # the user and the cgroups as the host names them, before the root changes
        user = launch.User(spec.user) if spec.user else None
        cgroups = launch.open_cgroups(spec.cgroup_procs)
        if spec.isolated:
            if pidfd is None:
                raise launch.SetupError("no pidfd of the task")
            enter(spec, pidfd)
        master, slave = os.openpty() if spec.tty else (None, None)
    except ProcessLookupError:
        _send(sock, error="the task is not running")
        return 0
    except (launch.SetupError, OSError) as exc:
        _send(sock, error=f"entering the task: {exc}")
        return 0
    errors_r, errors_w = os.pipe2(os.O_CLOEXEC)
    child = os.fork()
    if child == 0:
        os.close(errors_r)
        sock.close()
        if master is not None:
            os.close(master)
        _child(spec, user, errors_w, slave, cgroups)
        os._exit(127)  # not reached
    os.close(errors_w)
    for fd in cgroups:
        os.close(fd)
    if slave is not None:
        os.close(slave)
    problem = launch.read_all(errors_r).decode(errors="replace")
    os.close(errors_r)
    if problem:
        os.waitpid(child, 0)
        _send(sock, error=problem)
        return 0
    _send(sock, [master] if master is not None else None, pid=child)
    if master is not None:
        os.close(master)
    return _supervise(sock, child)


def _supervise(sock: socket.socket, child: int) -> int:
    """Until the command ends (answer its exit code) or the agent hangs up
    (kill it)."""
    child_fd = os.pidfd_open(child)
    poller = select.poll()
    poller.register(sock.fileno(), select.POLLIN | select.POLLHUP)
    poller.register(child_fd, select.POLLIN)
    while True:
        ready = {fd for fd, _ in poller.poll()}
        if child_fd in ready:
            _, status = os.waitpid(child, 0)
            _send(sock, exit_code=_exit_code(status))
            return 0
        if sock.fileno() in ready and not sock.recv(4096):
            try:
                os.killpg(child, signal.SIGKILL)
            except ProcessLookupError:
                pass
            os.waitpid(child, 0)
            return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m services.agent.executor.session")
    parser.add_argument("--control", type=int, required=True)
    parser.add_argument("--pidfd", type=int, default=-1)
    args = parser.parse_args(argv)
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    # neither may reach the command
    os.set_inheritable(args.control, False)
    if args.pidfd >= 0:
        os.set_inheritable(args.pidfd, False)
    sock = socket.socket(fileno=args.control)
    try:
        return run(sock, args.pidfd if args.pidfd >= 0 else None)
    except (OSError, ValueError) as exc:
        try:
            _send(sock, error=f"exec session: {exc}")
        except OSError:
            pass
        return 1


if __name__ == "__main__":
    sys.exit(main())
