"""Issue 26: the HTTP gateway fuzzed, as tests/fuzz fuzzes the gRPC API.

Every route and method of the gateway's route table gets hypothesis-made
requests on the real `corral dev -acl` of this package: its valid sample
request (samples.py) with the path's ids swapped for other objects' ids,
prefixes and hostile strings; Nomad's query parameters with good and bad
values; the token in each of its places, valid (management, a reader of
one namespace, one of no use), unknown or garbage; and a body that is the
sample's Nomad JSON with one to three values mutated, random JSON nested up
to and past the limits, an HCL job nested or sized past the parser's
limits, or bytes that are not JSON at all. Every answer must

* not be a 5xx (501 for a Nomad endpoint Corral does not serve excepted);
* hold no traceback, and, when it is an error, no exception's name the
  request did not contain;
* arrive within a generous timeout (REQUEST_TIMEOUT: bounded, not fast);
* leave the state alone when it is a 4xx: the state's index and the row
  count of every table are the same around it (the cluster keeps working
  meanwhile, so a change seen around one refusal sends the same request
  again until one try shows the state still, as tests/fuzz/checks.py).

`make test` runs the bounded profile: `BOUNDED` examples per route and
method, derandomized (the same requests every run). `make fuzz` runs the
long one (`CORRAL_FUZZ_PROFILE=long`, `LONG` examples each, fresh
randomness; `CORRAL_FUZZ_EXAMPLES` overrides either); docs/contributing.md.
"""

from __future__ import annotations

import json
import os
import re
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import psycopg
import pytest
import requests
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from corral.domain.jobspec import limits
from services.gateway import authz
from tests.e2e.gateway_security.conftest import READER_POLICY, REQUEST_TIMEOUT, Cluster
from tests.e2e.gateway_security.samples import Sample, routes
from tests.e2e.gateway_security.samples import samples as make_samples

pytestmark = [pytest.mark.slow]

#: examples per route and method: (writes, reads); writes take bodies
BOUNDED = (24, 8)
LONG = (400, 150)
#: how long a refused request may keep moving the state before it fails
REPLAY_BUDGET_S = 20.0
#: streams (the event stream, followed logs) are read this long, then left
STREAM_READ_S = 1.0

TRACEBACK = re.compile(r"Traceback|File \"[^\"]*\", line|\.py\", line")
EXCEPTION_NAME = re.compile(r"\b[A-Z]\w*(?:Error|Exception)\b")


def examples(method: str) -> tuple[int, bool]:
    """(examples for a route's method, derandomize)."""
    profile = os.environ.get("CORRAL_FUZZ_PROFILE", "bounded")
    if profile not in ("bounded", "long"):
        raise pytest.UsageError(f"CORRAL_FUZZ_PROFILE={profile!r}: expected bounded or long")
    writes, reads = BOUNDED if profile == "bounded" else LONG
    count = reads if method == "GET" else writes
    override = os.environ.get("CORRAL_FUZZ_EXAMPLES")
    return (int(override) if override else count), profile == "bounded"


# -- strategies ----------------------------------------------------------------

