"""Initial schema: the index counter, change log, table indexes, jobs (with
versions and summaries), nodes, allocs, evals, deployments, scheduler
configuration and the member registry.

Revision ID: 0001
Revises:
Create Date: 2026-11-23
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def _indexes() -> list[sa.Column[int]]:
    return [
        sa.Column("create_index", sa.BigInteger(), nullable=False),
        sa.Column("modify_index", sa.BigInteger(), nullable=False),
    ]


def upgrade() -> None:
    op.create_table(
        "index_counter",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("value", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_index_counter"),
    )
    op.execute("INSERT INTO index_counter (id, value) VALUES (1, 0)")
    op.create_table(
        "change_log",
        sa.Column("index", sa.BigInteger(), autoincrement=False, nullable=False),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("clock_timestamp()"),
            nullable=False,
        ),
        sa.Column("payload", sa.LargeBinary(), nullable=False),
        sa.PrimaryKeyConstraint("index", name="pk_change_log"),
    )
    op.create_table(
        "table_indexes",
        sa.Column("name", sa.String(64), nullable=False),
        sa.Column("index", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("name", name="pk_table_indexes"),
    )
    op.create_table(
        "jobs",
        sa.Column("namespace", sa.String(128), nullable=False),
        sa.Column("id", sa.String(256), nullable=False),
        sa.Column("type", sa.String(16), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("priority", sa.Integer(), nullable=False),
        sa.Column("stop", sa.Boolean(), nullable=False),
        sa.Column("version", sa.BigInteger(), nullable=False),
        sa.Column("payload", sa.LargeBinary(), nullable=False),
        *_indexes(),
        sa.Column("job_modify_index", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("namespace", "id", name="pk_jobs"),
    )
    op.create_table(
        "job_versions",
        sa.Column("namespace", sa.String(128), nullable=False),
        sa.Column("id", sa.String(256), nullable=False),
        sa.Column("version", sa.BigInteger(), nullable=False),
        sa.Column("payload", sa.LargeBinary(), nullable=False),
        sa.Column("create_index", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("namespace", "id", "version", name="pk_job_versions"),
    )
    op.create_table(
        "job_summaries",
        sa.Column("namespace", sa.String(128), nullable=False),
        sa.Column("job_id", sa.String(256), nullable=False),
        sa.Column("payload", sa.LargeBinary(), nullable=False),
        *_indexes(),
        sa.PrimaryKeyConstraint("namespace", "job_id", name="pk_job_summaries"),
    )
    op.create_table(
        "nodes",
        sa.Column("id", sa.String(64), nullable=False),
        sa.Column("name", sa.String(256), nullable=False),
        sa.Column("datacenter", sa.String(128), nullable=False),
        sa.Column("node_pool", sa.String(128), nullable=False),
        sa.Column("node_class", sa.String(128), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("eligibility", sa.String(16), nullable=False),
        sa.Column("drain", sa.Boolean(), nullable=False),
        sa.Column("payload", sa.LargeBinary(), nullable=False),
        *_indexes(),
        sa.PrimaryKeyConstraint("id", name="pk_nodes"),
    )
    op.create_table(
        "allocs",
        sa.Column("id", sa.String(64), nullable=False),
        sa.Column("namespace", sa.String(128), nullable=False),
        sa.Column("job_id", sa.String(256), nullable=False),
        sa.Column("node_id", sa.String(64), nullable=False),
        sa.Column("eval_id", sa.String(64), nullable=False),
        sa.Column("name", sa.String(512), nullable=False),
        sa.Column("task_group", sa.String(256), nullable=False),
        sa.Column("desired_status", sa.String(16), nullable=False),
        sa.Column("client_status", sa.String(16), nullable=False),
        sa.Column("payload", sa.LargeBinary(), nullable=False),
        *_indexes(),
        sa.PrimaryKeyConstraint("id", name="pk_allocs"),
    )
    op.create_index("ix_allocs__namespace_job_id", "allocs", ["namespace", "job_id"])
    op.create_index("ix_allocs__node_id", "allocs", ["node_id"])
    op.create_index("ix_allocs__eval_id", "allocs", ["eval_id"])
    op.create_table(
        "evals",
        sa.Column("id", sa.String(64), nullable=False),
        sa.Column("namespace", sa.String(128), nullable=False),
        sa.Column("job_id", sa.String(256), nullable=False),
        sa.Column("type", sa.String(16), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("triggered_by", sa.String(64), nullable=False),
        sa.Column("priority", sa.Integer(), nullable=False),
        sa.Column("payload", sa.LargeBinary(), nullable=False),
        *_indexes(),
        sa.PrimaryKeyConstraint("id", name="pk_evals"),
    )
    op.create_index("ix_evals__namespace_job_id", "evals", ["namespace", "job_id"])
    op.create_index("ix_evals__status", "evals", ["status"])
    op.create_table(
        "deployments",
        sa.Column("id", sa.String(64), nullable=False),
        sa.Column("namespace", sa.String(128), nullable=False),
        sa.Column("job_id", sa.String(256), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("payload", sa.LargeBinary(), nullable=False),
        *_indexes(),
        sa.PrimaryKeyConstraint("id", name="pk_deployments"),
    )
    op.create_index("ix_deployments__namespace_job_id", "deployments", ["namespace", "job_id"])
    op.create_table(
        "scheduler_config",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("payload", sa.LargeBinary(), nullable=False),
        sa.Column("modify_index", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_scheduler_config"),
    )
    op.create_table(
        "members",
        sa.Column("id", sa.String(64), nullable=False),
        sa.Column("role", sa.String(32), nullable=False),
        sa.Column("address", sa.String(256), nullable=False),
        sa.Column("payload", sa.LargeBinary(), nullable=False),
        sa.Column(
            "last_seen", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False
        ),
        sa.PrimaryKeyConstraint("id", name="pk_members"),
    )


def downgrade() -> None:
    for table in (
        "members",
        "scheduler_config",
        "deployments",
        "evals",
        "allocs",
        "nodes",
        "job_summaries",
        "job_versions",
        "jobs",
        "table_indexes",
        "change_log",
        "index_counter",
    ):
        op.drop_table(table)
