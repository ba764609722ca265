"""What Nomad's template functions read from the cluster, and who answers.

`nomadVar`, `nomadVarList`, `nomadVarExists`, `nomadService` and
`nomadServices` do not fetch anything during a render: as in
consul-template, each call names a *dependency* (`VarGet`, `ServiceQuery`,
...) and asks a `NomadData` provider for what it already knows. A provider
answers `UNKNOWN` for a dependency it has not fetched yet; the render then
records the dependency as missing and returns an empty value, and the
template runner fetches the missing dependencies (blocking queries with
the task's identity) and renders again. Every dependency a render touched
is in its `used` set, so the runner knows what to watch and re-renders
when one changes.

The returned values behave as consul-template's: `nomadVar` gives
`NomadVarItems` (a map of `NomadVarItem`, printing as their values, with
`.Keys`, `.Values`, `.Tuples`, `.Metadata`, `.Parent`), `nomadService`
gives `NomadService` structs (`.Address`, `.Port`, `.Tags`, `.ID`, ...).
"""

from __future__ import annotations

import datetime as dt
import fnmatch
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

from corral.domain.template.values import GoList, GoMap, GoStruct, Method, Uint64


class _Unknown:
    def __repr__(self) -> str:
        return "UNKNOWN"


UNKNOWN: Any = _Unknown()
"""A provider's answer for a dependency it has not fetched yet."""


class ProviderError(Exception):
    """A provider could not answer (permission denied, bad query): the render
    fails with this message."""


# ---------------------------------------------------------------- dependencies


@dataclass(frozen=True)
class VarGet:
    """One Nomad variable (`nomadVar` blocks until it exists; `nomadVarExists`
    does not)."""

    path: str
    namespace: str = "default"
    region: str = ""
    block: bool = False

    def __str__(self) -> str:
        kind = "block" if self.block else "get"
        return f"nomad.var.{kind}({self.path}@{self.namespace}.{self.region or 'global'})"


@dataclass(frozen=True)
class VarList:
    """The variables under a prefix (`nomadVarList`); `safe` refuses to render
    while the list is empty (`nomadVarListSafe`)."""

    prefix: str = ""
    namespace: str = "default"
    region: str = ""

    def __str__(self) -> str:
        return f"nomad.var.list({self.prefix}@{self.namespace}.{self.region or 'global'})"


@dataclass(frozen=True)
class ServiceQuery:
    """The instances of one service (`nomadService`), optionally filtered by
    tag and narrowed by rendezvous hashing (`choose` = "count|key")."""

    name: str
    tag: str = ""
    region: str = ""
    choose: str = ""
    namespace: str = "default"

    def __str__(self) -> str:
        name = self.name
        if self.tag:
            name = f"{self.tag}.{name}"
        if self.region:
            name = f"{name}@{self.region}"
        if self.choose:
            name = f"{name}:{self.choose}"
        return f"nomad.service({name})"


@dataclass(frozen=True)
class ServicesQuery:
    """The service names of the namespace (`nomadServices`)."""

    region: str = ""
    namespace: str = "default"

    def __str__(self) -> str:
        return f"nomad.services(@{self.region})" if self.region else "nomad.services"


@dataclass(frozen=True)
class FileDependency:
    """A file read by `file` (the runner re-renders when it changes)."""

    path: str

    def __str__(self) -> str:
        return f"file({self.path})"


Dependency = VarGet | VarList | ServiceQuery | ServicesQuery | FileDependency

_WORD = r"[A-Za-z0-9_]"
_VAR_GET_RE = re.compile(
    rf"/?(?P<path>[^@]+)(@(?P<namespace>(?:{_WORD}|-)+))?(\.(?P<region>(?:{_WORD}|-)+))?\Z"
)
_VAR_LIST_RE = re.compile(
    rf"/?(?P<prefix>[^@]*)(@(?P<namespace>(?:{_WORD}|-)+|\*))?(\.(?P<region>(?:{_WORD}|-)+))?\Z"
)
_SERVICE_RE = re.compile(
    rf"((?P<tag>(?:{_WORD}|[=:.\-])+)\.)?(?P<name>(?:{_WORD}|-)+)(@(?P<region>(?:{_WORD}|[.\-])+))?\Z"
)
_SERVICES_RE = re.compile(rf"(@(?P<region>(?:{_WORD}|[.\-])+))?\Z")


