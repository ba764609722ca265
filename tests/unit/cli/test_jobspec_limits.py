"""Issue 26, findings 2 and 4 in the parser: a job file too large, nested too
deeply or too slow to parse is one JobspecError naming the limit, never a
RecursionError, in the HCL and the JSON front end, in the main thread (where
the CPU timer works) and in another one (the gateway's threads)."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest

from cli.jobspec import JobspecError, hcl, limits, parse_job
from cli.jobspec import json as jobspec_json

LIMIT = limits.MAX_NESTING_DEPTH
JOB = 'job "x" {\n  group "g" {\n    task "t" {\n      driver = "mock"\n%s\n    }\n  }\n}\n'


def in_meta(expression: str) -> str:
    """A valid job whose task meta holds `expression` (job > group > task >
    meta: four levels before it)."""
    return JOB % f"      meta {{\n        a = {expression}\n      }}"


#: constructs that nest one level per repetition: (opening, inner, closing)
NESTERS: dict[str, Callable[[int], str]] = {
    "lists": lambda n: "[" * n + '"x"' + "]" * n,
    "maps": lambda n: "{a = " * n + '"x"' + "}" * n,
    "parentheses": lambda n: "(" * n + '"x"' + ")" * n,
    "interpolations": lambda n: '"${' * n + "x" + '}"' * n,
    "function calls": lambda n: "f(" * n + "1" + ")" * n,
    "operators": lambda n: "1" + " + 1" * n,
    "conditionals": lambda n: "true ? 1 : " * n + "1",
    "attribute access": lambda n: "x" + ".a" * n,
}


def error_of(fn: Callable[[], object]) -> str:
    with pytest.raises(JobspecError) as caught:
        fn()
    return str(caught.value)


@pytest.mark.parametrize("kind", sorted(NESTERS))
def test_hcl_nesting_past_the_limit_names_it(kind: str) -> None:
    text = in_meta(NESTERS[kind](LIMIT))  # four levels above it: over
    message = error_of(lambda: hcl.parse(text, "deep.nomad.hcl"))
    assert f"nested more than {LIMIT} levels deep" in message
    assert "Recursion" not in message


@pytest.mark.parametrize("kind", ["lists", "maps", "interpolations", "parentheses"])
def test_hcl_nesting_within_the_limit_reads_in_any_thread(kind: str) -> None:
    """Four levels (job, group, task, meta) plus LIMIT - 4 of the construct:
    exactly at the limit, it reads (meta values must be strings, so what is
    refused is the value's type, not its depth), also in a thread whose
    stack is not the main one's."""
    text = in_meta(NESTERS[kind](LIMIT - 4))
    problems: list[str] = []

    def parse() -> None:
        try:
            hcl.parse(text, "ok.nomad.hcl")
        except JobspecError as exc:
            problems.append(str(exc))

    parse()
    thread = threading.Thread(target=parse)
    thread.start()
    thread.join()
    assert len(problems) in (0, 2)
    assert not any("nested" in p for p in problems), problems


def test_the_forty_kilobytes_of_brackets_of_the_issue() -> None:
    """The exact shape of finding 2: 40 KB of nested brackets (a
    RecursionError, 500 at the gateway, before)."""
    text = 'job "x" { meta { a = ' + "[" * 20_000 + "]" * 20_000 + " } }"
    assert "nested more than" in error_of(lambda: parse_job(text, "brackets.hcl"))
    thread_errors: list[str] = []
    thread = threading.Thread(
        target=lambda: thread_errors.append(error_of(lambda: parse_job(text, "brackets.hcl")))
    )
    thread.start()
    thread.join()
    assert thread_errors and "nested more than" in thread_errors[0]


@pytest.mark.parametrize(
    "text",
    [
        "[" * 40_000 + "]" * 40_000,
        '{"Job": ' + '{"a": ' * 40_000 + "1" + "}" * 40_000 + "}",
        '{"Job": ' + '{"Meta": ' * (LIMIT + 1) + '"x"' + "}" * (LIMIT + 1) + "}",
    ],
    ids=["lists", "objects-past-recursion", "objects-past-the-limit"],
)
def test_json_nesting_past_the_limit_names_it(text: str) -> None:
    message = error_of(lambda: jobspec_json.parse(text, "deep.json"))
    assert f"nested more than {LIMIT} levels deep" in message


def test_json_from_nomad_refuses_decoded_data_nested_too_deeply() -> None:
    data: dict[str, object] = {"a": "x"}
    for _ in range(LIMIT + 1):
        data = {"a": data}
    job = {"ID": "x", "TaskGroups": [{"Name": "g", "Tasks": [{"Name": "t", "Config": data}]}]}
    assert "nested more than" in error_of(lambda: jobspec_json.from_nomad(job))


def test_load_json_measures_depth_without_recursion() -> None:
    assert limits.json_depth(1) == 0
    assert limits.json_depth({"a": [1, {"b": []}]}) == 4
    assert limits.load_json("[[[]]]") == [[[]]]
    with pytest.raises(limits.NestingError):
        limits.load_json("[" * 100_000 + "]" * 100_000)
    with pytest.raises(limits.NestingError):
        limits.load_json("[" * (LIMIT + 1) + "]" * (LIMIT + 1))


def test_a_file_past_the_size_limit_is_refused_before_parsing() -> None:
    text = JOB % ("#" * (limits.MAX_JOBSPEC_BYTES + 1))
    message = error_of(lambda: parse_job(text, "big.nomad.hcl"))
    assert f"at most {limits.MAX_JOBSPEC_BYTES} are accepted" in message
    assert "size limit" in message
    as_json = '{"Job": {"ID": "' + "x" * limits.MAX_JOBSPEC_BYTES + '"}}'
    assert "size limit" in error_of(lambda: parse_job(as_json, "big.json"))


def test_a_parse_past_the_cpu_budget_is_stopped(monkeypatch: pytest.MonkeyPatch) -> None:
    """A file within the size limit that python-hcl2 is slow on (lists of
    lists, about 50 µs a byte): stopped once the budget is spent."""
    monkeypatch.setattr(limits, "PARSE_CPU_SECONDS", 0.2)
    text = in_meta("[" + ",".join("[[[[[[1]]]]]]" for _ in range(20_000)) + "]")
    assert len(text) < limits.MAX_JOBSPEC_BYTES
    message = error_of(lambda: parse_job(text, "slow.nomad.hcl"))
    assert "parsing took more than 0.2 s of CPU time" in message
    assert "parse time limit" in message


def test_the_cpu_timer_is_disarmed_after_a_parse(monkeypatch: pytest.MonkeyPatch) -> None:
    """A parse within its budget leaves no timer running and the previous
    SIGPROF handler in place."""
    import signal

    monkeypatch.setattr(limits, "PARSE_CPU_SECONDS", 0.5)
    before = signal.getsignal(signal.SIGPROF)
    parse_job(JOB % "", "small.nomad.hcl")
    assert signal.getitimer(signal.ITIMER_PROF) == (0.0, 0.0)
    assert signal.getsignal(signal.SIGPROF) == before
