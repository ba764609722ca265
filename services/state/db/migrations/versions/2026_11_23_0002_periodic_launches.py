"""Periodic launches: the last launch time of each periodic job.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-23
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "periodic_launches",
        sa.Column("namespace", sa.String(128), nullable=False),
        sa.Column("job_id", sa.String(256), nullable=False),
        sa.Column("launch", sa.BigInteger(), nullable=False),
        sa.Column("payload", sa.LargeBinary(), nullable=False),
        sa.Column("create_index", sa.BigInteger(), nullable=False),
        sa.Column("modify_index", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("namespace", "job_id", name="pk_periodic_launches"),
    )


def downgrade() -> None:
    op.drop_table("periodic_launches")
