"""How the template engine sees Python values the way Go's `reflect` sees Go's.

Go's text/template is defined in terms of Go types: a map key that is absent
gives an *invalid* value ("<no value>"), a nil interface is not the same as an
absent key, `eq` compares by kind, `printf "%T"` names the type, an `int64`
does not fit a parameter of type `int`. Python values carry less type than
that, so this module fixes one mapping and every other module uses it:

- `MISSING` is Go's invalid `reflect.Value` (an absent map key, an unset dot);
  `None` is a nil interface (a JSON `null`, an explicit nil);
- `bool`, `int` (Go `int`), `Int64`, `Uint64`, `float` (`float64`), `str`
  (`string`), `list`/`tuple` (`[]interface {}`), `dict`
  (`map[string]interface {}`);
- `GoList`, `GoMap` and `GoStruct` carry a Go type name and, for maps and
  structs, methods callable from a template (`.Keys`, `.String`), the way
  consul-template's `NomadVarItems` and `NomadService` do.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar


class _Missing:
    """Go's zero `reflect.Value`: "no value" (an absent key, nil data)."""

    _instance: ClassVar[_Missing | None] = None

    def __new__(cls) -> _Missing:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "MISSING"

    def __bool__(self) -> bool:
        return False


MISSING: Any = _Missing()


class Int64(int):
    """A Go `int64` (what consul-template's parseInt and arithmetic return)."""

    go_type: ClassVar[str] = "int64"

    def __repr__(self) -> str:
        return f"Int64({int(self)})"


class Uint64(int):
    """A Go `uint64` (parseUint, the indexes of a Nomad variable)."""

    go_type: ClassVar[str] = "uint64"

    def __repr__(self) -> str:
        return f"Uint64({int(self)})"


@dataclass(frozen=True)
class Signature:
    """Parameter kinds of a callable, in Go's terms.

    A kind is one of "any" (interface{}), "value" (reflect.Value: receives
    MISSING as is), "string", "int", "int64", "uint64", "float64", "bool",
    "[]string", "[]any", "map"; `variadic` is the kind of each `...` argument.
    """

    params: tuple[str, ...] = ()
    variadic: str | None = None


GO_KIND_NAMES: dict[str, str] = {
    "any": "interface {}",
    "value": "reflect.Value",
    "string": "string",
    "int": "int",
    "int64": "int64",
    "uint64": "uint64",
    "float64": "float64",
    "bool": "bool",
    "[]string": "[]string",
    "[]any": "[]interface {}",
    "map": "map[string]interface {}",
}


@dataclass(frozen=True)
class Method:
    """A Go method exposed to templates: `fn(receiver, *args)`."""

    fn: Callable[..., Any]
    signature: Signature = Signature()


class GoList(list[Any]):
    """A Go slice with a named element type (`[]string`, `[]*NomadService`)."""

    def __init__(self, items: Any = (), go_type: str = "[]interface {}") -> None:
        super().__init__(items)
        self.go_type = go_type


class GoMap(dict[Any, Any]):
    """A Go map type that may carry methods (consul-template's NomadVarItems)."""

    go_type: ClassVar[str] = "map[string]interface {}"
    go_methods: ClassVar[Mapping[str, Method]] = {}

    def go_zero(self) -> Any:
        """The zero value of the element type (a missing key under
        missingkey=zero); nil for interface elements."""
        return None


class GoStruct:
    """A Go struct (or pointer to one, when `go_pointer`): exported fields
    are attributes named as in Go; methods are listed in `go_methods`."""

    go_type: ClassVar[str] = "struct {}"
    go_fields: ClassVar[tuple[str, ...]] = ()
    go_methods: ClassVar[Mapping[str, Method]] = {}
    go_pointer: ClassVar[bool] = True

    def go_field(self, name: str) -> Any:
        return getattr(self, name)


class GoChan:
    """A receive-only channel of ints, as consul-template's `loop` returns:
    range over it yields each value once, lazily (no list is built)."""

    go_type = "<-chan int64"

    def __init__(self, start: int, stop: int) -> None:
        self.start = start
        self.stop = stop

    def __iter__(self) -> Iterator[Int64]:
        for i in range(self.start, self.stop):
            yield Int64(i)


class GoFunc:
    """A function value in the data, callable with the `call` builtin."""

    go_type = "func"

    def __init__(self, fn: Callable[..., Any], signature: Signature) -> None:
        self.fn = fn
        self.signature = signature


def go_methods_of(value: Any) -> Mapping[str, Method]:
    if isinstance(value, GoStruct | GoMap):
        return value.go_methods
    return {}


def type_name(value: Any) -> str:
    """The Go type name of a value, as `%T` and error messages print it."""
    if value is MISSING:
        return "<invalid Value>"
    if value is None:
        return "<nil>"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, Int64 | Uint64):
        return value.go_type
    if isinstance(value, int):
        return "int"
    if isinstance(value, float):
        return "float64"
    if isinstance(value, complex):
        return "complex128"
    if isinstance(value, str):
        return "string"
    if isinstance(value, bytes):
        return "[]uint8"
    if isinstance(value, GoList):
        return value.go_type
    if isinstance(value, list | tuple):
        return "[]interface {}"
    if isinstance(value, GoMap):
        return value.go_type
    if isinstance(value, dict):
        return "map[string]interface {}"
    if isinstance(value, GoStruct | GoChan | GoFunc):
        return value.go_type
    return type(value).__name__


def is_true(value: Any) -> tuple[bool, bool]:
    """Go's truth of a value for if/with/and/or/not: (truth, meaningful)."""
    if value is MISSING or value is None:
        return False, True
    if isinstance(value, bool):
        return value, True
    if isinstance(value, int | float | complex):
        return value != 0, True
    if isinstance(value, str | bytes | list | tuple | dict):
        return len(value) > 0, True
    if isinstance(value, GoStruct | GoChan | GoFunc):
        return True, True
    return False, False


# Kinds for comparisons (Go's basicKind in text/template/funcs.go).
BOOL, COMPLEX, INT, FLOAT, STRING, UINT, INVALID = range(7)


def basic_kind(value: Any) -> int:
    if isinstance(value, bool):
        return BOOL
    if isinstance(value, Uint64):
        return UINT
    if isinstance(value, int):
        return INT
    if isinstance(value, float):
        return FLOAT
    if isinstance(value, complex):
        return COMPLEX
    if isinstance(value, str):
        return STRING
    return INVALID


def is_nillable(value: Any) -> bool:
    """Values of Go kinds that can be nil (maps, slices, pointers, ...)."""
    return (
        value is None
        or isinstance(value, list | tuple | dict | GoChan | GoFunc | bytes)
        or (isinstance(value, GoStruct) and value.go_pointer)
    )


def kind_name(value: Any) -> str:
    """Go's reflect.Kind name (sprig's kindOf)."""
    if value is None or value is MISSING:
        return "invalid"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, Int64):
        return "int64"
    if isinstance(value, Uint64):
        return "uint64"
    if isinstance(value, int):
        return "int"
    if isinstance(value, float):
        return "float64"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list | tuple | bytes):
        return "slice"
    if isinstance(value, dict):
        return "map"
    if isinstance(value, GoStruct):
        return "ptr" if value.go_pointer else "struct"
    if isinstance(value, GoChan):
        return "chan"
    if isinstance(value, GoFunc):
        return "func"
    return "invalid"
