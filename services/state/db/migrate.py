"""Apply the Alembic migrations: the only way the schema is created.

`upgrade(dsn)` runs on state service start-up and from `corral state
migrate`; concurrent callers are serialized by a transaction-level advisory
lock so several state replicas starting together do not race.
"""

from __future__ import annotations

from pathlib import Path

import psycopg
from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, create_engine, text
from sqlalchemy.pool import NullPool

MIGRATIONS_DIR = Path(__file__).resolve().parent / "migrations"
# pg_advisory_xact_lock key for migrations ("corral" in ASCII, arbitrary but fixed)
MIGRATION_LOCK = 0x636F7272616C


def alembic_config(connection: Connection | None = None) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    if connection is not None:
        cfg.attributes["connection"] = connection
    return cfg


def sync_engine(dsn: str):  # type: ignore[no-untyped-def]
    """A SQLAlchemy engine over any libpq DSN (URI or key=value form)."""
    return create_engine(
        "postgresql+psycopg://",
        creator=lambda: psycopg.connect(dsn),
        poolclass=NullPool,
    )


def upgrade(dsn: str, revision: str = "head") -> str:
    """Migrate the database to `revision`; returns the resulting revision."""
    engine = sync_engine(dsn)
    try:
        with engine.begin() as conn:
            conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": MIGRATION_LOCK})
            command.upgrade(alembic_config(conn), revision)
            return current_revision(conn) or ""
    finally:
        engine.dispose()


def current_revision(conn: Connection) -> str | None:
    return MigrationContext.configure(conn).get_current_revision()


def head_revision() -> str:
    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    return head or ""
