"""Bad input, proven (issue 15): every RPC the cluster serves gets
generated and mutated requests from every kind of caller, and each answer
is a clean status with no internals in it, no process dies, and a refused
request writes nothing (state index and row counts unchanged).

* Internal RPCs (servers only) must refuse every caller that is not a
  server with PERMISSION_DENIED: anonymous, a stale or random ACL token, a
  forged server token.
* Public RPCs (users' and nodes') get the same callers, a user dialling
  with `security.dial` and a server (`security.dial` with the server
  token); their answers may be OK or any status in `checks.ALLOWED`.

The RPCs come from the running processes and `corral.security.access.RULES` (see
rpcs.py); the requests from the protobuf descriptors (messages.py) and
from valid requests with broken fields (mutate.py). Budgets and how to run
the long profile: conftest.py and docs/contributing.md.
"""

from __future__ import annotations

from collections import Counter, defaultdict

import grpc
import pytest
from google.protobuf import text_format
from google.protobuf.message import Message
from hypothesis import given
from hypothesis import strategies as st

from corral.security.access import ACL_SERVICE, MAX_PUBLIC_REQUEST_BYTES, RULES
from corral.v1 import query_pb2
from tests.fuzz import checks, messages, mutate
from tests.fuzz.conftest import Fuzz, budget, hypothesis_settings
from tests.fuzz.rpcs import Answer, As, Rpc

pytestmark = pytest.mark.slow

#: answers by RPC and status code, for the coverage check at the end
OUTCOMES: defaultdict[str, Counter[str]] = defaultdict(Counter)

#: the services of roles the fuzz cluster does not start (the client
#: agent serves ClientAlloc, ClientFS, ClientStats and ClientNode; their RPCs are
#: checked by the agent's own tests)
NOT_IN_CLUSTER = (
    "/corral.v1.ClientAlloc/",
    "/corral.v1.ClientStats/",
    "/corral.v1.ClientFS/",
    "/corral.v1.ClientNode/",
)

#: client deadlines: an answer that should come at once, and a blocking
#: query or stream that may wait (DEADLINE_EXCEEDED is then allowed)
PROMPT_S = 30.0
WAITING_S = 0.5


def _blocking(msg: Message) -> bool:
    """Whether the request asks to wait (a min_index, here or in its query)."""
    for fd, value in msg.ListFields():
        if fd.name == "min_index" and value:
            return True
        if fd.message_type is query_pb2.QueryOptions.DESCRIPTOR and value.min_index:
            return True
    return False


@st.composite
def _tame_waits(draw: st.DrawFn, msg: Message) -> Message:
    """Most blocking queries get a short wait_ms, so they answer by
    themselves; the rest wait for the client's deadline."""
    holders = [msg] + [
        v for fd, v in msg.ListFields() if fd.message_type is query_pb2.QueryOptions.DESCRIPTOR
    ]
    patience = draw(st.integers(0, 4))  # 0: wait for the client's deadline
    for h in holders:
        fields = h.DESCRIPTOR.fields_by_name
        blocking = "min_index" in fields and "wait_ms" in fields and bool(h.min_index)  # type: ignore[attr-defined]
        if blocking and patience:
            h.wait_ms = draw(st.integers(1, 50))  # type: ignore[attr-defined]
    return msg


def _requests(rpc: Rpc, fz: Fuzz) -> st.SearchStrategy[Message]:
    pool = fz.top_up().frozen()
    generated = messages.messages(rpc.input, depth=4, hints=mutate.hints(pool))
    mutated = mutate.mutated_requests(rpc.input, pool)
    return st.one_of(generated, mutated).flatmap(_tame_waits)


def _describe(msg: Message, caller: As) -> str:
    text = text_format.MessageToString(msg, as_one_line=True)
    return f"as {caller.value}: {text[:400]}{'...' if len(text) > 400 else ''}"


def _alive(fz: Fuzz, what: str) -> None:
    dead = [p.name for p in fz.cluster.procs.values() if not p.alive]
    if dead:
        tail = fz.cluster.log(dead[0])[-3000:]
        pytest.fail(f"{', '.join(dead)} died after {what}:\n{tail}")


def _fuzz(fz: Fuzz, rpc: Rpc) -> None:
    callers = [As.ANONYMOUS, As.STALE_TOKEN, As.FORGED_SERVER]
    if not rpc.internal:
        callers += [As.USER, As.SERVER]
    b = budget()

    @hypothesis_settings(b.internal if rpc.internal else b.public)
    @given(request=_requests(rpc, fz), caller=st.sampled_from(callers), pick=st.integers(0, 7))
    def one(request: Message, caller: As, pick: int) -> None:
        blocking = _blocking(request)
        timeout = WAITING_S if blocking or rpc.streaming else PROMPT_S
        what = _describe(request, caller)

        def send() -> Answer:
            return fz.callers.call(rpc, request, caller, timeout=timeout, pick=pick)

        before = fz.probe.mark()
        answer = send()
        after = fz.probe.mark()
        OUTCOMES[rpc.name][answer.code.name] += 1
        _alive(fz, what)
        if rpc.internal:
            assert answer.code == grpc.StatusCode.PERMISSION_DENIED, (
                f"{rpc.name} is for servers only but answered {answer.code.name} "
                f"{answer.details!r} ({what})"
            )
        checks.check_answer(rpc, answer, blocking=blocking, what=what)
        if answer.ok:
            mutate.learn(request, fz.pool)
        else:
            checks.refusal_writes_nothing(fz.probe, send, (before, answer, after), what=what)

    one()


