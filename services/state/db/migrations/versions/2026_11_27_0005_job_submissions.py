"""Job submissions: the source (and variables) each job version was
submitted with, as Nomad keeps them for `job inspect -hcl` and the UI.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-27
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "job_submissions",
        sa.Column("namespace", sa.String(128), nullable=False),
        sa.Column("id", sa.String(256), nullable=False),
        sa.Column("version", sa.BigInteger(), nullable=False),
        sa.Column("payload", sa.LargeBinary(), nullable=False),
        sa.PrimaryKeyConstraint("namespace", "id", "version", name="pk_job_submissions"),
    )


def downgrade() -> None:
    op.drop_table("job_submissions")
