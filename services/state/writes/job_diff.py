"""A field-level diff between two versions of a job (Nomad's structs/diff.go,
reduced): what `job plan` and `job history -p` show with +/-/+/- markers.

Fields are named as Nomad's API names them (CamelCase); task groups and
tasks are matched by name, other repeated blocks by position.
"""

from __future__ import annotations

import json

from google.protobuf import struct_pb2
from google.protobuf.json_format import MessageToDict
from google.protobuf.message import Message

from corral.domain.structs import NON_SPEC_FIELDS
from corral.v1 import job_pb2
from corral.v1 import structs_pb2 as pb

#: bookkeeping, not spec: never shown in a diff
_SKIP = {*NON_SPEC_FIELDS, "payload"}
_TYPE_NAMES = {"task_groups": "TaskGroup", "tasks": "Task"}


def _camel(name: str) -> str:
    return "".join(part[:1].upper() + part[1:] for part in name.split("_"))


def _kind(old: object, new: object) -> str:
    if old is None:
        return "Added"
    if new is None:
        return "Deleted"
    return "Edited" if old != new else "None"


def _scalar(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def config_value(value: object) -> str:
    """A driver config value as the user wrote it: strings plain, whole
    numbers without the `.0` a protobuf Struct gives them, lists and maps
    as JSON (which is also their HCL form)."""
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    if value is None:
        return "null"
    if isinstance(value, list | dict):
        return json.dumps(_whole_numbers(value), ensure_ascii=False, sort_keys=True)
    return str(value)


def _whole_numbers(value: object) -> object:
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, list):
        return [_whole_numbers(v) for v in value]
    if isinstance(value, dict):
        return {k: _whole_numbers(v) for k, v in value.items()}
    return value


def _struct_diff(name: str, old: Message | None, new: Message | None) -> job_pb2.ObjectDiff:
    """A task's `config` (a protobuf Struct) diffed key by key, each value
    rendered as written, never as the Struct's internal Value messages."""
    ov = MessageToDict(old) if old is not None else {}
    nv = MessageToDict(new) if new is not None else {}
    obj = job_pb2.ObjectDiff(name=name)
    for key in sorted(set(ov) | set(nv)):
        a = config_value(ov[key]) if key in ov else None
        b = config_value(nv[key]) if key in nv else None
        obj.fields.add(name=key, type=_kind(a, b), old=a or "", new=b or "")
    obj.type = _rollup(old, new, obj.fields, obj.objects)
    return obj


def _diff(
    old: Message | None, new: Message | None, skip: set[str] = _SKIP
) -> tuple[list[job_pb2.FieldDiff], list[job_pb2.ObjectDiff]]:
    ref = new if new is not None else old
    assert ref is not None
    fields: list[job_pb2.FieldDiff] = []
    objects: list[job_pb2.ObjectDiff] = []
    for fd in ref.DESCRIPTOR.fields:
        if fd.name in skip or fd.name in _TYPE_NAMES:
            continue
        name = _camel(fd.name)
        o = getattr(old, fd.name) if old is not None else None
        n = getattr(new, fd.name) if new is not None else None
        if fd.message_type is not None and fd.message_type.GetOptions().map_entry:
            ov = dict(o) if o is not None else {}
            nv = dict(n) if n is not None else {}
            if not ov and not nv:
                continue
            obj = job_pb2.ObjectDiff(name=name)
            for key in sorted(set(ov) | set(nv)):
                a, b = ov.get(key), nv.get(key)
                if isinstance(a, Message) or isinstance(b, Message):
                    sub_f, sub_o = _diff(a, b)
                    objects_kind = (
                        _kind(a, b) if a is None or b is None else ("Edited" if a != b else "None")
                    )
                    obj.objects.add(
                        name=f"{name}[{key}]", type=objects_kind, fields=sub_f, objects=sub_o
                    )
                else:
                    obj.fields.add(name=f"{name}[{key}]", type=_kind(a, b), old=_s(a), new=_s(b))
            obj.type = _rollup(old, new, obj.fields, obj.objects)
            objects.append(obj)
        elif fd.name == "actions":
            objects.extend(_action_diffs(o, n))
        elif fd.is_repeated and fd.message_type is not None:
            ol = list(o) if o is not None else []
            nl = list(n) if n is not None else []
            for i in range(max(len(ol), len(nl))):
                a = ol[i] if i < len(ol) else None
                b = nl[i] if i < len(nl) else None
                sub_f, sub_o = _diff(a, b)
                objects.append(
                    job_pb2.ObjectDiff(name=name, type=_kind(a, b), fields=sub_f, objects=sub_o)
                )
        elif fd.is_repeated:
            a = ",".join(map(_scalar, o)) if o is not None and len(o) else None
            b = ",".join(map(_scalar, n)) if n is not None and len(n) else None
            if a is not None or b is not None:
                fields.append(
                    job_pb2.FieldDiff(name=name, type=_kind(a, b), old=a or "", new=b or "")
                )
        elif fd.message_type is not None:
            a = o if old is not None and old.HasField(fd.name) else None
            b = n if new is not None and new.HasField(fd.name) else None
            if a is None and b is None:
                continue
            if fd.message_type.full_name == struct_pb2.Struct.DESCRIPTOR.full_name:
                objects.append(_struct_diff(name, a, b))
                continue
            sub_f, sub_o = _diff(a, b)
            objects.append(
                job_pb2.ObjectDiff(
                    name=name, type=_rollup(a, b, sub_f, sub_o), fields=sub_f, objects=sub_o
                )
            )
        else:
            present_old = old is not None and (
                o != fd.default_value or fd.has_presence and old.HasField(fd.name)
            )
            present_new = new is not None and (
                n != fd.default_value or fd.has_presence and new.HasField(fd.name)
            )
            if not present_old and not present_new:
                continue
            a = _scalar(o) if present_old else None
            b = _scalar(n) if present_new else None
            fields.append(job_pb2.FieldDiff(name=name, type=_kind(a, b), old=a or "", new=b or ""))
    return fields, objects


