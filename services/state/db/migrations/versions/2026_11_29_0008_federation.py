"""Federation: the regions this region joined or was joined by, and where
their state servers are reached.

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "federation_regions",
        sa.Column("region", sa.String(64), nullable=False),
        sa.Column("addresses", sa.ARRAY(sa.Text()), nullable=False),
        sa.Column(
            "joined_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.Column(
            "updated_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.PrimaryKeyConstraint("region", name="pk_federation_regions"),
    )


def downgrade() -> None:
    op.drop_table("federation_regions")
