"""Nomad HCL job files → `pb.Job`.

The file is parsed and evaluated as Nomad's jobspec2 does (`language/`:
variables, locals, expressions, functions, dynamic blocks) into plain data
with the line of every block and argument, then read here block by block,
so any problem can be reported as `file:line: field: problem`. Every block
reader consumes the arguments it knows; whatever is left over is reported as
unknown (a typo) or unsupported (a Nomad feature Corral does not have), never
silently ignored. Variables Nomad leaves for run time (`${NOMAD_*}`,
`${attr.*}`, `${meta.*}`, `${node.*}`, any name that is not `var`, `local`
or an iterator) come out of evaluation as their `${...}` text and pass
through for the client and scheduler to interpolate."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from corral.domain import scaling
from corral.domain.jobspec import defaults, limits, validate
from corral.domain.jobspec import services as service_blocks
from corral.domain.jobspec import templates as template_blocks
from corral.domain.jobspec.body import (
    Body,
    Source,
    _is_block_list,
    _kind,
)
from corral.domain.jobspec.errors import JobspecError
from corral.domain.jobspec.language.config import BLOCK, Decoded, decode
from corral.domain.jobspec.language.errors import HclError
from corral.domain.jobspec.language.parser import MAX_DEPTH
from corral.domain.jobspec.language.variables import VarInputs
from corral.domain.structs import CONSTRAINT_SHORTHANDS
from corral.v1 import structs_pb2 as pb


def _fill(msg: Any, body: Body, spec: list[tuple[str, str, str]]) -> set[str]:
    """Set proto fields from arguments: spec is (hcl name, kind, proto field)."""
    readers: dict[str, Callable[..., Any]] = {
        "int": body.integer,
        "dur": body.duration,
        "bool": body.boolean,
        "str": body.string,
    }
    chosen: set[str] = set()
    for name, kind, proto_field in spec:
        value = readers[kind](name, proto_field)
        if value is not None:
            setattr(msg, proto_field, value)
            chosen.add(proto_field)
    return chosen


# --------------------------------------------------------------- stanzas

RESTART = [
    ("attempts", "int", "attempts"),
    ("interval", "dur", "interval"),
    ("delay", "dur", "delay"),
    ("mode", "str", "mode"),
    ("render_templates", "bool", "render_templates"),
]
RESCHEDULE = [
    ("attempts", "int", "attempts"),
    ("interval", "dur", "interval"),
    ("delay", "dur", "delay"),
    ("delay_function", "str", "delay_function"),
    ("max_delay", "dur", "max_delay"),
    ("unlimited", "bool", "unlimited"),
]
UPDATE = [
    ("stagger", "dur", "stagger"),
    ("max_parallel", "int", "max_parallel"),
    ("health_check", "str", "health_check"),
    ("min_healthy_time", "dur", "min_healthy_time"),
    ("healthy_deadline", "dur", "healthy_deadline"),
    ("progress_deadline", "dur", "progress_deadline"),
    ("auto_revert", "bool", "auto_revert"),
    ("auto_promote", "bool", "auto_promote"),
    ("canary", "int", "canary"),
]
MIGRATE = [
    ("max_parallel", "int", "max_parallel"),
    ("health_check", "str", "health_check"),
    ("min_healthy_time", "dur", "min_healthy_time"),
    ("healthy_deadline", "dur", "healthy_deadline"),
]


def _value_str(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _constraint(body: Body, out: pb.Constraint | pb.Affinity) -> None:
    attribute = body.string("attribute", "l_target")
    operator = body.string("operator", "operand")
    value_raw = body._take("value", "r_target")
    if isinstance(value_raw, dict | list):
        raise body.fail("value", f"expected a string, got {_kind(value_raw)}")
    for short in CONSTRAINT_SHORTHANDS:
        if short not in body.data:
            continue
        if operator is not None:
            raise body.fail(short, f"cannot be combined with operator = {operator!r}")
        raw = body._take(short, "r_target")
        operator = short
        if short == "distinct_hosts":
            if _value_str(raw) != "true":
                raise body.fail(short, "only distinct_hosts = true is meaningful")
            value_raw = None
        elif short == "distinct_property":
            attribute = _value_str(raw)
        else:
            value_raw = raw
    out.l_target = attribute or ""
    out.operand = operator or "="
    out.r_target = "" if value_raw is None else _value_str(value_raw)


def _constraints(body: Body, proto: str, target: Any) -> None:
    for _, cb in body.blocks("constraint", f"{body.proto}.{proto}", labeled=False):
        c = target.add()
        _constraint(cb, c)
        cb.done()


def _affinities(body: Body, target: Any) -> None:
    for _, ab in body.blocks("affinity", f"{body.proto}.affinities", labeled=False):
        a = target.add()
        _constraint(ab, a)
        weight = ab.integer("weight", minimum=-100)
        a.weight = 50 if weight is None else weight
        ab.done()


def _spreads(body: Body, target: Any) -> None:
    for _, sb in body.blocks("spread", f"{body.proto}.spreads", labeled=False):
        s = target.add()
        s.attribute = sb.string("attribute") or ""
        weight = sb.integer("weight")
        s.weight = 50 if weight is None else weight
        for label, tb in sb.blocks("target", f"{sb.proto}.spread_target", labeled=True):
            t = s.spread_target.add(value=label or "")
            t.percent = tb.integer("percent") or 0
            tb.done()
        sb.done()


def _policy(body: Body, name: str, msg: Any, proto: str, spec: list[tuple[str, str, str]]) -> bool:
    pb_body = body.block(name, proto)
    if pb_body is None:
        return False
    chosen = _fill(msg, pb_body, spec)
    msg.SetInParent()
    body.src.explicit[proto] = chosen
    pb_body.done()
    return True


def _ports(body: Body, net: pb.NetworkResource) -> None:
    for label, pbody in body.blocks("port", f"{body.proto}.ports", labeled=True):
        static = pbody.integer("static", "value")
        to = pbody.integer("to", "to", minimum=-1)
        host_network = pbody.string("host_network")
        port = pb.Port(label=label or "", to=to or 0, host_network=host_network or "")
        if static:
            if static > 65535:
                raise pbody.fail("static", "must be a port number (1..65535)")
            port.value = static
            net.reserved_ports.append(port)
        else:
            net.dynamic_ports.append(port)
        pbody.done()


def _network(body: Body, out: Any) -> None:
    for _, nb in body.blocks("network", f"{body.proto}.networks", labeled=False):
        net = out.add()
        net.mode = nb.string("mode") or "host"
        if net.mode not in ("host", "bridge", "none") and not (
            net.mode.startswith("cni/") and len(net.mode) > 4
        ):
            raise nb.fail(
                "mode",
                f'unknown network mode {net.mode!r} (expected "host", "bridge", "none" '
                'or "cni/<network>")',
            )
        net.mbits = nb.integer("mbits") or 0
        net.hostname = nb.string("hostname") or ""
        cni = nb.block("cni", f"{nb.proto}.cni")
        if cni is not None:
            net.cni.args.update(cni.string_map("args") or {})
            net.cni.SetInParent()
            cni.done()
        _ports(nb, net)
        if "dns" in nb.data:
            raise nb.fail("dns", "the dns block is not supported by Corral")
        nb.done()


def _resources(body: Body, task: pb.Task) -> None:
    rb = body.block("resources", f"{body.proto}.resources")
    if rb is None:
        return
    r = task.resources
    r.cpu = rb.integer("cpu", "cpu") or 0
    r.cores = rb.integer("cores", "cores") or 0
    r.memory_mb = rb.integer("memory", "memory_mb") or 0
    # -1 is Nomad's "no limit" (MemoryNoLimit)
    r.memory_max_mb = rb.integer("memory_max", "memory_max_mb", minimum=-1) or 0
    r.disk_mb = rb.integer("disk", "disk_mb") or 0
    _network(rb, r.networks)
    for label, db in rb.blocks("device", f"{rb.proto}.devices", labeled=True):
        dev = r.devices.add(name=label or "")
        count = db.integer("count")
        dev.count = 1 if count is None else count
        _constraints(db, "constraints", dev.constraints)
        if "affinity" in db.data:
            raise db.fail("affinity", "device affinities are not supported by Corral")
        db.done()
    rb.done()


def _task(label: str, body: Body, task: pb.Task) -> None:
    task.name = label
    task.driver = body.string("driver") or ""
    task.user = body.string("user") or ""
    config = body.raw_map("config")
    if config is not None:
        task.config.update(config)
    env = body.string_map("env")
    if env:
        task.env.update(env)
    meta = body.string_map("meta")
    if meta:
        task.meta.update(meta)
    _resources(body, task)
    _constraints(body, "constraints", task.constraints)
    _affinities(body, task.affinities)
    kill_timeout = body.duration("kill_timeout")
    if kill_timeout is not None:
        task.kill_timeout = kill_timeout
        body.src.explicit[f"{body.proto}.kill_timeout"] = set()
    task.kill_signal = body.string("kill_signal") or ""
    task.shutdown_delay = body.duration("shutdown_delay") or 0
    task.leader = bool(body.boolean("leader"))
    _policy(body, "restart", task.restart_policy, f"{body.proto}.restart_policy", RESTART)
    dp = body.block("dispatch_payload", f"{body.proto}.dispatch_payload")
    if dp is not None:
        task.dispatch_payload.file = dp.string("file") or ""
        dp.done()
    service_blocks.read(body, task.services)
    _task_scaling(body, task)
    _identities(body, task)
    _volume_mounts(body, task)
    _artifacts(body, task)
    template_blocks.read(body, task)
    _actions(body, task)
    lb = body.block("lifecycle", f"{body.proto}.lifecycle")
    if lb is not None:
        task.lifecycle.SetInParent()
        _fill(task.lifecycle, lb, [("hook", "str", "hook"), ("sidecar", "bool", "sidecar")])
        lb.done()
    gb = body.block("logs", f"{body.proto}.log_config")
    if gb is not None:
        chosen = _fill(
            task.log_config,
            gb,
            [
                ("max_files", "int", "max_files"),
                ("max_file_size", "int", "max_file_size_mb"),
                ("disabled", "bool", "disabled"),
            ],
        )
        # written as 0 is not left out: Nomad refuses it rather than default it
        if "max_files" in chosen and task.log_config.max_files < 1:
            raise gb.fail(
                "max_files", f"minimum number of files is 1; got {task.log_config.max_files}"
            )
        if "max_file_size_mb" in chosen and task.log_config.max_file_size_mb < 1:
            raise gb.fail(
                "max_file_size",
                f"minimum file size is 1MB; got {task.log_config.max_file_size_mb}",
            )
        if gb.boolean("enabled") is False:
            # Nomad ignores the old `enabled` (1.5.4 swapped it for `disabled`):
            # refused rather than ignored when it asks for what it no longer does
            raise gb.fail("enabled", "enabled = false is ignored by Nomad; use disabled = true")
        gb.done()
    body.done()


def _identities(body: Body, task: pb.Task) -> None:
    """`identity` blocks: the one without a name (or named "default") is
    the task's default identity, the others its named identities (Nomad's
    jobspec2 moves the default one out of the list the same way)."""
    for _, ib in body.blocks("identity", "", labeled=False):
        name = ib.string("name") or ""
        if name in ("", "default"):
            if task.HasField("identity"):
                raise ib.src.error(ib.path, ib.display, "the default identity is defined twice")
            wid = task.identity
            ib.proto = f"{body.proto}.identity"
        else:
            ib.proto = f"{body.proto}.identities[{len(task.identities)}]"
            wid = task.identities.add()
        ib.src.origins[ib.proto] = (ib.src.lines.get(ib.path), ib.display)
        wid.name = name or "default"
        wid.audience.extend(ib.strings("aud", "audience") or [])
        wid.env = bool(ib.boolean("env"))
        wid.file = bool(ib.boolean("file"))
        wid.filepath = ib.string("filepath") or ""
        wid.ttl = ib.duration("ttl") or 0
        wid.change_mode = ib.string("change_mode") or ""
        wid.change_signal = ib.string("change_signal") or ""
        for name in ("extra_claims", "service_name"):
            if name in ib.data:
                raise ib.fail(name, f"identity {name} is not supported by Corral")
        ib.done()


def _actions(body: Body, task: pb.Task) -> None:
    """`action "name" { command = "..." args = [...] }` blocks (Nomad 1.7),
    kept in the job for `corral action` to run."""
    for label, ab in body.blocks("action", f"{body.proto}.actions", labeled=True):
        action = task.actions.add(name=label or "")
        action.command = ab.string("command") or ""
        action.args.extend(ab.strings("args") or [])
        ab.done()


def _volume_mounts(body: Body, task: pb.Task) -> None:
    for _, mb in body.blocks("volume_mount", f"{body.proto}.volume_mounts", labeled=False):
        m = task.volume_mounts.add()
        _fill(
            m,
            mb,
            [
                ("volume", "str", "volume"),
                ("destination", "str", "destination"),
                ("read_only", "bool", "read_only"),
                ("propagation_mode", "str", "propagation_mode"),
                ("selinux_label", "str", "selinux_label"),
            ],
        )
        mb.done()


def _artifacts(body: Body, task: pb.Task) -> None:
    for _, ab in body.blocks("artifact", f"{body.proto}.artifacts", labeled=False):
        a = task.artifacts.add()
        _fill(
            a,
            ab,
            [
                ("source", "str", "getter_source"),
                ("destination", "str", "relative_dest"),
                ("mode", "str", "getter_mode"),
                ("insecure", "bool", "getter_insecure"),
                ("chown", "bool", "chown"),
            ],
        )
        options = ab.string_map("options", "getter_options")
        if options:
            a.getter_options.update(options)
        headers = ab.string_map("headers", "getter_headers")
        if headers:
            a.getter_headers.update(headers)
        ab.done()


def _volumes(body: Body, tg: pb.TaskGroup) -> None:
    for label, vb in body.blocks("volume", f"{body.proto}.volumes", labeled=True):
        name = label or ""
        if name in tg.volumes:
            raise vb.src.error(vb.path, vb.display, f"volume {name!r} is defined twice")
        req = tg.volumes[name]
        req.name = name
        vb.proto = f"{body.proto}.volumes[{name}]"
        body.src.origins[vb.proto] = (body.src.lines.get(vb.path), vb.display)
        _fill(
            req,
            vb,
            [
                ("type", "str", "type"),
                ("source", "str", "source"),
                ("read_only", "bool", "read_only"),
                ("sticky", "bool", "sticky"),
                ("per_alloc", "bool", "per_alloc"),
                ("access_mode", "str", "access_mode"),
                ("attachment_mode", "str", "attachment_mode"),
            ],
        )
        if "mount_options" in vb.data:
            raise vb.fail("mount_options", "host volumes cannot have mount options")
        vb.done()


def _group(label: str, body: Body, tg: pb.TaskGroup) -> None:
    tg.name = label
    count = body.integer("count")
    if count is not None:
        tg.count = count
        body.src.explicit[f"{body.proto}.count"] = set()
    _constraints(body, "constraints", tg.constraints)
    _affinities(body, tg.affinities)
    _spreads(body, tg.spreads)
    _policy(body, "restart", tg.restart_policy, f"{body.proto}.restart_policy", RESTART)
    _policy(body, "reschedule", tg.reschedule_policy, f"{body.proto}.reschedule_policy", RESCHEDULE)
    _policy(body, "update", tg.update, f"{body.proto}.update", UPDATE)
    _policy(body, "migrate", tg.migrate, f"{body.proto}.migrate", MIGRATE)
    eb = body.block("ephemeral_disk", f"{body.proto}.ephemeral_disk")
    if eb is not None:
        _fill(
            tg.ephemeral_disk,
            eb,
            [
                ("sticky", "bool", "sticky"),
                ("migrate", "bool", "migrate"),
                ("size", "int", "size_mb"),
            ],
        )
        eb.done()
    _network(body, tg.networks)
    meta = body.string_map("meta")
    if meta:
        tg.meta.update(meta)
    mcd = body.duration("max_client_disconnect")
    if mcd is not None:
        tg.max_client_disconnect = mcd
    sacd = body.duration("stop_after_client_disconnect")
    if sacd is not None:
        tg.stop_after_client_disconnect = sacd
    db = body.block("disconnect", f"{body.proto}.disconnect")
    if db is not None:
        if mcd is not None or sacd is not None:
            raise db.src.error(
                db.path,
                db.display,
                "use either the disconnect block or max_client_disconnect / "
                "stop_after_client_disconnect, not both",
            )
        disconnect_spec = [
            ("lost_after", "dur", "lost_after"),
            ("reconcile", "str", "reconcile"),
            ("stop_on_client_after", "dur", "stop_on_client_after"),
        ]
        _fill(tg.disconnect, db, disconnect_spec)
        replace = db.boolean("replace")
        if replace is not None:
            tg.disconnect.replace = replace
        db.done()
    prevent = body.boolean("prevent_reschedule_on_lost")
    tg.prevent_reschedule_on_lost = bool(prevent)
    tg.shutdown_delay = body.duration("shutdown_delay") or 0
    tg.max_run_duration = body.duration("max_run_duration") or 0
    service_blocks.read(body, tg.services)
    sb = body.block("scaling", f"{body.proto}.scaling")
    if sb is not None:
        _scaling_policy(sb, tg.scaling)
        tg.scaling.type = tg.scaling.type or scaling.HORIZONTAL
    _volumes(body, tg)
    for tlabel, tb in body.blocks("task", f"{body.proto}.tasks", labeled=True):
        _task(tlabel or "", tb, tg.tasks.add())
    body.done()


def _job(label: str, body: Body, job: pb.Job) -> None:
    job.id = body.string("id") or label
    body.src.origins.setdefault("job.id", (body.src.lines.get(body.path), body.display))
    job.name = body.string("name") or label
    job.namespace = body.string("namespace") or ""
    # the region it runs in ("global", or none: the region that registers it)
    job.region = body.string("region") or ""
    job.type = body.string("type") or ""
    priority = body.integer("priority")
    if priority is not None:
        job.priority = priority
        body.src.explicit["job.priority"] = set()
    job.all_at_once = bool(body.boolean("all_at_once"))
    dcs = body.strings("datacenters")
    if dcs is not None:
        job.datacenters.extend(dcs)
    job.node_pool = body.string("node_pool") or ""
    meta = body.string_map("meta")
    if meta:
        job.meta.update(meta)
    _constraints(body, "constraints", job.constraints)
    _affinities(body, job.affinities)
    _spreads(body, job.spreads)
    _policy(body, "update", job.update, "job.update", UPDATE)
    # Job-level reschedule/migrate apply to every group that has none.
    job_resched = pb.ReschedulePolicy()
    has_resched = _policy(body, "reschedule", job_resched, "job.reschedule_policy", RESCHEDULE)
    job_migrate = pb.MigrateStrategy()
    has_migrate = _policy(body, "migrate", job_migrate, "job.migrate", MIGRATE)
    pbody = body.block("periodic", "job.periodic")
    if pbody is not None:
        spec = pbody.string("cron", "spec")
        crons = pbody.strings("crons", "crons")
        if crons is not None and spec is not None:
            raise pbody.fail("crons", "use either cron or crons, not both")
        job.periodic.spec = spec or ""
        job.periodic.crons.extend(crons or [])
        job.periodic.prohibit_overlap = bool(pbody.boolean("prohibit_overlap"))
        job.periodic.time_zone = pbody.string("time_zone") or ""
        enabled = pbody.boolean("enabled")
        job.periodic.enabled = True if enabled is None else enabled
        body.src.explicit["job.periodic.enabled"] = set()
        pbody.done()
    ui = body.block("ui", "job.ui")
    if ui is not None:
        job.ui.description = ui.string("description") or ""
        for _, lb in ui.blocks("link", "job.ui.links", labeled=False):
            job.ui.links.add(label=lb.string("label") or "", url=lb.string("url") or "")
            lb.done()
        job.ui.SetInParent()
        ui.done()
    parm = body.block("parameterized", "job.parameterized")
    if parm is not None:
        job.parameterized.payload = parm.string("payload") or "optional"
        job.parameterized.meta_required.extend(parm.strings("meta_required") or [])
        job.parameterized.meta_optional.extend(parm.strings("meta_optional") or [])
        parm.done()
    # A task written directly in the job becomes a group of its own, named
    # after the task and placed before the groups (Nomad's jobspec2).
    alone = body.blocks("task", "job.task_groups", labeled=True)
    groups = body.blocks("group", "job.task_groups", labeled=True, offset=len(alone))
    for tlabel, tb in alone:
        tg = job.task_groups.add(name=tlabel or "")
        tb.proto = f"{tb.proto}.tasks[0]"
        body.src.origins[tb.proto] = body.src.origins[tb.proto.rsplit(".", 1)[0]]
        _task(tlabel or "", tb, tg.tasks.add())
    for glabel, gb in groups:
        tg = job.task_groups.add()
        _group(glabel or "", gb, tg)
        gpath = gb.proto
        if has_resched and not tg.HasField("reschedule_policy"):
            tg.reschedule_policy.CopyFrom(job_resched)
            body.src.explicit[f"{gpath}.reschedule_policy"] = body.src.explicit[
                "job.reschedule_policy"
            ]
        if has_migrate and not tg.HasField("migrate"):
            tg.migrate.CopyFrom(job_migrate)
            body.src.explicit[f"{gpath}.migrate"] = body.src.explicit["job.migrate"]
        if job.HasField("update") and not tg.HasField("update"):
            body.src.explicit[f"{gpath}.update"] = body.src.explicit["job.update"]
        elif job.HasField("update") and tg.HasField("update"):
            # group update fields override the job's, the rest come from the job
            merged = pb.UpdateStrategy()
            merged.CopyFrom(job.update)
            for f in body.src.explicit.get(f"{gpath}.update", set()):
                setattr(merged, f, getattr(tg.update, f))
            tg.update.CopyFrom(merged)
            body.src.explicit[f"{gpath}.update"] = body.src.explicit["job.update"] | (
                body.src.explicit.get(f"{gpath}.update", set())
            )
    body.done()


# --------------------------------------------------------------- scaling

#: how deep a scaling `policy` document may nest (blocks and values)
MAX_POLICY_DEPTH = 32


def _scaling_policy(body: Body, out: pb.ScalingPolicy) -> None:
    """A `scaling` block: min, max, enabled, type and the opaque `policy`
    document an autoscaler reads (Nomad stores it as it was written)."""
    for name in ("min", "max"):
        value = body.integer(name, minimum=0)
        if value is not None:
            setattr(out, name, value)
    enabled = body.boolean("enabled")
    if enabled is not None:
        out.enabled = enabled
    out.type = body.string("type") or ""
    if "policy" in body.data:
        value = body.data["policy"]
        body.used.add("policy")
        if not _is_block_list(value) or len(value) != 1 or BLOCK not in value[0]:
            raise body.fail("policy", "expected one block: policy { ... }")
        out.policy.update(_policy_body(body, value[0], 1))
    body.done()


def _task_scaling(body: Body, task: pb.Task) -> None:
    """A task's `scaling "cpu"` and `scaling "mem"` blocks (Nomad's vertical
    policies, for an external autoscaler)."""
    seen: set[str] = set()
    for label, sb in body.blocks("scaling", f"{body.proto}.scaling_policies", labeled=True):
        name = (label or "").lower()
        kind = scaling.TASK_LABELS.get(name)
        if kind is None:
            raise sb.src.error(sb.path, sb.display, 'scaling policy name must be "cpu" or "mem"')
        if name in seen:
            raise sb.src.error(sb.path, sb.display, f'only one scaling "{name}" block is allowed')
        seen.add(name)
        p = task.scaling_policies.add()
        _scaling_policy(sb, p)
        if p.type and p.type != kind:
            raise sb.fail("type", f"invalid policy type, expected {kind!r} but found {p.type!r}")
        p.type = kind


def _policy_body(owner: Body, data: dict[str, Any], depth: int) -> dict[str, Any]:
    """A policy block's body in Nomad's shape: arguments as values, blocks
    as lists (`check "x" { ... }` → `"check": [{"x": [{...}]}]`, as Nomad's
    parser hands the autoscaler)."""
    if depth > MAX_POLICY_DEPTH:
        raise owner.fail("policy", f"is nested more than {MAX_POLICY_DEPTH} levels deep")
    out: dict[str, Any] = {}
    for key, value in data.items():
        if key == BLOCK:
            continue
        if _is_block_list(value):
            blocks = out.setdefault(key, [])
            blocks.extend(_policy_block(owner, item, depth + 1) for item in value)
        else:
            out[key] = _policy_value(owner, value, depth + 1)
    return out


def _policy_block(owner: Body, item: dict[str, Any], depth: int) -> dict[str, Any]:
    if BLOCK in item:
        return _policy_body(owner, item, depth)
    ((label, inner),) = item.items()
    return {label: [_policy_block(owner, inner, depth + 1)]}


def _policy_value(owner: Body, value: Any, depth: int) -> Any:
    if depth > MAX_POLICY_DEPTH:
        raise owner.fail("policy", f"is nested more than {MAX_POLICY_DEPTH} levels deep")
    if isinstance(value, dict):
        return {k: _policy_value(owner, v, depth + 1) for k, v in value.items() if k != BLOCK}
    if isinstance(value, list):
        return [_policy_value(owner, v, depth + 1) for v in value]
    return value


# --------------------------------------------------------------- entry point


@dataclass
class Parsed:
    """A parsed job and what Nomad keeps of its submission."""

    job: pb.Job
    decoded: Decoded


def parse(
    text: str,
    filename: str = "<stdin>",
    inputs: VarInputs | None = None,
    *,
    allow_fs: bool = True,
) -> pb.Job:
    """Parse, apply Nomad's defaults and validate one HCL job file."""
    return parse_file(text, filename, inputs, allow_fs=allow_fs).job


