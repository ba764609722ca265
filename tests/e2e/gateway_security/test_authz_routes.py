"""Issue 26: every HTTP route is authorised like its Nomad counterpart.

Generated from the gateway's route table: for every route and method, the
need it declares (services/gateway/authz.py) is turned into tokens, and a
real request (naming seeded objects, with a body that passes validation)
is sent with each:

* a token holding exactly the need (each alternative in turn, where Nomad
  accepts several capabilities) is not refused (no 403);
* a token holding everything else but one part of the need, an unknown
  token, and no token at all are refused (403), except where the route is
  open; a list or stream that filters may answer 2xx instead, without any
  of the namespace's objects; the UI's overview answers its refusals in
  its body.

A route added to the table without a declared need fails
tests/unit/test_gateway_authz.py; one without a sample request here fails
`test_every_route_has_a_sample`."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator

import pytest
import requests

from corral.security import acl
from services.gateway import authz
from tests.e2e.gateway_security.conftest import Cluster
from tests.e2e.gateway_security.samples import Sample, routes
from tests.e2e.gateway_security.samples import samples as make_samples

pytestmark = [pytest.mark.slow]

ALL_CAPS = sorted(acl.NAMESPACE_CAPABILITIES - {acl.DENY})
SCOPE_LEVELS = {"read": "", "write": "read"}  # what is one level short of each


# -- tokens from needs ---------------------------------------------------------


POOL_CAPS = sorted(acl.NODE_POOL_CAPABILITIES - {acl.DENY})
VARIABLE_CAPS = sorted(acl.VARIABLE_CAPABILITIES - {acl.DENY})


def _listed(caps: list[str]) -> str:
    return ", ".join(f'"{c}"' for c in sorted(set(caps)))


def _rules(
    namespace: str,
    caps: list[str],
    scopes: dict[str, str],
    pools: dict[str, list[str]] | None = None,
    variables: list[str] | None = None,
) -> str:
    lines = []
    if variables:
        listed = _listed(variables)
        lines.append(
            f'namespace "{namespace}" {{\n  capabilities = [{_listed(caps)}]\n'
            f'  variables {{\n    path "*" {{ capabilities = [{listed}] }}\n  }}\n}}'
        )
    elif caps:
        lines.append(f'namespace "{namespace}" {{ capabilities = [{_listed(caps)}] }}')
    else:  # a token that may do something, just nothing of the need
        lines.append('namespace "zz-unused" { policy = "read" }')
    for scope, level in sorted(scopes.items()):
        if level:
            lines.append(f'{scope} {{ policy = "{level}" }}')
    for pool, pool_caps in sorted((pools or {}).items()):
        if pool_caps:
            lines.append(f'node_pool "{pool}" {{ capabilities = [{_listed(pool_caps)}] }}')
    return "\n".join(lines)


def granting(need: authz.Need, sample: Sample) -> Iterator[tuple[str, str]]:
    """(what, rules) of tokens holding exactly the need: the first
    alternative of each group, then each other alternative in turn."""
    scopes = dict(need.scopes)
    pools = {sample.pool: list(need.node_pool)}
    variables = list(need.variables)
    firsts = [group[0] for group in need.namespace]
    if need.namespace_seen and not firsts:
        firsts = ["list-jobs"]  # any capability shows the namespace
    yield "exactly", _rules(sample.namespace, firsts, scopes, pools, variables)
    for i, group in enumerate(need.namespace):
        for other in group[1:]:
            caps = [*firsts[:i], other, *firsts[i + 1 :]]
            yield f"with {other}", _rules(sample.namespace, caps, scopes, pools, variables)


def denying(need: authz.Need, sample: Sample) -> Iterator[tuple[str, str]]:
    """(what, rules) of tokens holding everything but one part of the need."""
    namespace = sample.namespace
    scopes = dict(need.scopes)
    everything = dict.fromkeys(acl.SCOPES, "write")
    all_pools = {sample.pool: POOL_CAPS}
    needed = [c for group in need.namespace for c in group]
    for group in need.namespace:
        caps = [c for c in ALL_CAPS if c not in group]
        yield (
            f"without {'/'.join(group)}",
            _rules(namespace, caps, {**everything, **scopes}, all_pools),
        )
    for scope, level in need.scopes:
        short = {**everything, scope: SCOPE_LEVELS[level]}
        yield f"without {scope}:{level}", _rules(namespace, needed or ALL_CAPS, short, all_pools)
    for cap in need.node_pool:
        pools = {sample.pool: [c for c in POOL_CAPS if c != cap]}
        yield f"without node_pool {cap}", _rules(namespace, needed or ALL_CAPS, everything, pools)
    for cap in need.variables:
        others = [c for c in VARIABLE_CAPS if c != cap]
        yield (
            f"without variables {cap}",
            _rules(namespace, ALL_CAPS, everything, all_pools, others),
        )
    if need.namespace_seen:
        yield (
            "without any capability in the namespace",
            f'namespace "*" {{ policy = "write" }}\nnamespace "{namespace}" {{ policy = "deny" }}',
        )
    if need.management:
        yield (
            "a client token with every capability",
            "\n".join(
                [
                    'namespace "*" { policy = "write" }',
                    f'namespace "{namespace}" {{ capabilities = [{_listed(ALL_CAPS)}] }}',
                    'node_pool "*" { policy = "write" }',
                    *(f'{s} {{ policy = "write" }}' for s in acl.SCOPES),
                ]
            ),
        )


class Tokens:
    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.made: dict[str, str] = {}

    def holding(self, rules: str) -> str:
        if rules not in self.made:
            name = f"authz-{len(self.made)}"
            self.made[rules] = self.cluster.token(name, rules)
        return self.made[rules]


# -- the test ------------------------------------------------------------------


@pytest.fixture(scope="module")
def samples(cluster: Cluster) -> dict[str, Callable[[str], Sample]]:
    return make_samples(cluster)


def test_every_route_has_a_sample(samples: dict[str, Callable[[str], Sample]]) -> None:
    missing = sorted({path for _, path, _ in routes() if path not in samples})
    assert not missing, f"add a sample request for: {missing}"


def _send(cluster: Cluster, method: str, sample: Sample, token: str | None) -> tuple[int, str]:
    params = dict(sample.params)
    if sample.namespace != "default":
        params.setdefault("namespace", sample.namespace)
    if sample.stream:
        headers = {"X-Nomad-Token": token} if token else {}
        with requests.get(
            cluster.url + sample.path, params=params, headers=headers, stream=True, timeout=60
        ) as resp:
            return resp.status_code, ""  # the body is an endless stream
    answer = cluster.http.call(method, sample.path, token=token, params=params, body=sample.body)
    return answer.status, answer.text


def _objects_of(cluster: Cluster, namespace: str) -> list[str]:
    for objects in (cluster.default, cluster.team_a, cluster.team_b):
        if objects.namespace == namespace:
            return objects.ids()
    return []


def _refused(cluster: Cluster, need: authz.Need, sample: Sample, status: int, text: str) -> bool:
    if status == 403:
        return True
    if need.partial:
        return status == 200 and "Permission denied" in text
    if need.filters and 200 <= status < 300:
        shown = [i for i in _objects_of(cluster, sample.namespace) if i in text]
        return not shown
    return False


def _order(item: tuple[str, str, authz.Need]) -> tuple[int, str, str]:
    """Reads first, then writes, deletions last (an allowed write may change
    what a later sample names)."""
    method, path, _ = item
    return ({"GET": 0, "DELETE": 2}.get(method, 1), path, method)


def test_every_route_answers_its_need_and_only_its_need(
    cluster: Cluster, samples: dict[str, Callable[[str], Sample]]
) -> None:
    tokens = Tokens(cluster)
    wrong: list[str] = []
    checked = 0
    for method, path, need in sorted(routes(), key=_order):
        sample = samples[path](method)
        where = sample.namespace
        # refused: every way of missing the need
        refusals: list[tuple[str, str | None]] = []
        if not need.open:
            refusals.append(("an unknown token", str(uuid.uuid4())))
            if not need.any_token:
                refusals.append(("no token", None))
                refusals += [(w, tokens.holding(r)) for w, r in denying(need, sample)]
        for what, token in refusals:
            status, text = _send(cluster, method, sample, token)
            checked += 1
            if not _refused(cluster, need, sample, status, text):
                wrong.append(f"{method} {sample.path} with {what}: {status} {text[:200]}")
        # allowed: exactly the need, each alternative
        if need.open:
            allowed: list[tuple[str, str | None]] = [("no token", None)]
        elif need.any_token:
            allowed = [("a token of no use", tokens.holding(_rules(where, [], {})))]
        elif need.management:
            allowed = [("the management token", cluster.management)]
        else:
            allowed = [(w, tokens.holding(r)) for w, r in granting(need, sample)]
        for what, token in allowed:
            status, text = _send(cluster, method, sample, token)
            checked += 1
            if status == 403 or status >= 500 and status != 501:
                wrong.append(f"{method} {sample.path} with {what}: {status} {text[:200]}")
    assert not wrong, f"{len(wrong)} of {checked} answers wrong:\n" + "\n".join(wrong)
