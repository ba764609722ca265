"""Rendering a job diff (`JobDiff` from the state service) the way Nomad's
`job plan` and `job history -p` print one: `+`, `-` and `+/-` markers,
markers and values aligned within each block, a task as `Task: "name"`,
other nested blocks in braces, values quoted except a task config's lists
and maps, which are shown in their JSON/HCL form."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import TextIO

from corral.v1 import job_pb2
from corral.v1 import structs_pb2 as pb

MARKERS = {"Added": "+ ", "Deleted": "- ", "Edited": "+/- "}
#: the state service names a task's diff object `Task "<name>"`
_TASK_PREFIX = 'Task "'


def marker(kind: str) -> str:
    return MARKERS.get(kind, "")


def shown(value: str) -> str:
    """A diffed value: quoted, except a config's lists and maps, which the
    diff already gives as JSON."""
    if value[:1] in ("[", "{"):
        try:
            if isinstance(json.loads(value), list | dict):
                return value
        except ValueError:
            pass
    return json.dumps(value, ensure_ascii=False)


def _field_value(f: job_pb2.FieldDiff) -> str:
    if f.type == "Added":
        return shown(f.new)
    if f.type == "Deleted":
        return shown(f.old)
    if f.type == "Edited":
        return f"{shown(f.old)} => {shown(f.new)}"
    return shown(f.new or f.old)


def _changed(kind: str, verbose: bool) -> bool:
    return verbose or kind not in ("", "None")


def _aligned(
    out: TextIO,
    fields: Sequence[job_pb2.FieldDiff],
    objects: Sequence[job_pb2.ObjectDiff],
    start: int,
    verbose: bool,
    *,
    extra_markers: Sequence[str] = (),
) -> None:
    shown_fields = sorted((f for f in fields if _changed(f.type, verbose)), key=lambda f: f.name)
    shown_objects = [o for o in objects if _changed(o.type, verbose)]
    name_width = max((len(f.name) for f in shown_fields), default=0)
    kinds = [*(f.type for f in shown_fields), *(o.type for o in shown_objects)]
    marker_width = max([0, *(len(marker(k)) for k in kinds), *(len(m) for m in extra_markers)])
    for f in shown_fields:
        m = marker(f.type)
        gap = " " * (marker_width - len(m))
        value_gap = " " * (name_width - len(f.name))
        out.write(f"{' ' * start}{m}{gap}{f.name}: {value_gap}{_field_value(f)}\n")
    for o in shown_objects:
        pad = marker_width - len(marker(o.type))
        write = _task if o.name.startswith(_TASK_PREFIX) else _object
        write(out, o, start, pad, verbose)


def _object(out: TextIO, o: job_pb2.ObjectDiff, start: int, pad: int, verbose: bool) -> None:
    m = marker(o.type)
    out.write(f"{' ' * start}{m}{' ' * pad}{o.name} {{\n")
    _aligned(out, o.fields, o.objects, start + pad + 2, verbose)
    out.write(f"{' ' * (start + len(m) + pad)}}}\n")


def _task(out: TextIO, o: job_pb2.ObjectDiff, start: int, pad: int, verbose: bool) -> None:
    """`Task: "name"`, its changes below it; an added or deleted task is one
    line unless verbose (its every field would be noise)."""
    name = o.name[len(_TASK_PREFIX) - 1 :]
    out.write(f"{' ' * start}{marker(o.type)}{' ' * pad}Task: {name}\n")
    if o.type in ("Added", "Deleted", "None") and not verbose:
        return
    _aligned(out, o.fields, o.objects, start + 2, verbose)


def write_job_diff(
    out: TextIO,
    diff: job_pb2.JobDiff,
    job_id: str,
    *,
    verbose: bool,
    annotations: Mapping[str, pb.DesiredUpdates] | None = None,
    tg_note: Callable[[pb.DesiredUpdates | None, dict[str, int]], str] | None = None,
) -> None:
    """The whole diff. With `annotations` (a plan), every group the diff
    lists is shown with its note; without (history), unchanged groups only
    when verbose. The job's and a group's own fields show only when they
    were edited (a new job is its groups and tasks), as in Nomad."""
    out.write(f'{marker(diff.type)}Job: "{job_id or diff.id}"\n')
    groups = [
        tg for tg in diff.task_groups if annotations is not None or _changed(tg.type, verbose)
    ]
    group_markers = [marker(tg.type) for tg in groups]
    if diff.type == "Edited" or verbose:
        _aligned(out, diff.fields, diff.objects, 0, verbose, extra_markers=group_markers)
    width = max([0, *(len(m) for m in group_markers)])
    for tg in groups:
        m = marker(tg.type)
        upd = annotations.get(tg.name) if annotations is not None else None
        note = tg_note(upd, dict(tg.updates)) if tg_note is not None else ""
        out.write(f'{m}{" " * (width - len(m))}Task Group: "{tg.name}"{note}\n')
        if tg.type == "Edited" or verbose:
            _aligned(out, tg.fields, tg.objects, 2, verbose)
        else:
            tasks = [o for o in tg.objects if o.name.startswith(_TASK_PREFIX)]
            _aligned(out, [], tasks, 2, verbose)
