"""Nomad's native service discovery in domain terms: the rules of a job's
`service` and `check` blocks (provider "nomad"), the ids of registrations
and checks, and `choose`, the rendezvous-hashed subset of a service's
instances (nomad/structs/services.go, service_registration.go, checks.go).

Corral has no Consul. A service whose provider is "consul" (Nomad's default
when `provider` is not set) would never be placed by Nomad without a Consul
agent on the nodes; here it is refused at submission with the one-line fix
(docs/services.md). The job parsers refuse Consul-only fields before they
reach a `pb.Service`; `problem` judges what can be said in the proto."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Sequence

from corral.v1 import structs_pb2 as pb

PROVIDER_NOMAD = "nomad"
PROVIDER_CONSUL = "consul"

ADDRESS_AUTO = "auto"
ADDRESS_HOST = "host"
SERVICE_ADDRESS_MODES = ("", ADDRESS_AUTO, ADDRESS_HOST)
CHECK_ADDRESS_MODES = ("", ADDRESS_HOST)

CHECK_HTTP = "http"
CHECK_TCP = "tcp"
CHECK_TYPES = (CHECK_HTTP, CHECK_TCP)

ON_UPDATE_REQUIRE_HEALTHY = "require_healthy"
ON_UPDATE_IGNORE = "ignore"
ON_UPDATE_IGNORE_WARNINGS = "ignore_warnings"
ON_UPDATE = (ON_UPDATE_REQUIRE_HEALTHY, ON_UPDATE_IGNORE)

#: a check's initial status as written (Consul's names) → its first result
INITIAL_STATUS = {"passing": "success", "critical": "failure"}

#: check results (Nomad's CheckStatus) and modes (CheckMode)
CHECK_SUCCESS = "success"
CHECK_FAILURE = "failure"
CHECK_PENDING = "pending"
HEALTHINESS = "healthiness"
READINESS = "readiness"

HTTP_METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "CONNECT", "OPTIONS", "TRACE")
PROTOCOLS = ("", "http", "https")

SECOND = 1_000_000_000
MIN_CHECK_INTERVAL = SECOND
MIN_CHECK_TIMEOUT = SECOND
#: check_restart's grace when the block leaves it out (api.CheckRestart)
DEFAULT_CHECK_RESTART_GRACE = SECOND

#: the prefix of every registration id (client/serviceregistration/id.go)
REGISTRATION_ID_PREFIX = "_nomad-task-"

CONSUL_UNAVAILABLE = "Consul is not available in Corral"
MALFORMED_CHOOSE = "Parameter for choose must be in form '<number>|<key>'"

_NAME = re.compile(r"^(?i:[a-z0-9]|[a-z0-9][a-z0-9\-]{0,61}[a-z0-9])$")
_INTERPOLATION = re.compile(r"\$\{[^{}]*\}")
#: the placeholders a service name may use, replaced at submission
_SUBMIT_PLACEHOLDERS = ("JOB", "TASKGROUP", "TASK", "BASE")


# --------------------------------------------------------------------------- ids


def workload_name(task: str, group: str) -> str:
    """Whose instance a registration is: the task, or `group-<group>` for a
    group service (WorkloadServices.Name)."""
    return task or f"group-{group}"


def registration_id(alloc_id: str, workload: str, service: pb.Service) -> str:
    """`_nomad-task-<alloc>-<workload>-<service>-<port label>`
    (MakeAllocServiceID): one instance per alloc, workload, name and port."""
    return f"{REGISTRATION_ID_PREFIX}{alloc_id}-{workload}-{service.name}-{service.port_label}"


def check_id(alloc_id: str, group: str, check: pb.ServiceCheck) -> str:
    """A check's id within its alloc (NomadCheckID): a hash of what makes
    the check what it is, so a job update that changes it starts it anew."""
    h = hashlib.sha256()
    for part in (
        alloc_id,
        group,
        check.task_name,
        check.name,
        check.type,
        check.port_label,
        check.on_update,
        check.address_mode,
        str(check.interval),
        str(check.timeout),
        check.protocol,
        check.path,
        check.method,
        "true" if check.tls_skip_verify else "false",
    ):
        h.update(part.encode())
        h.update(b"\x00")
    return h.hexdigest()


def check_mode(check: pb.ServiceCheck) -> str:
    """A check with on_update "ignore" is a readiness check: it never makes
    a deployment unhealthy (GetCheckMode)."""
    return READINESS if check.on_update == ON_UPDATE_IGNORE else HEALTHINESS


def group_services(tg: pb.TaskGroup) -> list[pb.Service]:
    """Every service of the group: the group's own, then each task's
    (TaskGroup.NomadServices)."""
    out = list(tg.services)
    for task in tg.tasks:
        out.extend(task.services)
    return out


# --------------------------------------------------------------------------- choose


def hash_with(reg: pb.ServiceRegistration, key: str) -> str:
    """The registration's rank for `key` (ServiceRegistration.HashWith)."""
    h = hashlib.sha256()
    h.update(max(reg.port, 0).to_bytes(8, "big"))
    for part in (reg.alloc_id, reg.id, reg.namespace, reg.address, reg.service_name):
        h.update(part.encode())
    for tag in reg.tags:
        h.update(tag.encode())
    h.update(key.encode())
    return h.hexdigest()


