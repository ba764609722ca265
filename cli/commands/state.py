"""`corral state migrate`: bring a database's schema up to date (runs
`python -m services.state migrate`). With no -dsn/CORRAL_DSN it migrates the
dev cluster's embedded PostgreSQL in -data-dir."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import warnings
from pathlib import Path

from cli.commands import group
from cli.commands.dev import DEFAULT_DATA_DIR
from cli.context import CliError, Context
from cli.supervisor import module_exists


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    states = group(sub, "state", "State database maintenance")
    p = states.add_parser("migrate", help="Apply schema migrations")
    p.add_argument(
        "-dsn",
        "--dsn",
        default=os.environ.get("CORRAL_DSN", ""),
        help="PostgreSQL DSN (env CORRAL_DSN)",
    )
    p.add_argument(
        "-data-dir",
        "--data-dir",
        dest="data_dir",
        default=DEFAULT_DATA_DIR,
        help="dev data directory whose embedded PostgreSQL to migrate when no DSN is given",
    )
    p.set_defaults(func=cmd_migrate)


def cmd_migrate(args: argparse.Namespace, ctx: Context) -> int:
    if not module_exists("services.state"):
        raise CliError("services.state does not exist yet; cannot migrate")
    pg = None
    dsn = args.dsn
    if not dsn:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from corral.devtools.pgserver import EmbeddedPostgres

            Path(args.data_dir).mkdir(parents=True, exist_ok=True)
            pg = EmbeddedPostgres(Path(args.data_dir) / "pg")
            try:
                dsn = pg.start()
            except RuntimeError as exc:  # no embedded PostgreSQL in this install
                raise CliError(str(exc)) from None
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "services.state", "migrate", "--dsn", dsn], check=False
        )
        return 0 if proc.returncode == 0 else 1
    finally:
        if pg is not None:
            pg.stop()
