# ruff: noqa: E501 - one template case per line reads better than wrapped strings
"""consul-template's helpers and the Sprig functions, as a Nomad template
sees them (dot is nil, missingkey=zero)."""

from __future__ import annotations

import datetime as dt

import pytest

from corral.domain.template.errors import TemplateError
from corral.domain.template.render import NomadTemplate, render


def out(text: str, **kwargs: object) -> str:
    return render(text, **kwargs).output


def fail(text: str, **kwargs: object) -> str:
    with pytest.raises(TemplateError) as info:
        render(text, **kwargs)
    return str(info.value)


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ('{{ env "APP" }}|{{ env "NOPE" }}|{{ or (env "NOPE") "dflt" }}', "web||dflt"),
        (
            '{{ envOrDefault "APP" "x" }} {{ envOrDefault "NOPE" "x" }} {{ envOrDefault "EMPTY" "x" }}',
            "web x ",
        ),
        ('{{ mustEnv "APP" }}', "web"),
        ('{{ base64Encode "hello" }} {{ base64Decode "aGVsbG8=" }}', "aGVsbG8= hello"),
        ('{{ base64URLEncode "??>" }} {{ base64URLDecode "Pz8-" }}', "Pz8- ??>"),
        (
            '{{ "a,b,c" | split "," }} {{ "a,b,c" | split "," | join "-" }} {{ "" | split "," | len }}',
            "[a b c] a-b-c 0",
        ),
        ('{{ "k1:v1\\nk2:v2" | splitToMap "\\n" ":" }}', "map[k1:v1 k2:v2]"),
        (
            '{{ "Hello" | toLower }} {{ "Hello" | toUpper }} {{ "hello wide world" | toTitle }}',
            "hello HELLO Hello Wide World",
        ),
        (
            '{{ "  x \\n" | trimSpace }}|{{ "!!x!!" | trim "!" }}|{{ "prefix-x" | trimPrefix "prefix-" }}|{{ "x.txt" | trimSuffix ".txt" }}',
            "x|x|x|x",
        ),
        (
            '{{ "foo.bar" | replaceAll "." "_" }} {{ "foo.bar" | regexReplaceAll "foo([.a-z]+)" "$1" }} {{ "ab" | regexReplaceAll "(?P<x>a)" "${x}${x}" }}',
            "foo_bar .bar aab",
        ),
        ('{{ "foo.bar" | regexMatch "foo([.a-z]+)" }} {{ "x" | regexMatch "^y" }}', "true false"),
        (
            '{{ "true" | parseBool }} {{ "1.5" | parseFloat }} {{ "-12" | parseInt }} {{ "12" | parseUint }} {{ "" | parseInt }}',
            "true 1.5 -12 12 0",
        ),
        (
            '{{ $d := parseJSON `{"a":{"b":[1,2.5,null]},"n":1000000}` }}{{ $d.a.b }} {{ $d.n }} {{ index $d.a.b 1 }}',
            "[1 2.5 <nil>] 1e+06 2.5",
        ),
        ('{{ (parseYAML "a: 1\\nb: [x, y]").b }}', "[x y]"),
        (
            '{{ toJSON (parseJSON `{"b":[1,2],"a":"<&>","c":1e21,"d":0.0000001}`) }}',
            '{"a":"\\u003c\\u0026\\u003e","b":[1,2],"c":1e+21,"d":1e-7}',
        ),
        ('{{ toUnescapedJSON (parseJSON `{"a":"<&>"}`) }}', '{"a":"<&>"}'),
        (
            '{{ toJSONPretty (parseJSON `{"a":{"b":1},"c":[]}`) }}',
            '{\n  "a": {\n    "b": 1\n  },\n  "c": []\n}',
        ),
        ('{{ toYAML (parseJSON `{"b":[1,2.5],"a":{"x":"y"}}`) }}', "a:\n  x: y\nb:\n- 1\n- 2.5"),
        (
            '{{ "x" | sha256Hex }}',
            "2d711642b726b04401627ca9fbac32f5c8530fb1903cc4db02258717921a4881",
        ),
        ('{{ "x" | md5sum }}', "9dd4e461268c8034f5c8564e155c67a6"),
        (
            '{{ hmacSHA256Hex "msg" "key" }}',
            "2d93cbc1be167bcb1637a4a23cbff01a7878f0c50ee833954ea5221bb1b8c628",
        ),
        (
            '{{ $l := "a,b" | split "," }}{{ $l | contains "b" }} {{ in $l "z" }} {{ "team" | contains "ea" }}',
            "true false true",
        ),
        (
            '{{ $t := split "," "a,b,c" }}{{ containsAll (split "," "a,b") $t }} {{ containsAny (split "," "z,c") $t }} {{ containsNone (split "," "z") $t }} {{ containsNotAll (split "," "a,z") $t }}',
            "true true true true",
        ),
        (
            "{{ add 1 2 }} {{ 5 | subtract 2 }} {{ multiply 3 4 }} {{ 10 | divide 4 }} {{ 10.0 | divide 4 }} {{ 7 | modulo 3 }} {{ minimum 2 5 }} {{ maximum 2 5.5 }}",
            "3 3 12 2 2.5 1 2 5.5",
        ),
        ('{{ printf "%T" (add 1 2) }} {{ printf "%T" (add 1 2.0) }}', "int64 float64"),
        (
            '{{ range loop 3 }}{{ . }}{{ end }} {{ range $i := loop 5 8 }}{{ $i }}{{ end }} {{ range loop "2" }}x{{ end }}',
            "012 567 xx",
        ),
        ('{{ "a\\nb" | indent 2 }}', "  a\n  b"),
        (
            '{{ define "t" }}<{{ . }}>{{ end }}{{ executeTemplate "t" }}{{ executeTemplate "t" 42 }}{{ $v := executeTemplate "t" "s" }}{{ $v }}',
            "<<no value>><42><s>",
        ),
        (
            '{{ timestamp }} {{ timestamp "2006-01-02 15:04:05.000 Jan Mon MST -0700" }} {{ timestamp "unix" }}',
            "2024-03-05T06:07:08Z 2024-03-05 06:07:08.009 Mar Tue UTC +0000 1709618828",
        ),
        (
            '{{ sprig_upper "x" }} {{ sprig_trim "  y " }} {{ "a" | sprig_repeat 3 }} {{ sprig_default "d" "" }} {{ sprig_default "d" "g" }}',
            "X y aaa d g",
        ),
        (
            '{{ sprig_list 1 2 | sprig_last }} {{ (sprig_dict "a" 1 "b" 2).b }} {{ sprig_keys (sprig_dict "a" 1) }} {{ sprig_hasKey (sprig_dict "a" 1) "a" }}',
            "2 2 [a] true",
        ),
        (
            '{{ sprig_until 3 }} {{ sprig_add 1 2 3 }} {{ sprig_max 1 5 3 }} {{ sprig_ternary "y" "n" true }} {{ sprig_b64enc "hi" }} {{ sprig_quote "a" 1 }}',
            '[0 1 2] 6 5 y aGk= "a" "1"',
        ),
        (
            '{{ sprig_regexReplaceAll "a(x*)b" "-ab-axxb-" "${1}W" }} {{ sprig_regexFindAll "a." "abacad" -1 }} {{ sprig_snakecase "FirstName" }} {{ sprig_base "/a/b.txt" }}',
            "-W-xxW- [ab ac ad] first_name b.txt",
        ),
        (
            '{{ sprig_toJson (sprig_dict "b" 1 "a" (sprig_list "x")) }} {{ sprig_fromJson `{"a":1}` }}',
            '{"a":["x"],"b":1} map[a:1]',
        ),
        (
            '{{ sprig_coalesce "" 0 "x" }} {{ sprig_empty "" }} {{ sprig_typeOf 1 }} {{ sprig_kindOf (sprig_list) }}',
            "x true int slice",
        ),
    ],
)
def test_helper(text: str, want: str) -> None:
    now = dt.datetime(2024, 3, 5, 6, 7, 8, 9000, tzinfo=dt.UTC)
    assert out(text, env={"APP": "web", "EMPTY": ""}, now=lambda: now) == want


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ('{{ mustEnv "NOPE" }}', "required environment variable NOPE is empty"),
        (
            '{{ base64Decode "!!" }}',
            "error calling base64Decode: base64Decode: illegal base64 data",
        ),
        (
            '{{ "x" | parseInt }}',
            'error calling parseInt: parseInt: strconv.ParseInt: parsing "x": invalid syntax',
        ),
        ('{{ "yes" | parseBool }}', 'parsing "yes": invalid syntax'),
        ("{{ parseJSON `{` }}", "error calling parseJSON: unexpected end of JSON input"),
        ('{{ "x" | regexMatch "(" }}', "error calling regexMatch: error parsing regexp"),
        ('{{ add "a" 1 }}', 'error calling add: add: unknown type for "a" (string)'),
        ("{{ 1 | divide 0 }}", "integer divide by zero"),
        ("{{ loop 1 2 3 }}", "loop: wrong number of arguments, expected 1 or 2, but got 3"),
        ('{{ executeTemplate "nope" }}', 'no template "nope"'),
        (
            '{{ timestamp "a" "b" }}',
            "timestamp: wrong number of arguments, expected 0 or 1, but got 2",
        ),
        ('{{ indent -1 "x" }}', "indent value must be a positive integer"),
        ('{{ sprig_fail "boom" }}', "error calling sprig_fail: boom"),
        ("{{ toJSON (sprig_list 1.0 (divide 0.0 0.0)) }}", "json: unsupported value: NaN"),
        ('{{ "x" | indent (parseInt "2") }}', "wrong type for value; expected int; got int64"),
        (
            '{{ parseJSON "[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[" }}',
            "nesting deeper than 100 levels",
        ),
        ('{{ plugin "x" }} ', "error calling plugin: function is disabled"),
        (
            '{{ writeToFile "/tmp/x" "" "" "0644" }}',
            "error calling writeToFile: function is disabled",
        ),
    ],
)
def test_helper_errors(text: str, want: str) -> None:
    assert want in fail(text)


