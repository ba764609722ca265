"""Service registrations: the instances of Nomad-provider services the
client agents register (Nomad's native service discovery).

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-28
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "service_registrations",
        sa.Column("namespace", sa.String(128), nullable=False),
        sa.Column("id", sa.String(1024), nullable=False),
        sa.Column("service_name", sa.String(256), nullable=False),
        sa.Column("node_id", sa.String(64), nullable=False),
        sa.Column("datacenter", sa.String(128), nullable=False),
        sa.Column("job_id", sa.String(256), nullable=False),
        sa.Column("alloc_id", sa.String(64), nullable=False),
        sa.Column("tags", sa.ARRAY(sa.Text()), nullable=False),
        sa.Column("address", sa.String(256), nullable=False),
        sa.Column("port", sa.Integer(), nullable=False),
        sa.Column("payload", sa.LargeBinary(), nullable=False),
        sa.Column("create_index", sa.BigInteger(), nullable=False),
        sa.Column("modify_index", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("namespace", "id", name="pk_service_registrations"),
    )
    op.create_index(
        "ix_service_registrations__namespace_service_name",
        "service_registrations",
        ["namespace", "service_name"],
    )
    op.create_index("ix_service_registrations__alloc_id", "service_registrations", ["alloc_id"])
    op.create_index("ix_service_registrations__node_id", "service_registrations", ["node_id"])
    op.create_index(
        "ix_service_registrations__namespace_job_id",
        "service_registrations",
        ["namespace", "job_id"],
    )


def downgrade() -> None:
    op.drop_table("service_registrations")
