"""Alembic environment: migrations run on the connection `migrate.upgrade`
hands over (inside its advisory-locked transaction)."""

from __future__ import annotations

from alembic import context

from services.state.db.models import Base

config = context.config
connection = config.attributes.get("connection")
if connection is None:
    raise RuntimeError("run migrations through services.state.db.migrate.upgrade(dsn)")

context.configure(
    connection=connection,
    target_metadata=Base.metadata,
    transaction_per_migration=True,
    compare_type=True,
)
with context.begin_transaction():
    context.run_migrations()
