"""HCL2 expressions, templates and functions as Nomad's jobspec2 evaluates
them (cases after HCL's spec and the jobspec documentation's examples)."""

import pytest

from corral.domain.jobspec.language import functions
from corral.domain.jobspec.language.errors import HclError, Source
from corral.domain.jobspec.language.evaluate import Evaluator, Scope
from corral.domain.jobspec.language.parser import parse_config, parse_expression


def ev(text, variables=None, *, passthrough=True):
    expr = parse_expression(text, "t.hcl")
    scope = Scope(
        dict(variables or {}),
        functions.library(".", False),
        passthrough=passthrough,
        lazy=functions.LAZY,
    )
    return Evaluator(Source(text, "t.hcl")).eval(expr, scope)


def attr(text, **variables):
    """The value of `x` in a one-argument body (heredocs need a body)."""
    body = parse_config(text, "t.hcl")
    scope = Scope(dict(variables), functions.library(".", False), passthrough=True)
    return Evaluator(Source(text, "t.hcl")).eval(body.attributes[0].expr, scope)


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("1 + 2 * 3", 7),
        ("(1 + 2) * 3", 9),
        ("10 / 4", 2.5),
        ("10 / 5", 2),
        ("-7 % 3", -1),
        ("2 - -1", 3),
        ('"1" + 2', 3),
        ("1 < 2 && 2 <= 2", True),
        ("!(1 == 1) || 3 >= 4", False),
        ('1 == "1"', False),
        ("[1, 2] == [1, 2]", True),
        ('{a = 1} != {a = "1"}', True),
        ('true ? "yes" : "no"', "yes"),
        ("null", None),
        ("1.5e3", 1500),
        ('"a\\tb\\n\\"c\\" \\u00e9"', 'a\tb\n"c" é'),
        ('"$${x} %%{y}"', "${x} %{y}"),
        ('[for s in ["a", "b"] : upper(s)]', ["A", "B"]),
        ("{for k, v in {a = 1, b = 2} : v => k}", {"1": "a", "2": "b"}),
        ("[for i, v in [5, 6, 7] : i + v if v != 6]", [5, 9]),
        ('{for s in ["a", "b", "a"] : s => 1...}', {"a": [1, 1], "b": [1]}),
        ("[{n = 1}, {n = 2}][*].n", [1, 2]),
        ("[{n = [1]}, {n = [2]}].*.n[0]", [1]),
        ("[[1, 2], [3]][*][0]", [1, 3]),
        ("null[*]", []),
        ('{a = {b = ["x", "y"]}}.a.b[1]', "y"),
        ('{"k.x" = 1}["k.x"]', 1),
        ("[1, 2, 3].1", 2),
        ('"%{ if true }yes%{ else }no%{ endif }"', "yes"),
        ('"%{ for i, v in ["a", "b"] }${i}=${v};%{ endfor }"', "0=a;1=b;"),
        ('"a ${~ " b " ~} c"', "a b c"),
        ('"${1 + 1}"', 2),
        ('"n=${1 + 1}"', "n=2"),
        ('"${true}!"', "true!"),
    ],
)
def test_expressions(text, value):
    assert ev(text) == value


def test_runtime_variables_pass_through_as_written():
    assert ev('"${NOMAD_ALLOC_ID}"') == "${NOMAD_ALLOC_ID}"
    assert ev('"${attr.kernel.name}"') == "${attr.kernel.name}"
    assert ev('"${meta.rack}-${node.unique.name}"') == "${meta.rack}-${node.unique.name}"
    assert ev('"${NOMAD_ALLOC_DIR}/data"') == "${NOMAD_ALLOC_DIR}/data"
    assert ev('"${attr.unique.network.ip-address}"') == "${attr.unique.network.ip-address}"
    assert ev('"${env["HOME"]}"') == '${env["HOME"]}'
    assert ev("NOMAD_TASK_NAME") == "${NOMAD_TASK_NAME}"


def test_var_and_local_errors_name_the_variable():
    with pytest.raises(HclError, match=r'unknown variable var.image: no `variable "image"`'):
        ev("var.image", {"var": {}})
    with pytest.raises(HclError, match="unknown local value local.x"):
        ev("local.x", {"local": {"y": 1}})
    with pytest.raises(HclError, match=r"unknown function upperr\(\)"):
        ev('upperr("x")')
    with pytest.raises(HclError, match="variables are not allowed here"):
        ev("NOMAD_ALLOC_ID", passthrough=False)


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ('"unterminated', "unterminated string"),
        ("1 +", "expected an expression"),
        ('"${"', "syntax error"),
        ('"%{ if true }x"', "without a matching %{ endif }"),
        ('"%{ endfor }"', "without its opening directive"),
        ('"\\q"', "invalid escape"),
        ("{a = 1 b = 2}", "after the object item"),
        ("foo::bar::baz()", "provider functions"),
    ],
)
def test_syntax_errors(text, problem):
    with pytest.raises(HclError, match="syntax error") as info:
        ev(text)
    assert problem in info.value.message


