"""The forked side of the executor: what happens between fork and the
task's execve.

raw_exec: one child joins the task's cgroups, starts its own session,
becomes the task's user and executes the command.

exec: the executor has unshared the PID namespace for its children, so
its child is PID 1 there — a small init. It unshares the mount, UTS and
IPC namespaces, builds the task's root (the task directory with the host's
system directories bound read-only, a private /dev, /proc, /sys), pivots
into it, then forks the task (PID 2: "PID 1's child", as in a container)
and stays behind to forward signals to it and reap orphans. When the task
exits, init reports its wait status and exits, and the kernel kills
whatever is left in the namespace. Only the task joins the cgroups: init's
few pages are not charged to the task's memory limit.

Every failure before execve is written to the `errors` pipe (close-on-exec:
a successful execve closes it, which is how the executor knows the task
started) and ends the child with status 127.
"""

from __future__ import annotations

import os
import pwd
import select
import signal
import stat
from pathlib import Path
from typing import NoReturn

from services.agent.executor import linux
from services.agent.executor.spec import Bind, Isolation, LaunchSpec

#: signals init passes on to the task (everything a user or Nomad's
#: kill_signal would send; SIGKILL and SIGSTOP cannot be caught)
FORWARDED = (
    signal.SIGHUP,
    signal.SIGINT,
    signal.SIGQUIT,
    signal.SIGUSR1,
    signal.SIGUSR2,
    signal.SIGALRM,
    signal.SIGTERM,
    signal.SIGCONT,
    signal.SIGTSTP,
    signal.SIGTTIN,
    signal.SIGTTOU,
    signal.SIGWINCH,
    signal.SIGURG,
    signal.SIGIO,
    signal.SIGPWR,
    signal.SIGXCPU,
    signal.SIGXFSZ,
    signal.SIGVTALRM,
    signal.SIGPROF,
)

#: device nodes bound into the task's /dev (the set Docker and Nomad give)
DEVICES = ("null", "zero", "full", "random", "urandom", "tty")
#: /dev links a program expects
DEV_LINKS = {
    "fd": "/proc/self/fd",
    "stdin": "/proc/self/fd/0",
    "stdout": "/proc/self/fd/1",
    "stderr": "/proc/self/fd/2",
    "ptmx": "pts/ptmx",
    "core": "/proc/kcore",
}
#: kernel knobs a task may read but not write, and what it may not read
PROC_READONLY = ("sys", "sysrq-trigger", "irq", "bus")
PROC_MASKED = ("kcore",)

_SPECIAL = linux.MS_NOSUID | linux.MS_NODEV | linux.MS_NOEXEC


class SetupError(Exception):
    """A step before execve failed; the message names it."""


def fail(errors: int, message: str) -> NoReturn:
    """Report a failure before execve on the `errors` pipe and end the child."""
    try:
        os.write(errors, message.encode(errors="replace")[:4000])
    finally:
        os._exit(127)


def read_all(fd: int) -> bytes:
    """Everything until EOF (the errors pipe: empty when execve succeeded)."""
    out = b""
    while chunk := os.read(fd, 65536):
        out += chunk
    return out


# ------------------------------------------------------------ the task's identity


class User:
    def __init__(self, name: str) -> None:
        try:
            entry = pwd.getpwnam(name)
        except KeyError:
            raise SetupError(f"user {name!r} not found on this node") from None
        self.name = name
        self.uid = entry.pw_uid
        self.gid = entry.pw_gid
        self.groups = os.getgrouplist(name, entry.pw_gid)


def _capability_numbers(names: list[str]) -> set[int]:
    return {linux.CAPABILITIES[n] for n in names if n in linux.CAPABILITIES}


