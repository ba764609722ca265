# ruff: noqa: E501 - one template case per line reads better than wrapped strings
"""The Nomad data functions over a provider: values shaped as
consul-template's, dependencies recorded for the runner."""

from __future__ import annotations

import pytest

from corral.domain.template.errors import TemplateError
from corral.domain.template.nomad import (
    UNKNOWN,
    MemoryData,
    NomadService,
    ServiceQuery,
    ServicesQuery,
    VarGet,
    VarList,
)
from corral.domain.template.render import NomadTemplate, render


@pytest.fixture
def data() -> MemoryData:
    d = MemoryData()
    d.put_variable("nomad/jobs/web", {"password": "s3cr3t", "user": "app"}, index=7)
    d.put_variable("nomad/jobs/db", {"root": "r"})
    d.put_variable("other/x", {"k": "v"}, namespace="prod")
    d.put_service(
        NomadService("db-1", "db", "10.0.0.5", 5432, tags=["primary", "pg"], alloc_id="a1")
    )
    d.put_service(NomadService("db-2", "db", "10.0.0.6", 5433, tags=["pg"]))
    d.put_service(NomadService("api-1", "api", "10.0.0.7", 80, tags=["http"]))
    return d


def test_nomad_var_items_behave_as_consul_templates(data: MemoryData) -> None:
    text = (
        '{{ with nomadVar "nomad/jobs/web" }}{{ .password }}|{{ .user }}|[{{ .nope }}]|'
        "{{ .Keys }}|{{ .Values }}|{{ range .Tuples }}{{ .K }}={{ .V }},{{ end }}|"
        "{{ .Metadata.Path }}|{{ .Metadata.ModifyIndex }}|{{ .Parent.Namespace }}|{{ .password.Key }}{{ end }}"
    )
    r = render(text, data=data)
    assert r.output == (
        "s3cr3t|app|[]|[password user]|[s3cr3t app]|password=s3cr3t,user=app,|"
        "nomad/jobs/web|7|default|password"
    )
    assert r.complete
    assert r.used == {VarGet("nomad/jobs/web", block=True)}


def test_ranging_a_variable_and_printing_it(data: MemoryData) -> None:
    out = render(
        '{{ range $k, $v := nomadVar "nomad/jobs/web" }}{{ $k }}={{ $v }};{{ end }}'
        '{{ nomadVar "nomad/jobs/web" }} {{ nomadVar "nomad/jobs/web" | toJSON }}',
        data=data,
    ).output
    assert out == (
        'password=s3cr3t;user=app;map[password:s3cr3t user:app] {"password":"s3cr3t","user":"app"}'
    )


def test_a_variable_that_does_not_exist_yet_blocks_the_render(data: MemoryData) -> None:
    r = render('[{{ with nomadVar "nomad/jobs/new" }}{{ .x }}{{ end }}]', data=data)
    assert r.output == "[]"
    assert r.missing == {VarGet("nomad/jobs/new", block=True)}
    data.put_variable("nomad/jobs/new", {"x": "1"})
    r = render('[{{ with nomadVar "nomad/jobs/new" }}{{ .x }}{{ end }}]', data=data)
    assert (r.output, r.complete) == ("[1]", True)


def test_var_exists_does_not_block(data: MemoryData) -> None:
    r = render('{{ nomadVarExists "nomad/jobs/web" }} {{ nomadVarExists "nope" }}', data=data)
    assert r.output == "true false"
    assert r.complete
    assert VarGet("nope") in r.used


def test_namespace_and_region_in_the_path(data: MemoryData) -> None:
    r = render('{{ with nomadVar "other/x@prod.eu" }}{{ .k }}{{ end }}', data=data)
    assert r.used == {VarGet("other/x", namespace="prod", region="eu", block=True)}
    assert str(next(iter(r.used))) == "nomad.var.block(other/x@prod.eu)"
    r = render('{{ with nomadVar "other/x" }}{{ .k }}{{ end }}', data=data, namespace="prod")
    assert r.output == "v"


def test_var_list(data: MemoryData) -> None:
    r = render('{{ range nomadVarList "nomad/jobs" }}{{ . }} {{ .Path }} {{ end }}', data=data)
    assert r.output == "nomad/jobs/db nomad/jobs/db nomad/jobs/web nomad/jobs/web "
    assert r.used == {VarList("nomad/jobs")}
    assert render("{{ len nomadVarList }}", data=data).output == "2"
    assert not render('{{ nomadVarListSafe "empty/" }}', data=data).complete
    assert render('{{ nomadVarList "empty/" }}', data=data).complete
    with pytest.raises(TemplateError, match="nomadVarList takes either"):
        render('{{ nomadVarList "a" "b" }}', data=data)


