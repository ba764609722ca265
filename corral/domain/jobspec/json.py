"""JSON job files → `pb.Job`, in either of two shapes:

* Nomad's API JSON (what `nomad job run -output` prints): `{"Job": {"ID": ...,
  "TaskGroups": [...]}}` with Go field names and durations in nanoseconds;
* our proto JSON (`corral job inspect -json`): `{"job": {"id": ...}}` or the
  bare job, field names as in structs.proto (snake_case or lowerCamelCase).

Nomad fields with no Corral counterpart are errors when they carry a value
and ignored when empty (null, "", 0, false, [], {}), because Nomad's JSON
lists every field whether used or not."""

from __future__ import annotations

import json as _json
import re
from typing import Any

from google.protobuf import json_format
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message

from corral.domain.jobspec import defaults, limits, validate
from corral.domain.jobspec import services as service_blocks
from corral.domain.jobspec import templates as template_blocks
from corral.domain.jobspec.errors import JobspecError
from corral.v1 import structs_pb2 as pb

# Nomad API names whose snake_case form differs from our proto field name.
_RENAMES = {
    "MBits": "mbits",
    "ParameterizedJob": "parameterized",
    "Spreads": "spreads",
    "SpreadTarget": "spread_target",
    "MemoryMB": "memory_mb",
    "MemoryMaxMB": "memory_max_mb",
    "DiskMB": "disk_mb",
    "SizeMB": "size_mb",
    "CPU": "cpu",
    "ID": "id",
    "ParentID": "parent_id",
    "Specs": "crons",
    "SELinuxLabel": "selinux_label",
    "MaxFileSizeMB": "max_file_size_mb",
}
# Nomad fields that describe server-side status or features that have no
# meaning for a submitted job; accepted and ignored whatever their value.
_IGNORED = frozenset(
    {
        "Status",
        "StatusDescription",
        "Stable",
        "Version",
        "SubmitTime",
        "CreateIndex",
        "ModifyIndex",
        "JobModifyIndex",
        "Stop",
        "SpecType",
        "VersionTag",
        "DispatchIdempotencyToken",
        "NomadTokenID",
        "ConsulToken",
        "VaultToken",
        "VaultNamespace",
        "ConsulNamespace",
        # a scaling policy's namespace: the state sets the job's, as Nomad's
        # servers do (a job read through the API shows it)
        "Namespace",
        # LogConfig's old field, ignored by Nomad since 1.5.4 (Disabled replaced it)
        "Enabled",
    }
)
_NOMAD_NAMES = {v: k for k, v in _RENAMES.items()} | {
    "l_target": "LTarget",
    "r_target": "RTarget",
    "spec": "Spec",
    "reschedule_policy": "ReschedulePolicy",
    "restart_policy": "RestartPolicy",
}
_ACRONYMS = {
    "id": "ID",
    "cpu": "CPU",
    "mb": "MB",
    "ui": "UI",
    "cni": "CNI",
    "url": "URL",
    "tls": "TLS",
    "ttl": "TTL",
}
_CAMEL = re.compile(r"(?<=[a-z0-9])([A-Z])|(?<=[A-Z])([A-Z][a-z])")


def _snake(name: str) -> str:
    if name in _RENAMES:
        return _RENAMES[name]
    return _CAMEL.sub(lambda m: "_" + (m.group(1) or m.group(2)), name).lower()


#: one step of a field path: a name and its subscripts (`meta[a.b]`: a map
#: key may hold dots)
_PATH_PART = re.compile(r"(?:[^.[]|\[[^\]]*\])+")
#: objects whose keys are the user's, not Nomad's field names
_FREE_FORM = frozenset({"config"})


