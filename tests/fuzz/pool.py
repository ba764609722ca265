"""What the cluster under test holds, read straight from its PostgreSQL:
ids of every kind, the stored objects, and the node secrets the harness
registered. Generated requests draw from it so they reach past "not
found" (a real job id in the wrong namespace, node A's id with node B's
secret, an alloc id's prefix).

Also the measures the fuzz test compares around each rejected request:
the row count of every table (new tables, such as the ACL's, are counted
the day their migration lands)."""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field, replace

import psycopg
from google.protobuf.message import Message

from corral.domain import structs
from corral.v1 import structs_pb2 as pb

#: tables whose rows the fuzz test leaves out of the counts: none today;
#: `alembic_version` never changes outside migrations
UNCOUNTED_TABLES = frozenset({"alembic_version"})

#: how many stored objects of each kind to keep as seeds
SAMPLE = 50


def vocabulary() -> list[str]:
    """Every status, type, trigger and topic name `corral.domain.structs` defines,
    so generated strings hit the accepted values as well as the refused."""
    words: set[str] = set()
    for _, cls in inspect.getmembers(structs, inspect.isclass):
        if cls.__module__ != structs.__name__:
            continue
        for name, value in vars(cls).items():
            if name.isupper() and isinstance(value, str) and value:
                words.add(value)
    return sorted(words)


@dataclass
class Pool:
    jobs: list[pb.Job] = field(default_factory=list)
    nodes: list[pb.Node] = field(default_factory=list)
    allocs: list[pb.Allocation] = field(default_factory=list)
    evals: list[pb.Evaluation] = field(default_factory=list)
    deployments: list[pb.Deployment] = field(default_factory=list)
    scheduler_config: pb.SchedulerConfiguration | None = None
    #: node id -> secret id, for the nodes the harness registered
    secrets: dict[str, str] = field(default_factory=dict)
    index: int = 0
    words: list[str] = field(default_factory=vocabulary)

    def frozen(self) -> Pool:
        """A copy that later learning and refreshes leave alone (strategies
        are built from one: see `tests.fuzz.messages.Hints`)."""
        return replace(self, secrets=dict(self.secrets))

    # ----------------------------------------------------------- id lists

    def job_ids(self) -> list[str]:
        return [j.id for j in self.jobs]

    def node_ids(self) -> list[str]:
        return [n.id for n in self.nodes]

    def alloc_ids(self) -> list[str]:
        return [a.id for a in self.allocs]

    def eval_ids(self) -> list[str]:
        return [e.id for e in self.evals]

    def deployment_ids(self) -> list[str]:
        return [d.id for d in self.deployments]

    def all_ids(self) -> list[str]:
        return [
            *self.job_ids(),
            *self.node_ids(),
            *self.alloc_ids(),
            *self.eval_ids(),
            *self.deployment_ids(),
        ]

    def prefixes(self) -> list[str]:
        """Short and ambiguous prefixes of real ids (Nomad accepts unique ones)."""
        out = {i[:n] for i in self.all_ids() for n in (1, 4, 8) if len(i) > n}
        return sorted(out)

    def namespaces(self) -> list[str]:
        return sorted({j.namespace for j in self.jobs} | {"default", "*"})

    def groups(self) -> list[str]:
        return sorted({tg.name for j in self.jobs for tg in j.task_groups})

    def secret_values(self) -> list[str]:
        return sorted(self.secrets.values())

    def secret_of(self, node_id: str) -> str:
        return self.secrets.get(node_id, "")


def _load(conn: psycopg.Connection, sql: str, cls: type[Message]) -> list[Message]:
    return [cls.FromString(bytes(row[0])) for row in conn.execute(sql).fetchall()]


def refresh(pool: Pool, dsn: str) -> Pool:
    """Re-read the stored objects (the fuzz writes and deletes some)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        pool.jobs = _load(conn, f"SELECT payload FROM jobs ORDER BY id LIMIT {SAMPLE}", pb.Job)  # type: ignore[assignment]
        pool.nodes = _load(conn, f"SELECT payload FROM nodes ORDER BY id LIMIT {SAMPLE}", pb.Node)  # type: ignore[assignment]
        pool.allocs = _load(
            conn, f"SELECT payload FROM allocs ORDER BY id LIMIT {SAMPLE}", pb.Allocation
        )  # type: ignore[assignment]
        pool.evals = _load(
            conn, f"SELECT payload FROM evals ORDER BY id LIMIT {SAMPLE}", pb.Evaluation
        )  # type: ignore[assignment]
        pool.deployments = _load(
            conn, f"SELECT payload FROM deployments ORDER BY id LIMIT {SAMPLE}", pb.Deployment
        )  # type: ignore[assignment]
        configs = _load(conn, "SELECT payload FROM scheduler_config", pb.SchedulerConfiguration)
        pool.scheduler_config = configs[0] if configs else None  # type: ignore[assignment]
        row = conn.execute("SELECT value FROM index_counter").fetchone()
        pool.index = int(row[0]) if row else 0
    return pool


def row_counts(conn: psycopg.Connection) -> dict[str, int]:
    """Rows in every table of the state's schema."""
    tables = [
        r[0]
        for r in conn.execute(
            "SELECT table_name FROM information_schema.tables "
            "WHERE table_schema = 'public' AND table_type = 'BASE TABLE' ORDER BY table_name"
        ).fetchall()
        if r[0] not in UNCOUNTED_TABLES
    ]
    if not tables:
        return {}
    sql = " UNION ALL ".join(f"SELECT '{t}', count(*) FROM \"{t}\"" for t in tables)
    return {str(name): int(n) for name, n in conn.execute(sql).fetchall()}  # type: ignore[call-overload]