def become(user: User | None, capabilities: list[str] | None) -> None:
    """Limit the capability bounding set to the task's, then switch to its
    user keeping exactly those capabilities (ambient, so they survive
    execve of an ordinary program): Nomad's exec driver model. A setuid
    binary inside the task cannot gain more than the bounding set."""
    wanted = _capability_numbers(capabilities) if capabilities is not None else None
    if wanted is not None:
        for number in linux.supported_capabilities().values():
            if number not in wanted:
                linux.prctl(linux.PR_CAPBSET_DROP, number)
    if user is None:
        return
    if wanted is not None:
        linux.prctl(linux.PR_SET_KEEPCAPS, 1)
    os.setgroups(user.groups)
    os.setgid(user.gid)
    os.setuid(user.uid)
    if wanted is not None and user.uid != 0:
        linux.capset(wanted)
        for number in sorted(wanted):
            linux.prctl(linux.PR_CAP_AMBIENT, linux.PR_CAP_AMBIENT_RAISE, number)


def join_cgroups(files: list[int]) -> None:
    for fd in files:
        os.write(fd, b"0")  # 0: the writing process
        os.close(fd)


def open_cgroups(procs: list[str]) -> list[int]:
    """The cgroup.procs files to join, opened now (before the root changes)."""
    try:
        return [os.open(p, os.O_WRONLY | os.O_CLOEXEC) for p in procs]
    except OSError as exc:
        raise SetupError(f"cannot join the task's cgroup: {exc}") from None


def enter_workdir(cwd: str) -> None:
    try:
        os.chdir(cwd)
    except OSError as exc:
        raise SetupError(f"cannot enter the working directory {cwd}: {exc.strerror}") from None


def restore_signals() -> None:
    """The dispositions Python changed at start-up back to the default: an
    ignored SIGPIPE or SIGXFSZ would be inherited by the program (as
    subprocess's restore_signals does)."""
    for sig in (signal.SIGPIPE, signal.SIGXFSZ):
        signal.signal(sig, signal.SIG_DFL)


def execute(spec: LaunchSpec) -> None:
    restore_signals()
    try:
        os.execvpe(spec.command, [spec.command, *spec.args], spec.env)
    except OSError as exc:
        raise SetupError(f"failed to execute {spec.command!r}: {exc.strerror}") from None


# ------------------------------------------------------------ raw_exec


def raw_child(spec: LaunchSpec, errors: int) -> None:
    """The raw_exec task: no isolation, the cgroups when the agent has them."""
    try:
        user = User(spec.user) if spec.user else None
        cgroups = open_cgroups(spec.cgroup_procs)
        os.setsid()
        join_cgroups(cgroups)
        _oom_score_adj()
        become(user, spec.capabilities)
        enter_workdir(spec.cwd)
        execute(spec)
    except (SetupError, OSError) as exc:
        fail(errors, str(exc))


def _oom_score_adj() -> None:
    """The task does not inherit the agent's OOM score adjustment (Nomad)."""
    try:
        Path("/proc/self/oom_score_adj").write_text("0")
    except OSError:
        pass


# ------------------------------------------------------------ exec: the root


def _mkdir(path: str, mode: int = 0o755) -> None:
    os.makedirs(path, mode=mode, exist_ok=True)


def _touch(path: str) -> None:
    if not os.path.lexists(path):
        os.close(os.open(path, os.O_CREAT | os.O_WRONLY | os.O_CLOEXEC, 0o644))


_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _target_parent(root: str, target: str) -> tuple[int, str]:
    """The directory that holds `target` inside `root` (an fd) and the
    target's last name. The task owns its directory and may have left
    symlinks in it: the walk follows none (SetupError), so nothing is made
    or mounted outside the task's root; missing directories are made."""
    parts = [p for p in target.split("/") if p not in ("", ".")]
    if not parts or ".." in parts:
        raise SetupError(f"bind target {target!r} is not a path inside the task's root")
    fd = os.open(root, _DIR_FLAGS)
    try:
        for part in parts[:-1]:
            try:
                os.mkdir(part, 0o755, dir_fd=fd)
            except FileExistsError:
                pass
            try:
                nxt = os.open(part, _DIR_FLAGS, dir_fd=fd)
            except OSError as exc:
                raise SetupError(
                    f"bind target {target}: {part} is a symlink or not a directory "
                    f"in the task directory ({exc.strerror})"
                ) from None
            os.close(fd)
            fd = nxt
        return fd, parts[-1]
    except BaseException:
        os.close(fd)
        raise


