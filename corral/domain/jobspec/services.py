"""`service` and `check` blocks of a job file (HCL) or of Nomad's API JSON
→ `pb.Service`, as Nomad's jobspec2 and api.Service.Canonicalize read them.

Consul-only fields (connect, tagged addresses, weights, script and gRPC
checks, warning thresholds, ...) are refused here by name with one wording
(`corral.domain.services.consul_only`): Corral has no Consul, and a field
that would be accepted and ignored is worse than a refusal. What the proto
can express is judged by `corral.domain.services.problem` (provider,
names, ports, check types and intervals)."""

from __future__ import annotations

from typing import Any

from corral.domain import services
from corral.domain.jobspec import validate
from corral.domain.jobspec.body import Body
from corral.v1 import structs_pb2 as pb

#: service arguments and blocks only Consul acts on (HCL name: what to call
#: it); Nomad's JSON names them in PascalCase (`_json_name`)
CONSUL_SERVICE_FIELDS = {
    "connect": "the connect block (Consul service mesh)",
    "enable_tag_override": "enable_tag_override",
    "tagged_addresses": "tagged_addresses",
    "weights": "the weights block (Consul DNS weights)",
    "identity": "a service identity (a Consul service token)",
    "kind": "kind (Consul gateways)",
    "namespace": "a service namespace (a Consul namespace)",
}
#: check arguments only Consul acts on
CONSUL_CHECK_FIELDS = {
    "success_before_passing": "success_before_passing",
    "failures_before_critical": "failures_before_critical",
    "failures_before_warning": "failures_before_warning",
    "tls_server_name": "tls_server_name",
    "expose": "expose (Consul service mesh)",
    "grpc_service": "a gRPC check",
    "grpc_use_tls": "a gRPC check",
    "command": "a script check",
    "args": "a script check",
    "notes": "notes",
    "advertise": "advertise",
}

SERVICE_STRINGS = [
    ("name", "name"),
    ("port", "port_label"),
    ("address_mode", "address_mode"),
    ("address", "address"),
    ("task", "task_name"),
    ("on_update", "on_update"),
]
CHECK_STRINGS = [
    ("name", "name"),
    ("type", "type"),
    ("path", "path"),
    ("method", "method"),
    ("body", "body"),
    ("protocol", "protocol"),
    ("port", "port_label"),
    ("address_mode", "address_mode"),
    ("initial_status", "initial_status"),
    ("on_update", "on_update"),
    ("task", "task_name"),
]


# --------------------------------------------------------------------------- HCL


def read(body: Body, out: Any) -> None:
    """Every `service` block of a group or task body into `out`."""
    for _, sb in body.blocks("service", f"{body.proto}.services", labeled=False):
        _service(sb, out.add())


def _zero(value: Any) -> bool:
    """Nomad's zero value of a field: it asks for nothing."""
    return value in (None, "", False, 0, [], {})


def _json_name(hcl: str) -> str:
    """A field's name in Nomad's API JSON (`tls_server_name` → `TLSServerName`)."""
    return "".join(_ACRONYMS.get(part, part.capitalize()) for part in hcl.split("_"))


_ACRONYMS = {"tls": "TLS", "grpc": "GRPC"}


def _consul_fields(body: Body, fields: dict[str, str]) -> None:
    for name, what in fields.items():
        if name in body.data:
            if _zero(body.data[name]):
                body.used.add(name)
                continue
            raise body.fail(name, services.consul_only(what))


def _service(sb: Body, service: pb.Service) -> None:
    # the provider first: for a Consul service nothing else in it matters
    provider = sb.string("provider")
    found = services.provider_problem(provider or "")
    if found is not None:
        if provider is None:
            raise sb.src.error(sb.path, sb.display, found)
        raise sb.fail("provider", found)
    _consul_fields(sb, CONSUL_SERVICE_FIELDS)
    cluster = sb.string("cluster")
    if cluster not in (None, "", "default"):
        raise sb.fail("cluster", services.consul_only("a Consul cluster"))
    service.provider = provider or ""
    for name, field in SERVICE_STRINGS:
        value = sb.string(name, field)
        if value is not None:
            setattr(service, field, value)
    service.tags.extend(sb.strings("tags") or [])
    service.canary_tags.extend(sb.strings("canary_tags") or [])
    service.meta.update(sb.string_map("meta") or {})
    service.canary_meta.update(sb.string_map("canary_meta") or {})
    shared = None
    crb = sb.block("check_restart", f"{sb.proto}.check_restart")
    if crb is not None:
        shared = _check_restart(crb)
    for _, cb in sb.blocks("check", f"{sb.proto}.checks", labeled=False):
        _check(cb, service.checks.add(), shared)
    sb.done()


Restart = tuple[pb.CheckRestart, bool]  # and whether grace was written


