"""The gateway's job file parser (services/gateway/jobfiles.py): HCL parsed
in a worker process, with the parser's limits answered as JobspecErrors
naming them, a parse past the wall-clock bound killed (and the next one
served by a new worker), and parses past the pending bound refused."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from corral.domain.jobspec.errors import JobspecError
from services.gateway.jobfiles import JobFileParser, ParserBusy

JOB = 'job "web" {\n  group "g" {\n    task "t" {\n      driver = "mock"\n    }\n  }\n}\n'
#: nested for expressions build millions of values: seconds of CPU
SLOW = 'job "x" { meta { a = length([for i in range(3000): [for j in range(3000): j]]) } }'


@pytest.fixture
async def parser() -> AsyncIterator[JobFileParser]:
    p = JobFileParser(wall_seconds=1.5, max_pending=2)
    try:
        yield p
    finally:
        await asyncio.to_thread(p.close)


async def test_a_job_file_parses_in_the_worker(parser: JobFileParser) -> None:
    job = await parser.parse_hcl(JOB, "web.nomad.hcl")
    assert job.id == "web" and job.task_groups[0].tasks[0].driver == "mock"


async def test_problems_come_back_as_jobspec_errors_naming_the_place(
    parser: JobFileParser,
) -> None:
    with pytest.raises(JobspecError) as bad:
        await parser.parse_hcl('job "x" {\n  group "g" {\n    count = \n  }\n}\n', "bad.hcl")
    assert bad.value.filename == "bad.hcl" and bad.value.line == 3
    deep = 'job "x" { meta { a = ' + "[" * 200 + "]" * 200 + " } }"
    with pytest.raises(JobspecError, match="nested more than 64 levels deep"):
        await parser.parse_hcl(deep, "deep.hcl")


async def test_a_parse_past_the_wall_clock_is_killed_and_the_next_served(
    parser: JobFileParser,
) -> None:
    with pytest.raises(JobspecError, match="parse time limit"):
        await parser.parse_hcl(SLOW, "slow.hcl")
    job = await parser.parse_hcl(JOB, "after.hcl")
    assert job.id == "web"


async def test_parses_past_the_pending_bound_are_refused(parser: JobFileParser) -> None:
    slow = [asyncio.ensure_future(parser.parse_hcl(SLOW, f"slow{i}.hcl")) for i in range(2)]
    await asyncio.sleep(0)  # both admitted
    with pytest.raises(ParserBusy):
        await parser.parse_hcl(JOB, "third.hcl")
    for fut in slow:
        with pytest.raises(JobspecError):
            await fut


async def test_variables_reach_the_worker(parser: JobFileParser) -> None:
    text = 'variable "n" { type = number }\n' + JOB.replace(
        'driver = "mock"', 'driver = "mock"\n      meta { n = "${var.n}" }'
    )
    job = await parser.parse_hcl(text, "vars.hcl", "n = 3\n")
    assert job.task_groups[0].tasks[0].meta["n"] == "3"
