"""`corral sim nodes --count N [...]`: many simulated client nodes in one
process (`python -m services.agent.sim`), for scale experiments."""

from __future__ import annotations

import argparse

from cli.commands import group
from cli.commands.agent import exec_module
from cli.context import Context


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    sims = group(sub, "sim", "Simulated client nodes")
    p = sims.add_parser(
        "nodes",
        help="Run N simulated nodes (flags go to `python -m services.agent.sim`, "
        "e.g. --count 1000)",
    )
    p.add_argument("-address", "--address", dest="address", default=None)
    p.set_defaults(func=cmd_nodes, passthrough=True)


def cmd_nodes(args: argparse.Namespace, ctx: Context) -> int:
    return exec_module("services.agent.sim", list(args.rest), ctx)
