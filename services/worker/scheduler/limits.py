"""How many placements one evaluation may materialise.

The state refuses jobs that ask for absurd counts, but a scheduler must not
trust that alone: an eval is redelivered after a worker dies, so one job that
makes a worker build millions of placements (a count of 2**31 once grew a
worker by 140 MB/s until the kernel killed it) would kill every worker that
dequeues it, one after the other, and stop all scheduling. So each scheduler
first counts what the eval asks for and, over the limit, fails the eval with
a description instead of reconciling it (docs/scheduler.md): the eval is
written `failed` and acked, nothing is placed, and the worker's memory stays
bounded by the limit.

The limit is a worker setting (`--max-placements-per-eval`); the worker's
start-up hands it to `configure`, and every scheduler built afterwards in
the process reads it (a scheduler may also be given one directly, as tests
do).
"""

from __future__ import annotations

from collections.abc import Iterable

from corral.v1 import structs_pb2 as pb

#: the default: 50,000 placements is far above any real eval (the largest
#: benchmark job has 10,000) and well inside a worker's memory
DEFAULT_MAX_PLACEMENTS = 50_000

_max_placements = DEFAULT_MAX_PLACEMENTS


def configure(max_placements: int) -> None:
    """Make `max_placements` the limit of schedulers built from now on."""
    global _max_placements
    if max_placements < 1:
        raise ValueError("max_placements must be at least 1")
    _max_placements = max_placements


def max_placements() -> int:
    """This process's limit."""
    return _max_placements


def desired_count(groups: Iterable[pb.TaskGroup]) -> int:
    """The allocations a job's groups ask for together (negative counts are
    refused by the state; they count as zero here)."""
    return sum(max(tg.count, 0) for tg in groups)


def over_limit(asked: int, limit: int, what: str) -> str:
    """The failed eval's description when `asked` exceeds `limit`, else ''."""
    if asked <= limit:
        return ""
    return (
        f"{what} {asked} placements, more than this worker's limit of {limit} per "
        "evaluation (--max-placements-per-eval)"
    )
