"""Status messages fit in the trailer gRPC carries them in, whatever input
they echo (found by the fuzz test: a 10,000-character id in a NOT_FOUND
message reached the client as RESOURCE_EXHAUSTED "metadata size exceeds
hard limit", the real status lost)."""

from __future__ import annotations

from urllib.parse import quote

from corral.domain.errors import MAX_MESSAGE_WIRE_BYTES, InvalidArgument, NotFound, bounded_message


def _wire(message: str) -> int:
    # what gRPC's percent-encoding of grpc-message makes of it
    return len(quote(message, safe="".join(chr(c) for c in range(0x20, 0x7F) if c != 0x25)))


def test_short_messages_are_kept_whole() -> None:
    msg = "job.task_groups[0].count: must be between 0 and 100000"
    assert bounded_message(msg) == msg
    assert InvalidArgument("job.id", "is required").message == "job.id: is required"


def test_long_messages_are_cut_to_fit_on_the_wire() -> None:
    for text in ("x" * 10_000, "é" * 10_000, "😀" * 10_000, "%" * 10_000, "a\x00b" * 5_000):
        err = NotFound(f"node {text!r} not found")
        assert err.message.startswith("node '")
        assert err.message.endswith(" ... (truncated)")
        assert _wire(err.message) <= MAX_MESSAGE_WIRE_BYTES
        assert str(err) == err.message


def test_a_message_exactly_at_the_limit_is_not_cut() -> None:
    msg = "a" * MAX_MESSAGE_WIRE_BYTES
    assert bounded_message(msg) == msg
    assert bounded_message(msg + "a").endswith("(truncated)")