def test_heredocs():
    assert attr("x = <<EOT\nhello\n  ${name}\nEOT\n", name="w") == "hello\n  w\n"
    # <<- removes the common indentation; blank lines do not count
    assert attr("x = <<-EOT\n    a\n\n      b\n    EOT\n") == "a\n\n  b\n"
    # the closing marker may be indented and followed by spaces (Go's HCL trims them)
    assert attr("x = <<EOT\nbody\n  EOT   \n") == "body\n"
    # ...and may end the file without a newline
    assert attr("x = <<EOT\nbody\nEOT") == "body\n"
    assert attr('x = <<EOT\n%{ for v in ["a", "b"] ~}\n${v}\n%{ endfor ~}\nEOT\n') == "a\nb\n"
    with pytest.raises(HclError, match="unterminated heredoc"):
        attr("x = <<EOT\nbody\n")


def test_newlines_end_arguments_except_inside_brackets():
    body = parse_config('a = [\n  1,\n  2,\n]\nb = f(\n  "x"\n)\nc = {\n  k = 1\n  j = 2\n}\n', "t")
    assert [a.name for a in body.attributes] == ["a", "b", "c"]
    with pytest.raises(HclError, match="expected an expression"):
        parse_config("a = 1 +\n  2\n", "t")
    with pytest.raises(HclError, match="set twice"):
        parse_config("a = 1\na = 2\n", "t")


def test_nesting_is_bounded():
    with pytest.raises(HclError, match="levels deep"):
        ev("[" * 500 + "]" * 500)


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ('upper("abc")', "ABC"),
        ('lower("ABC")', "abc"),
        ('title("hello world-wide")', "Hello World-Wide"),
        (
            'format("%s-%03d-%.2f-%t-%q-%x-%5s|%-4d|", "a", 7, 3.14159, true, "q", 255, "r", 1)',
            'a-007-3.14-true-"q"-ff-    r|1   |',
        ),
        ('format("%v %v", [1], "s")', "[1] s"),
        ('formatlist("%s=%s", ["a", "b"], "x")', ["a=x", "b=x"]),
        ('join(",", ["a", "b"], ["c"])', "a,b,c"),
        ('split(",", "a,b,,c")', ["a", "b", "", "c"]),
        ('chomp("x\\n\\n")', "x"),
        ('indent(2, "a\\nb")', "a\n  b"),
        ('trim("?!hello?!", "!?")', "hello"),
        ('trimprefix("helloworld", "hello")', "world"),
        ('trimsuffix("helloworld", "world")', "hello"),
        ('trimspace("  x \\n")', "x"),
        ('replace("a-b-c", "-", "+")', "a+b+c"),
        ('regex_replace("hello world", "o(\\\\w)?", "0$1")', "hell0 w0rld"),
        ('strlen("héllo")', 5),
        ('strrev("abc")', "cba"),
        ('substr("hello world", 1, 4)', "ello"),
        ('substr("hello", -3, -1)', "llo"),
        ("chunklist([1, 2, 3], 2)", [[1, 2], [3]]),
        ('coalesce("", null, "b")', "b"),
        ("coalescelist([], [1])", [1]),
        ('compact(["a", "", null, "b"])', ["a", "b"]),
        ("concat([1], [2, 3])", [1, 2, 3]),
        ('contains(["a"], "a")', True),
        ("distinct([1, 2, 1])", [1, 2]),
        ('element(["a", "b"], 3)', "b"),
        ("flatten([[1, [2]], 3])", [1, 2, 3]),
        ('index(["a", "b"], "b")', 1),
        ("keys({b = 1, a = 2})", ["a", "b"]),
        ("values({b = 1, a = 2})", [2, 1]),
        ('length("abc") + length([1]) + length({a = 1})', 5),
        ('lookup({a = 1}, "b", "d")', "d"),
        ("merge({a = 1, b = 1}, {b = 2})", {"a": 1, "b": 2}),
        ("range(3)", [0, 1, 2]),
        ("range(1, 10, 4)", [1, 5, 9]),
        ("reverse([1, 2])", [2, 1]),
        ("setunion([2, 1], [3, 1])", [1, 2, 3]),
        ("setintersection([1, 2, 3], [2, 3, 4])", [2, 3]),
        ('setproduct(["a"], [1, 2])', [["a", 1], ["a", 2]]),
        ("slice([1, 2, 3, 4], 1, 3)", [2, 3]),
        ('sort(["b", "a", "10"])', ["10", "a", "b"]),
        ('zipmap(["a", "b"], [1, 2])', {"a": 1, "b": 2}),
        ("abs(-3) + ceil(1.2) + floor(1.8) + signum(-5)", 5),
        ("log(8, 2)", 3),
        ("max(1, 5, 3) - min(4, 2)", 3),
        ('parseint("ff", 16) + parseint("-10", 2)', 253),
        ("pow(2, 10)", 1024),
        ('base64encode("hello")', "aGVsbG8="),
        ('base64decode("aGVsbG8=")', "hello"),
        ('urlencode("a b&c/d")', "a+b%26c%2Fd"),
        (
            'jsonencode({b = [1, true, null], a = "<x>"})',
            '{"a":"\\u003cx\\u003e","b":[1,true,null]}',
        ),
        ('jsondecode("{\\"a\\": [1, 2.5]}")', {"a": [1, 2.5]}),
        ('yamlencode({a = "b", c = [1, {d = true}]})', '"a": "b"\n"c":\n- 1\n- "d": true\n'),
        ('yamldecode("a: [1, x]")', {"a": [1, "x"]}),
        ('csvdecode("a,b\\n1,2\\n")', [{"a": "1", "b": "2"}]),
        ('md5("x")', "9dd4e461268c8034f5c8564e155c67a6"),
        ('sha1("x")', "11f6ad8ec52a2984abaafd7c3b516503785c2072"),
        ('sha256("x")', "2d711642b726b04401627ca9fbac32f5c8530fb1903cc4db02258717921a4881"),
        ('length(sha512("x"))', 128),
        ('uuidv5("dns", "example.com")', "cfbff0d1-9375-5685-968c-48ce8b15ae17"),
        ("length(uuidv4())", 36),
        ('cidrhost("10.12.112.0/20", 16)', "10.12.112.16"),
        ('cidrhost("10.12.112.0/20", -2)', "10.12.127.254"),
        ('cidrnetmask("172.16.0.0/12")', "255.240.0.0"),
        ('cidrsubnet("10.1.2.0/24", 4, 15)', "10.1.2.240/28"),
        (
            'cidrsubnets("10.1.0.0/16", 4, 4, 8, 4)',
            ["10.1.0.0/20", "10.1.16.0/20", "10.1.32.0/24", "10.1.48.0/20"],
        ),
        ('formatdate("DD MMM YYYY hh:mm ZZZ", "2018-01-02T23:12:01Z")', "02 Jan 2018 23:12 UTC"),
        (
            "formatdate(\"EEEE, H:mm aa 'o''clock'\", \"2018-01-02T23:12:01-08:00\")",
            "Tuesday, 11:12 pm o'clock",
        ),
        ('timeadd("2017-11-22T00:00:00Z", "10m")', "2017-11-22T00:10:00Z"),
        ('timeadd("2017-11-22T00:00:00Z", "-1h30m")', "2017-11-21T22:30:00Z"),
        ('try(var.missing, "fallback")', "fallback"),
        ("can(var.missing)", False),
        ('can(upper("x"))', True),
        ('convert(["a", "a"], set(string))', ["a"]),
        ('convert({a = "1"}, object({a = number, b = optional(string, "d")}))', {"a": 1, "b": "d"}),
    ],
)
def test_functions(text, value):
    assert ev(text, {"var": {}}) == value