@pytest.mark.parametrize("method", sorted(RULES))
def test_every_answer_is_clean_and_refusals_write_nothing(fuzz: Fuzz, method: str) -> None:
    targets = [r for r in fuzz.targets if r.method == method]
    if not targets:
        pytest.skip(f"{method} is not served by the fuzz cluster's processes")
    for rpc in targets:
        _fuzz(fuzz, rpc)


def _padded(rpc: Rpc, size: int) -> bytes:
    """An empty request of `rpc` with an unknown field of `size` bytes: any
    request can be made that large (a server keeps unknown fields)."""
    tag = (UNKNOWN_FIELD << 3) | 2  # length-delimited
    return _varint(tag) + _varint(size) + b"\x00" * size


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        low, n = n & 0x7F, n >> 7
        out.append(low | (0x80 if n else 0))
        if not n:
            return bytes(out)


UNKNOWN_FIELD = 536_870_911  # the largest field number: no message uses it


def test_a_request_over_the_public_size_limit_is_refused(fuzz: Fuzz) -> None:
    """Huge input, one RPC of each service of each role: a user's or a
    node's request over MAX_PUBLIC_REQUEST_BYTES is RESOURCE_EXHAUSTED,
    naming the limit, before any handler runs; nothing is written."""
    one_per_service: dict[str, Rpc] = {}
    for rpc in fuzz.targets:
        if rpc.method.startswith(ACL_SERVICE) and not fuzz.token:
            continue  # refused as a whole while ACLs are off (FAILED_PRECONDITION)
        if not rpc.internal and not rpc.streaming:
            one_per_service.setdefault(f"{rpc.role}:{rpc.method.split('/')[1]}", rpc)
    request = b""
    for rpc in one_per_service.values():
        request = request or _padded(rpc, MAX_PUBLIC_REQUEST_BYTES + 1)
        before = fuzz.probe.mark()
        answer = fuzz.callers.call(rpc, request, As.USER, timeout=PROMPT_S)
        assert answer.code == grpc.StatusCode.RESOURCE_EXHAUSTED, (rpc.name, answer.details)
        assert f"at most {MAX_PUBLIC_REQUEST_BYTES}" in answer.details, (rpc.name, answer.details)
        assert fuzz.probe.mark() == before, rpc.name


def test_the_cluster_serves_every_rpc_it_has_a_rule_for(fuzz: Fuzz) -> None:
    """The fuzz reaches everything: each served RPC has an access rule, and
    each rule's RPC is served by a process of the cluster, except the
    agent's and those of services that are not in the protobuf schema yet."""
    assert not fuzz.unruled, f"served without an access rule: {fuzz.unruled}"
    from google.protobuf import descriptor_pool

    pool = descriptor_pool.Default()
    missing = []
    served = {r.method for r in fuzz.targets} | set(fuzz.request_streams)
    for method in sorted(set(RULES) - served):
        if method.startswith(NOT_IN_CLUSTER):
            continue
        service = method.split("/")[1]
        try:
            pool.FindServiceByName(service)
        except KeyError:
            continue  # a rule ahead of its service (another branch brings it)
        missing.append(method)
    assert not missing, f"in RULES but served by no process of the cluster: {missing}"


def test_no_role_logged_a_traceback(fuzz: Fuzz) -> None:
    """Runs after the fuzz (file order): whatever the fuzzer sent or set off
    (a job it registered being scheduled, a drain it started), no role hit
    an unhandled exception."""
    for name in fuzz.cluster.procs:
        log = fuzz.cluster.log(name)
        assert "Traceback" not in log, f"{name} logged a traceback:\n{_around(log, 'Traceback')}"


def _around(text: str, needle: str) -> str:
    i = text.index(needle)
    return text[max(0, i - 500) : i + 2500]


def test_the_fuzz_reached_every_public_handler(fuzz: Fuzz) -> None:
    """Not vacuous: every public RPC fuzzed in this run answered something
    other than PERMISSION_DENIED at least once, so requests got past the
    access check into the handler (the counts are in the message)."""
    fuzzed = {r.name for r in fuzz.targets if not r.internal and r.name in OUTCOMES}
    stopped_at_the_door = sorted(
        n for n in fuzzed if set(OUTCOMES[n]) <= {grpc.StatusCode.PERMISSION_DENIED.name}
    )
    table = "\n".join(f"{n}: {dict(c)}" for n, c in sorted(OUTCOMES.items()))
    assert not stopped_at_the_door, f"never reached the handler: {stopped_at_the_door}\n{table}"


def test_every_role_shuts_down_cleanly_after_the_fuzz(fuzz: Fuzz) -> None:
    """Last (file order): whatever the fuzz left the cluster doing, each role
    stops on SIGTERM within the cluster's grace (15 s) with status 0. A
    scheduler spinning on an unbounded job held the worker past it."""
    codes = {name: fuzz.cluster.stop(name) for name in reversed(list(fuzz.cluster.procs))}
    assert all(code == 0 for code in codes.values()), f"exit statuses: {codes}"