def test_services(data: MemoryData) -> None:
    r = render(
        '{{ range nomadService "db" }}{{ .Address }}:{{ .Port }} {{ .Tags }} {{ .ID }} {{ .Name }} {{ .AllocID }}\n{{ end }}'
        "{{ range nomadServices }}{{ .Name }}={{ .Tags }};{{ end }}",
        data=data,
    )
    assert r.output == (
        "10.0.0.5:5432 [pg primary] db-1 db a1\n10.0.0.6:5433 [pg] db-2 db \n"
        "api=[http];db=[pg primary];"
    )
    assert r.used == {ServiceQuery("db"), ServicesQuery()}


def test_service_tag_filter_and_by_tag(data: MemoryData) -> None:
    assert (
        render('{{ range nomadService "primary.db" }}{{ .ID }}{{ end }}', data=data).output
        == "db-1"
    )
    out = render(
        '{{ range $tag, $s := nomadService "db" | byTag }}{{ $tag }}:{{ range $s }}{{ .ID }},{{ end }} {{ end }}',
        data=data,
    ).output
    assert out == "pg:db-1,db-2, primary:db-1, "


def test_service_choose_is_a_stable_subset(data: MemoryData) -> None:
    text = '{{ range nomadService 1 "alloc-a" "db" }}{{ .ID }}{{ end }}'
    first = render(text, data=data)
    assert first.output in ("db-1", "db-2")
    assert render(text, data=data).output == first.output
    assert first.used == {ServiceQuery("db", choose="1|alloc-a")}
    assert str(next(iter(first.used))) == "nomad.service(db:1|alloc-a)"
    with pytest.raises(TemplateError, match="expected integer for <count> argument"):
        render('{{ nomadService "1" "k" "db" }}', data=data)
    with pytest.raises(
        TemplateError, match="expected arguments <service> or <count> <key> <service>"
    ):
        render('{{ nomadService "a" "b" }}', data=data)
    with pytest.raises(TemplateError, match='nomad.service: invalid format: "bad name!"'):
        render('{{ nomadService "bad name!" }}', data=data)


def test_unknown_answers_make_the_render_incomplete(data: MemoryData) -> None:
    data.unknown.add(ServiceQuery("db"))
    r = render('[{{ range nomadService "db" }}{{ .ID }}{{ end }}]', data=data)
    assert r.output == "[]"
    assert r.missing == {ServiceQuery("db")}
    r = render('{{ nomadVar "nomad/jobs/web" }}')  # no provider at all
    assert r.missing == {VarGet("nomad/jobs/web", block=True)}
    assert UNKNOWN is not None


def test_provider_errors_fail_the_render(data: MemoryData) -> None:
    data.denied[VarGet("nomad/jobs/db")] = "Permission denied"
    with pytest.raises(TemplateError, match="error calling nomadVar: Permission denied"):
        render('{{ nomadVar "nomad/jobs/db" }}', data=data)


def test_a_parsed_template_renders_again_with_new_data(data: MemoryData) -> None:
    tmpl = NomadTemplate('DB={{ range nomadService "db" }}{{ .Address }} {{ end }}')
    assert tmpl.render(data=data).output == "DB=10.0.0.5 10.0.0.6 "
    data.remove_service("db-1")
    assert tmpl.render(data=data).output == "DB=10.0.0.6 "


def test_missing_key_in_a_variable_under_error_on_missing_key(data: MemoryData) -> None:
    tmpl = NomadTemplate(
        '{{ with nomadVar "nomad/jobs/web" }}{{ .nope }}{{ end }}', error_on_missing_key=True
    )
    with pytest.raises(TemplateError, match='map has no entry for key "nope"'):
        tmpl.render(data=data)


def test_custom_delimiters_in_a_nomad_template(data: MemoryData) -> None:
    tmpl = NomadTemplate(
        '[[ with nomadVar "nomad/jobs/web" ]][[ .user ]][[ end ]] {{ not a template }}',
        left_delimiter="[[",
        right_delimiter="]]",
    )
    assert tmpl.render(data=data).output == "app {{ not a template }}"
