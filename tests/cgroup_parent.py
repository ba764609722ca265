"""Test support for tests that run tasks in real cgroups: each test module's
agent (or driver) gets a cgroup parent of its own, removed at the end."""

from __future__ import annotations

import uuid
from pathlib import Path

V1_ROOT = Path("/sys/fs/cgroup")
V1_CONTROLLERS = ("cpu", "cpuacct", "cpuset", "memory")


def new_parent(label: str) -> str:
    return f"corral-{label}-{uuid.uuid4().hex[:8]}"


def v1_available() -> bool:
    return all((V1_ROOT / c / "cgroup.procs").exists() for c in V1_CONTROLLERS)


def remove_parent(parent: str) -> None:
    """Every cgroup left under `parent` (empty ones: tasks are gone), deepest first."""
    for controller in V1_CONTROLLERS:
        top = V1_ROOT / controller / parent
        if not top.exists():
            continue
        for d in sorted((p for p in top.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
            d.rmdir()
        top.rmdir()
