"""HCL job files parsed for /v1/jobs/parse, in a worker process.

The jobspec language is pure Python: a job file near the size limit can take
a minute of CPU and a gigabyte of memory, and its functions and for
expressions can cost far more than its size suggests
(corral/domain/jobspec/limits.py). Parsed in the
gateway's own process, even within its CPU budget it would hold the GIL the
event loop needs for every other request. So parses run in a pool of worker
processes (pebble's ProcessPool, started with `spawn` so that no gRPC or
event-loop state is forked), where:

* the parser's own CPU budget answers first, as a JobspecError naming the
  limit (the worker runs the parse in its main thread, where the timer
  works);
* `WALL_SECONDS` later the pool kills the worker and starts another, for a
  parse stuck where the timer cannot interrupt it;
* at most `MAX_PENDING` parses wait or run at once; more are refused (429)
  rather than queued without bound.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import multiprocessing
from typing import Final

from pebble import ProcessExpired, ProcessPool

from corral.domain.jobspec import hcl, limits
from corral.domain.jobspec.errors import JobspecError
from corral.domain.jobspec.language.variables import VarInputs
from corral.v1 import structs_pb2 as pb

log = logging.getLogger(__name__)

#: the wall-clock bound of one parse (queueing excluded): the CPU budget,
#: with room for a busy machine, before the worker is killed
WALL_SECONDS: Final = limits.PARSE_CPU_SECONDS * 4 + 10
#: parses waiting or running at once, per gateway
MAX_PENDING: Final = 8
WORKERS: Final = 1


class ParserBusy(Exception):
    """MAX_PENDING parses are already in progress."""


#: a JobspecError as plain values: (line, field, problem)
Problem = tuple[int | None, str, str]


def parse_in_worker(text: str, filename: str, variables: str) -> tuple[bytes, Problem | None]:
    """What the worker runs: (the job serialized, None) or (b'', what is
    wrong). Plain values cross the process boundary (a JobspecError does
    not pickle back into the same shape). `variables` is a var file's text;
    as Nomad's HTTP API, no filesystem functions, and values for variables
    the file does not declare are ignored."""
    inputs = VarInputs(content=variables, strict=False)
    try:
        job = hcl.parse(text, filename, inputs, allow_fs=False)
    except JobspecError as exc:
        return b"", (exc.line, exc.field, exc.problem)
    except MemoryError:
        return b"", (None, "", "the job file needs more memory to parse than the gateway allows")
    return job.SerializeToString(), None


class JobFileParser:
    """The gateway's pool of parse workers (started at the first parse)."""

    def __init__(
        self,
        workers: int = WORKERS,
        max_pending: int = MAX_PENDING,
        wall_seconds: float = WALL_SECONDS,
    ) -> None:
        self._workers = workers
        self._wall = wall_seconds
        self._pool: ProcessPool | None = None
        self._slots = max_pending
        self._pending = 0

    def _started(self) -> ProcessPool:
        if self._pool is None:
            self._pool = ProcessPool(
                max_workers=self._workers, context=multiprocessing.get_context("spawn")
            )
        return self._pool

    async def parse_hcl(self, text: str, filename: str, variables: str = "") -> pb.Job:
        """The job of an HCL file (`variables`: a var file's text); a
        JobspecError for a bad file or a limit hit, ParserBusy when too many
        parses are under way."""
        limits.check_size(text, filename)  # before anything crosses to the worker
        if self._pending >= self._slots:
            raise ParserBusy(f"{self._pending} job files are being parsed; retry shortly")
        self._pending += 1
        try:
            future = self._started().schedule(
                parse_in_worker, args=(text, filename, variables), timeout=self._wall
            )
            try:
                data, problem = await asyncio.wrap_future(future)
            except (concurrent.futures.TimeoutError, TimeoutError):
                raise JobspecError(
                    filename,
                    None,
                    "",
                    f"parsing took more than {self._wall:g} s (the jobspec parse time limit)",
                ) from None
            except ProcessExpired as exc:
                # killed from outside, or out of memory: the pool starts another
                log.warning("job file parser exited (%s); a new one starts", exc.exitcode)
                raise JobspecError(
                    filename,
                    None,
                    "",
                    "the job file could not be parsed within the gateway's limits",
                ) from None
            except asyncio.CancelledError:
                future.cancel()  # type: ignore[no-untyped-call]  # the caller left: stop it
                raise
        finally:
            self._pending -= 1
        if problem is not None:
            raise JobspecError(filename, *problem)
        return pb.Job.FromString(data)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.stop()  # type: ignore[no-untyped-call]
            self._pool.join(timeout=5)
            self._pool = None
