"""A consistent copy of every table at one index (Raft's snapshot install).

Nodes come without their secret's hash (services/state/node_identity.py):
this dump feeds `State.Snapshot` and the state's own feed.

Read in one REPEATABLE READ transaction: the counter value read there is the
index of the newest transaction visible to it, because a writer holds the
counter row lock until it commits.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from corral.domain.store import StateSnapshot, StateStore
from corral.v1 import structs_pb2 as pb
from services.state.db.database import Database
from services.state.node_identity import redact


@dataclass
class Dump:
    index: int = 0
    table_indexes: dict[str, int] = field(default_factory=dict)
    jobs: list[pb.Job] = field(default_factory=list)
    job_versions: list[pb.Job] = field(default_factory=list)
    nodes: list[pb.Node] = field(default_factory=list)
    allocs: list[pb.Allocation] = field(default_factory=list)
    evals: list[pb.Evaluation] = field(default_factory=list)
    deployments: list[pb.Deployment] = field(default_factory=list)
    job_summaries: list[pb.JobSummary] = field(default_factory=list)
    service_registrations: list[pb.ServiceRegistration] = field(default_factory=list)
    scheduler_config: pb.SchedulerConfiguration = field(default_factory=pb.SchedulerConfiguration)
    namespaces: list[pb.Namespace] = field(default_factory=list)
    node_pools: list[pb.NodePool] = field(default_factory=list)
    scaling_policies: list[pb.ScalingPolicy] = field(default_factory=list)
    scaling_events: list[pb.JobScalingEvents] = field(default_factory=list)

    def to_snapshot(self) -> StateSnapshot:
        return StateStore.build(
            self.index,
            jobs=self.jobs,
            job_versions=self.job_versions,
            nodes=self.nodes,
            allocs=self.allocs,
            evals=self.evals,
            deployments=self.deployments,
            job_summaries=self.job_summaries,
            service_registrations=self.service_registrations,
            scheduler_config=self.scheduler_config,
            namespaces=self.namespaces,
            node_pools=self.node_pools,
            scaling_policies=self.scaling_policies,
            scaling_events=self.scaling_events,
            table_indexes=self.table_indexes,
        )


_TABLES: list[tuple[str, str, type]] = [
    ("jobs", "SELECT payload FROM jobs", pb.Job),
    ("job_versions", "SELECT payload FROM job_versions", pb.Job),
    ("nodes", "SELECT payload FROM nodes", pb.Node),
    ("allocs", "SELECT payload FROM allocs", pb.Allocation),
    ("evals", "SELECT payload FROM evals", pb.Evaluation),
    ("deployments", "SELECT payload FROM deployments", pb.Deployment),
    ("job_summaries", "SELECT payload FROM job_summaries", pb.JobSummary),
    (
        "service_registrations",
        "SELECT payload FROM service_registrations",
        pb.ServiceRegistration,
    ),
    ("namespaces", "SELECT payload FROM namespaces", pb.Namespace),
    ("node_pools", "SELECT payload FROM node_pools", pb.NodePool),
    ("scaling_policies", "SELECT payload FROM scaling_policies", pb.ScalingPolicy),
    ("scaling_events", "SELECT payload FROM scaling_events", pb.JobScalingEvents),
]


async def stream_dump(
    db: Database, chunk_size: int = 1000, tables: set[str] | None = None
) -> AsyncIterator[tuple[str, list[object] | Dump]]:
    """Yield ("header", Dump-with-index) first, then (table, objects) chunks
    of every table, or only of `tables` (a filtered replica's)."""
    async with db.read(repeatable=True) as conn:
        cur = await conn.execute("SELECT value FROM index_counter WHERE id = 1")
        index_row = await cur.fetchone()
        head = Dump(index=int(index_row[0]) if index_row else 0)
        cur = await conn.execute("SELECT name, index FROM table_indexes")
        for name, idx in await cur.fetchall():
            head.table_indexes[str(name)] = int(idx)
        cur = await conn.execute("SELECT payload FROM scheduler_config WHERE id = 1")
        cfg = await cur.fetchone()
        if cfg is not None:
            head.scheduler_config = pb.SchedulerConfiguration.FromString(cfg[0])
        yield "header", head
        for name, query, cls in _TABLES:
            if tables is not None and name not in tables:
                continue
            async with conn.cursor(name=f"snapshot_{name}") as scur:
                await scur.execute(query)
                while True:
                    rows = await scur.fetchmany(chunk_size)
                    if not rows:
                        break
                    objs = [cls.FromString(r[0]) for r in rows]  # type: ignore[attr-defined]
                    if cls is pb.Node:
                        for node in objs:
                            redact(node)  # the secret's hash stays in the table
                    yield name, objs


async def load_dump(db: Database) -> Dump:
    """The whole state at one index, in memory."""
    dump = Dump()
    async for name, part in stream_dump(db, chunk_size=5000):
        if name == "header":
            assert isinstance(part, Dump)
            dump.index = part.index
            dump.table_indexes = part.table_indexes
            dump.scheduler_config = part.scheduler_config
        else:
            assert isinstance(part, list)
            getattr(dump, name).extend(part)
    return dump
