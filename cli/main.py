"""`corral` — the command line, modelled on Nomad's.

Dispatch and the one place errors become exit codes: a gRPC error prints
`Error: <message>` on stderr and exits 1; a bad job file prints its
`file:line: field: problem` the same way; Ctrl-C exits 130; usage errors exit
1 (as Nomad's do). No traceback reaches the user; set CORRAL_CLI_DEBUG=1 to
see one for an unexpected error."""

from __future__ import annotations

import argparse
import os
import sys
import traceback
from collections.abc import Sequence

import grpc

from cli.client import resolve_address
from cli.commands import (
    acl,
    action,
    agent,
    alloc,
    alloc_access,
    deployment,
    dev,
    eval,
    event,
    job,
    namespace,
    node,
    operator,
    scaling,
    server,
    service,
    sim,
    state,
    system,
    tls,
    ui,
    var,
    version,
)
from cli.context import (
    EXIT_ERROR,
    EXIT_INTERRUPTED,
    EXIT_OK,
    CliError,
    Context,
    Handler,
    Parser,
    UsageError,
    grpc_message,
)
from corral.domain.jobspec.errors import JobspecError


def build_parser() -> Parser:
    parser = Parser(
        prog="corral",
        description="Corral: a workload scheduler modelled on HashiCorp Nomad.",
        epilog="Run `corral <command> -h` for a command's flags. Docs: docs/cli.md",
    )
    sub = parser.add_subparsers(dest="command", metavar="<command>", parser_class=Parser)
    for module in (
        job,
        deployment,
        node,
        namespace,
        scaling,
        eval,
        alloc,
        action,
        var,
        service,
        operator,
        server,
        acl,
        event,
        dev,
        agent,
        sim,
        state,
        system,
        tls,
        ui,
        version,
    ):
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    ctx: Context | None = None
    try:
        parser = build_parser()
        if not args_list or args_list[0] in ("-h", "--help", "help"):
            parser.print_help()
            return EXIT_OK if args_list else EXIT_ERROR
        args_list, child = var.split_child(args_list)
        args, unknown = parser.parse_known_args(alloc_access.separate_command(args_list))
        if unknown and not getattr(args, "passthrough", False):
            raise UsageError(f"unrecognized arguments: {' '.join(unknown)}")
        args.rest = unknown
        args.child = child
        handler: Handler | None = getattr(args, "func", None)
        if handler is None:
            # `corral job` alone: the group's help
            sub_parser: argparse.ArgumentParser | None = getattr(args, "group_parser", None)
            (sub_parser or parser).print_help(sys.stderr)
            return EXIT_ERROR
        ctx = Context(args)
        return handler(args, ctx)
    except UsageError as exc:
        print(f"Error: {exc}", file=sys.stderr)
        return EXIT_ERROR
    except JobspecError as exc:
        print(f"Error: {exc}", file=sys.stderr)
        return EXIT_ERROR
    except CliError as exc:
        print(f"Error: {exc}", file=sys.stderr)
        return EXIT_ERROR
    except grpc.RpcError as exc:
        address = ctx.address if ctx else resolve_address(None)
        print(f"Error: {grpc_message(exc, address)}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        print("", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # `corral ... | head`: the reader went away; that is not an error.
        try:
            sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - silence the exit flush
        except OSError:
            pass
        return EXIT_OK
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else EXIT_ERROR)
    except Exception as exc:  # the last line of defence: never a traceback
        if os.environ.get("CORRAL_CLI_DEBUG"):
            traceback.print_exc()
        print(f"Error: unexpected {type(exc).__name__}: {exc}", file=sys.stderr)
        return EXIT_ERROR
    finally:
        if ctx is not None:
            ctx.close()


def run() -> None:
    sys.exit(main())


if __name__ == "__main__":
    run()
