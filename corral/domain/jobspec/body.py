"""Reading one HCL block's body (`Body`): typed argument readers that
remember what they read, errors that name the file line, and the source
map (`Source`). Apart from hcl.py so the block readers of other modules
(services.py) can take a body without importing the whole parser."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from corral.domain.jobspec.duration import parse_duration
from corral.domain.jobspec.errors import JobspecError
from corral.domain.jobspec.language.config import BLOCK

# Nomad stanzas Corral does not implement: reported as unsupported rather
# than unknown, so a user from Nomad knows the file is fine but the feature
# is missing here.
UNSUPPORTED = frozenset(
    {
        "vault",
        "consul",
        "csi_plugin",
        "connect",
        "multiregion",
        "secret",
        "schedule",
        "numa",
        "kind",
        "max_kill_timeout",
        "vault_token",
        "consul_token",
        "sidecar_task",
        # arguments of Nomad's api structs Corral does not act on
        "secrets",
        "iops",
        "ignore_collision",
        "cidr",
        "ip",
        "device",
        "reserved_ports",
    }
)

Path = tuple[Any, ...]


@dataclass
class Source:
    filename: str
    lines: dict[Path, int]
    # proto path → (line, display) of where it was written, for validation errors
    origins: dict[str, tuple[int | None, str]] = field(default_factory=dict)
    # policy proto path → proto fields the file set (defaults fill the rest)
    explicit: dict[str, set[str]] = field(default_factory=dict)

    def error(self, path: Path, display: str, problem: str) -> JobspecError:
        line = self.lines.get(path)
        while line is None and path:
            path = path[:-1]
            line = self.lines.get(path)
        return JobspecError(self.filename, line, display, problem)

    def origin_of(self, proto_path: str) -> tuple[int | None, str]:
        """Where the longest recorded prefix of `proto_path` was written."""
        probe = proto_path
        while probe:
            if probe in self.origins:
                line, display = self.origins[probe]
                rest = proto_path[len(probe) :].lstrip(".").replace(".", " > ")
                return (line, f"{display} > {rest}" if rest else display)
            cut = max(probe.rfind("."), probe.rfind("["))
            probe = probe[:cut] if cut > 0 else ""
        return (None, proto_path)


# --------------------------------------------------------------- body reader


def _is_block_list(value: Any) -> bool:
    if not isinstance(value, list) or not value:
        return False
    for item in value:
        if not isinstance(item, dict):
            return False
        if BLOCK in item:
            continue
        if len(item) == 1 and isinstance(next(iter(item.values())), dict):
            inner = next(iter(item.values()))
            if BLOCK in inner or _looks_labeled(inner):
                continue
        return False
    return True


def _looks_labeled(inner: dict[str, Any]) -> bool:
    # two labels: {"a": {"b": {...block...}}}
    return (
        len(inner) == 1
        and isinstance(next(iter(inner.values())), dict)
        and (BLOCK in next(iter(inner.values())))
    )


def _strip(value: Any) -> Any:
    """Plain data without the serializer's block markers (driver config)."""
    if isinstance(value, dict):
        return {k: _strip(v) for k, v in value.items() if k != BLOCK}
    if isinstance(value, list):
        return [_strip(v) for v in value]
    return value


def _is_expression(value: Any) -> bool:
    return isinstance(value, str) and value.startswith("${") and value.endswith("}")


