"""Session-wide fixtures: one PostgreSQL per test session, one migrated
template database, and a fresh clone of it per test module (Zulip's trick:
CREATE DATABASE ... TEMPLATE takes tens of milliseconds).

Set CORRAL_TEST_DSN to use an external PostgreSQL instead of the embedded one.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import signal
import tempfile
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pytest

from corral.devtools.pgserver import EmbeddedPostgres, with_database
from tests.cluster import Cluster

# The servers' shared secret for internal RPCs, for every process a test
# starts and for the test's own clients (corral.security.transport reads it lazily).
os.environ.setdefault("CORRAL_SERVER_TOKEN", f"test-{uuid.uuid4().hex}")

# Tests stop the CLI and `corral dev` with Ctrl-C (SIGINT). A test run
# started in the background of a non-interactive shell inherits SIGINT
# ignored, and so would every process it starts: they would never see the
# Ctrl-C. Children inherit "ignored" but not a handler, so taking Python's
# own handler back here gives them the default, as from a terminal.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

ROOT = Path(__file__).resolve().parent.parent

# Each checkout its own root for pytest's temporary directories. At every
# session start pytest closes its per-user directory (/tmp/pytest-of-root)
# to 0700; as root the embedded PostgreSQL runs as a user of its own, which
# then cannot reach the data of another session's `corral dev` on the same
# machine (initdb: Permission denied). Short on purpose: task sockets live
# under these directories and AF_UNIX paths are at most 107 bytes.
_TEMPROOT = Path(tempfile.gettempdir()) / f"ct-{hashlib.sha1(bytes(ROOT)).hexdigest()[:6]}"
_TEMPROOT.mkdir(mode=0o755, exist_ok=True)
os.environ.setdefault("PYTEST_DEBUG_TEMPROOT", str(_TEMPROOT))
MIGRATIONS = ROOT / "services" / "state" / "db" / "migrations"


def _migrations_hash() -> str:
    h = hashlib.sha1()
    if MIGRATIONS.exists():
        for p in sorted(MIGRATIONS.rglob("*.py")):
            h.update(p.name.encode())
            h.update(p.read_bytes())
    return h.hexdigest()[:12]


@pytest.fixture(scope="session")
def pg_admin_dsn() -> Iterator[str]:
    """DSN of a superuser connection to the session's PostgreSQL server."""
    external = os.environ.get("CORRAL_TEST_DSN")
    if external:
        yield external
        return
    tmp = tempfile.mkdtemp(prefix="corral-test-pg-")
    server = EmbeddedPostgres(Path(tmp) / "data", delete_on_stop=True)
    dsn = server.start()
    try:
        yield dsn
    finally:
        server.stop()
        shutil.rmtree(tmp, ignore_errors=True)


@pytest.fixture(scope="session")
def pg_template(pg_admin_dsn: str) -> str:
    """Name of a database migrated to head, rebuilt when migrations change."""
    from services.state.db.migrate import upgrade

    name = f"corral_tmpl_{_migrations_hash()}"
    with psycopg.connect(pg_admin_dsn, autocommit=True) as conn:
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone()
        if not exists:
            for (old,) in conn.execute(
                "SELECT datname FROM pg_database WHERE datname LIKE 'corral_tmpl_%%'"
            ).fetchall():
                conn.execute(f'ALTER DATABASE "{old}" IS_TEMPLATE false')
                conn.execute(f'DROP DATABASE IF EXISTS "{old}"')
            conn.execute(f'CREATE DATABASE "{name}"')
            upgrade(with_database(pg_admin_dsn, name))
            conn.execute(f'ALTER DATABASE "{name}" IS_TEMPLATE true')
    return name


def new_database(admin_dsn: str, template: str, label: str) -> str:
    safe = re.sub(r"[^a-z0-9_]", "_", label.lower())[-30:]
    name = f"t_{safe}_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template}"')
    return name


def drop_database(admin_dsn: str, name: str) -> None:
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(scope="module")
def pg_dsn(request: pytest.FixtureRequest, pg_admin_dsn: str, pg_template: str) -> Iterator[str]:
    """A freshly migrated database of this test module's own."""
    name = new_database(pg_admin_dsn, pg_template, request.module.__name__.rsplit(".", 1)[-1])
    try:
        yield with_database(pg_admin_dsn, name)
    finally:
        drop_database(pg_admin_dsn, name)


@pytest.fixture
def fresh_pg_dsn(
    request: pytest.FixtureRequest, pg_admin_dsn: str, pg_template: str
) -> Iterator[str]:
    """A freshly migrated database for one test (when a module needs several)."""
    name = new_database(pg_admin_dsn, pg_template, request.node.name)
    try:
        yield with_database(pg_admin_dsn, name)
    finally:
        drop_database(pg_admin_dsn, name)


@pytest.fixture
def make_cluster(
    request: pytest.FixtureRequest, pg_admin_dsn: str, pg_template: str, tmp_path: Path
) -> Iterator[Callable[..., Cluster]]:
    """Call it to get an empty Cluster of real processes (start roles
    yourself), over a database of its own; everything is stopped and the
    database dropped when the test ends."""
    made: list[tuple[Cluster, str]] = []

    def make(**env: str) -> Cluster:
        name = new_database(pg_admin_dsn, pg_template, f"{request.node.name}_{len(made)}")
        cluster = Cluster(
            with_database(pg_admin_dsn, name), tmp_path / f"cluster{len(made)}", env=env
        )
        made.append((cluster, name))
        return cluster

    try:
        yield make
    finally:
        for cluster, name in made:
            cluster.stop_all()
            drop_database(pg_admin_dsn, name)