def parse_file(
    text: str,
    filename: str = "<stdin>",
    inputs: VarInputs | None = None,
    *,
    allow_fs: bool = True,
    basedir: str | None = None,
) -> Parsed:
    """`parse` that also returns the evaluated variables (for the job's
    submission) and warnings. `allow_fs` enables file(), fileset() and the
    other filesystem functions (the CLI: relative to `basedir`, by default
    the job file's directory; the HTTP API: off, as in Nomad). Within the
    limits of `limits.py`: the file's size first, then the CPU time of the
    whole parse (evaluation included: functions and for expressions can
    cost far more than the text's size suggests)."""
    limits.check_size(text, filename)
    return limits.cpu_budget(
        lambda: _parse_file(text, filename, inputs, allow_fs=allow_fs, basedir=basedir),
        filename,
    )


def _parse_file(
    text: str,
    filename: str,
    inputs: VarInputs | None,
    *,
    allow_fs: bool,
    basedir: str | None,
) -> Parsed:
    if basedir is None:
        basedir = os.path.dirname(filename) if filename not in ("<stdin>", "-") else "."
    try:
        decoded = decode(text, filename, inputs, basedir=basedir or ".", allow_fs=allow_fs)
    except HclError as exc:
        raise JobspecError(exc.filename, exc.line, exc.field, exc.message) from None
    except RecursionError:  # a value built deeper than the parser's own bound
        raise JobspecError(
            filename, None, "", f"nested more than {MAX_DEPTH} levels deep (the nesting limit)"
        ) from None
    src = Source(filename, decoded.lines)
    top = Body(decoded.data, (), "", "", src)
    jobs = top.blocks("job", "", labeled=True)
    if not jobs:
        raise JobspecError(
            filename, None, "", 'no job found (expected a `job "name" { ... }` block)'
        )
    if len(jobs) > 1:
        raise src.error((("job", 1),), "job", "a file may hold only one job")
    top.done()
    label, body = jobs[0]
    body.proto = "job"
    src.origins["job"] = (src.lines.get(body.path), body.display)
    job = pb.Job()
    _job(label or "", body, job)
    defaults.canonicalize(job, src.explicit)
    try:
        validate.check(job)
    except validate.FieldProblem as problem:
        line, display = src.origin_of(problem.path)
        raise JobspecError(filename, line, display, problem.problem) from None
    return Parsed(job, decoded)