def parse_var_get(s: str, default_namespace: str) -> VarGet:
    s = s.strip().strip("/")
    m = _VAR_GET_RE.match(s)
    if s and m is None:
        raise ProviderError(f"nomad.var.get: invalid format: {_q(s)}")
    assert m is not None
    return VarGet(
        path=m.group("path") or "",
        namespace=m.group("namespace") or default_namespace or "default",
        region=m.group("region") or "",
    )


def parse_var_list(s: str, default_namespace: str) -> VarList:
    m = _VAR_LIST_RE.match(s)
    if s and m is None:
        raise ProviderError(f"nomad.var.list: invalid format: {_q(s)}")
    assert m is not None
    prefix = m.group("prefix") or ""
    if prefix.strip("/") == "":
        prefix = ""
    return VarList(
        prefix=prefix,
        namespace=m.group("namespace") or default_namespace or "default",
        region=m.group("region") or "",
    )


def parse_service(s: str, namespace: str, choose: str = "") -> ServiceQuery:
    m = _SERVICE_RE.match(s)
    if m is None:
        raise ProviderError(f"nomad.service: invalid format: {_q(s)}")
    return ServiceQuery(
        name=m.group("name"),
        tag=m.group("tag") or "",
        region=m.group("region") or "",
        choose=choose,
        namespace=namespace or "default",
    )


def parse_services(s: str, namespace: str) -> ServicesQuery:
    m = _SERVICES_RE.match(s)
    if m is None:
        raise ProviderError(f"nomad.services: invalid format: {_q(s)}")
    return ServicesQuery(region=m.group("region") or "", namespace=namespace or "default")


def _q(s: str) -> str:
    from corral.domain.template.gofmt import quote

    return quote(s)


# ---------------------------------------------------------------- values