def _action_diffs(old: object, new: object) -> list[job_pb2.ObjectDiff]:
    """A task's actions as Nomad diffs them: by position, each an "Action"
    (Name and Command as fields, Args as a set), unchanged actions left out."""
    ol: list[pb.Action] = list(old) if old is not None else []  # type: ignore[call-overload]
    nl: list[pb.Action] = list(new) if new is not None else []  # type: ignore[call-overload]
    out: list[job_pb2.ObjectDiff] = []
    for i in range(max(len(ol), len(nl))):
        a = ol[i] if i < len(ol) else None
        b = nl[i] if i < len(nl) else None
        if a == b:
            continue
        obj = job_pb2.ObjectDiff(name="Action", type=_kind(a, b))
        for field in ("command", "name"):
            x = getattr(a, field) if a is not None else None
            y = getattr(b, field) if b is not None else None
            obj.fields.add(name=_camel(field), type=_kind(x, y), old=x or "", new=y or "")
        args = _string_set_diff("Args", a.args if a else [], b.args if b else [])
        if args is not None:
            obj.objects.append(args)
        out.append(obj)
    out.sort(key=lambda d: (d.name, d.type, len(d.fields)))
    return out


def _string_set_diff(name: str, old: object, new: object) -> job_pb2.ObjectDiff | None:
    """Nomad's stringSetDiff, contextual as the rest of this diff: every
    value, added, removed or kept (order ignored); None when both are empty."""
    a, b = set(old), set(new)  # type: ignore[call-overload]
    if not a and not b:
        return None
    obj = job_pb2.ObjectDiff(name=name)
    for v in sorted(a | b):
        obj.fields.add(
            name=name,
            type=_kind(v if v in a else None, v if v in b else None),
            old=v if v in a else "",
            new=v if v in b else "",
        )
    obj.type = (
        "Edited" if a - b and b - a else ("Added" if b - a else ("Deleted" if a - b else "None"))
    )
    return obj


def _s(v: object) -> str:
    return "" if v is None else _scalar(v)


def _rollup(old: object, new: object, fields: object, objects: object) -> str:
    if old is None:
        return "Added"
    if new is None:
        return "Deleted"
    changed = any(f.type != "None" for f in fields) or any(o.type != "None" for o in objects)  # type: ignore[attr-defined]
    return "Edited" if changed else "None"


def _by_name(items: object) -> dict[str, Message]:
    return {i.name: i for i in items}  # type: ignore[attr-defined]


def job_diff(old: pb.Job | None, new: pb.Job) -> job_pb2.JobDiff:
    fields, objects = _diff(old, new)
    diff = job_pb2.JobDiff(id=new.id, fields=fields, objects=objects)
    old_groups = _by_name(old.task_groups) if old is not None else {}
    new_groups = _by_name(new.task_groups)
    for name in sorted(set(old_groups) | set(new_groups)):
        a, b = old_groups.get(name), new_groups.get(name)
        tf, to = _diff(a, b)
        old_tasks = _by_name(a.tasks) if a is not None else {}  # type: ignore[attr-defined]
        new_tasks = _by_name(b.tasks) if b is not None else {}  # type: ignore[attr-defined]
        for tname in sorted(set(old_tasks) | set(new_tasks)):
            x, y = old_tasks.get(tname), new_tasks.get(tname)
            f2, o2 = _diff(x, y)
            to.append(
                job_pb2.ObjectDiff(
                    name=f'Task "{tname}"', type=_rollup(x, y, f2, o2), fields=f2, objects=o2
                )
            )
        diff.task_groups.add(name=name, type=_rollup(a, b, tf, to), fields=tf, objects=to)
    changed = (
        any(f.type != "None" for f in diff.fields)
        or any(o.type != "None" for o in diff.objects)
        or any(t.type != "None" for t in diff.task_groups)
    )
    diff.type = "Added" if old is None else ("Edited" if changed else "None")
    return diff
