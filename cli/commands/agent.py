"""`corral agent -dev` (= `corral dev`) and `corral agent -client ...`, which
runs a client node: `python -m services.agent` with the remaining flags."""

from __future__ import annotations

import argparse
import os
import sys

from cli.commands.dev import add_dev_flags, cmd_dev
from cli.context import CliError, Context
from cli.supervisor import module_exists


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "agent",
        help="Run a dev cluster (-dev) or a client node (-client [agent flags...])",
        description="`corral agent -dev` is `corral dev`. `corral agent -client [flags]` "
        "runs `python -m services.agent [flags]` (see its -h); -address/CORRAL_ADDR "
        "becomes --state-addr.",
    )
    p.add_argument("-dev", "--dev", dest="dev", action="store_true")
    p.add_argument("-client", "--client", dest="client", action="store_true")
    p.add_argument("-address", "--address", dest="address", default=None)
    add_dev_flags(p)
    p.set_defaults(func=cmd_agent, passthrough=True)


def exec_module(module: str, argv: list[str], ctx: Context, *, state_flag: bool = True) -> int:
    """Replace this process with `python -m module argv...`."""
    if not module_exists(module):
        raise CliError(f"{module} does not exist yet (no {module.replace('.', '/')}/__main__.py)")
    if state_flag and not any(a.startswith("--state-addr") for a in argv):
        argv = ["--state-addr", ctx.address, *argv]
    sys.stdout.flush()
    os.execv(sys.executable, [sys.executable, "-m", module, *argv])
    return 0  # not reached


def cmd_agent(args: argparse.Namespace, ctx: Context) -> int:
    if args.dev == args.client:
        raise CliError("give exactly one of -dev or -client")
    if args.dev:
        if args.rest:
            raise CliError(f"unexpected arguments for -dev: {' '.join(args.rest)}")
        return cmd_dev(args, ctx)
    return exec_module("services.agent", list(args.rest), ctx)