def test_bcrypt_hashes_verifiably():
    import bcrypt

    hashed = ev('bcrypt("secret", 4)')
    assert hashed.startswith("$2a$04$")
    assert bcrypt.checkpw(b"secret", hashed.encode())


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("upper([1])", "upper(): the argument must be a string"),
        ("element([], 0)", "empty list"),
        ("range(1e9)", "more than"),
        ('format("%d", "x")', "must be a number"),
        ('format("%999999s", "x")', "above 10000"),
        ('base64decode("%%%")', "not valid base64"),
        ('jsondecode("{")', "invalid JSON"),
        ('cidrsubnet("10.0.0.0/30", 4, 0)', "cannot extend"),
        ('timeadd("yesterday", "1h")', "RFC 3339"),
        ('file("x")', "filesystem functions are disabled"),
        ("try(var.a, var.b)", "no expression succeeded"),
        ('lookup({}, "k")', "has no key"),
    ],
)
def test_function_errors(text, problem):
    with pytest.raises(HclError) as info:
        ev(text, {"var": {}})
    assert problem in info.value.message


def test_function_names_are_nomads():
    # jobspec2/functions.go, md5 and sha1 included (not a FIPS build)
    assert "regex" not in functions.NAMES and "timestamp" not in functions.NAMES
    for name in (
        "uuidv4",
        "cidrsubnets",
        "yamldecode",
        "file",
        "abspath",
        "rsadecrypt",
        "try",
        "can",
        "convert",
        "regex_replace",
        "strlen",
        "bcrypt",
    ):
        assert name in functions.NAMES
    assert len(functions.NAMES) == 83
