"""One-time tokens (Nomad's OneTimeToken): a short-lived secret that
exchanges once for the ACL token it was made for.

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-28
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "acl_one_time_tokens",
        sa.Column("accessor_id", sa.String(64), nullable=False),
        sa.Column("secret_hash", sa.String(64), nullable=False),
        sa.Column("sealed_secret", sa.LargeBinary(), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("create_index", sa.BigInteger(), nullable=False),
        sa.Column("modify_index", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("accessor_id", name="pk_acl_one_time_tokens"),
        sa.UniqueConstraint("secret_hash", name="uq_acl_one_time_tokens__secret_hash"),
        sa.ForeignKeyConstraint(
            ["accessor_id"],
            ["acl_tokens.accessor_id"],
            name="fk_acl_one_time_tokens__accessor_id__acl_tokens",
            ondelete="CASCADE",
        ),
    )
    op.create_index("ix_acl_one_time_tokens__expires_at", "acl_one_time_tokens", ["expires_at"])


def downgrade() -> None:
    op.drop_table("acl_one_time_tokens")
