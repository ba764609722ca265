"""An alloc's directory on the node, laid out as Nomad's client/allocdir:

    <data-dir>/allocs/<alloc id>/
        alloc/              shared by the alloc's tasks (NOMAD_ALLOC_DIR)
            data/  tmp/
            logs/           <task>.stdout.0..N, <task>.stderr.0..N (rotated)
        <task>/             the task's directory; the exec driver's root
            local/          NOMAD_TASK_DIR
            secrets/        NOMAD_SECRETS_DIR
            tmp/            /tmp inside the exec driver's root (sticky, 1777)

Inside the exec driver's root the shared directory is at /alloc, and the
environment names the paths as the task sees them (/alloc, /local,
/secrets); raw_exec tasks get the host paths. Directories a task writes to
are world-writable as in Nomad: a task runs as `nobody` unless its `user`
says otherwise, and another task cannot reach them from its own root.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

SHARED = "alloc"
LOGS = "logs"

#: where the exec driver's tasks find their directories
CHROOT_ALLOC_DIR = "/alloc"
CHROOT_LOCAL_DIR = "/local"
CHROOT_SECRETS_DIR = "/secrets"


def _mkdir(path: Path, mode: int) -> None:
    path.mkdir(parents=True, exist_ok=True)
    os.chmod(path, mode)  # the umask must not narrow what tasks may write


@dataclass(frozen=True)
class TaskDir:
    dir: Path
    alloc_dir: Path  # the alloc's shared alloc/
    name: str

    @property
    def local(self) -> Path:
        return self.dir / "local"

    @property
    def secrets(self) -> Path:
        return self.dir / "secrets"

    @property
    def tmp(self) -> Path:
        return self.dir / "tmp"

    @property
    def log_dir(self) -> Path:
        """The alloc's alloc/logs, where every task's output is kept."""
        return self.alloc_dir / LOGS

    def log_path(self, kind: str, index: int = 0) -> Path:
        """stdout or stderr, where Nomad keeps them: file `index` of the
        rotation, alloc/logs/<task>.<kind>.<index>."""
        return self.log_dir / f"{self.name}.{kind}.{index}"

    def build(self) -> None:
        _mkdir(self.dir, 0o777)
        _mkdir(self.local, 0o777)
        _mkdir(self.secrets, 0o777)
        _mkdir(self.tmp, 0o1777)


@dataclass(frozen=True)
class AllocDir:
    dir: Path

    @classmethod
    def of(cls, data_dir: Path, alloc_id: str) -> AllocDir:
        return cls(data_dir / "allocs" / alloc_id)

    @property
    def shared(self) -> Path:
        return self.dir / SHARED

    @property
    def logs(self) -> Path:
        return self.shared / LOGS

    def task(self, name: str) -> TaskDir:
        return TaskDir(self.dir / name, self.shared, name)

    def build(self) -> None:
        _mkdir(self.dir, 0o755)
        _mkdir(self.shared, 0o755)
        for sub in ("data", "tmp", LOGS):
            _mkdir(self.shared / sub, 0o777)
