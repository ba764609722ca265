"""A job diff as `job plan` and `job history -p` print it: Nomad's markers
and alignment, and task config values as the user wrote them (never the
protobuf Struct's internals)."""

from __future__ import annotations

import io
from typing import Any

from cli.diff_output import shown, write_job_diff
from cli.plan_output import tg_annotation
from corral.v1 import structs_pb2 as pb
from services.state.writes.job_diff import config_value, job_diff


def job(config: dict[str, Any], *, count: int = 1, priority: int = 50) -> pb.Job:
    task = pb.Task(name="render", driver="raw_exec")
    task.config.update(config)
    return pb.Job(
        id="frames",
        type="batch",
        priority=priority,
        task_groups=[pb.TaskGroup(name="work", count=count, tasks=[task])],
    )


def render(old: pb.Job | None, new: pb.Job, *, verbose: bool = False) -> str:
    out = io.StringIO()
    write_job_diff(out, job_diff(old, new), new.id, verbose=verbose)
    return out.getvalue()


OLD = {
    "command": "/bin/sh",
    "args": ["-c", "sleep 5"],
    "port": 80,
    "opts": {"b": "two", "a": 1},
    "ratio": 0.5,
}
NEW = {"command": "/bin/sh", "args": ["-c", "sleep 10"], "port": 81, "debug": True, "ratio": 0.5}


def test_an_edited_job_shows_its_changed_fields_aligned_like_nomad() -> None:
    text = render(job(OLD), job(NEW, count=3, priority=70))
    assert text == (
        '+/- Job: "frames"\n'
        '+/- Priority: "50" => "70"\n'
        '+/- Task Group: "work"\n'
        '  +/- Count: "1" => "3"\n'
        '  +/- Task: "render"\n'
        "    +/- Config {\n"
        '      +/- args:  ["-c", "sleep 5"] => ["-c", "sleep 10"]\n'
        '      +   debug: "true"\n'
        '      -   opts:  {"a": 1, "b": "two"}\n'
        '      +/- port:  "80" => "81"\n'
        "        }\n"
    )


def test_no_protobuf_internals_in_any_rendering() -> None:
    for text in (
        render(job(OLD), job(NEW)),
        render(job(OLD), job(NEW), verbose=True),
        render(None, job(NEW), verbose=True),
    ):
        for internal in ("Fields[", "StringValue", "NumberValue", "ListValue", "StructValue"):
            assert internal not in text, text
    verbose = render(job(OLD), job(NEW), verbose=True)
    assert '      command: "/bin/sh"\n' in verbose  # unchanged, shown plain
    assert '      ratio:   "0.5"\n' in verbose


def test_a_new_job_is_its_groups_and_tasks_unless_verbose() -> None:
    assert render(None, job(NEW)) == '+ Job: "frames"\n+ Task Group: "work"\n  + Task: "render"\n'
    verbose = render(None, job(NEW), verbose=True)
    assert '+ Priority: "50"\n' in verbose
    assert '      + args:    ["-c", "sleep 10"]\n' in verbose


def test_an_unchanged_job_lists_nothing_but_itself() -> None:
    assert render(job(OLD), job(OLD)) == 'Job: "frames"\n'


def test_plan_annotations_follow_the_group() -> None:
    out = io.StringIO()
    ann = {"work": pb.DesiredUpdates(place=2, in_place_update=1)}
    write_job_diff(
        out,
        job_diff(job(OLD), job(OLD, count=3)),
        "frames",
        verbose=False,
        annotations=ann,
        tg_note=tg_annotation,
    )
    assert '+/- Task Group: "work" (2 create, 1 in-place update)\n' in out.getvalue()


def test_config_values_as_written() -> None:
    assert config_value("sleep 5") == "sleep 5"
    assert config_value(80.0) == "80"
    assert config_value(0.25) == "0.25"
    assert config_value(True) == "true"
    assert config_value(None) == "null"
    assert config_value(["-c", 1.0, {"k": 2.0}]) == '["-c", 1, {"k": 2}]'
    assert config_value({"z": "a", "a": [1.5]}) == '{"a": [1.5], "z": "a"}'
    assert shown('["-c", "x"]') == '["-c", "x"]'
    assert shown("[not json") == '"[not json"'
    assert shown('say "hi"') == '"say \\"hi\\""'
