"""ACL roles: named sets of policies, and the roles each token links.

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-28
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "acl_roles",
        sa.Column("id", sa.String(64), nullable=False),
        sa.Column("name", sa.String(128), nullable=False),
        sa.Column("description", sa.String(256), nullable=False),
        sa.Column("policies", sa.ARRAY(sa.Text()), nullable=False),
        sa.Column("create_index", sa.BigInteger(), nullable=False),
        sa.Column("modify_index", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_acl_roles"),
        sa.UniqueConstraint("name", name="uq_acl_roles__name"),
    )
    op.add_column(
        "acl_tokens",
        sa.Column("roles", sa.ARRAY(sa.Text()), nullable=False, server_default="{}"),
    )


def downgrade() -> None:
    op.drop_column("acl_tokens", "roles")
    op.drop_table("acl_roles")
