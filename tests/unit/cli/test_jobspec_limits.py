"""Issue 26, findings 2 and 4 in the parser: a job file too large, nested too
deeply or too slow to parse is one JobspecError naming the limit, never a
RecursionError, in the HCL and the JSON front end, in the main thread (where
the CPU timer works) and in another one."""

from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import Callable

import pytest

from corral.domain.jobspec import hcl, limits
from corral.domain.jobspec import json as jobspec_json
from corral.domain.jobspec.errors import JobspecError
from corral.domain.jobspec.language.parser import MAX_DEPTH
from corral.domain.jobspec.load import parse_job

LIMIT = limits.MAX_NESTING_DEPTH
JOB = 'job "x" {\n  group "g" {\n    task "t" {\n      driver = "mock"\n%s\n    }\n  }\n}\n'


def in_meta(expression: str) -> str:
    """A valid job whose task meta holds `expression` (job > group > task >
    meta: four levels before it)."""
    return JOB % f"      meta {{\n        a = {expression}\n      }}"


#: constructs that nest one level per repetition
NESTERS: dict[str, Callable[[int], str]] = {
    "lists": lambda n: "[" * n + '"x"' + "]" * n,
    "maps": lambda n: "{a = " * n + '"x"' + "}" * n,
    "parentheses": lambda n: "(" * n + '"x"' + ")" * n,
    "interpolations": lambda n: '"${' * n + "x" + '}"' * n,
    "function calls": lambda n: "upper(" * n + '"x"' + ")" * n,
    "operators": lambda n: "1" + " + 1" * n,
    "conditionals": lambda n: "true ? 1 : " * n + "1",
    "negations": lambda n: "!" * n + "true",
    "attribute access": lambda n: "x" + ".a" * n,
}


def error_of(fn: Callable[[], object]) -> str:
    with pytest.raises(JobspecError) as caught:
        fn()
    return str(caught.value)


@pytest.mark.parametrize("kind", sorted(NESTERS))
@pytest.mark.parametrize("depth", [MAX_DEPTH + 1, 20_000])
def test_hcl_nested_past_the_parser_bound_names_a_limit(kind: str, depth: int) -> None:
    """Past the parser's bound, in any construct, a file is one
    JobspecError naming a limit (or, for what nests by iteration rather
    than recursion, it reads): never a RecursionError."""
    text = in_meta(NESTERS[kind](depth))
    try:
        hcl.parse(text, "deep.nomad.hcl")
    except JobspecError as exc:
        message = str(exc)
        assert "Recursion" not in message and "recursion" not in message, message
        if "nested" in message:
            assert "levels deep" in message, message


def test_a_task_config_nested_past_the_value_limit_names_it() -> None:
    """A task's config becomes a protobuf Struct, three messages a level:
    past MAX_VALUE_DEPTH it is refused naming the field and the limit (the
    state could not decode the job inside its change feed); at it, it
    reads."""
    limit = limits.MAX_VALUE_DEPTH

    def job(depth: int) -> str:
        value = "{a = " * (depth - 1) + '"x"' + "}" * (depth - 1)
        return JOB % f"      config {{\n        a = {value}\n      }}"

    message = error_of(lambda: hcl.parse(job(limit + 1), "deep.nomad.hcl"))
    assert "config" in message and f"nested more than {limit} levels deep" in message
    hcl.parse(job(limit), "ok.nomad.hcl")


def test_the_forty_kilobytes_of_brackets_of_the_issue() -> None:
    """The exact shape of finding 2: 40 KB of nested brackets (a
    RecursionError, 500 at the gateway, before), in the main thread and in
    another one (the gateway's)."""
    text = 'job "x" { meta { a = ' + "[" * 20_000 + "]" * 20_000 + " } }"
    assert "nested more than" in error_of(lambda: parse_job(text, "brackets.hcl"))
    thread_errors: list[str] = []
    thread = threading.Thread(
        target=lambda: thread_errors.append(error_of(lambda: parse_job(text, "brackets.hcl")))
    )
    thread.start()
    thread.join()
    assert thread_errors and "nested more than" in thread_errors[0]


@pytest.mark.parametrize("function", ["jsondecode", "yamldecode"])
def test_decoding_deep_json_or_yaml_in_a_job_names_the_limit(function: str) -> None:
    deep = "[" * 5_000 + "]" * 5_000
    text = in_meta(f'length({function}("{deep}"))')
    message = error_of(lambda: hcl.parse(text, "deep.nomad.hcl"))
    assert "nested more than" in message and "recursion" not in message, message


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


#: what the CLI does with a slow file, in a process of its own
SLOW_PARSE = """
import sys
from corral.domain.jobspec import limits
from corral.domain.jobspec.errors import JobspecError
from corral.domain.jobspec.load import parse_job
limits.PARSE_CPU_SECONDS = 0.2
try:
    parse_job(sys.stdin.read(), "slow.nomad.hcl")
except JobspecError as exc:
    print(exc)
else:
    print("parsed")
"""


def test_a_parse_past_the_cpu_budget_is_stopped() -> None:
    """A small file whose evaluation is slow (nested for expressions build
    millions of values, 9 s of CPU unbounded): stopped once the budget is
    spent. Run in a process of its own, as the CLI parses: the timer's
    signal belongs to the process, and a test runner's worker (with its own
    threads and signal state) once kept it from ever firing."""
    text = in_meta("length([for i in range(3000): [for j in range(3000): j]])")
    proc = subprocess.run(
        [sys.executable, "-c", SLOW_PARSE],
        input=text,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "parsing took more than 0.2 s of CPU time" in proc.stdout, proc.stdout
    assert "parse time limit" in proc.stdout


def test_the_cpu_timer_is_disarmed_after_a_parse(monkeypatch: pytest.MonkeyPatch) -> None:
    """A parse within its budget leaves no timer running and the previous
    SIGPROF handler in place."""
    import signal

    monkeypatch.setattr(limits, "PARSE_CPU_SECONDS", 0.5)
    before = signal.getsignal(signal.SIGPROF)
    parse_job(JOB % "", "small.nomad.hcl")
    assert signal.getitimer(signal.ITIMER_PROF) == (0.0, 0.0)
    assert signal.getsignal(signal.SIGPROF) == before
