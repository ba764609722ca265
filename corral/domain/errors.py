"""Domain errors and their gRPC status codes.

Handlers raise these; the one interceptor in `corral.runtime.server` turns them into
statuses, so a handler never builds a status by hand and the mapping lives
in one place (STYLE.md: INVALID_ARGUMENT names the field, FAILED_PRECONDITION
for a stale check-index or a non-ready node, ABORTED for retryable
serialization failures, UNAVAILABLE for not-leader with the leader's address).
"""

from __future__ import annotations

from typing import Any

import grpc

LEADER_METADATA_KEY = "corral-leader"
#: the trailing metadata of an INVALID_ARGUMENT that names its field (an
#: `InvalidArgument.field`), so a gateway can name it in its caller's words
FIELD_METADATA_KEY = "corral-field"
#: the trailing metadata of the OUT_OF_RANGE that ends a change-feed stream
#: because the state was replaced by a snapshot restore (`StateRestored`):
#: the index the restore committed at
RESTORED_METADATA_KEY = "corral-restored"

#: The longest status message a caller is sent, in bytes as gRPC carries it
#: (percent-encoded in the `grpc-message` trailer). Clients drop trailers
#: over 8 to 16 KiB: the caller then gets RESOURCE_EXHAUSTED ("metadata size
#: exceeds hard limit") instead of the status, and messages echo input (an
#: unknown id of 10,000 characters, a list of them).
MAX_MESSAGE_WIRE_BYTES = 2048
_TRUNCATED = " ... (truncated)"


def _wire_bytes(ch: str) -> int:
    """What one character costs in a grpc-message trailer: printable ASCII
    as is (`%` escaped), everything else percent-encoded per UTF-8 byte."""
    if " " <= ch <= "~":
        return 3 if ch == "%" else 1
    return 3 * len(ch.encode("utf-8", errors="replace"))


def bounded_message(message: str, limit: int = MAX_MESSAGE_WIRE_BYTES) -> str:
    """`message`, cut so that it fits in `limit` bytes on the wire."""
    room = limit - len(_TRUNCATED)
    used = 0
    for i, ch in enumerate(message):
        used += _wire_bytes(ch)
        if used > room:
            rest = message[i:]
            if sum(map(_wire_bytes, rest)) + used - _wire_bytes(ch) <= limit:
                return message  # the whole message fits after all
            return message[:i] + _TRUNCATED
    return message


class CorralError(Exception):
    code: grpc.StatusCode = grpc.StatusCode.INTERNAL

    def __init__(self, message: str) -> None:
        message = bounded_message(message)
        super().__init__(message)
        self.message = message


class InvalidArgument(CorralError):
    """Bad input; `field` names the offending field (e.g. `job.task_groups[0].count`)."""

    code = grpc.StatusCode.INVALID_ARGUMENT

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field}: {problem}" if field else problem)
        self.field = field


class NotFound(CorralError):
    code = grpc.StatusCode.NOT_FOUND


class AlreadyExists(CorralError):
    code = grpc.StatusCode.ALREADY_EXISTS


class FailedPrecondition(CorralError):
    code = grpc.StatusCode.FAILED_PRECONDITION


class Aborted(CorralError):
    """A retryable conflict (serialization failure, lost race)."""

    code = grpc.StatusCode.ABORTED


class OutOfRange(CorralError):
    code = grpc.StatusCode.OUT_OF_RANGE


class StateRestored(OutOfRange):
    """A change-feed stream crossed a snapshot restore: the subscriber
    reloads from a snapshot, and knows (RESTORED_METADATA_KEY) that what it
    kept beside its copy of the state may be gone."""

    def __init__(self, index: int) -> None:
        super().__init__(
            f"the state was replaced by a snapshot restore at index {index}; "
            "re-bootstrap from State.Snapshot"
        )
        self.index = index


class ResourceExhausted(CorralError):
    code = grpc.StatusCode.RESOURCE_EXHAUSTED


class Unavailable(CorralError):
    code = grpc.StatusCode.UNAVAILABLE


class NotLeader(Unavailable):
    """This process is a standby; `leader_address` says where the leader is
    (empty while an election is under way)."""

    def __init__(self, role: str, leader_address: str, *, message: str = "") -> None:
        where = f"leader={leader_address}" if leader_address else "no leader elected yet"
        super().__init__(message or f"this {role} is not the leader; {where}")
        self.leader_address = leader_address


class TakingOffice(NotLeader):
    """This process won the election but has not taken office yet (it is
    restoring its state); it names itself as the leader, and a caller
    retries it after a backoff. Said as such: "not the leader; leader=<its
    own address>" read as if another process led (issue 26, finding 9)."""

    def __init__(self, role: str, address: str) -> None:
        super().__init__(
            role,
            address,
            message=f"this {role} is the leader but still taking office (restoring its "
            "state); retry shortly",
        )


class PermissionDenied(CorralError):
    code = grpc.StatusCode.PERMISSION_DENIED


#: trailing metadata that tells a gRPC client's retry policy not to try a
#: call again (a server pushback of -1, gRPC's retry design A6)
NO_RETRY_METADATA = (("grpc-retry-pushback-ms", "-1"),)
NO_REGION_PATH = "No path to region"


class NoRegionPath(CorralError):
    """Nomad's "No path to region": a request names a region this server
    cannot reach. UNAVAILABLE when the region is known but none of its
    servers answered (the caller may try later; its channel does not retry
    at once), FAILED_PRECONDITION when no such region is known here."""

    def __init__(self, region: str, why: str, *, known: bool = True) -> None:
        super().__init__(f"{NO_REGION_PATH} {region!r}: {why}")
        self.code = grpc.StatusCode.UNAVAILABLE if known else grpc.StatusCode.FAILED_PRECONDITION
        self.region = region


def leader_from_error(err: grpc.aio.AioRpcError | grpc.RpcError) -> str:
    """The leader address carried by an UNAVAILABLE not-leader status, or ''."""
    md: Any = err.trailing_metadata() if hasattr(err, "trailing_metadata") else None
    for key, value in md or ():
        if key == LEADER_METADATA_KEY:
            return value if isinstance(value, str) else value.decode()
    return ""


class ConfigError(Exception):
    """Settings a process cannot start with safely (TLS files unreadable, an
    internal API with no way to tell servers apart). The runner logs the
    message and exits with status 2, without a traceback."""