HOSTILE = [
    "",
    "*",
    "../x",
    "..%2F..%2Fetc%2Fpasswd",
    "x" * 5000,
    "é😀",
    "a\x00b",
    "default ",
    "dеfault",  # a Cyrillic е
    "-1",
    "18446744073709551616",
    "%",
    "null",
    "{}",
    "${NOMAD_ALLOC_ID}",
]
QUERY_VALUES = [
    "",
    "true",
    "false",
    "0",
    "1",
    "-1",
    "9223372036854775808",
    "1e3",
    "*",
    "default",
    "team-b",
    "abc",
    "x" * 3000,
    "é",
    '"',
]
QUERY_KEYS = {
    "namespace": ["default", "team-a", "team-b", "*", "", "nope"],
    "prefix": ["", "a", "gw", "*", "\x00"],
    "per_page": ["1", "2", "0", "-5", "10001", "x"],
    "next_token": ["", "gw-web", "zzz", "\x00"],
    "filter": [
        'Status == "running"',
        "ID matches `^(a+)+$`",
        "(((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((a)",
        'Meta.x contains "y"',
        "not",
        "ID ==",
        "x" * 5000,
    ],
    "stale": [],
    "reverse": [],
    "pretty": [],
    "all": [],
    "diffs": [],
    "purge": [],
    "related": [],
    "enable": [],
    "no_shutdown_delay": [],
    "task": ["main", "", "nope", "../../etc/passwd"],
    "type": ["stdout", "stderr", "x"],
    "origin": ["start", "end", "middle"],
    "offset": ["0", "5", "-1", "99999999999999999999"],
    "follow": ["false", "true"],
    "plain": ["true", "false"],
    "topic": ["Job", "Job:gw-web", "*", "Allocation:*", "Nope", "Job:", ":"],
    "cas": ["0", "1", "-1", "x"],
    "status": ["ready", "running", "x"],
    "job": ["gw-web", "x"],
    "node": ["", "x"],
    "client_status": ["running", "x"],
    "region": ["global", "eu"],
    "token": [],
    "meta": ["true"],
}


def query_values(key: str) -> st.SearchStrategy[str]:
    return st.one_of(st.sampled_from(QUERY_KEYS[key] or ["true"]), st.sampled_from(QUERY_VALUES))


@st.composite
def queries(draw: st.DrawFn) -> dict[str, str]:
    keys = draw(st.lists(st.sampled_from(sorted(QUERY_KEYS)), max_size=4, unique=True))
    params = {k: draw(query_values(k)) for k in keys}
    if draw(st.booleans()):
        # a blocking query: its wait kept short (a long one waits by design)
        params["index"] = draw(st.sampled_from(["1", "5", "999999999", "-1", "x"]))
        params["wait"] = draw(st.sampled_from(["100ms", "1s", "x", "-1s"]))
    return params


json_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=30),
    st.sampled_from(HOSTILE),
)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=12), inner, max_size=4)
    ),
    max_leaves=20,
)


def nested(depth: int, leaf: Any = "x") -> Any:
    value = leaf
    for i in range(depth):
        value = [value] if i % 2 else {"a": value}
    return value