@pytest.mark.parametrize(
    ("name", "reason"),
    [
        ("key", "it reads Consul"),
        ("service", "it reads Consul"),
        ("secret", "it reads Vault"),
        ("sprig_genCA", ""),
        ("sprig_bcrypt", ""),
        ("toTOML", ""),
    ],
)
def test_functions_corral_lacks_are_refused_by_name(name: str, reason: str) -> None:
    msg = fail("{{ " + name + ' "x" }}')
    assert msg.startswith(f'template: :1: function "{name}" is not supported by Corral')
    assert reason in msg


def test_denylist_globs_disable_functions() -> None:
    tmpl = NomadTemplate('{{ sprig_upper "x" }}', function_denylist=["sprig_*"])
    with pytest.raises(TemplateError, match="error calling sprig_upper: function is disabled"):
        tmpl.render()


def test_nomad_runs_templates_with_missingkey_zero_or_error() -> None:
    assert out("{{ $m := parseJSON `{}` }}[{{ $m.x }}]") == "[<no value>]"
    assert 'map has no entry for key "x"' in fail(
        "{{ $m := parseJSON `{}` }}{{ $m.x }}", error_on_missing_key=True
    )


def test_parse_error_of_a_nomad_template_has_empty_name() -> None:
    assert fail("{{ if }}") == "template: :1: missing value for if"


