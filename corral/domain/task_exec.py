"""A command run inside a task, by `alloc exec` or as a job's action: the
bounds of the command, and the signal the agent gives once it runs it.

Why the signal: a gRPC asyncio client that writes to a bidirectional call
the server has already ended reports INTERNAL ("Internal error from Core")
instead of the server's status (grpc/grpc#36066). The agent refuses a
session (no permission, unknown task or action) right after the setup
message, so a caller relaying stdin would turn each refusal into that
internal error. The agent sends EXEC_STARTED as initial metadata once the
command runs; a relay writes nothing but the setup before it sees it."""

from __future__ import annotations

from collections.abc import Iterable

#: the largest command (all its arguments) run in a task
MAX_COMMAND_BYTES = 64 * 1024
MAX_COMMAND_ARGS = 1024

#: initial metadata key the agent sends when the command is running
EXEC_STARTED = "corral-exec-started"


def command_problem(command: list[str]) -> str:
    """What is wrong with a command to run in a task ('' when nothing)."""
    if not command or not command[0]:
        return "command is not present"
    if len(command) > MAX_COMMAND_ARGS:
        return f"has {len(command)} arguments, more than {MAX_COMMAND_ARGS}"
    if sum(len(a.encode()) for a in command) > MAX_COMMAND_BYTES:
        return f"is longer than {MAX_COMMAND_BYTES} bytes"
    if any("\x00" in a for a in command):
        return "must not contain NUL characters"
    return ""


def started(initial_metadata: Iterable[tuple[str, str | bytes]] | None) -> bool:
    """Whether the agent's initial metadata says the command runs."""
    return any(key == EXEC_STARTED for key, _ in initial_metadata or ())