def _open_target(root: str, target: str, *, directory: bool, create: bool) -> int:
    """An O_PATH fd of the bind target (a directory or a file, made when
    missing and `create`), reached without following a symlink."""
    parent, name = _target_parent(root, target)
    try:
        if create and directory:
            try:
                os.mkdir(name, 0o755, dir_fd=parent)
            except FileExistsError:
                pass
        elif create:
            try:
                os.close(
                    os.open(
                        name,
                        os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC,
                        0o644,
                        dir_fd=parent,
                    )
                )
            except FileExistsError:
                pass
        flags = os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC | (os.O_DIRECTORY if directory else 0)
        try:
            fd = os.open(name, flags, dir_fd=parent)
        except OSError as exc:
            raise SetupError(f"bind target {target}: {exc.strerror}") from None
        if not directory and stat.S_ISLNK(os.fstat(fd).st_mode):
            os.close(fd)
            raise SetupError(f"bind target {target} is a symlink in the task directory")
        return fd
    finally:
        os.close(parent)


def bind(root: str, b: Bind) -> None:
    """`b.source` of the host at `b.target` inside `root` (mounted through
    an fd of the target, so the mount lands exactly where the walk found)."""
    if os.path.islink(b.source):
        parent, name = _target_parent(root, b.target)
        try:
            try:
                os.symlink(os.readlink(b.source), name, dir_fd=parent)
            except FileExistsError:
                pass
        finally:
            os.close(parent)
        return
    try:
        st = os.stat(b.source)
    except FileNotFoundError:
        return  # Nomad's chroot_env skips what the host does not have
    directory = stat.S_ISDIR(st.st_mode)
    fd = _open_target(root, b.target, directory=directory, create=True)
    try:
        linux.mount(b.source, f"/proc/self/fd/{fd}", None, linux.MS_BIND | linux.MS_REC)
    finally:
        os.close(fd)
    if b.readonly:
        # the mount just made, found again: the fd above is of what it covers
        fd = _open_target(root, b.target, directory=directory, create=False)
        try:
            linux.mount(
                None,
                f"/proc/self/fd/{fd}",
                None,
                linux.MS_BIND
                | linux.MS_REMOUNT
                | linux.MS_RDONLY
                | linux.MS_NOSUID
                | linux.MS_NODEV,
            )
        finally:
            os.close(fd)


def _mount_on(root: str, target: str, fstype: str, flags: int, data: str | None = None) -> None:
    """A fresh file system at `target` in the root, which the task may not
    have turned into a symlink (what lies below is then the new mount's)."""
    fd = _open_target(root, target, directory=True, create=True)
    try:
        linux.mount(fstype, f"/proc/self/fd/{fd}", fstype, flags, data)
    finally:
        os.close(fd)