def nomad_path(path: str) -> str:
    """A proto field path (`job.task_groups[0].resources.memory_mb`) in
    Nomad's JSON names (`Job.TaskGroups[0].Resources.MemoryMB`). What
    follows a task's `config` is the driver's own keys, kept as written."""
    out: list[str] = []
    parts = _PATH_PART.findall(path)
    for i, part in enumerate(parts):
        if i > 0 and parts[i - 1] in _FREE_FORM:
            out.extend(parts[i:])
            break
        name, bracket, rest = part.partition("[")
        if name in _NOMAD_NAMES:
            nomad = _NOMAD_NAMES[name]
        elif name[:1].isupper():
            nomad = name
        else:
            nomad = "".join(_ACRONYMS.get(w, w.capitalize()) for w in name.split("_"))
        out.append(nomad + bracket + rest)
    return ".".join(out)


def _empty(value: Any) -> bool:
    return value is None or value == "" or value is False or value == 0 or value in ([], {})


#: what each integer field type holds (a value past it is the input's
#: mistake, not a crash of the protobuf runtime)
_INT_RANGES = {
    FieldDescriptor.TYPE_INT32: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_SINT32: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_SFIXED32: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_UINT32: (0, 2**32 - 1),
    FieldDescriptor.TYPE_FIXED32: (0, 2**32 - 1),
    FieldDescriptor.TYPE_UINT64: (0, 2**64 - 1),
    FieldDescriptor.TYPE_FIXED64: (0, 2**64 - 1),
}


def _scalar(fd: Any, value: Any, path: str) -> Any:
    t = fd.type
    if t == FieldDescriptor.TYPE_BOOL:
        if not isinstance(value, bool):
            raise validate.FieldProblem(path, f"expected true or false, got {value!r}")
        return value
    if t == FieldDescriptor.TYPE_STRING:
        if isinstance(value, dict | list) or value is None:
            raise validate.FieldProblem(path, f"expected a string, got {value!r}")
        if isinstance(value, bool):
            return "true" if value else "false"
        return str(value)
    if t in (FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT):
        return float(value)
    if t == FieldDescriptor.TYPE_BYTES:
        if not isinstance(value, str):
            raise validate.FieldProblem(path, "expected base64 text")
        import base64

        return base64.b64decode(value)
    # integers (durations are nanoseconds in Nomad's JSON)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise validate.FieldProblem(path, f"expected a whole number, got {value!r}")
    if isinstance(value, float) and not value.is_integer():
        raise validate.FieldProblem(path, f"expected a whole number, got {value!r}")
    low, high = _INT_RANGES.get(t, (-(2**63), 2**63 - 1))
    if not low <= value <= high:
        raise validate.FieldProblem(path, f"{value!r} is out of range ({low}..{high})")
    return int(value)


def _fill(msg: Message, data: Any, path: str, explicit: dict[str, set[str]] | None = None) -> None:
    """`data` (Nomad's JSON) into `msg`. `explicit` collects what the input
    set, zeros included (`"Count": 0`, `"Unlimited": false`): Nomad's api
    types hold these as pointers, so a written zero is kept rather than
    taken for "unset" by the defaults (defaults.canonicalize)."""
    if not isinstance(data, dict):
        raise validate.FieldProblem(path, f"expected an object, got {type(data).__name__}")
    fields = msg.DESCRIPTOR.fields_by_name
    given = explicit.setdefault(path, set()) if explicit is not None else None
    for key, value in data.items():
        name = _snake(key)
        fd = fields.get(name)
        fpath = f"{path}.{name}"
        if fd is None:
            if key in _IGNORED or _empty(value):
                continue
            raise validate.FieldProblem(f"{path}.{key}", "is not supported by Corral")
        if value is None:
            continue
        if given is not None and explicit is not None:
            given.add(name)
            explicit.setdefault(fpath, set())
        target = getattr(msg, name)
        if fd.message_type is not None and fd.message_type.full_name == "google.protobuf.Struct":
            if not isinstance(value, dict):
                raise validate.FieldProblem(fpath, "expected an object")
            target.update(value)
        elif fd.message_type is not None and fd.message_type.GetOptions().map_entry:
            if not isinstance(value, dict):
                raise validate.FieldProblem(fpath, "expected an object of strings")
            vfd = fd.message_type.fields_by_name["value"]
            for k, v in value.items():
                if vfd.message_type is not None:
                    _fill(target[k], v, f"{fpath}[{k}]", explicit)
                else:
                    target[k] = _scalar(vfd, v, f"{fpath}[{k}]")
        elif fd.is_repeated:
            if not isinstance(value, list):
                raise validate.FieldProblem(fpath, "expected a list")
            for i, item in enumerate(value):
                if fd.message_type is not None:
                    _fill(target.add(), item, f"{fpath}[{i}]", explicit)
                else:
                    target.append(_scalar(fd, item, f"{fpath}[{i}]"))
        elif fd.message_type is not None:
            _fill(target, value, fpath, explicit)
            target.SetInParent()
        else:
            setattr(msg, name, _scalar(fd, value, fpath))