def _check(cb: Body, check: pb.ServiceCheck, shared: Restart | None) -> None:
    _consul_fields(cb, CONSUL_CHECK_FIELDS)
    for name, field in CHECK_STRINGS:
        value = cb.string(name, field)
        if value is not None:
            setattr(check, field, value)
    check.interval = cb.duration("interval") or 0
    check.timeout = cb.duration("timeout") or 0
    check.tls_skip_verify = bool(cb.boolean("tls_skip_verify"))
    header = cb.raw_map("header")
    if header is not None:
        for key, values in header.items():
            if isinstance(values, str):
                values = [values]
            if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
                raise cb.fail("header", f'header {key!r} takes a list of strings (["value"])')
            check.header[key].values.extend(values)
    own = None
    crb = cb.block("check_restart", f"{cb.proto}.check_restart")
    if crb is not None:
        own = _check_restart(crb)
    merged = merge_check_restart(shared, own)
    if merged is not None:
        check.check_restart.CopyFrom(merged)
    cb.done()


def _check_restart(body: Body) -> Restart:
    cr = pb.CheckRestart(limit=body.integer("limit") or 0)
    grace = body.duration("grace")
    cr.grace = grace or 0
    if body.boolean("ignore_warnings"):
        raise body.fail("ignore_warnings", services.consul_only("ignore_warnings"))
    body.done()
    return cr, grace is not None


def merge_check_restart(shared: Restart | None, own: Restart | None) -> pb.CheckRestart | None:
    """A service's `check_restart` applies to each of its checks; a check's
    own overrides what it sets (api.CheckRestart.Merge), and a grace
    nobody wrote is 1 s (api.CheckRestart.Canonicalize)."""
    if shared is None and own is None:
        return None
    merged = pb.CheckRestart()
    grace_set = False
    for part in (shared, own):
        if part is None:
            continue
        cr, has_grace = part
        if cr.limit > 0:
            merged.limit = cr.limit
        if has_grace:
            merged.grace, grace_set = cr.grace, True
    if not grace_set:
        merged.grace = services.DEFAULT_CHECK_RESTART_GRACE
    return merged


# --------------------------------------------------------------------------- Nomad JSON


def nomad_json(job: dict[str, Any]) -> None:
    """Nomad's API JSON `Services` of every group and task, made fit for
    the generic reader (in place): Consul-only fields refused by name,
    `Header` lists wrapped, a service's `CheckRestart` merged into its
    checks, `Cluster` "default" dropped. Raises validate.FieldProblem."""
    for gi, tg in enumerate(_list(job.get("TaskGroups"))):
        if not isinstance(tg, dict):
            continue
        gp = f"job.task_groups[{gi}]"
        _json_services(tg, f"{gp}.services")
        for ti, task in enumerate(_list(tg.get("Tasks"))):
            if isinstance(task, dict):
                _json_services(task, f"{gp}.tasks[{ti}].services")


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _json_services(owner: dict[str, Any], path: str) -> None:
    for i, service in enumerate(_list(owner.get("Services"))):
        if not isinstance(service, dict):
            continue
        sp = f"{path}[{i}]"
        _json_consul_fields(service, CONSUL_SERVICE_FIELDS, sp)
        if service.get("Cluster") not in (None, "", "default"):
            raise validate.FieldProblem(f"{sp}.Cluster", services.consul_only("a Consul cluster"))
        service.pop("Cluster", None)
        shared = service.pop("CheckRestart", None)
        for ci, check in enumerate(_list(service.get("Checks"))):
            if not isinstance(check, dict):
                continue
            cp = f"{sp}.checks[{ci}]"
            _json_consul_fields(check, CONSUL_CHECK_FIELDS, cp)
            header = check.get("Header")
            if isinstance(header, dict):
                check["Header"] = {k: _header_values(v) for k, v in header.items()}
            own = check.get("CheckRestart")
            if isinstance(shared, dict) or isinstance(own, dict):
                check["CheckRestart"] = _json_check_restart(shared, own)


def _json_consul_fields(data: dict[str, Any], fields: dict[str, str], path: str) -> None:
    for name, what in fields.items():
        key = _json_name(name)
        if not _zero(data.get(key)):
            raise validate.FieldProblem(f"{path}.{key}", services.consul_only(what))
        data.pop(key, None)


def _header_values(value: Any) -> Any:
    """Nomad's `[values]` (or one value) as our message; ours passes."""
    if isinstance(value, dict):
        return value
    return {"Values": value if isinstance(value, list) else [value]}


def _json_check_restart(shared: Any, own: Any) -> dict[str, Any]:
    """api.CheckRestart.Merge then Canonicalize: a nil Grace is 1 s."""
    merged: dict[str, Any] = dict(shared) if isinstance(shared, dict) else {}
    if isinstance(own, dict):
        if own.get("Limit"):
            merged["Limit"] = own["Limit"]
        if own.get("Grace") is not None:
            merged["Grace"] = own["Grace"]
        if own.get("IgnoreWarnings"):
            merged["IgnoreWarnings"] = True
    if merged.get("Grace") is None:
        merged["Grace"] = services.DEFAULT_CHECK_RESTART_GRACE
    return merged
