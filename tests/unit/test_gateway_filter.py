"""The gateway's `filter` expressions (go-bexpr, as Nomad documents it):
every operator, precedence, selectors, values and their coercion, missing
fields, and the errors a bad expression gets."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.gateway.filter import MAX_DEPTH, MAX_LENGTH, FilterError, apply, parse

JOB: dict[str, Any] = {
    "ID": "countdash",
    "Name": "countdash",
    "Namespace": "default",
    "Type": "service",
    "Status": "pending",
    "Priority": 50,
    "Stop": False,
    "Periodic": False,
    "ParentID": "",
    "SubmitTime": 1645230445788556000,
    "Datacenters": ["dc1", "dc2"],
    "Meta": {"env": "prod", "team.name": "sre", "empty": ""},
    "Multiregion": None,
    "TaskGroups": {"api": {"DesiredTotal": 1, "Promoted": False}, "my-group": {"DesiredTotal": 3}},
    "Ratio": 0.5,
}


def ok(expression: str, obj: dict[str, Any] = JOB) -> bool:
    return parse(expression)(obj)


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        ('Status == "pending"', True),
        ('Status == "running"', False),
        ('Status != "running"', True),
        ('Status != "pending"', False),
        ("Status == pending", True),  # a bare word is a value
        ("Status == `pending`", True),
        # numbers: a literal is read as the field's type
        ("Priority == 50", True),
        ('Priority == "50"', True),
        ("Priority == 50.0", True),
        ("Priority != 51", True),
        ('Priority == "fifty"', False),
        ("Ratio == 0.5", True),
        ("SubmitTime == 1645230445788556000", True),
        ("Priority == 5e1", True),
        # booleans, in Go's ParseBool spellings
        ("Stop == false", True),
        ('Stop == "false"', True),
        ("Stop == F", True),
        ("Stop == 0", True),
        ("Stop == true", False),
        ('Stop == "no"', False),
        ('Stop != "no"', True),
        # a string field compared with a number compares the text
        ('ID == "50"', False),
    ],
)
def test_equality(expression: str, expected: bool) -> None:
    assert ok(expression) is expected


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        ("ParentID is empty", True),
        ("ParentID is not empty", False),
        ("ID is empty", False),
        ("Datacenters is not empty", True),
        ("Multiregion is empty", True),  # null
        ("Meta.empty is empty", True),
        ("Meta is empty", False),
        ("Meta.nope is empty", True),  # a missing field is empty
        ("Meta.nope is not empty", False),
        ("Priority is empty", False),
    ],
)
def test_emptiness(expression: str, expected: bool) -> None:
    assert ok(expression) is expected


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        ('Datacenters contains "dc2"', True),
        ('Datacenters contains "dc3"', False),
        ('Datacenters not contains "dc3"', True),
        ('"dc1" in Datacenters', True),
        ('"dc3" not in Datacenters', True),
        ('"dc1" not in Datacenters', False),
        ("dc1 in Datacenters", True),  # a bare value before `in`
        ('"dash" in ID', True),  # substring of a string
        ('ID contains "count"', True),
        ('ID contains "nope"', False),
        ('Meta contains "env"', True),  # key of a map
        ('"team.name" in Meta', True),
        ('"prod" in Meta', False),  # values are not keys
        ('"api" in TaskGroups', True),
        ('Priority contains "5"', False),  # neither string, list nor map
    ],
)
def test_containment(expression: str, expected: bool) -> None:
    assert ok(expression) is expected


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        ('ID matches "^count"', True),
        ('ID matches "dash$"', True),
        ('ID matches "^dash"', False),
        ('ID not matches "^dash"', True),
        (r'ID matches "c.u\\w+"', True),  # Go escapes: \\ is one backslash
        (r"ID matches `c.u\w+`", True),  # raw strings keep backslashes
        ('Priority matches "5"', False),  # only strings match
        ('Meta.nope matches ".*"', False),
        ('Meta.nope not matches ".*"', True),
    ],
)
def test_regex(expression: str, expected: bool) -> None:
    assert ok(expression) is expected


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        ('Meta.env == "prod"', True),
        ('Meta["env"] == "prod"', True),
        ('Meta["team.name"] == "sre"', True),
        ("TaskGroups.api.DesiredTotal == 1", True),
        ('TaskGroups["my-group"].DesiredTotal == 3', True),
        ('TaskGroups["my-group"]["DesiredTotal"] == 3', True),
        ('Datacenters.1 == "dc2"', True),  # a list takes an index
        ('Datacenters.7 == "dc2"', False),
        ('Meta.env.deeper == "x"', False),  # through a string: nothing
        # a missing field: positive operators false, negations true
        ('Nope == "x"', False),
        ('Nope != "x"', True),
        ('Nope contains "x"', False),
        ('Nope not contains "x"', True),
        ('"x" not in Nope', True),
        # selectors are case-sensitive
        ('status == "pending"', False),
    ],
)
def test_selectors(expression: str, expected: bool) -> None:
    assert ok(expression) is expected


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        ('Status == "pending" and Priority == 50', True),
        ('Status == "pending" and Priority == 51', False),
        ('Status == "x" or Priority == 50', True),
        ('Status == "x" or Priority == 51', False),
        ('not Status == "x"', True),
        ('not not Status == "x"', False),
        # and binds tighter than or; not tightest
        ('Status == "x" and Priority == 1 or Type == "service"', True),
        ('Status == "x" and (Priority == 1 or Type == "service")', False),
        ('Type == "service" or Status == "x" and Priority == 1', True),
        ('not Status == "pending" or Type == "service"', True),
        ('not (Status == "pending" or Type == "service")', False),
        ('((Status == "pending"))', True),
        ('Status=="pending"and(Priority==50)', True),  # whitespace is optional
    ],
)
def test_logic_and_precedence(expression: str, expected: bool) -> None:
    assert ok(expression) is expected


def test_string_escapes() -> None:
    obj = {"S": 'a"b\tc\u00e9\n'}
    assert ok(r'S == "a\"b\tc\u00e9\n"', obj)
    assert ok(r'S == "a\"b\x09c\303\251\n"', {"S": 'a"b\tc\u00e9\n'})  # bytes, as Go
    assert ok(r'S == "\U0001F600"', {"S": "\U0001f600"})
    assert not ok(r"S == `a\tb`", {"S": "a\tb"})
    assert ok(r"S == `a\tb`", {"S": "a\\tb"})


def test_apply_keeps_order_and_all_without_expression() -> None:
    items = [{"ID": str(i), "N": i} for i in range(6)]
    assert apply(None, items) == items
    assert apply("", items) == items
    assert [i["ID"] for i in apply("N != 3 and N != 0", items)] == ["1", "2", "4", "5"]


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        ("", "empty filter expression"),
        ("   ", "empty filter expression"),
        ('Status = "x"', "unexpected character '='"),
        ('Status == "x', "unterminated string starting at position 11"),
        ("Status == `x", "unterminated raw string"),
        ('Status "x"', "expected an operator"),
        ("Status ==", "unexpected the end of the expression at position 10: expected a value"),
        ('Status == "x" and', "expected a selector"),
        ('(Status == "x"', "expected ')'"),
        ('Status == "x")', "expected 'and', 'or' or the end of the expression"),
        ('"x" == Status', "expected 'in'"),
        ("Status is full", "expected 'empty'"),
        ('Meta[env] == "x"', "expected a quoted map key"),
        ('Meta["env" == "x"', "expected ']'"),
        ('Meta. == "x"', "expected a name after '.'"),
        ('ID matches "("', "bad regular expression"),
        (r'ID == "\q"', "unknown escape sequence \\q"),
        (r'ID == "\x4"', "bad escape sequence"),
        (r'ID == "\777"', "bad escape sequence"),
        (r'ID == "\UFFFFFFFF"', "bad escape sequence"),
        (r'ID == "\uD800"', "bad escape sequence"),
        ('Status == "x" Type == "y"', "expected 'and', 'or'"),
        ("and == 1", "expected a selector, a value, 'not' or '('"),
        ("ID == 1.2.3", "unexpected '.'"),
        ('ID == "x" # comment', "unexpected character '#'"),
    ],
)
def test_errors_name_the_problem(expression: str, message: str) -> None:
    with pytest.raises(FilterError) as raised:
        parse(expression)
    assert message in str(raised.value)
    assert "Traceback" not in str(raised.value)


def test_bounds() -> None:
    deep = "(" * (MAX_DEPTH + 1) + 'ID == "x"' + ")" * (MAX_DEPTH + 1)
    with pytest.raises(FilterError, match="nested deeper"):
        parse(deep)
    nots = "not " * (MAX_DEPTH + 1) + 'ID == "x"'
    with pytest.raises(FilterError, match="nested deeper"):
        parse(nots)
    assert parse("(" * MAX_DEPTH + 'ID == "countdash"' + ")" * MAX_DEPTH)(JOB)
    with pytest.raises(FilterError, match="longer than"):
        parse('ID == "' + "x" * MAX_LENGTH + '"')


def test_regex_is_linear_time() -> None:
    """RE2: a pattern that backtracks exponentially in `re` is instant."""
    assert not ok('ID matches "(a+)+$"', {"ID": "a" * 5000 + "!"})


def test_the_list_hook_filters_and_answers_400() -> None:
    """http.apply_filter, the one call the list endpoints make before paging."""
    from services.gateway.http import NomadError, apply_filter

    items = [{"ID": "a", "Status": "running"}, {"ID": "b", "Status": "dead"}]
    assert apply_filter('Status == "dead"', items) == [items[1]]
    with pytest.raises(NomadError) as bad:
        apply_filter("Status ===", items)
    assert bad.value.status == 400
    assert bad.value.message.startswith("failed to read filter expression: ")


_PIECES = st.sampled_from(
    [
        "ID", "Meta", ".", "env", "[", "]", '"x"', "`y`", "50", "-1.5e3", "==", "!=",
        "is", "not", "empty", "in", "contains", "matches", "and", "or", "(", ")",
        '"(a"', '"\\u00e9"', '"\\q"', "Datacenters", "0", "TaskGroups", '"api"', " ",
    ]
)  # fmt: skip


@settings(max_examples=400, derandomize=True, deadline=None)
@given(st.one_of(st.text(max_size=60), st.lists(_PIECES, max_size=12).map(" ".join)))
def test_any_input_parses_or_is_named(expression: str) -> None:
    """Whatever a caller sends: a filter that evaluates without raising,
    or a FilterError (a 400), never another exception (a 500)."""
    try:
        keep = parse(expression)
    except FilterError as exc:
        assert str(exc)
        return
    assert keep(JOB) in (True, False)
    assert keep({}) in (True, False)