class TestFile:
    def test_reads_inside_the_sandbox(self, tmp_path) -> None:
        (tmp_path / "local").mkdir()
        (tmp_path / "local" / "conf").write_text("hello\n")
        r = render('{{ file "local/conf" | trimSpace }}', sandbox_dir=str(tmp_path))
        assert r.output == "hello"
        assert r.complete
        assert [str(d) for d in r.used] == [f"file({tmp_path}/local/conf)"]

    def test_refuses_paths_outside_the_sandbox(self, tmp_path) -> None:
        (tmp_path / "task").mkdir()
        (tmp_path / "secret").write_text("s")
        (tmp_path / "task" / "link").symlink_to(tmp_path / "secret")
        for path in ("../secret", "/etc/passwd", "link"):
            msg = fail('{{ file "' + path + '" }}', sandbox_dir=str(tmp_path / "task"))
            assert "is outside of sandbox" in msg

    def test_a_missing_file_is_a_missing_dependency(self, tmp_path) -> None:
        r = render('{{ file "nope" }}', sandbox_dir=str(tmp_path))
        assert r.output == ""
        assert not r.complete


def test_sockaddr_basics() -> None:
    assert out('{{ sockaddr "GetInterfaceIP \\"lo\\"" }}') == "127.0.0.1"
    assert "not supported by Corral" in fail(
        '{{ sockaddr "GetAllInterfaces | include \\"name\\" \\"lo\\"" }}'
    )