class NanoTime(GoStruct):
    """consul-template's nanoTime: Unix nanoseconds printing as a date."""

    go_type = "dependency.nanoTime"
    go_pointer = False

    def __init__(self, nanos: int) -> None:
        self.nanos = int(nanos)

    def time(self) -> dt.datetime:
        return dt.datetime.fromtimestamp(self.nanos / 1e9, tz=dt.UTC)

    def go_json(self) -> int:
        return self.nanos

    def string(self) -> str:
        t = self.time()
        frac = f"{self.nanos % 1_000_000_000:09d}".rstrip("0")
        return t.strftime("%Y-%m-%d %H:%M:%S") + (f".{frac}" if frac else "") + " +0000 UTC"

    go_methods: ClassVar[Mapping[str, Method]] = {
        "String": Method(lambda self: self.string()),
        "Unix": Method(lambda self: self.nanos // 1_000_000_000),
    }


def _set_metadata(
    obj: Any,
    namespace: str,
    path: str,
    create_index: int,
    modify_index: int,
    create_time: int,
    modify_time: int,
) -> None:
    """The metadata fields a variable and its NomadVarMeta share."""
    obj.Namespace = namespace
    obj.Path = path
    obj.CreateIndex = Uint64(create_index)
    obj.ModifyIndex = Uint64(modify_index)
    obj.CreateTime = NanoTime(create_time)
    obj.ModifyTime = NanoTime(modify_time)


class NomadVarMeta(GoStruct):
    go_type = "*dependency.NomadVarMeta"
    go_fields = ("Namespace", "Path", "CreateIndex", "ModifyIndex", "CreateTime", "ModifyTime")
    Namespace: str
    Path: str
    CreateIndex: Uint64
    ModifyIndex: Uint64
    CreateTime: NanoTime
    ModifyTime: NanoTime

    def __init__(
        self,
        namespace: str,
        path: str,
        create_index: int = 0,
        modify_index: int = 0,
        create_time: int = 0,
        modify_time: int = 0,
    ) -> None:
        _set_metadata(self, namespace, path, create_index, modify_index, create_time, modify_time)

    go_methods: ClassVar[Mapping[str, Method]] = {"String": Method(lambda self: self.Path)}


class NomadVariable(GoStruct):
    """A whole variable (what `.Parent` returns): metadata and its Items."""

    go_type = "*dependency.NomadVariable"
    go_fields = (
        "Namespace",
        "Path",
        "CreateIndex",
        "ModifyIndex",
        "CreateTime",
        "ModifyTime",
        "Items",
    )
    Namespace: str
    Path: str
    CreateIndex: Uint64
    ModifyIndex: Uint64
    CreateTime: NanoTime
    ModifyTime: NanoTime

    def __init__(
        self,
        path: str,
        items: Mapping[str, str],
        *,
        namespace: str = "default",
        create_index: int = 0,
        modify_index: int = 0,
        create_time: int = 0,
        modify_time: int = 0,
    ) -> None:
        _set_metadata(self, namespace, path, create_index, modify_index, create_time, modify_time)
        self.Items = NomadVarItems({k: NomadVarItem(k, str(v), self) for k, v in items.items()})

    def metadata(self) -> NomadVarMeta:
        return NomadVarMeta(
            self.Namespace,
            self.Path,
            int(self.CreateIndex),
            int(self.ModifyIndex),
            self.CreateTime.nanos,
            self.ModifyTime.nanos,
        )

    go_methods: ClassVar[Mapping[str, Method]] = {"Metadata": Method(lambda self: self.metadata())}


class NomadVarItem(GoStruct):
    """One key of a variable; prints (and encodes to JSON) as its value."""

    go_type = "dependency.NomadVarItem"
    go_fields = ("Key", "Value")
    go_pointer = False

    def __init__(self, key: str, value: str, parent: NomadVariable | None) -> None:
        self.Key = key
        self.Value = value
        self.parent = parent

    def go_json(self) -> str:
        return self.Value

    go_methods: ClassVar[Mapping[str, Method]] = {
        "String": Method(lambda self: self.Value),
        "Metadata": Method(lambda self: self.parent.metadata() if self.parent else None),
        "Parent": Method(lambda self: self.parent),
    }


class _Tuple(GoStruct):
    go_type = "struct { K string; V string }"
    go_fields = ("K", "V")
    go_pointer = False

    def __init__(self, k: str, v: str) -> None:
        self.K = k
        self.V = v


class NomadVarItems(GoMap):
    """What `nomadVar` returns: key -> NomadVarItem, with helper methods."""

    go_type = "dependency.NomadVarItems"

    def go_zero(self) -> Any:
        return NomadVarItem("", "", None)

    def _first_parent(self) -> NomadVariable | None:
        for item in self.values():
            return item.parent  # type: ignore[no-any-return]
        return None

    go_methods: ClassVar[Mapping[str, Method]] = {
        "Keys": Method(lambda self: GoList(sorted(self), "[]string")),
        "Values": Method(lambda self: GoList([self[k].Value for k in sorted(self)], "[]string")),
        "Tuples": Method(
            lambda self: GoList(
                [_Tuple(k, self[k].Value) for k in sorted(self)], "[]struct { K string; V string }"
            )
        ),
        "Metadata": Method(
            lambda self: p.metadata() if (p := self._first_parent()) is not None else None
        ),
        "Parent": Method(lambda self: self._first_parent()),
        "ItemsMap": Method(lambda self: {k: v.Value for k, v in self.items()} if self else None),
    }


class ServiceTags(GoList):
    def __init__(self, tags: Iterable[str]) -> None:
        super().__init__(sorted(tags), "dependency.ServiceTags")


class NomadService(GoStruct):
    """One instance of a Nomad service registration."""

    go_type = "*dependency.NomadService"
    go_fields = ("ID", "Name", "Node", "Address", "Port", "Datacenter", "Tags", "JobID", "AllocID")

    def __init__(
        self,
        id: str,
        name: str,
        address: str,
        port: int,
        *,
        node: str = "",
        datacenter: str = "",
        tags: Sequence[str] = (),
        job_id: str = "",
        alloc_id: str = "",
    ) -> None:
        self.ID = id
        self.Name = name
        self.Node = node
        self.Address = address
        self.Port = int(port)
        self.Datacenter = datacenter
        self.Tags = ServiceTags(tags)
        self.JobID = job_id
        self.AllocID = alloc_id


class NomadServicesSnippet(GoStruct):
    """One service name of `nomadServices`, with the union of its tags."""

    go_type = "*dependency.NomadServicesSnippet"
    go_fields = ("Name", "Tags")

    def __init__(self, name: str, tags: Sequence[str] = ()) -> None:
        self.Name = name
        self.Tags = ServiceTags(tags)


# ---------------------------------------------------------------- providers


class NomadData(Protocol):
    """Answers the Nomad functions of a render from what the caller has
    fetched. Each method returns UNKNOWN for what is not known yet, and may
    raise ProviderError (e.g. permission denied)."""

    def variable(self, query: VarGet) -> NomadVariable | None:
        """The variable at query.path, None when it does not exist."""
        ...

    def variables(self, query: VarList) -> list[NomadVarMeta]:
        """Metadata of the variables under query.prefix, sorted by path."""
        ...

    def service(self, query: ServiceQuery) -> list[NomadService]:
        """The instances of query.name (tag filtered, `choose` applied)."""
        ...

    def services(self, query: ServicesQuery) -> list[NomadServicesSnippet]:
        """The service names of query.namespace, sorted."""
        ...


@dataclass
class MemoryData:
    """A NomadData over in-memory dictionaries, for tests and dry runs.
    A namespace absent from `known_namespaces`... every query is known unless
    listed in `unknown` (then it answers UNKNOWN, as a provider that has not
    fetched it yet)."""

    vars: dict[tuple[str, str], NomadVariable] = field(default_factory=dict)
    registrations: list[tuple[str, NomadService]] = field(default_factory=list)
    unknown: set[Any] = field(default_factory=set)
    denied: dict[Any, str] = field(default_factory=dict)

    def put_variable(
        self, path: str, items: Mapping[str, str], namespace: str = "default", index: int = 1
    ) -> NomadVariable:
        var = NomadVariable(
            path,
            items,
            namespace=namespace,
            create_index=index,
            modify_index=index,
            create_time=1_700_000_000_000_000_000,
            modify_time=1_700_000_000_000_000_000,
        )
        self.vars[(namespace, path)] = var
        return var

    def delete_variable(self, path: str, namespace: str = "default") -> None:
        self.vars.pop((namespace, path), None)

    def put_service(self, service: NomadService, namespace: str = "default") -> None:
        self.registrations.append((namespace, service))

    def remove_service(self, service_id: str) -> None:
        self.registrations = [(ns, s) for ns, s in self.registrations if service_id != s.ID]

    def _check(self, query: Any) -> bool:
        if query in self.denied:
            raise ProviderError(self.denied[query])
        return query in self.unknown

    def variable(self, query: VarGet) -> NomadVariable | None:
        if self._check(query):
            return UNKNOWN  # type: ignore[no-any-return]
        return self.vars.get((query.namespace, query.path))

    def variables(self, query: VarList) -> list[NomadVarMeta]:
        if self._check(query):
            return UNKNOWN  # type: ignore[no-any-return]
        namespaces = None if query.namespace == "*" else {query.namespace}
        out = [
            var.metadata()
            for (ns, path), var in sorted(self.vars.items())
            if (namespaces is None or ns in namespaces) and path.startswith(query.prefix)
        ]
        return out

    def service(self, query: ServiceQuery) -> list[NomadService]:
        if self._check(query):
            return UNKNOWN  # type: ignore[no-any-return]
        out = [
            s
            for ns, s in self.registrations
            if ns == query.namespace
            and s.Name == query.name
            and (not query.tag or query.tag in s.Tags)
        ]
        if query.choose:
            count_s, _, key = query.choose.partition("|")
            out = rendezvous_choose(out, int(count_s), key)
        return sorted(out, key=lambda s: s.Name)

    def services(self, query: ServicesQuery) -> list[NomadServicesSnippet]:
        if self._check(query):
            return UNKNOWN  # type: ignore[no-any-return]
        tags: dict[str, set[str]] = {}
        for ns, s in self.registrations:
            if ns == query.namespace:
                tags.setdefault(s.Name, set()).update(s.Tags)
        return [NomadServicesSnippet(name, sorted(t)) for name, t in sorted(tags.items())]


def rendezvous_choose(
    instances: Sequence[NomadService], count: int, key: str
) -> list[NomadService]:
    """Nomad's `choose=count|key`: the `count` instances with the highest
    rendezvous hash of key and instance ID (a stable subset per key)."""
    import hashlib

    def score(s: NomadService) -> bytes:
        return hashlib.sha256((key + s.ID).encode()).digest()

    ranked = sorted(instances, key=score, reverse=True)
    return list(ranked[: max(count, 0)])


def glob_match(pattern: str, name: str) -> bool:
    """consul-template's function_denylist patterns (`sprig_*`)."""
    return fnmatch.fnmatchcase(name, pattern)
