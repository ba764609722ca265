"""ACL: policies, tokens (only a SHA-256 hash of each secret id) and the
one-row bootstrap marker.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-24
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "acl_policies",
        sa.Column("name", sa.String(128), nullable=False),
        sa.Column("description", sa.String(256), nullable=False),
        sa.Column("rules", sa.Text(), nullable=False),
        sa.Column("create_index", sa.BigInteger(), nullable=False),
        sa.Column("modify_index", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("name", name="pk_acl_policies"),
    )
    op.create_table(
        "acl_tokens",
        sa.Column("accessor_id", sa.String(64), nullable=False),
        sa.Column("secret_hash", sa.String(64), nullable=False),
        sa.Column("name", sa.String(256), nullable=False),
        sa.Column("type", sa.String(16), nullable=False),
        sa.Column("policies", sa.ARRAY(sa.Text()), nullable=False),
        sa.Column("global", sa.Boolean(), nullable=False),
        sa.Column("create_time", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expiration_time", sa.DateTime(timezone=True), nullable=True),
        sa.Column("create_index", sa.BigInteger(), nullable=False),
        sa.Column("modify_index", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("accessor_id", name="pk_acl_tokens"),
        sa.UniqueConstraint("secret_hash", name="uq_acl_tokens__secret_hash"),
        sa.CheckConstraint("type IN ('client', 'management')", name="ck_acl_tokens__type"),
    )
    op.create_table(
        "acl_bootstrap",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("bootstrap_index", sa.BigInteger(), nullable=False),
        sa.Column("accessor_id", sa.String(64), nullable=False),
        sa.Column("create_time", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_acl_bootstrap"),
        sa.CheckConstraint("id = 1", name="ck_acl_bootstrap__one_row"),
    )


def downgrade() -> None:
    for table in ("acl_bootstrap", "acl_tokens", "acl_policies"):
        op.drop_table(table)
