"""One module per command group (`corral job ...` → `job.py`); each has
`register(subparsers)` adding its parsers with a `func(args, ctx) -> int`."""

from __future__ import annotations

import argparse
from typing import Any

import grpc


def group(sub: Any, name: str, help_text: str) -> Any:
    """A command group (`corral job`) with its own subcommands."""
    p: argparse.ArgumentParser = sub.add_parser(name, help=help_text, description=help_text)
    p.set_defaults(group_parser=p)
    return p.add_subparsers(dest=f"{name}_command", metavar="<subcommand>")


def not_found(exc: grpc.RpcError) -> bool:
    return bool(exc.code() == grpc.StatusCode.NOT_FOUND)
