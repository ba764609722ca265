"""What every fuzzed answer must satisfy.

* **A clean status.** OK, or a code a client can act on (below); never
  UNKNOWN or INTERNAL (an unhandled exception), UNIMPLEMENTED, CANCELLED
  or DATA_LOSS. Nor UNAVAILABLE: every role of the cluster is up, so no
  request has a reason to be told "try again elsewhere" (a relayed one,
  Job.Plan or Periodic.Force on the state, included).
* **No internals in the answer.** Neither the details nor the trailing
  metadata carry traceback text or a database driver's error.
* **The server's answer arrives.** Not a status the transport made up
  because the server's could not be delivered (a message too long for its
  trailer).
* **Nothing written by a refusal.** Around a refused request the state
  index (`State.GetIndex`) and the row count of every table are unchanged.
  The cluster keeps working meanwhile (a job the fuzzer registered a moment
  ago is still being scheduled), so a change seen around one refusal is
  not yet a failure: the same request is sent again until one try shows
  the state still, and only a request that moves the state on every try
  for `REPLAY_BUDGET_S` fails. A refusal that writes does so on every try.
* **No process died.**
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass

import grpc
import psycopg

from corral.security import transport
from corral.v1 import state_pb2, state_pb2_grpc
from tests.fuzz.pool import row_counts
from tests.fuzz.rpcs import Answer, Rpc

S = grpc.StatusCode

#: Statuses a refused request may carry, and why each is a fair answer:
ALLOWED: dict[grpc.StatusCode, str] = {
    S.INVALID_ARGUMENT: "the request is malformed; the details name the field",
    S.NOT_FOUND: "an id names nothing",
    S.PERMISSION_DENIED: "the caller may not do this (identity, token, node secret)",
    S.UNAUTHENTICATED: "the caller's credentials are not valid",
    S.FAILED_PRECONDITION: "the request is well formed but the object's state refuses it "
    "(a stale check-index, a node not ready, a deployment already ended)",
    S.ALREADY_EXISTS: "the object exists and the request asked for a new one",
    S.OUT_OF_RANGE: "a position (log offset, page) past the end",
    S.RESOURCE_EXHAUSTED: "a request over a size or count limit",
}

#: Statuses allowed only where the RPC waits by design: a blocking query
#: with a min_index, or a stream, outlives the client's short deadline.
WAITING: dict[grpc.StatusCode, str] = {
    S.DEADLINE_EXCEEDED: "a blocking query or a stream outlived the client's deadline",
}

#: Text that must never reach a caller: Python traceback lines and the
#: database layer's own errors (the server log has them).
LEAKS = re.compile(
    r"Traceback \(most recent call last\)|Traceback|File \"|\.py\", line|"
    r"psycopg\.|sqlalchemy\.|asyncpg\.|grpc\._cython"
)

#: Statuses the transport made up because the server's answer could not be
#: delivered (a status message too long for its trailer, a reset stream):
#: the caller never learns what the server said.
TRANSPORT = re.compile(
    r"Stream removed|metadata size exceeds|Socket closed|failed to connect|"
    r"Connection reset|RST_STREAM|GOAWAY"
)

#: how long a refusal may keep moving the state before it is a failure
REPLAY_BUDGET_S = 20.0


@dataclass(frozen=True)
class StateMark:
    index: int
    rows: dict[str, int]


class StateProbe:
    """The state index (through `State.GetIndex`, as a server) and the row
    counts (from PostgreSQL directly)."""

    def __init__(self, state_address: str, dsn: str) -> None:
        self._channel = transport.dial_sync(state_address)
        self._stub = state_pb2_grpc.StateStub(self._channel)
        self._db = psycopg.connect(dsn, autocommit=True)

    def mark(self) -> StateMark:
        index = self._stub.GetIndex(state_pb2.GetIndexRequest(), timeout=30).index
        return StateMark(index, row_counts(self._db))

    def close(self) -> None:
        self._channel.close()
        self._db.close()


def leaks(answer: Answer) -> list[str]:
    return [t for t in answer.texts() if LEAKS.search(t)]


def allowed_codes(rpc: Rpc, blocking: bool) -> set[grpc.StatusCode]:
    codes = {S.OK, *ALLOWED}
    if blocking or rpc.streaming:
        codes |= set(WAITING)
    return codes


def check_answer(rpc: Rpc, answer: Answer, *, blocking: bool, what: str) -> None:
    assert answer.code in allowed_codes(rpc, blocking), (
        f"{rpc.name} answered {answer.code.name}: {answer.details!r} ({what})"
    )
    leaked = leaks(answer)
    assert not leaked, f"{rpc.name} leaked internals in its answer: {leaked[:2]!r} ({what})"
    made_by_transport = answer.code != S.DEADLINE_EXCEEDED and TRANSPORT.search(answer.details)
    assert not made_by_transport, (
        f"{rpc.name}: the answer was lost on the way, the caller got {answer.code.name} "
        f"{answer.details[:300]!r} from the transport ({what})"
    )


def refusal_writes_nothing(
    probe: StateProbe,
    send: Callable[[], Answer],
    first: tuple[StateMark, Answer, StateMark],
    *,
    what: str,
) -> None:
    """Given one refused call and the marks around it, fail if the refusal
    wrote (see the module doc for why the call may be sent again)."""
    before, answer, after = first
    deadline = time.monotonic() + REPLAY_BUDGET_S
    tries = 1
    while before != after:
        if answer.ok:
            return  # the request went through this time: no refusal to judge
        assert time.monotonic() < deadline, (
            f"a refused request moved the state on each of {tries} tries over "
            f"{REPLAY_BUDGET_S:g} s: index {before.index} -> {after.index}, "
            f"rows {_diff(before.rows, after.rows)}; answer {answer.code.name} "
            f"{answer.details!r} ({what})"
        )
        before = probe.mark()
        answer = send()
        after = probe.mark()
        tries += 1


def _diff(a: dict[str, int], b: dict[str, int]) -> dict[str, tuple[int, int]]:
    return {
        k: (a.get(k, 0), b.get(k, 0)) for k in sorted(a.keys() | b.keys()) if a.get(k) != b.get(k)
    }