def choose(regs: Sequence[pb.ServiceRegistration], parameter: str) -> list[pb.ServiceRegistration]:
    """Nomad's `choose=<n>|<key>`: the n instances ranked first by their
    hash with key (rendezvous hashing), so each caller (consul-template
    passes its alloc id) gets a stable subset that moves little when
    instances come and go. ValueError with Nomad's message when malformed."""
    count, sep, key = parameter.partition("|")
    if not sep or not key or not count.isdigit():
        raise ValueError(MALFORMED_CHOOSE)
    n = int(count)
    ranked = sorted(regs, key=lambda r: hash_with(r, key))
    return ranked[: max(0, min(n, len(ranked)))]


# --------------------------------------------------------------------------- submission


def _replace_placeholders(name: str, values: dict[str, str]) -> str:
    for placeholder in _SUBMIT_PLACEHOLDERS:
        name = name.replace("${" + placeholder + "}", values[placeholder])
    return name


def canonicalize(job: pb.Job) -> None:
    """Nomad's Service.Canonicalize over every service of `job` (in place,
    idempotent): default names (`<job>-<group>-<task>`, `<job>-<group>`),
    `${JOB}`, `${TASKGROUP}`, `${TASK}` and `${BASE}` replaced, each
    check named (`service: "<name>" check`) and given its task and the
    service's on_update."""
    name = job.name or job.id
    for tg in job.task_groups:
        for service in tg.services:
            _canonicalize(service, name, tg.name, "", f"{name}-{tg.name}")
        for task in tg.tasks:
            for service in task.services:
                if not service.task_name:
                    service.task_name = task.name
                _canonicalize(service, name, tg.name, task.name, f"{name}-{tg.name}-{task.name}")


def _canonicalize(service: pb.Service, job: str, group: str, task: str, default: str) -> None:
    if not service.name:
        service.name = default
    service.name = _replace_placeholders(
        service.name,
        {"JOB": job, "TASKGROUP": group, "TASK": task or "group", "BASE": f"{job}-{group}-{task}"},
    )
    if not service.address_mode:
        service.address_mode = ADDRESS_AUTO
    if not service.on_update:
        service.on_update = ON_UPDATE_REQUIRE_HEALTHY
    for check in service.checks:
        if not check.name:
            check.name = f'service: "{service.name}" check'
        if not check.task_name and task:
            check.task_name = task
        if not check.on_update:
            check.on_update = service.on_update


# --------------------------------------------------------------------------- validation


def consul_only(what: str) -> str:
    """The refusal of a Consul feature, in one wording everywhere."""
    return f"{what} is a Consul feature; {CONSUL_UNAVAILABLE}"


def provider_problem(provider: str) -> str | None:
    if provider == PROVIDER_NOMAD:
        return None
    if provider in ("", PROVIDER_CONSUL):
        shown = (
            'provider "consul" (Nomad\'s default when provider is not set)'
            if not provider
            else 'provider "consul"'
        )
        return (
            f'{shown} needs Consul, and {CONSUL_UNAVAILABLE}: set provider = "nomad" '
            "to use Corral's built-in service catalog (docs/services.md)"
        )
    return f'unknown provider {provider!r} (Corral has only "nomad")'


