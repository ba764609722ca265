import pytest

from corral.domain.jobspec.duration import format_duration, parse_duration

S = 1_000_000_000


@pytest.mark.parametrize(
    ("text", "ns"),
    [
        ("0", 0),
        ("30s", 30 * S),
        ("5m", 300 * S),
        ("1h30m", 5400 * S),
        ("250ms", 250_000_000),
        ("1.5s", 1_500_000_000),
        ("10us", 10_000),
        ("7ns", 7),
        ("-5s", -5 * S),
        ("2h0m0s", 7200 * S),
    ],
)
def test_parse_duration(text, ns):
    assert parse_duration(text) == ns


@pytest.mark.parametrize("text", ["", "5", "5 minutes", "1d", "s", "1h 30m", "abc"])
def test_parse_duration_rejects(text):
    with pytest.raises(ValueError):
        parse_duration(text)


@pytest.mark.parametrize(
    ("ns", "text"),
    [(0, "0s"), (30 * S, "30s"), (5400 * S, "1h30m"), (250_000_000, "250ms"), (3600 * S, "1h")],
)
def test_format_duration(ns, text):
    assert format_duration(ns) == text
    assert parse_duration(text) == ns
