"""Starting and stopping role processes for `corral dev`.

Each role runs as `python -m services.<role>` in its own session (so a
terminal's Ctrl-C reaches only the supervisor, which then stops everything in
order), with its output in `logs/<role>.log` and a `--ready-file` the role
writes once it listens. On Linux every child also gets PR_SET_PDEATHSIG, so
even a supervisor killed with SIGKILL leaves no role running."""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

GRACE_SECONDS = 10.0
READY_TIMEOUT = 90.0


class StartError(Exception):
    """A role did not come up; the message says which and why."""


class Shutdown(Exception):  # noqa: N818 - a control-flow signal, not an error
    """SIGINT/SIGTERM arrived."""


def _die_with_parent() -> None:
    """preexec_fn: SIGTERM this child when the supervisor dies."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        pr_set_pdeathsig = 1
        libc.prctl(pr_set_pdeathsig, signal.SIGTERM, 0, 0, 0)
    except OSError:
        pass


def module_exists(module: str) -> bool:
    """Whether `python -m module` can run. Role modules are looked up as
    files under `services/`, so no role code is imported here."""
    if not module.startswith("services."):
        import importlib.util

        try:
            return importlib.util.find_spec(module) is not None
        except ModuleNotFoundError:
            return False
    root = Path(__file__).resolve().parent.parent
    parts = module.split(".")
    base = root.joinpath(*parts)
    return (base / "__main__.py").exists() or base.with_suffix(".py").exists()


@dataclass
class RoleProcess:
    role: str
    module: str
    argv: list[str]
    log_path: Path
    ready_path: Path
    proc: subprocess.Popen[bytes] | None = None
    info: dict[str, Any] = field(default_factory=dict)
    #: the interpreter that runs the role ("": this one)
    python: str = ""
    _log: IO[bytes] | None = None

    @property
    def pid(self) -> int:
        return self.proc.pid if self.proc else 0

    @property
    def address(self) -> str:
        return str(self.info.get("address", ""))

    def start(self, env: dict[str, str]) -> None:
        if not module_exists(self.module):
            raise StartError(
                f"role {self.role}: module {self.module} does not exist yet "
                f"(no {self.module.replace('.', '/')}/__main__.py); cannot start it"
            )
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.ready_path.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            self.ready_path.unlink()
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - closed in stop()
        self._log.write(f"\n---- corral dev: starting {self.role} at {time.ctime()}\n".encode())
        self._log.flush()
        python = self.python or sys.executable
        cmd = [python, "-m", self.module, *self.argv, "--ready-file", str(self.ready_path)]
        self.proc = subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
            preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None,  # noqa: PLW1509
        )

    def wait_ready(self, timeout: float = READY_TIMEOUT) -> dict[str, Any]:
        assert self.proc is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.ready_path.exists():
                try:
                    self.info = json.loads(self.ready_path.read_text())
                    return self.info
                except (OSError, ValueError):
                    pass  # being renamed into place; read again
            code = self.proc.poll()
            if code is not None:
                raise StartError(
                    f"role {self.role} exited with code {code} before it was ready; "
                    f"last lines of {self.log_path}:\n{self.tail()}"
                )
            time.sleep(0.05)
        raise StartError(
            f"role {self.role} was not ready after {timeout:.0f}s; see {self.log_path}"
        )

    def tail(self, lines: int = 8) -> str:
        try:
            text = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return "    (no log)"
        return "\n".join(f"    {line}" for line in text[-lines:])

    def signal(self, sig: int) -> None:
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, sig)

    def close_log(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None


def stop_all(roles: list[RoleProcess], grace: float = GRACE_SECONDS) -> list[str]:
    """Stop roles one at a time in reverse start order (clients first, the
    state service last, so no role loses its dependencies while it shuts
    down): SIGTERM, wait up to `grace` seconds, then SIGKILL. Returns the
    roles that had to be killed."""
    killed: list[str] = []
    for r in reversed(roles):
        if r.proc is None or r.proc.poll() is not None:
            continue
        r.signal(signal.SIGTERM)
        try:
            r.proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            r.signal(signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                r.proc.wait(timeout=5)
            killed.append(r.role)
    for r in roles:
        r.close_log()
        with contextlib.suppress(FileNotFoundError):
            r.ready_path.unlink()
    return killed


@contextlib.contextmanager
def shutdown_signals() -> Any:
    """Turn SIGINT/SIGTERM/SIGHUP into a `Shutdown` exception while inside,
    so start-up waits and the main loop unwind through their `finally`."""
    signals = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

    def handler(signum: int, _frame: object) -> None:
        # Further signals during the orderly stop are ignored.
        for sig in signals:
            signal.signal(sig, signal.SIG_IGN)
        raise Shutdown(signal.Signals(signum).name)

    old = {sig: signal.signal(sig, handler) for sig in signals}
    try:
        yield
    finally:
        for sig, previous in old.items():
            signal.signal(sig, previous)


# ------------------------------------------------------------ supervision


@dataclass
class RestartPolicy:
    """How `Supervisor` restarts what dies, as an init system would:
    exponential backoff from `initial` to `maximum` seconds, reset by a run
    of `stable_after` seconds; a role that dies `give_up_after` times within
    `window` seconds (it keeps dying at start) is given up on."""

    initial: float = 1.0
    maximum: float = 30.0
    stable_after: float = 60.0
    give_up_after: int = 5
    window: float = 60.0


class GiveUp(Exception):  # noqa: N818 - the supervisor's verdict, not a bug
    """A role keeps dying; the message says which, how often, and its log tail."""


class Supervised:
    """Something the supervisor keeps running: a role process, or the
    embedded PostgreSQL. `exit_code` is None while it runs."""

    name: str = ""

    def exit_code(self) -> int | None:
        raise NotImplementedError

    def restart(self) -> None:
        raise NotImplementedError

    def ready(self) -> bool:
        return True

    def tail(self) -> str:
        return "    (no log)"


class SupervisedRole(Supervised):
    """A role process, restarted with the same arguments and environment on
    the address it first bound (so every other role still finds it)."""

    def __init__(self, role: RoleProcess, env: dict[str, str]) -> None:
        self.role = role
        self.name = role.role
        self.env = env

    def exit_code(self) -> int | None:
        return self.role.proc.poll() if self.role.proc is not None else -1

    def pin_address(self) -> None:
        """After the first start: listen on the port the role bound, not 0."""
        argv = self.role.argv
        if "--listen" in argv and self.role.address:
            i = argv.index("--listen") + 1
            if argv[i].endswith(":0"):
                argv[i] = self.role.address
                self.env[f"CORRAL_{self.name.upper()}_LISTEN"] = self.role.address

    def restart(self) -> None:
        self.role.close_log()
        self.role.info = {}
        self.role.start(self.env)

    def ready(self) -> bool:
        if self.role.info:
            return True
        try:
            self.role.info = json.loads(self.role.ready_path.read_text())
        except (OSError, ValueError):
            return False
        return True

    def tail(self) -> str:
        return self.role.tail(20)


@dataclass
class _Watch:
    item: Supervised
    started: float
    backoff: float
    exits: list[float] = field(default_factory=list)
    restart_at: float | None = None
    announced_ready: bool = True


class Supervisor:
    """Watches every supervised item; restarts what dies after its backoff
    with a line on the terminal (`==> state exited with code -9;
    restarting in 1s`), and raises `GiveUp` for one that keeps dying."""

    def __init__(
        self,
        items: list[Supervised],
        *,
        policy: RestartPolicy | None = None,
        say: Any = print,
        clock: Any = time.monotonic,
    ) -> None:
        self.policy = policy or RestartPolicy()
        self.say = say
        self.clock = clock
        now = clock()
        self.watches = [_Watch(item, now, self.policy.initial) for item in items]

    def step(self) -> None:
        """One look at everything (the caller sleeps between steps)."""
        for w in self.watches:
            now = self.clock()
            if w.restart_at is not None:
                if now >= w.restart_at:
                    w.restart_at = None
                    w.started = now
                    w.announced_ready = False
                    try:
                        w.item.restart()
                    except Exception as exc:  # counts as another exit
                        self._exited(w, now, f"could not be restarted ({exc})")
                continue
            code = w.item.exit_code()
            if code is None:
                if not w.announced_ready and w.item.ready():
                    w.announced_ready = True
                    self.say(f"{w.item.name} is running again")
                continue
            self._exited(w, now, f"exited with code {code}")

    def _exited(self, w: _Watch, now: float, how: str) -> None:
        p = self.policy
        if now - w.started >= p.stable_after:
            w.backoff = p.initial
        w.exits = [t for t in w.exits if now - t < p.window] + [now]
        if len(w.exits) >= p.give_up_after:
            raise GiveUp(
                f"{w.item.name} {how}; it died {len(w.exits)} times within "
                f"{p.window:g}s, giving up. Last lines of its log:\n{w.item.tail()}"
            )
        delay = w.backoff
        w.backoff = min(w.backoff * 2, p.maximum)
        w.restart_at = now + delay
        self.say(f"{w.item.name} {how}; restarting in {delay:g}s")

    def run(self, interval: float = 0.2) -> None:
        """Step until `GiveUp` (or a `Shutdown` from a signal) ends it."""
        while True:
            self.step()
            time.sleep(interval)
