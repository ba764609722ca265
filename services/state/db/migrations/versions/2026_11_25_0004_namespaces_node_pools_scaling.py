"""Namespaces, node pools and scaling policies as objects: their tables, the
scaling events of each job, and the node pool of each job as a column (a
pool with live jobs cannot be deleted, and that is asked of the column).

The objects that always exist are created here: the `default` namespace,
the `all` and `default` node pools. So that an upgraded cluster keeps
working, every namespace its jobs already used and every pool its jobs and
nodes already named become objects too. They are written at the current
index (no change-log row: every state process and replica loads them with
its snapshot when it starts on the new schema).

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-25
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from corral.v1 import structs_pb2 as pb

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

_BUILT_IN_POOLS = {
    "all": "Node pool with all nodes in the cluster.",
    "default": "Default node pool.",
}


def upgrade() -> None:
    op.create_table(
        "namespaces",
        sa.Column("name", sa.String(128), nullable=False),
        sa.Column("payload", sa.LargeBinary(), nullable=False),
        sa.Column("create_index", sa.BigInteger(), nullable=False),
        sa.Column("modify_index", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("name", name="pk_namespaces"),
    )
    op.create_table(
        "node_pools",
        sa.Column("name", sa.String(128), nullable=False),
        sa.Column("payload", sa.LargeBinary(), nullable=False),
        sa.Column("create_index", sa.BigInteger(), nullable=False),
        sa.Column("modify_index", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("name", name="pk_node_pools"),
    )
    op.create_table(
        "scaling_policies",
        sa.Column("id", sa.String(64), nullable=False),
        sa.Column("namespace", sa.String(128), nullable=False),
        sa.Column("job_id", sa.String(256), nullable=False),
        sa.Column("type", sa.String(32), nullable=False),
        sa.Column("payload", sa.LargeBinary(), nullable=False),
        sa.Column("create_index", sa.BigInteger(), nullable=False),
        sa.Column("modify_index", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_scaling_policies"),
    )
    op.create_index(
        "ix_scaling_policies__namespace_job_id", "scaling_policies", ["namespace", "job_id"]
    )
    op.create_table(
        "scaling_events",
        sa.Column("namespace", sa.String(128), nullable=False),
        sa.Column("job_id", sa.String(256), nullable=False),
        sa.Column("payload", sa.LargeBinary(), nullable=False),
        sa.Column("modify_index", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("namespace", "job_id", name="pk_scaling_events"),
    )
    op.add_column(
        "jobs",
        sa.Column("node_pool", sa.String(128), nullable=False, server_default="default"),
    )
    _existing_objects()


def _existing_objects() -> None:
    """The built-in objects, and those an existing cluster used implicitly."""
    conn = op.get_bind()
    index = int(conn.execute(sa.text("SELECT value FROM index_counter WHERE id = 1")).scalar() or 0)
    namespaces = {"default"}
    pools = set(_BUILT_IN_POOLS)
    rows = conn.execute(sa.text("SELECT namespace, id, payload FROM jobs")).fetchall()
    for namespace, job_id, payload in rows:
        namespaces.add(str(namespace))
        pool = pb.Job.FromString(bytes(payload)).node_pool or "default"
        pools.add(pool)
        conn.execute(
            sa.text("UPDATE jobs SET node_pool = :p WHERE namespace = :n AND id = :i"),
            {"p": pool, "n": namespace, "i": job_id},
        )
    for (pool,) in conn.execute(sa.text("SELECT DISTINCT node_pool FROM nodes")).fetchall():
        pools.add(str(pool) or "default")
    for name in sorted(namespaces):
        description = "Default shared namespace" if name == "default" else ""
        ns = pb.Namespace(
            name=name, description=description, create_index=index, modify_index=index
        )
        conn.execute(
            sa.text("INSERT INTO namespaces VALUES (:n, :p, :i, :i)"),
            {"n": name, "p": ns.SerializeToString(), "i": index},
        )
    for name in sorted(pools):
        pool_msg = pb.NodePool(
            name=name,
            description=_BUILT_IN_POOLS.get(name, ""),
            create_index=index,
            modify_index=index,
        )
        conn.execute(
            sa.text("INSERT INTO node_pools VALUES (:n, :p, :i, :i)"),
            {"n": name, "p": pool_msg.SerializeToString(), "i": index},
        )


def downgrade() -> None:
    op.drop_column("jobs", "node_pool")
    for table in ("scaling_events", "scaling_policies", "node_pools", "namespaces"):
        op.drop_table(table)
