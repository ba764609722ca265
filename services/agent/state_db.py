"""The client's state (Nomad's client/state, a BoltDB file there; SQLite
here): every alloc this node runs with the job version it runs, and per
task its TaskState (state, events, restarts) and its local state — the
driver handle that finds the run again, the restart counters, whether the
run loop finished. A restarted agent, even one killed with SIGKILL,
rebuilds its alloc runners from it and adopts the tasks still running
(services/agent/runner.py). It also holds the node's dynamic metadata
(services/agent/node_meta.py), which the agent merges into the node it
registers after a restart.

Every change is written before the agent acts on it (an alloc before it
starts, the intent to launch a task before the executor starts), in its
own transaction. `<data-dir>/client/state.db` is created 0600 in a 0700
directory: it holds the tasks' environments' sources (job versions). WAL
with synchronous=NORMAL survives the agent's own crash, which is what
it is for; an OS crash may lose the last transactions, as BoltDB's
NoSync would.
"""

from __future__ import annotations

import json
import os
import sqlite3
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from corral.v1 import structs_pb2 as pb

#: bump with a migration in `_migrate` when the schema changes
SCHEMA_VERSION = 2

_SCHEMA = """
CREATE TABLE IF NOT EXISTS allocs (
    id TEXT PRIMARY KEY,
    alloc BLOB NOT NULL,        -- pb.Allocation, the server's latest copy
    job BLOB NOT NULL,          -- pb.Job, the version the alloc runs
    health TEXT NOT NULL DEFAULT '{}'  -- the deployment health verdict reported
);
CREATE TABLE IF NOT EXISTS tasks (
    alloc_id TEXT NOT NULL REFERENCES allocs (id) ON DELETE CASCADE,
    task TEXT NOT NULL,
    state BLOB,                 -- pb.TaskState as last reported
    local TEXT NOT NULL DEFAULT '{}',  -- handle, restart counters, run_complete
    PRIMARY KEY (alloc_id, task)
);
-- schema 2: the node's dynamic metadata (a NULL value unsets a static key)
CREATE TABLE IF NOT EXISTS node_meta (
    key TEXT PRIMARY KEY,
    value TEXT
);
"""


@dataclass
class StoredTask:
    state: pb.TaskState | None = None
    local: dict[str, Any] = field(default_factory=dict)


@dataclass
class StoredAlloc:
    alloc: pb.Allocation
    job: pb.Job
    health: dict[str, Any] = field(default_factory=dict)
    tasks: dict[str, StoredTask] = field(default_factory=dict)


class StateDB:
    def __init__(self, data_dir: Path) -> None:
        directory = data_dir / "client"
        directory.mkdir(parents=True, exist_ok=True)
        os.chmod(directory, 0o700)
        self.path = directory / "state.db"
        if not self.path.exists():
            os.close(os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
        self._db = sqlite3.connect(self.path, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.execute("PRAGMA foreign_keys=ON")
        self._migrate()

    def _migrate(self) -> None:
        (version,) = self._db.execute("PRAGMA user_version").fetchone()
        if version > SCHEMA_VERSION:
            raise RuntimeError(
                f"{self.path} was written by a newer agent (schema {version} > {SCHEMA_VERSION})"
            )
        with self._db:
            self._db.executescript(_SCHEMA)
            self._db.execute(f"PRAGMA user_version={SCHEMA_VERSION}")

    def close(self) -> None:
        self._db.close()

    # ---------------------------------------------------------------- writes

    def put_alloc(self, alloc: pb.Allocation, job: pb.Job) -> None:
        """A new alloc (or one moved to another job version), before it runs."""
        self._db.execute(
            "INSERT INTO allocs (id, alloc, job) VALUES (?, ?, ?) "
            "ON CONFLICT (id) DO UPDATE SET alloc = excluded.alloc, job = excluded.job",
            (alloc.id, alloc.SerializeToString(), job.SerializeToString()),
        )

    def put_server_alloc(self, alloc: pb.Allocation) -> None:
        """The server's newer copy of an alloc already stored."""
        self._db.execute(
            "UPDATE allocs SET alloc = ? WHERE id = ?", (alloc.SerializeToString(), alloc.id)
        )

    def put_health(self, alloc_id: str, health: dict[str, Any]) -> None:
        self._db.execute(
            "UPDATE allocs SET health = ? WHERE id = ?", (json.dumps(health), alloc_id)
        )

    def put_task_state(self, alloc_id: str, task: str, state: pb.TaskState) -> None:
        self._db.execute(
            "INSERT INTO tasks (alloc_id, task, state) VALUES (?, ?, ?) "
            "ON CONFLICT (alloc_id, task) DO UPDATE SET state = excluded.state",
            (alloc_id, task, state.SerializeToString()),
        )

    def put_task_local(self, alloc_id: str, task: str, local: dict[str, Any]) -> None:
        self._db.execute(
            "INSERT INTO tasks (alloc_id, task, local) VALUES (?, ?, ?) "
            "ON CONFLICT (alloc_id, task) DO UPDATE SET local = excluded.local",
            (alloc_id, task, json.dumps(local)),
        )

    def delete_alloc(self, alloc_id: str) -> None:
        """The alloc is gone from this node (garbage collected by the servers)."""
        self._db.execute("DELETE FROM allocs WHERE id = ?", (alloc_id,))

    def put_node_meta(self, dynamic: dict[str, str | None]) -> None:
        """The node's whole dynamic metadata, replacing what was stored."""
        with self._db:
            self._db.execute("BEGIN")
            self._db.execute("DELETE FROM node_meta")
            self._db.executemany(
                "INSERT INTO node_meta (key, value) VALUES (?, ?)", sorted(dynamic.items())
            )

    # ---------------------------------------------------------------- reads

    def load_node_meta(self) -> dict[str, str | None]:
        """The node's dynamic metadata (None: a static key unset)."""
        return {
            str(k): (None if v is None else str(v))
            for k, v in self._db.execute("SELECT key, value FROM node_meta")
        }

    def load(self) -> list[StoredAlloc]:
        """Every alloc stored, with its tasks (at start-up)."""
        out: dict[str, StoredAlloc] = {}
        for alloc_id, alloc_blob, job_blob, health in self._db.execute(
            "SELECT id, alloc, job, health FROM allocs ORDER BY id"
        ):
            alloc, job = pb.Allocation(), pb.Job()
            alloc.ParseFromString(alloc_blob)
            job.ParseFromString(job_blob)
            out[alloc_id] = StoredAlloc(alloc, job, _json_object(health))
        for alloc_id, task, state_blob, local in self._db.execute(
            "SELECT alloc_id, task, state, local FROM tasks"
        ):
            stored = out.get(alloc_id)
            if stored is None:
                continue
            state = None
            if state_blob is not None:
                state = pb.TaskState()
                state.ParseFromString(state_blob)
            stored.tasks[task] = StoredTask(state, _json_object(local))
        return list(out.values())


def _json_object(text: str | None) -> dict[str, Any]:
    try:
        value = json.loads(text or "{}")
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}