def _nomad_job(data: dict[str, Any]) -> tuple[pb.Job, dict[str, set[str]]]:
    """The job, and the fields Nomad's JSON set that a zero would not tell
    (for the defaults): what it wrote, zeros included (`"Count": 0`,
    `"Unlimited": false`: Nomad's api types hold these as pointers, so a
    written zero is kept rather than taken for "unset")."""
    job = pb.Job()
    service_blocks.nomad_json(data)
    explicit = template_blocks.nomad_json(data)
    _fill(job, data, "job", explicit)
    # Nomad's JSON names the disconnect block's fields like ours, and the
    # seed-era group fields map the same way the HCL ones do.
    return job, explicit


def parse(text: str, filename: str = "<stdin>") -> pb.Job:
    """Parse, apply Nomad's defaults and validate one JSON job, within the
    limits of `limits.py` (size, nesting, CPU time)."""
    limits.check_size(text, filename)
    return limits.cpu_budget(lambda: _parse(text, filename), filename)


def _parse(text: str, filename: str) -> pb.Job:
    try:
        data = limits.load_json(text)
    except _json.JSONDecodeError as exc:
        raise JobspecError(filename, exc.lineno, "", f"invalid JSON: {exc.msg}") from None
    except limits.NestingError as exc:
        raise JobspecError(filename, None, "", str(exc)) from None
    if not isinstance(data, dict):
        raise JobspecError(filename, None, "", "expected a JSON object holding a job")
    explicit: dict[str, set[str]] = {}
    try:
        if "Job" in data:
            job, explicit = _nomad_job(data["Job"])
        elif "job" in data and isinstance(data["job"], dict):
            job = _proto_job(data["job"], filename)
        elif any(k[:1].isupper() for k in data):
            job, explicit = _nomad_job(data)
        else:
            job = _proto_job(data, filename)
        defaults.canonicalize(job, explicit)
        validate.check(job)
    except validate.FieldProblem as problem:
        raise JobspecError(filename, None, problem.path, problem.problem) from None
    return job


def from_nomad(data: dict[str, Any], filename: str = "<request>") -> pb.Job:
    """A job from Nomad's API JSON already decoded (`{"ID": ..., "TaskGroups":
    [...]}`, the HTTP gateway's job registration), with Nomad's defaults
    applied and validated; problems raise JobspecError naming the field."""
    if not isinstance(data, dict):
        raise JobspecError(filename, None, "", "expected a JSON object holding a job")
    if limits.json_depth(data) > limits.MAX_NESTING_DEPTH:
        raise JobspecError(filename, None, "", str(limits.NestingError(what=limits.JSON_LEVELS)))
    try:
        job, explicit = _nomad_job(data)
        defaults.canonicalize(job, explicit)
        validate.check(job)
    except validate.FieldProblem as problem:
        raise JobspecError(filename, None, nomad_path(problem.path), problem.problem) from None
    return job


def _proto_job(data: dict[str, Any], filename: str) -> pb.Job:
    job = pb.Job()
    try:
        json_format.ParseDict(data, job)
    except json_format.ParseError as exc:
        raise JobspecError(filename, None, "job", str(exc)) from None
    return job