def name_problem(name: str) -> str | None:
    """RFC 1123 after runtime variables are set aside (ValidateName)."""
    stripped = _INTERPOLATION.sub("ENV-VAR", name)
    if _NAME.match(stripped):
        return None
    return (
        f"{name!r} is not a valid service name: letters, digits and '-' only, at most "
        "63 characters, not starting or ending with '-' (RFC 1123)"
    )


def _address_mode_problem(mode: str, allowed: tuple[str, ...]) -> str | None:
    if mode in allowed:
        return None
    if mode == "driver":
        return (
            'address_mode "driver" needs a driver network (Docker-style port mapping); '
            "Corral's drivers (raw_exec, exec, mock) have none"
        )
    if mode in ("alloc", "alloc_ipv6"):
        return (
            f"address_mode {mode!r} needs a bridge or CNI network, which Corral's client "
            "does not set up"
        )
    if mode == ADDRESS_AUTO:
        return 'address_mode "auto" is only valid for services'
    shown = ", ".join(repr(m) for m in allowed if m)
    return f"unknown address_mode {mode!r} (expected {shown})"


def _port_labels(tg: pb.TaskGroup, task: pb.Task | None) -> set[str]:
    """The port labels a service may name: the group's network's, and those
    of the task's (a task service) or of any task (a group service)."""
    labels = {p.label for n in tg.networks for p in (*n.reserved_ports, *n.dynamic_ports)}
    tasks = [task] if task is not None else list(tg.tasks)
    for t in tasks:
        for n in t.resources.networks:
            labels.update(p.label for p in (*n.reserved_ports, *n.dynamic_ports))
    return labels


def _port_problem(label: str, labels: set[str]) -> str | None:
    if not label or label in labels:
        return None
    if label.isdigit():
        return None if 0 < int(label) <= 65535 else f"port {label} is not a port number (1..65535)"
    known = ", ".join(sorted(labels)) or "none: add a network block with a port"
    return f"port label {label!r} is not a port of the group's network (known: {known})"


def problem(job: pb.Job) -> tuple[str, str] | None:
    """The first problem with the job's services, as (proto path, problem);
    None when every service can be registered and checked by Corral."""
    for gi, tg in enumerate(job.task_groups):
        gp = f"job.task_groups[{gi}]"
        tasks = {t.name for t in tg.tasks}
        seen: set[tuple[str, str, str]] = set()
        owners: list[tuple[str, pb.Service, pb.Task | None]] = [
            (f"{gp}.services[{i}]", s, None) for i, s in enumerate(tg.services)
        ]
        for ti, t in enumerate(tg.tasks):
            owners.extend(
                (f"{gp}.tasks[{ti}].services[{i}]", s, t) for i, s in enumerate(t.services)
            )
        for path, service, owner in owners:
            found = _service_problem(service, path, tg, owner, tasks)
            if found is not None:
                return found
            key = (service.name, owner.name if owner is not None else "group", service.port_label)
            if key in seen:
                where = f"task {owner.name!r}" if owner is not None else f"group {tg.name!r}"
                return (
                    f"{path}.name",
                    f"service {service.name!r} with port {service.port_label!r} is defined "
                    f"twice in {where}",
                )
            seen.add(key)
    return None