def build_root(iso: Isolation) -> None:
    """Inside the new mount namespace: nothing here reaches the host's."""
    root = iso.root.rstrip("/")
    linux.mount(None, "/", None, linux.MS_REC | linux.MS_PRIVATE)
    # the root must be a mount point of its own for pivot_root
    linux.mount(root, root, None, linux.MS_BIND | linux.MS_REC)
    for b in iso.binds:
        bind(root, b)
    dev = root + "/dev"
    _mount_on(root, "/dev", "tmpfs", linux.MS_NOSUID | linux.MS_STRICTATIME, "mode=755")
    for name in DEVICES:
        if os.path.exists(f"/dev/{name}"):
            _touch(f"{dev}/{name}")
            linux.mount(f"/dev/{name}", f"{dev}/{name}", None, linux.MS_BIND)
    for name, target in DEV_LINKS.items():
        os.symlink(target, f"{dev}/{name}")
    _mkdir(f"{dev}/pts")
    linux.mount(
        "devpts",
        f"{dev}/pts",
        "devpts",
        linux.MS_NOSUID | linux.MS_NOEXEC,
        "newinstance,ptmxmode=0666,mode=0620",
    )
    _mkdir(f"{dev}/shm", 0o1777)
    linux.mount("shm", f"{dev}/shm", "tmpfs", _SPECIAL, "mode=1777,size=65536k")
    if iso.ipc_namespace:
        _mkdir(f"{dev}/mqueue")
        linux.mount("mqueue", f"{dev}/mqueue", "mqueue", _SPECIAL)
    proc = root + "/proc"
    _mount_on(root, "/proc", "proc", _SPECIAL)
    for name in PROC_READONLY:
        path = f"{proc}/{name}"
        if os.path.exists(path):
            linux.mount(path, path, None, linux.MS_BIND | linux.MS_REC)
            linux.mount(
                None, path, None, linux.MS_BIND | linux.MS_REMOUNT | linux.MS_RDONLY | _SPECIAL
            )
    for name in PROC_MASKED:
        if os.path.exists(f"{proc}/{name}"):
            linux.mount("/dev/null", f"{proc}/{name}", None, linux.MS_BIND)
    _mount_on(root, "/sys", "sysfs", _SPECIAL | linux.MS_RDONLY)


def enter_root(iso: Isolation) -> None:
    root = iso.root.rstrip("/")
    if iso.pivot_root and linux.can_pivot_root():
        # the old root stacked under the new one, then detached: nothing of
        # the host's tree stays reachable (chroot could be escaped by root)
        os.chdir(root)
        linux.pivot_root(".", ".")
        linux.umount2(".", linux.MNT_DETACH)
    else:
        os.chroot(root)
    os.chdir("/")


# ------------------------------------------------------------ exec: init


def init_child(spec: LaunchSpec, errors: int, results: int, lifeline: int) -> None:
    """PID 1 of the task's namespace (see the module doc). `lifeline` is the
    read end of a pipe only the executor writes to: readable (EOF) once the
    executor is gone."""
    iso = spec.isolation
    assert iso is not None
    try:
        linux.prctl(linux.PR_SET_PDEATHSIG, signal.SIGKILL)
        if select.select([lifeline], [], [], 0)[0]:
            os._exit(1)  # the executor died before the death signal was armed
        os.close(lifeline)
        user = User(spec.user) if spec.user else None
        cgroups = open_cgroups(spec.cgroup_procs)
        _oom_score_adj()
        flags = linux.CLONE_NEWNS | linux.CLONE_NEWUTS
        if iso.ipc_namespace:
            flags |= linux.CLONE_NEWIPC
        linux.unshare(flags)
        linux.sethostname(iso.hostname)
        build_root(iso)
        enter_root(iso)
    except (SetupError, OSError) as exc:
        fail(errors, f"building the task's isolation: {exc}")
    task = os.fork()
    if task == 0:
        try:
            os.setsid()
            join_cgroups(cgroups)
            become(user, spec.capabilities)
            enter_workdir(spec.cwd)
            execute(spec)
        except (SetupError, OSError) as exc:
            fail(errors, str(exc))
    for fd in cgroups:
        os.close(fd)
    os.close(errors)
    _supervise(task, results)


def _supervise(task: int, results: int) -> None:
    def forward(signum: int, _frame: object) -> None:
        try:
            os.kill(task, signum)
        except ProcessLookupError:
            pass

    for sig in FORWARDED:
        signal.signal(sig, forward)
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    status = 0
    while True:
        try:
            pid, st = os.waitpid(-1, 0)
        except ChildProcessError:
            break
        if pid == task:
            status = st
            break
    os.write(results, f"{status}\n".encode())
    os._exit(0)