class Body:
    """One block's body: typed argument readers that remember what they read."""

    def __init__(
        self, data: dict[str, Any], path: Path, display: str, proto: str, src: Source
    ) -> None:
        self.data = {k: v for k, v in data.items() if k != BLOCK}
        self.path = path
        self.display = display
        self.proto = proto
        self.src = src
        self.used: set[str] = set()

    # -- errors and bookkeeping

    def where(self, name: str) -> str:
        return f"{self.display} > {name}" if self.display else name

    def fail(self, name: str, problem: str) -> JobspecError:
        key: Path = (*self.path, name)
        if key not in self.src.lines and (*self.path, (name, 0)) in self.src.lines:
            key = (*self.path, (name, 0))  # a block rather than an argument
        return self.src.error(key, self.where(name), problem)

    def _take(self, name: str, to: str | None) -> Any:
        if name not in self.data:
            return None
        self.used.add(name)
        value = self.data[name]
        if _is_block_list(value):
            raise self.fail(name, f"expected an argument ({name} = ...), found a block")
        if to is not None:
            self.src.origins[f"{self.proto}.{to}"] = (
                self.src.lines.get((*self.path, name)),
                self.where(name),
            )
        return value

    def _literal(self, name: str, value: Any, what: str) -> None:
        if _is_expression(value):
            raise self.fail(
                name,
                f"expected {what}, got {value!r} (a variable known only at run time "
                "cannot be used here)",
            )

    # -- typed readers (None when absent)

    def string(self, name: str, to: str | None = None) -> str | None:
        value = self._take(name, to or name)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, str | int | float):
            raise self.fail(name, f"expected a string, got {_kind(value)}")
        return str(value)

    def integer(self, name: str, to: str | None = None, *, minimum: int | None = 0) -> int | None:
        value = self._take(name, to or name)
        if value is None:
            return None
        self._literal(name, value, "a number")
        if isinstance(value, bool):
            raise self.fail(name, "expected a number, got a bool")
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if isinstance(value, str):
            try:
                value = int(value.strip())
            except ValueError:
                raise self.fail(name, f"expected a whole number, got {value!r}") from None
        if not isinstance(value, int):
            raise self.fail(name, f"expected a whole number, got {_kind(value)} {value!r}")
        if minimum is not None and value < minimum:
            raise self.fail(name, f"must be >= {minimum}, got {value}")
        if abs(value) >= 2**31:
            raise self.fail(name, f"{value} is too large")
        return value

    def boolean(self, name: str, to: str | None = None) -> bool | None:
        value = self._take(name, to or name)
        if value is None:
            return None
        self._literal(name, value, "true or false")
        if isinstance(value, str) and value in ("true", "false"):
            return value == "true"
        if not isinstance(value, bool):
            raise self.fail(name, f"expected true or false, got {value!r}")
        return value

    def duration(self, name: str, to: str | None = None) -> int | None:
        value = self._take(name, to or name)
        if value is None:
            return None
        self._literal(name, value, "a duration")
        if not isinstance(value, str) or isinstance(value, bool):
            raise self.fail(
                name, f'expected a duration string such as "30s" or "5m", got {value!r}'
            )
        try:
            ns = parse_duration(value)
        except ValueError as exc:
            raise self.fail(name, str(exc)) from None
        if ns < 0:
            raise self.fail(name, "must not be negative")
        return ns

    def strings(self, name: str, to: str | None = None) -> list[str] | None:
        value = self._take(name, to or name)
        if value is None:
            return None
        self._literal(name, value, "a list of strings")
        if isinstance(value, str):
            raise self.fail(name, f'expected a list of strings (["{value}"]), got a string')
        if not isinstance(value, list) or not all(
            isinstance(v, str | int | float) and not isinstance(v, bool) for v in value
        ):
            raise self.fail(name, f"expected a list of strings, got {value!r}")
        return [str(v) for v in value]

    def string_map(self, name: str, to: str | None = None) -> dict[str, str] | None:
        """`meta { k = "v" }` (block) and `meta = { k = "v" }` (argument) alike."""
        if name not in self.data:
            return None
        value = self.data[name]
        self.used.add(name)
        self.src.origins[f"{self.proto}.{to or name}"] = (
            self.src.lines.get((*self.path, name)) or self.src.lines.get((*self.path, (name, 0))),
            self.where(name),
        )
        if _is_block_list(value):
            if len(value) > 1:
                raise self.src.error((*self.path, (name, 1)), self.where(name), "defined twice")
            value = {k: v for k, v in value[0].items() if k != BLOCK}
        if not isinstance(value, dict):
            raise self.fail(name, f"expected a map of strings, got {_kind(value)}")
        out: dict[str, str] = {}
        for k, v in value.items():
            if isinstance(v, dict | list) or v is None:
                raise self.fail(name, f"value of {k!r} must be a string, got {_kind(v)}")
            out[str(k)] = ("true" if v else "false") if isinstance(v, bool) else str(v)
        return out

    def raw_map(self, name: str) -> dict[str, Any] | None:
        """Free-form data (driver config): block or argument, markers stripped."""
        if name not in self.data:
            return None
        value = self.data[name]
        self.used.add(name)
        if _is_block_list(value):
            if len(value) > 1:
                raise self.src.error((*self.path, (name, 1)), self.where(name), "defined twice")
            value = value[0]
        if not isinstance(value, dict):
            raise self.fail(name, f"expected a block, got {_kind(value)}")
        result: dict[str, Any] = _strip(value)
        return result

    # -- blocks

    def blocks(
        self, name: str, proto: str, *, labeled: bool, offset: int = 0
    ) -> list[tuple[str | None, Body]]:
        """Every `name` block, as (label, body); `proto` is the repeated proto
        field they become (`{proto}[offset + i]` is recorded as their origin)."""
        if name not in self.data:
            return []
        value = self.data[name]
        self.used.add(name)
        if not _is_block_list(value):
            shape = f'{name} "label" {{ ... }}' if labeled else f"{name} {{ ... }}"
            raise self.fail(name, f"expected a block ({shape}), found an argument")
        out: list[tuple[str | None, Body]] = []
        for i, item in enumerate(value):
            path = (*self.path, (name, i))
            if BLOCK in item:
                if labeled:
                    raise self.src.error(
                        path, self.where(name), f'needs a label: {name} "name" {{ ... }}'
                    )
                label, inner = None, item
            else:
                label, inner = next(iter(item.items()))
                if not labeled:
                    raise self.src.error(path, self.where(name), f"takes no label, got {label!r}")
                if BLOCK not in inner:
                    raise self.src.error(path, self.where(name), "takes exactly one label")
            display = f'{name} "{label}"' if label is not None else name
            if self.display:
                display = f"{self.display} > {display}"
            ppath = f"{proto}[{offset + i}]" if proto else self.proto
            self.src.origins[ppath] = (self.src.lines.get(path), display)
            out.append((label, Body(inner, path, display, ppath, self.src)))
        return out

    def block(self, name: str, proto: str) -> Body | None:
        """An optional block that may appear once."""
        found = self.blocks(name, "", labeled=False)
        if not found:
            return None
        if len(found) > 1:
            raise self.src.error((*self.path, (name, 1)), self.where(name), "may appear only once")
        body = found[0][1]
        body.proto = proto
        self.src.origins[proto] = (self.src.lines.get(body.path), body.display)
        return body

    def done(self) -> None:
        for name in self.data:
            if name in self.used:
                continue
            kind = "block" if _is_block_list(self.data[name]) else "argument"
            if name in UNSUPPORTED:
                raise self.fail(name, f"the {name} {kind} is not supported by Corral")
            raise self.fail(name, f"unknown {kind} {name!r}")


def _kind(value: Any) -> str:
    if isinstance(value, bool):
        return "a bool"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "a map"
    if value is None:
        return "null"
    return type(value).__name__
