"""`template` blocks of a job file (HCL) or of Nomad's API JSON →
`pb.Template`, as Nomad's jobspec2 and api.Template read them. What they
mean and which values are right is `corral.domain.template.block`'s."""

from __future__ import annotations

from typing import Any

from corral.domain.jobspec import validate
from corral.domain.jobspec.body import Body
from corral.v1 import structs_pb2 as pb

#: (HCL argument, proto field) of the template block's strings and bools
STRINGS = [
    ("source", "source_path"),
    ("destination", "dest_path"),
    ("data", "embedded_tmpl"),
    ("change_mode", "change_mode"),
    ("change_signal", "change_signal"),
    ("perms", "perms"),
    ("left_delimiter", "left_delim"),
    ("right_delimiter", "right_delim"),
]
BOOLS = [("env", "envvars"), ("error_on_missing_key", "err_missing_key"), ("once", "once")]
VAULT_GRACE = (
    "vault_grace is not supported by Corral (Nomad ignores it since Vault 0.5, and Corral "
    "has no Vault)"
)


# --------------------------------------------------------------------------- HCL


def read(body: Body, task: pb.Task) -> None:
    """Every `template` block of a task body into `task.templates`; the
    fields each one set are recorded in the source's `explicit` map (a
    written `splay = "0s"` is not a default)."""
    for _, tb in body.blocks("template", f"{body.proto}.templates", labeled=False):
        _template(tb, task.templates.add())


def _template(tb: Body, t: pb.Template) -> None:
    written: set[str] = set()
    for name, field in STRINGS:
        value = tb.string(name, field)
        if value is not None:
            setattr(t, field, value)
            written.add(field)
    for name, field in BOOLS:
        flag = tb.boolean(name, field)
        if flag is not None:
            setattr(t, field, flag)
            written.add(field)
    splay = tb.duration("splay")
    if splay is not None:
        t.splay = splay
        written.add("splay")
    for field in ("uid", "gid"):
        ident = tb.integer(field, minimum=-1)
        if ident is not None:
            setattr(t, field, ident)
            written.add(field)
    if "vault_grace" in tb.data:
        raise tb.fail("vault_grace", VAULT_GRACE)
    sb = tb.block("change_script", f"{tb.proto}.change_script")
    if sb is not None:
        script = t.change_script
        script.SetInParent()
        script.command = sb.string("command") or ""
        script.args.extend(sb.strings("args") or [])
        timeout = sb.duration("timeout")
        script_written = set()
        if timeout is not None:
            script.timeout = timeout
            script_written.add("timeout")
        script.fail_on_error = bool(sb.boolean("fail_on_error"))
        script.run_on_first_render = bool(sb.boolean("run_on_first_render"))
        tb.src.explicit[f"{tb.proto}.change_script"] = script_written
        sb.done()
    wb = tb.block("wait", f"{tb.proto}.wait")
    if wb is not None:
        t.wait.SetInParent()
        for bound in ("min", "max"):
            nanos = wb.duration(bound)
            if nanos is not None:
                setattr(t.wait, bound, nanos)
        wb.done()
    tb.src.explicit[tb.proto] = written
    tb.done()


# --------------------------------------------------------------------------- Nomad JSON


def nomad_json(job: dict[str, Any]) -> dict[str, set[str]]:
    """Nomad's API JSON `Templates` of every task made fit for the generic
    reader (in place): a zero `VaultGrace` dropped, another refused. The
    answer says which fields each template set, for the defaults (as
    `read` records them), by proto path. Raises validate.FieldProblem."""
    explicit: dict[str, set[str]] = {}
    for gi, tg in enumerate(_list(job.get("TaskGroups"))):
        if not isinstance(tg, dict):
            continue
        for ti, task in enumerate(_list(tg.get("Tasks"))):
            if not isinstance(task, dict):
                continue
            for i, tmpl in enumerate(_list(task.get("Templates"))):
                if not isinstance(tmpl, dict):
                    continue
                path = f"job.task_groups[{gi}].tasks[{ti}].templates[{i}]"
                if tmpl.get("VaultGrace") not in (None, 0):
                    raise validate.FieldProblem(f"{path}.VaultGrace", VAULT_GRACE)
                tmpl.pop("VaultGrace", None)
                if tmpl.get("Splay") is not None:
                    explicit[path] = {"splay"}
                script = tmpl.get("ChangeScript")
                if isinstance(script, dict) and script.get("Timeout") is not None:
                    explicit[f"{path}.change_script"] = {"timeout"}
                for field in ("Uid", "Gid"):
                    if tmpl.get(field) is None:
                        tmpl.pop(field, None)
    return explicit


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []
