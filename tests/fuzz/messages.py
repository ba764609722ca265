"""Hypothesis strategies for any protobuf message, built from its
descriptor: every scalar type at its limits, repeated fields and maps,
nested messages to a bounded depth, oneofs (one member at most).

Nothing here knows Corral's messages: a new RPC or field is fuzzed the day
it lands in `proto/`. The values are hostile on purpose (NUL, unicode,
10,000-character strings, negative and huge numbers, NaN); `Hints` lets the
caller mix in values that mean something to the cluster under test (real
ids, so generated requests reach past the "not found" checks).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from google.protobuf import message_factory
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message
from hypothesis import strategies as st

F = FieldDescriptor
#: a field's descriptor: the pure-Python or the upb class, depending on the
#: protobuf runtime, which its stubs tell apart and its API does not
Field = Any

INT_RANGES: dict[int, tuple[int, int]] = {
    F.TYPE_INT32: (-(2**31), 2**31 - 1),
    F.TYPE_SINT32: (-(2**31), 2**31 - 1),
    F.TYPE_SFIXED32: (-(2**31), 2**31 - 1),
    F.TYPE_INT64: (-(2**63), 2**63 - 1),
    F.TYPE_SINT64: (-(2**63), 2**63 - 1),
    F.TYPE_SFIXED64: (-(2**63), 2**63 - 1),
    F.TYPE_UINT32: (0, 2**32 - 1),
    F.TYPE_FIXED32: (0, 2**32 - 1),
    F.TYPE_UINT64: (0, 2**64 - 1),
    F.TYPE_FIXED64: (0, 2**64 - 1),
}

LONG = "x" * 10_000
#: a "huge" repeated field: one drawn element repeated to about this size
HUGE_LIST_BYTES = 200_000
HUGE_LIST_ITEMS = 5_000

#: strings that have broken parsers, paths, SQL and terminals before
HOSTILE_STRINGS: tuple[str, ...] = (
    "",
    " ",
    "*",
    "**",
    ".",
    "..",
    "../x",
    "../../../../etc/passwd",
    "/",
    "default",
    "Default",
    "\x00",
    "a\x00b",
    "\n",
    "\t\r",
    "\\",
    "'",
    '"',
    "' OR '1'='1",
    "%s%n%x",
    "${attr.kernel.name}",
    "{{ .Foo }}",
    "é",
    "名前",
    "😀",
    "\u202eevil",
    "\ufeff",
    "\uffff",
    "-1",
    "0",
    "NaN",
    LONG,
    "é" * 5_000,
)


def int_boundaries(lo: int, hi: int) -> list[int]:
    picks = {0, 1, -1, 2, lo, hi, lo + 1, hi - 1, 2**31 - 1, -(2**31), 2**32, 2**53, 2**63 - 1}
    return sorted(v for v in picks if lo <= v <= hi)


def hostile_ints(lo: int, hi: int) -> st.SearchStrategy[int]:
    return st.one_of(st.sampled_from(int_boundaries(lo, hi)), st.integers(lo, hi))


def hostile_text() -> st.SearchStrategy[str]:
    return st.one_of(
        st.sampled_from(HOSTILE_STRINGS),
        st.text(max_size=24),
        st.text(alphabet=st.characters(codec="utf-8"), min_size=1, max_size=8),
    )


def hostile_bytes() -> st.SearchStrategy[bytes]:
    return st.one_of(
        st.binary(max_size=32),
        st.sampled_from([b"", b"\x00", b"\xff" * 64, b"\x00" * 70_000]),
    )


def hostile_floats(width: int) -> st.SearchStrategy[float]:
    return st.floats(allow_nan=True, allow_infinity=True, width=width)  # type: ignore[arg-type]


@dataclass
class Hints:
    """Values the cluster knows, offered for fields by name: a field whose
    name `rule` accepts draws, some of the time, from `values` instead.
    Fixed when the strategy is built: hypothesis needs the same choices to
    give the same request, whatever the cluster does meanwhile."""

    #: (does this field name match?, the values to offer)
    strings: list[tuple[Callable[[str], bool], Sequence[str]]] = field(default_factory=list)

    def for_string(self, name: str) -> Sequence[str]:
        out: list[str] = []
        for rule, values in self.strings:
            if rule(name):
                out.extend(values)
        return out


NO_HINTS = Hints()


def message_class(desc: Descriptor) -> type[Message]:
    return message_factory.GetMessageClass(desc)  # type: ignore[no-any-return]


def is_map(fd: Field) -> bool:
    mt = fd.message_type
    return mt is not None and bool(mt.GetOptions().map_entry)


def sub_type(fd: Field) -> Descriptor:
    """The message type of a message (or map) field."""
    mt = fd.message_type
    assert mt is not None, fd.full_name
    return mt  # type: ignore[no-any-return]


def scalar(fd: Field, hints: Hints = NO_HINTS) -> st.SearchStrategy[Any]:
    """A hostile value for one scalar field (or a map's key or value)."""
    t = fd.type
    if t in INT_RANGES:
        return hostile_ints(*INT_RANGES[t])
    if t == F.TYPE_BOOL:
        return st.booleans()
    if t == F.TYPE_STRING:
        known = hints.for_string(fd.name)
        if known:
            return st.one_of(hostile_text(), st.sampled_from(list(known)))
        return hostile_text()
    if t == F.TYPE_BYTES:
        return hostile_bytes()
    if t == F.TYPE_DOUBLE:
        return hostile_floats(64)
    if t == F.TYPE_FLOAT:
        return hostile_floats(32)
    if t == F.TYPE_ENUM:
        numbers = [v.number for v in fd.enum_type.values] or [0]
        # proto3 enums are open: an unknown number reaches the handler too
        return st.one_of(st.sampled_from(numbers), hostile_ints(-(2**31), 2**31 - 1))
    raise TypeError(f"no strategy for field type {t} ({fd.full_name})")


def messages(
    desc: Descriptor,
    *,
    depth: int = 3,
    hints: Hints = NO_HINTS,
    max_items: int = 3,
) -> st.SearchStrategy[Message]:
    """Messages of type `desc` with any subset of fields set."""

    @st.composite
    def build(draw: st.DrawFn) -> Message:
        msg = message_class(desc)()
        fill(draw, msg, depth=depth, hints=hints, max_items=max_items)
        return msg

    return build()


def fill(draw: st.DrawFn, msg: Message, *, depth: int, hints: Hints, max_items: int) -> None:
    """Set a drawn subset of `msg`'s fields (in place)."""
    desc = msg.DESCRIPTOR
    chosen_in_oneof: dict[str, str | None] = {}
    for oneof in desc.oneofs:
        names = [f.name for f in oneof.fields]
        chosen_in_oneof[oneof.name] = draw(st.sampled_from([None, *names]))
    for fd in desc.fields:
        group = fd.containing_oneof
        if group is not None:
            if chosen_in_oneof.get(group.name) != fd.name:
                continue
        elif not draw(st.booleans()):
            continue
        set_field(draw, msg, fd, depth=depth, hints=hints, max_items=max_items)


def set_field(
    draw: st.DrawFn,
    msg: Message,
    fd: Field,
    *,
    depth: int,
    hints: Hints,
    max_items: int,
) -> None:
    """Give one field of `msg` a drawn value (replacing what it held)."""
    msg.ClearField(fd.name)
    if is_map(fd):
        key_fd = sub_type(fd).fields_by_name["key"]
        value_fd = sub_type(fd).fields_by_name["value"]
        keys = draw(st.lists(scalar(key_fd, hints), max_size=max_items, unique=True))
        target = getattr(msg, fd.name)
        for k in keys:
            if value_fd.type == F.TYPE_MESSAGE:
                if depth > 0:
                    fill(draw, target[k], depth=depth - 1, hints=hints, max_items=max_items)
                else:
                    target[k].SetInParent()
            else:
                target[k] = draw(scalar(value_fd, hints))
        return
    if fd.is_repeated:
        target = getattr(msg, fd.name)
        n = draw(st.integers(0, max_items))
        # now and then a huge list: one element many times (cheap to draw),
        # up to about HUGE_LIST_BYTES
        huge = draw(st.sampled_from([False] * 9 + [True]))
        for i in range(n):
            if fd.type == F.TYPE_MESSAGE:
                item = message_class(sub_type(fd))()
                if depth > 0:
                    fill(draw, item, depth=depth - 1, hints=hints, max_items=max_items)
                size = item.ByteSize()
            else:
                value = draw(scalar(fd, hints))
                size = len(value) if isinstance(value, str | bytes) else 8
            copies = max(1, HUGE_LIST_BYTES // max(size, 1)) if huge and i == 0 else 1
            copies = min(copies, HUGE_LIST_ITEMS)
            if fd.type == F.TYPE_MESSAGE:
                for _ in range(copies):
                    target.add().CopyFrom(item)
            else:
                target.extend([value] * copies)
        return
    if fd.type == F.TYPE_MESSAGE:
        sub = getattr(msg, fd.name)
        sub.SetInParent()
        if depth > 0:
            fill(draw, sub, depth=depth - 1, hints=hints, max_items=max_items)
        return
    setattr(msg, fd.name, draw(scalar(fd, hints)))
