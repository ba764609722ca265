# ruff: noqa: E501 - one template case per line reads better than wrapped strings
"""A hostile template ends in a TemplateError, never a hang or an
exhausted agent; and rendering never raises anything else."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from corral.domain.template.errors import LimitExceeded, TemplateError
from corral.domain.template.exec import Limits
from corral.domain.template.nomad import MemoryData, NomadService
from corral.domain.template.render import NomadTemplate

SMALL = Limits(
    max_output=10_000,
    max_steps=50_000,
    max_template_depth=20,
    max_nesting=20,
    max_value_len=10_000,
    max_items=1_000,
)


def render(text: str, limits: Limits = SMALL) -> str:
    return NomadTemplate(text, limits=limits).render().output


@pytest.mark.parametrize(
    ("text", "want"),
    [
        (
            '{{ define "a" }}{{ template "a" }}{{ end }}{{ template "a" }}',
            "exceeded maximum template depth (20)",
        ),
        (
            '{{ define "a" }}{{ executeTemplate "a" }}{{ end }}{{ template "a" }}',
            "exceeded maximum template depth (20)",
        ),
        ("{{ range loop 100000000 }}x{{ end }}", "exceeds the limit"),
        ("{{ range loop 100000 }}{{ end }}", "limit of 50000 steps"),
        ("{{ range 100000000 }}{{ end }}", "limit of 50000 steps"),
        (
            "{{ range loop 5000 }}xxxxxxxxxx{{ end }}",
            "output exceeds the limit of 10000 characters",
        ),
        (
            '{{ $x := "ab" }}{{ range loop 40 }}{{ $x = printf "%s%s" $x $x }}{{ end }}',
            "exceeds the limit of 10000",
        ),
        ('{{ "x" | sprig_repeat 100000000 }}', "exceeds the limit of 10000"),
        ('{{ printf "%1000000d" 1 }}', "exceeds the limit of 10000"),
        ("{{ sprig_until 100000000 }}", "exceeds the limit of 1000 items"),
        (
            '{{ $s := printf "%9000d" 1 }}{{ html (sprig_list $s $s $s $s) }}',
            "exceeds the limit of 10000",
        ),
        (
            '{{ $s := printf "%900d" 1 }}{{ $l := sprig_list $s $s $s $s $s $s $s $s $s $s $s $s }}{{ toYAML (sprig_list $l $l $l) }}',
            "yaml: result exceeds the limit",
        ),
        ("{{ $l := sprig_until 900 }}{{ sprig_concat $l $l }}", "exceeds the limit of 1000 items"),
        ('{{ split "," (printf "%5000s" "" | replaceAll " " ",") }}', "more than 1000 parts"),
        ('{{ split "" (printf "%9000d" 1) | len }}', ""),
        ("{{" + "(" * 30 + "1" + ")" * 30 + "}}", "max expression depth exceeded"),
        ("{{ if 1 }}" * 30 + "{{ end }}" * 30, "max expression depth exceeded"),
    ],
)
def test_limits(text: str, want: str) -> None:
    if want == "":  # split trims the padding first, as consul-template's does
        assert render(text) == "1"
        return
    with pytest.raises(TemplateError) as info:
        render(text)
    assert want in str(info.value)


def test_limit_errors_are_limit_exceeded() -> None:
    with pytest.raises(LimitExceeded):
        render("{{ range loop 100000000 }}{{ end }}")


def test_defaults_render_a_large_real_template_quickly() -> None:
    data = MemoryData()
    for i in range(200):
        data.put_service(
            NomadService(f"web-{i}", "web", f"10.0.{i // 256}.{i % 256}", 8000 + i, tags=["http"])
        )
    text = 'upstream web {\n{{ range nomadService "web" }}  server {{ .Address }}:{{ .Port }};\n{{ end }}}\n'
    out = NomadTemplate(text).render(data=data).output
    assert out.count("server ") == 200


def test_the_template_text_itself_is_bounded() -> None:
    with pytest.raises(TemplateError, match="more than the limit"):
        NomadTemplate("x" * 20_000, limits=SMALL)


_PIECES = st.sampled_from(
    [
        "{{",
        "}}",
        "{{-",
        "-}}",
        " ",
        "\n",
        "x",
        ".",
        ".A",
        "$",
        "$x",
        ":=",
        "=",
        "|",
        "(",
        ")",
        "if",
        "else",
        "end",
        "range",
        "with",
        "define",
        "template",
        "block",
        "break",
        "continue",
        '"s"',
        "`r`",
        "'c'",
        "1",
        "-1",
        "1.5",
        "0x1f",
        "nil",
        "true",
        "printf",
        "len",
        "index",
        "eq",
        "lt",
        "and",
        "or",
        "not",
        "toJSON",
        "split",
        "join",
        "add",
        "divide",
        "loop",
        "parseJSON",
        "sprig_repeat",
        "env",
        "nomadVar",
        "/*",
        "*/",
        ",",
        "@",
        "\\",
    ]
)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_PIECES, max_size=40).map("".join))
def test_rendering_raises_only_template_errors(text: str) -> None:
    try:
        render(text)
    except TemplateError:
        pass


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=60))
def test_arbitrary_text_raises_only_template_errors(text: str) -> None:
    try:
        render(text)
    except TemplateError:
        pass


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet=st.characters(blacklist_characters="{}"), max_size=80))
def test_text_without_delimiters_renders_unchanged(text: str) -> None:
    assert render(text) == text
