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
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

import grpc

from cli.client import Client, resolve_address
from cli.jobspec import JobspecError

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_INTERRUPTED = 130

Handler = Callable[[argparse.Namespace, "Context"], int]


class UsageError(Exception):
    """Wrong flags or arguments (exit 1, like Nomad)."""


class CliError(Exception):
    """A problem to report as one `Error: ...` line (exit 1)."""


class Parser(argparse.ArgumentParser):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{message}\n\n{self.format_usage().strip()}")


class Context:
    """What a command handler gets besides its flags: a lazily opened
    client for `-address`/CORRAL_ADDR, and the output streams."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.address = resolve_address(getattr(args, "address", None))
        self._client: Client | None = None
        self.out = sys.stdout
        self.err = sys.stderr

    @property
    def client(self) -> Client:
        if self._client is None:
            self._client = Client(self.address)
        return self._client

    def close(self) -> None:
        if self._client is not None:
            self._client.close()


def add_address(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "-address",
        "--address",
        dest="address",
        default=None,
        help="state service gRPC address (env CORRAL_ADDR, default 127.0.0.1:4646)",
    )


def add_json(p: argparse.ArgumentParser) -> None:
    p.add_argument("-json", "--json", dest="json", action="store_true", help="print JSON")


def add_verbose(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "-verbose", "--verbose", dest="verbose", action="store_true", help="full ids and details"
    )


def common(p: argparse.ArgumentParser, *, json: bool = False, verbose: bool = False) -> None:
    """The flags most commands share: -address, and -json / -verbose where they apply."""
    add_address(p)
    if json:
        add_json(p)
    if verbose:
        add_verbose(p)


def build_parser() -> Parser:
    from cli.commands import (
        agent,
        alloc,
        dev,
        eval,
        event,
        job,
        node,
        operator,
        sim,
        state,
        version,
    )

    parser = Parser(
        prog="corral",
        description="Corral: a workload scheduler modelled on HashiCorp Nomad.",
        epilog="Run `corral <command> -h` for a command's flags. Docs: docs/cli.md",
    )
    sub = parser.add_subparsers(dest="command", metavar="<command>", parser_class=Parser)
    for module in (job, node, eval, alloc, operator, event, dev, agent, sim, state, version):
        module.register(sub)
    return parser


def grpc_message(exc: grpc.RpcError, address: str) -> str:
    """A sentence a person can act on, from a gRPC status."""
    code = exc.code() if hasattr(exc, "code") else None
    details = (exc.details() if hasattr(exc, "details") else None) or str(code)
    if code == grpc.StatusCode.UNAVAILABLE:
        lowered = details.lower()
        if (
            "connect" in lowered
            or "refused" in lowered
            or "dns" in lowered
            or "failed to" in lowered
        ):
            reason = "connection refused" if "refused" in lowered else details
            return (
                f"cannot reach Corral at {address} ({reason}); is `corral dev` running? "
                "Set -address or CORRAL_ADDR to point elsewhere"
            )
        return f"{details} (server unavailable at {address})"
    if code == grpc.StatusCode.UNIMPLEMENTED:
        return f"the server at {address} does not implement this call ({details})"
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return f"timed out waiting for {address} ({details})"
    return details


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    ctx: Context | None = None
    try:
        parser = build_parser()
        if not args_list or args_list[0] in ("-h", "--help", "help"):
            parser.print_help()
            return EXIT_OK if args_list else EXIT_ERROR
        args, unknown = parser.parse_known_args(args_list)
        if unknown and not getattr(args, "passthrough", False):
            raise UsageError(f"unrecognized arguments: {' '.join(unknown)}")
        args.rest = unknown
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
