"""`corral version`."""

from __future__ import annotations

import argparse
from importlib import metadata

from cli.context import Context


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("version", help="Print the version")
    p.set_defaults(func=cmd_version)


def cmd_version(args: argparse.Namespace, ctx: Context) -> int:
    try:
        v = metadata.version("corral")
    except metadata.PackageNotFoundError:
        v = "unknown"
    ctx.out.write(f"Corral v{v}\n")
    return 0