def _service_problem(
    service: pb.Service, path: str, tg: pb.TaskGroup, task: pb.Task | None, tasks: set[str]
) -> tuple[str, str] | None:
    found = provider_problem(service.provider)
    if found is not None:
        return (f"{path}.provider", found)
    found = name_problem(service.name)
    if found is not None:
        return (f"{path}.name", found)
    found = _address_mode_problem(service.address_mode, SERVICE_ADDRESS_MODES)
    if found is not None:
        return (f"{path}.address_mode", found)
    if service.address and service.address_mode not in ("", ADDRESS_AUTO):
        return (f"{path}.address", 'needs address_mode = "auto" (the default)')
    if service.on_update not in ("", *ON_UPDATE):
        return (f"{path}.on_update", _on_update_problem(service.on_update))
    if task is not None and service.task_name not in ("", task.name):
        return (
            f"{path}.task_name",
            f"a task's service belongs to that task ({task.name!r}), got {service.task_name!r}",
        )
    if task is None and service.task_name and service.task_name not in tasks:
        return (f"{path}.task_name", f"names no task of group {tg.name!r}: {service.task_name!r}")
    labels = _port_labels(tg, task)
    found = _port_problem(service.port_label, labels)
    if found is not None:
        return (f"{path}.port_label", found)
    names: set[str] = set()
    for ci, check in enumerate(service.checks):
        cp = f"{path}.checks[{ci}]"
        bad = _check_problem(check, service, labels)
        if bad is not None:
            return (f"{cp}.{bad[0]}", bad[1])
        if task is not None and check.task_name not in ("", task.name):
            return (f"{cp}.task_name", f"a task's check belongs to that task ({task.name!r})")
        if task is None and check.task_name and check.task_name not in tasks:
            return (f"{cp}.task_name", f"names no task of group {tg.name!r}: {check.task_name!r}")
        if check.name and check.name in names:
            return (f"{cp}.name", f"check {check.name!r} is defined twice in the service")
        names.add(check.name)
    return None


def _on_update_problem(value: str) -> str:
    if value == ON_UPDATE_IGNORE_WARNINGS:
        return (
            'on_update "ignore_warnings" is for Consul checks (Nomad checks have no warning '
            'state); use "require_healthy" or "ignore"'
        )
    return f'unknown on_update {value!r} (expected "require_healthy" or "ignore")'


def _check_problem(
    check: pb.ServiceCheck, service: pb.Service, labels: set[str]
) -> tuple[str, str] | None:
    kind = check.type.lower()
    if kind in ("script", "grpc"):
        return ("type", consul_only(f"a {kind} check"))
    if kind not in CHECK_TYPES:
        return ("type", f'unknown check type {check.type!r} (expected "http" or "tcp")')
    if kind == CHECK_HTTP:
        if not check.path:
            return ("path", "an http check needs a path")
        if "://" in check.path or check.path.startswith("//"):
            return ("path", f"must be a path relative to the service, got {check.path!r}")
        if check.method and check.method.upper() not in HTTP_METHODS:
            return ("method", f"unknown HTTP method {check.method!r}")
        if check.protocol not in PROTOCOLS:
            return ("protocol", f'unknown protocol {check.protocol!r} (expected "http" or "https")')
    elif check.path or check.method or check.header or check.body or check.protocol:
        return ("type", "path, method, header, body and protocol apply to http checks only")
    if check.interval < MIN_CHECK_INTERVAL:
        return ("interval", "is required and must be at least 1s")
    if check.timeout < MIN_CHECK_TIMEOUT:
        return ("timeout", "is required and must be at least 1s")
    if check.initial_status not in ("", *INITIAL_STATUS):
        if check.initial_status == "warning":
            return (
                "initial_status",
                'Nomad checks have no warning state; use "passing" or "critical"',
            )
        return (
            "initial_status",
            f'unknown status {check.initial_status!r} (expected "passing" or "critical")',
        )
    found = _address_mode_problem(check.address_mode, CHECK_ADDRESS_MODES)
    if found is not None:
        return ("address_mode", found)
    if check.on_update not in ("", *ON_UPDATE):
        return ("on_update", _on_update_problem(check.on_update))
    if not (check.port_label or service.port_label):
        return (
            "port_label",
            "the check needs a port, and neither the check nor its service has one",
        )
    found = _port_problem(check.port_label, labels)
    if found is not None:
        return ("port_label", found)
    if check.HasField("check_restart"):
        cr = check.check_restart
        if cr.limit < 0:
            return ("check_restart.limit", "must not be negative")
        if cr.grace < 0:
            return ("check_restart.grace", "must not be negative")
        if cr.ignore_warnings:
            return ("check_restart.ignore_warnings", consul_only("ignore_warnings"))
        if check.on_update == ON_UPDATE_IGNORE and cr.limit > 0:
            return (
                "on_update",
                'on_update "ignore" cannot be combined with check_restart (a readiness check '
                "never restarts its task)",
            )
    return None


def tags_union(regs: Iterable[pb.ServiceRegistration]) -> list[str]:
    """The sorted union of the instances' tags (a service list's Tags)."""
    return sorted({t for r in regs for t in r.tags})