def _paths(value: Any, at: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [at]
    if isinstance(value, dict):
        for k, v in value.items():
            out += _paths(v, (*at, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            out += _paths(v, (*at, i))
    return out


@st.composite
def mutated(draw: st.DrawFn, body: Any) -> Any:
    """`body` (a sample's valid JSON) with one to three values replaced,
    removed, or nested deeply, and sometimes an unknown field added."""
    body = json.loads(json.dumps(body))
    for _ in range(draw(st.integers(1, 3))):
        paths = _paths(body)
        path = draw(st.sampled_from(paths))
        replacement = draw(
            st.one_of(
                json_values,
                st.integers(min_value=limits.MAX_NESTING_DEPTH - 8, max_value=60).map(nested),
                st.just("__remove__"),
            )
        )
        if not path:
            body = replacement if replacement != "__remove__" else None
            continue
        parent = body
        for key in path[:-1]:
            parent = parent[key]
        if replacement == "__remove__":
            del parent[path[-1]]
        else:
            parent[path[-1]] = replacement
    if isinstance(body, dict) and draw(st.booleans()):
        body[draw(st.text(min_size=1, max_size=10))] = draw(json_values)
    return body


HCL_NESTERS: list[Callable[[int], str]] = [
    lambda n: "[" * n + '"x"' + "]" * n,
    lambda n: "{a = " * n + '"x"' + "}" * n,
    lambda n: "(" * n + "1" + ")" * n,
    lambda n: '"${' * n + "x" + '}"' * n,
    lambda n: "1" + " + 1" * n,
]


@st.composite
def hcl_bodies(draw: st.DrawFn) -> Any:
    """JobHCL near and past the parser's limits, or random text."""
    kind = draw(st.sampled_from(["nested", "random", "large", "broken"]))
    if kind == "nested":
        nester = draw(st.sampled_from(HCL_NESTERS))
        depth = draw(st.integers(limits.MAX_NESTING_DEPTH - 6, 20_000))
        meta = f"meta {{ a = {nester(depth)} }}"
        text = f'job "f" {{\n {meta}\n group "g" {{ task "t" {{ driver = "mock" }} }}\n}}\n'
    elif kind == "large":
        text = 'job "f" {\n' + "# " * draw(st.integers(400_000, 700_000)) + "\n}\n"
    elif kind == "broken":
        text = 'job "f" {\n group "g" {\n' + draw(st.text(max_size=200))
    else:
        text = draw(st.text(max_size=400))
    return {"JobHCL": text, "Canonicalize": draw(st.booleans())}


@dataclass
class Request:
    method: str
    path: str
    params: dict[str, str]
    headers: dict[str, str]
    data: bytes | None
    stream: bool

    def text(self) -> str:
        """What the request said, for telling echo from leak."""
        raw = (self.data or b"").decode(errors="replace")
        return f"{self.method} {self.path} {json.dumps(self.params)} {raw}"


def tokens(cluster: Cluster) -> list[str | None]:
    reader = cluster.token("team-a-reader", READER_POLICY)
    useless = cluster.token("of-no-use", 'namespace "zz-unused" { policy = "read" }')
    return [
        cluster.management,
        reader,
        useless,
        None,
        str(uuid.uuid4()),
        "not-a-token",
        "x" * 4000,
    ]


@st.composite
def requests_for(
    draw: st.DrawFn, cluster: Cluster, method: str, sample: Sample, ids: list[str]
) -> Request:
    path = sample.path
    if draw(st.booleans()):
        # swap one path segment for another object's id or a hostile string
        segments = path.split("/")
        i = draw(st.integers(2, len(segments) - 1)) if len(segments) > 2 else 1
        segments[i] = quote(draw(st.sampled_from(ids + HOSTILE)), safe="")
        path = "/".join(segments)
    params = dict(sample.params)
    if draw(st.booleans()):
        params.update(draw(queries()))
    headers: dict[str, str] = {}
    token = draw(st.sampled_from(tokens(cluster)))
    if token is not None:
        place = draw(st.sampled_from(["header", "bearer", "query"]))
        if place == "header":
            headers["X-Nomad-Token"] = token
        elif place == "bearer":
            headers["Authorization"] = f"Bearer {token}"
        else:
            params["token"] = token
    if draw(st.booleans()):
        headers["Content-Type"] = draw(
            st.sampled_from(["application/json", "text/plain", "multipart/form-data", "x"])
        )
    data: bytes | None = None
    if method in ("PUT", "POST", "DELETE", "PATCH"):
        kind = draw(
            st.sampled_from(["sample", "mutated", "mutated", "mutated", "json", "deep", "bytes"])
        )
        if sample.path == "/v1/jobs/parse" and draw(st.booleans()):
            data = json.dumps(draw(hcl_bodies())).encode()
        elif kind == "sample" and sample.body is not None:
            data = json.dumps(sample.body).encode()
        elif kind == "mutated" and sample.body is not None:
            data = json.dumps(draw(mutated(sample.body))).encode()
        elif kind == "json":
            data = json.dumps(draw(json_values)).encode()
        elif kind == "deep":
            depth = draw(st.sampled_from([limits.MAX_NESTING_DEPTH, 40, 2000, 50_000]))
            data = ("[" * depth + "]" * depth).encode()
        elif kind == "bytes":
            data = draw(st.binary(max_size=200))
    return Request(method, path, params, headers, data, sample.stream or "follow" in params)


# -- the checks ----------------------------------------------------------------


class Probe:
    """The state's index, straight from its PostgreSQL: every write moves
    it (docs/consistency.md), so an unchanged index is an unchanged state."""

    def __init__(self, dsn: str) -> None:
        self.conn = psycopg.connect(dsn, autocommit=True)

    def mark(self) -> int:
        row = self.conn.execute("SELECT value FROM index_counter WHERE id = 1").fetchone()
        return int(row[0]) if row else 0


@dataclass
class Reply:
    status: int
    text: str
    seconds: float


_SESSION = requests.Session()


def send(cluster: Cluster, req: Request) -> Reply:
    started = time.monotonic()
    with _SESSION.request(
        req.method,
        cluster.url + req.path,
        params=req.params,
        headers=req.headers,
        data=req.data,
        stream=True,
        timeout=REQUEST_TIMEOUT,
    ) as resp:
        chunks: list[bytes] = []
        size = 0
        stop = time.monotonic() + (STREAM_READ_S if req.stream else REQUEST_TIMEOUT)
        for chunk in resp.iter_content(chunk_size=65536):
            chunks.append(chunk)
            size += len(chunk)
            if size > 4 * 1024 * 1024 or time.monotonic() > stop:
                break  # a stream (or a big page): what arrived is enough
        text = b"".join(chunks).decode(errors="replace")
        return Reply(resp.status_code, text, time.monotonic() - started)


def check(req: Request, reply: Reply) -> None:
    what = f"{req.method} {req.path} params={req.params!r} body={(req.data or b'')[:300]!r}"
    assert reply.status < 500 or reply.status == 501, f"{reply.status} {reply.text[:500]} ({what})"
    assert not TRACEBACK.search(reply.text), f"a traceback: {reply.text[:500]} ({what})"
    if reply.status >= 400:
        sent = req.text()
        named = [n for n in EXCEPTION_NAME.findall(reply.text) if n not in sent]
        assert not named, f"an exception's name {named}: {reply.text[:300]} ({what})"


def refusal_writes_nothing(
    cluster: Cluster, probe: Probe, req: Request, before: int, reply: Reply, after: int
) -> None:
    deadline = time.monotonic() + REPLAY_BUDGET_S
    tries = 1
    while before != after:
        if not 400 <= reply.status < 500:
            return  # went through this time: no refusal to judge
        assert time.monotonic() < deadline, (
            f"a {reply.status} moved the state on each of {tries} tries: index "
            f"{before} -> {after} ({req.method} {req.path} {req.params!r})"
        )
        before = probe.mark()
        reply = send(cluster, req)
        after = probe.mark()
        tries += 1


# -- the test ------------------------------------------------------------------


@pytest.fixture(scope="module")
def fuzzing(cluster: Cluster) -> tuple[dict[str, Callable[[str], Sample]], list[str], Probe]:
    ids = [
        *cluster.default.ids(),
        *cluster.team_a.ids(),
        *cluster.team_b.ids(),
        cluster.node_id,
        cluster.dispatch_job,
        cluster.periodic_job,
        "team-a-reader",
    ]
    tokens(cluster)  # made before any request
    return make_samples(cluster), ids, Probe(cluster.dev.info["dsn"])


#: every route and method (HEAD is GET's), the fuzz's parameters
TARGETS = sorted((path, method) for method, path, _ in routes())


@pytest.mark.parametrize(("path", "method"), TARGETS, ids=[f"{m} {p}" for p, m in TARGETS])
def test_fuzz_route(
    cluster: Cluster,
    fuzzing: tuple[dict[str, Callable[[str], Sample]], list[str], Probe],
    path: str,
    method: str,
) -> None:
    samples, ids, probe = fuzzing
    sample = samples[path](method)
    count, derandomize = examples(method)

    @settings(
        max_examples=count,
        derandomize=derandomize,
        database=None,
        deadline=None,
        print_blob=not derandomize,
        suppress_health_check=list(HealthCheck),
    )
    @given(req=requests_for(cluster, method, sample, ids))
    def fuzz(req: Request) -> None:
        before = probe.mark()
        reply = send(cluster, req)
        after = probe.mark()
        check(req, reply)
        if 400 <= reply.status < 500:
            refusal_writes_nothing(cluster, probe, req, before, reply, after)

    fuzz()


def test_the_fuzz_covers_every_route() -> None:
    """Each declared route and method is a target (a route added later is
    fuzzed without a line here)."""
    declared = {(p, m) for m, p, _ in routes()}
    assert declared == set(TARGETS)
    assert any(need.gateway for _, _, need in routes()), "authz declarations not found"
    assert authz.OPEN.open
