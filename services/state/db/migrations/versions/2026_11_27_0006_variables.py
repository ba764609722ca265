"""Variables (items as AES-256-GCM ciphertext only) and the keyring's root
keys (their material wrapped by the state role's key-encryption key).

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-26
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "variables",
        sa.Column("namespace", sa.String(128), nullable=False),
        sa.Column("path", sa.String(128), nullable=False),
        sa.Column("key_id", sa.String(64), nullable=False),
        sa.Column("data", sa.LargeBinary(), nullable=False),
        sa.Column("create_index", sa.BigInteger(), nullable=False),
        sa.Column("modify_index", sa.BigInteger(), nullable=False),
        sa.Column("create_time", sa.BigInteger(), nullable=False),
        sa.Column("modify_time", sa.BigInteger(), nullable=False),
        sa.Column("lock_id", sa.String(64), nullable=True),
        sa.Column("lock_ttl", sa.BigInteger(), nullable=False, server_default="0"),
        sa.Column("lock_delay", sa.BigInteger(), nullable=False, server_default="0"),
        sa.Column("lock_expires", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("namespace", "path", name="pk_variables"),
    )
    op.create_index("ix_variables__key_id", "variables", ["key_id"])
    op.create_table(
        "root_keys",
        sa.Column("key_id", sa.String(64), nullable=False),
        sa.Column("algorithm", sa.String(32), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("create_time", sa.BigInteger(), nullable=False),
        sa.Column("publish_time", sa.BigInteger(), nullable=False, server_default="0"),
        sa.Column("create_index", sa.BigInteger(), nullable=False),
        sa.Column("modify_index", sa.BigInteger(), nullable=False),
        sa.Column("kek_id", sa.String(64), nullable=False),
        sa.Column("wrapped_key", sa.LargeBinary(), nullable=False),
        sa.Column("wrapped_rsa_key", sa.LargeBinary(), nullable=False),
        sa.Column("public_key", sa.LargeBinary(), nullable=False),
        sa.PrimaryKeyConstraint("key_id", name="pk_root_keys"),
        sa.CheckConstraint(
            "state IN ('active', 'inactive', 'rekeying', 'prepublished', 'deprecated')",
            name="ck_root_keys__state",
        ),
    )


def downgrade() -> None:
    op.drop_table("root_keys")
    op.drop_index("ix_variables__key_id", table_name="variables")
    op.drop_table("variables")
