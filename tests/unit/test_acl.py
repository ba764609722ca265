"""Nomad's ACL model (corral.security.acl): policies parse from HCL or fail naming
the problem; shorthands stand for Nomad's capability sets; one namespace
rule applies (exact, else the closest glob); deny wins when policies merge."""

from __future__ import annotations

import pytest

from corral.domain.errors import InvalidArgument
from corral.security import acl
from corral.security.acl import ACL, DENY_ALL, MANAGEMENT, compile_acl, parse_policy


def _acl(*texts: str) -> ACL:
    return compile_acl([parse_policy(t) for t in texts])


# ------------------------------------------------------------------ parsing


def test_parses_every_rule_kind() -> None:
    rules = parse_policy(
        """
        # comments are fine
        namespace "default" {
          policy = "read"
        }
        namespace "prod-*" {
          policy       = "read"
          capabilities = ["submit-job", "read-logs"]
        }
        namespace "ops" { capabilities = ["alloc-lifecycle"] }
        node     { policy = "write" }
        agent    { policy = "read" }
        operator { policy = "deny" }
        """
    )
    assert set(rules.namespaces) == {"default", "prod-*", "ops"}
    assert rules.namespaces["ops"] == frozenset({"alloc-lifecycle"})
    assert {"submit-job", "read-logs", "read-job", "list-jobs"} <= rules.namespaces["prod-*"]
    assert (rules.node, rules.agent, rules.operator) == ("write", "read", "deny")


def test_a_namespace_block_without_label_is_the_default_namespace() -> None:
    rules = parse_policy('namespace { policy = "write" }')
    assert set(rules.namespaces) == {"default"}
    assert _acl('namespace { policy = "write" }').allows_namespace("", "submit-job")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('namespace "a" {', "not valid HCL: unexpected end"),
        ('namespace "a" { policy = "read" ', "not valid HCL"),
        ("@@", "not valid HCL: unexpected '@@' at line 1"),
        ("", "the policy has no rules"),
        ("# only a comment\n", "the policy has no rules"),
        (
            'namespace "a" { policy = "rw" }',
            "namespace \"a\".policy: unknown policy 'rw' "
            "(expected one of deny, read, write, scale)",
        ),
        (
            'namespace "a" { capabilities = ["read-job", "csi-read-volume"] }',
            "namespace \"a\".capabilities[1]: unknown capability 'csi-read-volume'",
        ),
        ('namespace "a" { capabilities = "read-job" }', "capabilities: must be a list of strings"),
        ('namespace "a" { capabilities = [3] }', "capabilities[0]: must be a string"),
        ('namespace "a" { policy = 3 }', 'namespace "a".policy: must be a string'),
        ('namespace "a" {}', 'namespace "a": needs a policy, capabilities or variables'),
        ('namespace "a" { policy = "read"\n x = 1 }', 'namespace "a".x: unknown field'),
        (
            'namespace "a" { policy = "read" }\nnamespace "a" { policy = "write" }',
            'namespace "a": is defined twice',
        ),
        ('namespace "a" "b" { policy = "read" }', "must be a block with at most one label"),
        ('namespace "a b" { policy = "read" }', "label may contain only letters"),
        ('namespace "' + "a" * 129 + '" { policy = "read" }', "longer than 128 characters"),
        ('node "x" { policy = "read" }', "node: takes no label"),
        ("node { }", "node: needs a policy"),
        ('node { policy = "scale" }', "node.policy: unknown policy 'scale'"),
        (
            'agent { policy = "read" }\nagent { policy = "write" }',
            "agent: only one agent rule is allowed",
        ),
        ('operator { capabilities = ["x"] }', "operator.capabilities: unknown field"),
        ('node = "read"', "node: must be a block, not an attribute"),
        ('quota { policy = "read" }', "quota: Nomad's rule is not supported by Corral"),
        ('host_volume "*" { policy = "read" }', "host_volume: Nomad's rule is not supported"),
        (
            'namespace "a" { variables { path "/x" { capabilities = ["read"] } } }',
            "cannot start with a leading '/'",
        ),
        (
            'namespace "a" { variables { path "x" { capabilities = ["sudo"] } } }',
            "unknown variables capability 'sudo'",
        ),
        ('namespace "a" { variables { path "x" {} } }', "capabilities: is required"),
        ('namespace "a" { variables { } }', "needs at least one path rule"),
        (
            'namespace "a" { variables { path "x" { capabilities = ["read"] }\n'
            'path "x" { capabilities = ["list"] } } }',
            'path "x": is defined twice',
        ),
        ('namespace "a" { variables { path { capabilities = ["read"] } } }', "exactly one label"),
        (
            'jobs { policy = "read" }',
            "jobs: unknown rule (expected namespace, node_pool, node, agent or",
        ),
        ('node_pool { policy = "read" }', 'node_pool: needs exactly one label: node_pool "name"'),
        ('node_pool "a" { policy = "scale" }', "node_pool \"a\".policy: unknown policy 'scale'"),
        (
            'node_pool "a" { capabilities = ["submit-job"] }',
            "node_pool \"a\".capabilities[0]: unknown capability 'submit-job'",
        ),
        (
            'node_pool "a" { policy = "read" }\nnode_pool "a" { policy = "write" }',
            'node_pool "a": is defined twice',
        ),
        ('namespace "a" { policy = "read\x00" }', "must not contain NUL"),
        ('namespace "a" { capabilities = ' + "[" * 20000 + "]" * 20000 + " }", "nested too"),
    ],
)
def test_bad_policies_are_refused_naming_the_problem(text: str, message: str) -> None:
    with pytest.raises(InvalidArgument) as err:
        parse_policy(text)
    assert message in err.value.message
    assert err.value.message.startswith("rules")


def test_the_error_names_the_request_field() -> None:
    with pytest.raises(InvalidArgument) as err:
        parse_policy("bogus {}", field="policies[2].rules")
    assert err.value.field.startswith("policies[2].rules")


def test_huge_policies_are_refused() -> None:
    with pytest.raises(InvalidArgument, match="longer than"):
        parse_policy('namespace "a" { policy = "read" }\n' * 5000)


# --------------------------------------------------------------- shorthands


def test_read_shorthand_is_nomads_read_set() -> None:
    caps = parse_policy('namespace "x" { policy = "read" }').namespaces["x"]
    assert caps == {
        "list-jobs",
        "parse-job",
        "read-job",
        "list-scaling-policies",
        "read-scaling-policy",
        "read-job-scaling",
    }


def test_write_implies_read_and_the_write_capabilities() -> None:
    read = parse_policy('namespace "x" { policy = "read" }').namespaces["x"]
    write = parse_policy('namespace "x" { policy = "write" }').namespaces["x"]
    assert read < write
    assert write - read == {
        "submit-job",
        "dispatch-job",
        "read-logs",
        "read-fs",
        "alloc-exec",
        "alloc-lifecycle",
        "scale-job",
    }
    assert "alloc-node-exec" not in write  # as in Nomad: only when named


def test_scale_shorthand() -> None:
    a = _acl('namespace "x" { policy = "scale" }')
    assert a.allows_namespace("x", "scale-job")
    assert a.allows_namespace("x", "read-job-scaling")
    assert not a.allows_namespace("x", "read-job")
    assert not a.allows_namespace("x", "submit-job")


def test_policy_and_capabilities_merge() -> None:
    a = _acl('namespace "default" { policy = "read"\n capabilities = ["submit-job"] }')
    assert a.allows_namespace("default", "submit-job")
    assert a.allows_namespace("default", "read-job")
    assert not a.allows_namespace("default", "read-logs")


def test_deny_in_a_rule_grants_nothing() -> None:
    a = _acl('namespace "x" { policy = "write"\n capabilities = ["deny"] }')
    assert not a.allows_namespace("x", "read-job")
    assert not a.allows_any_in_namespace("x")


def test_scope_levels() -> None:
    a = _acl('node { policy = "write" }\nagent { policy = "read" }\noperator { policy = "deny" }')
    assert a.allows("node", "read") and a.allows("node", "write")
    assert a.allows("agent", "read") and not a.allows("agent", "write")
    assert not a.allows("operator", "read") and not a.allows("operator", "write")


def test_no_rule_grants_nothing() -> None:
    a = _acl('namespace "a" { policy = "read" }')
    assert not a.allows("node", "read")
    assert not a.allows_namespace("b", "list-jobs")
    assert not a.allows_any_in_namespace("b")


def test_typos_in_checks_are_programming_errors() -> None:
    with pytest.raises(ValueError, match="capability"):
        DENY_ALL.allows_namespace("default", "read-jobs")
    with pytest.raises(ValueError, match="scope"):
        DENY_ALL.allows("nodes", "read")
    with pytest.raises(ValueError, match="level"):
        DENY_ALL.allows("node", "deny")


# ------------------------------------------------------------ glob matching


def test_exact_match_wins_over_any_glob() -> None:
    a = _acl('namespace "*" { policy = "write" }\nnamespace "prod" { policy = "read" }')
    assert not a.allows_namespace("prod", "submit-job")
    assert a.allows_namespace("prod", "read-job")
    assert a.allows_namespace("dev", "submit-job")


def test_closest_glob_wins_as_in_nomads_example() -> None:
    # production-web: 9 characters from "*-web", 13 from "*"
    a = _acl('namespace "*-web" { policy = "deny" }\nnamespace "*" { policy = "write" }')
    assert not a.allows_namespace("production-web", "read-job")
    assert a.allows_namespace("production-api", "submit-job")


def test_more_specific_prefix_glob_wins() -> None:
    a = _acl(
        'namespace "prod-*" { policy = "read" }\n'
        'namespace "prod-eu-*" { policy = "write" }\n'
        'namespace "*" { policy = "deny" }'
    )
    assert a.allows_namespace("prod-eu-1", "submit-job")
    assert a.allows_namespace("prod-us-1", "read-job")
    assert not a.allows_namespace("prod-us-1", "submit-job")
    assert not a.allows_namespace("dev", "list-jobs")


def test_glob_ties_go_to_the_label_that_sorts_first() -> None:
    # "a*" and "*b" both match "ab" with one character from the glob
    a = _acl('namespace "a*" { policy = "read" }\nnamespace "*b" { policy = "write" }')
    assert (
        a.namespace_capabilities("ab")
        == parse_policy('namespace "x" { policy = "write" }').namespaces["x"]
    )


def test_a_glob_does_not_match_what_it_does_not_cover() -> None:
    a = _acl('namespace "prod-*" { policy = "write" }')
    assert not a.allows_namespace("production", "read-job")
    assert a.allows_namespace("prod-", "read-job")  # `*` matches nothing too


# ------------------------------------------------------ several policies


def test_policies_union() -> None:
    a = _acl(
        'namespace "a" { policy = "read" }',
        'namespace "a" { capabilities = ["submit-job"] }\nnamespace "b" { policy = "write" }',
        'node { policy = "read" }',
        'node { policy = "write" }\nagent { policy = "read" }',
    )
    assert a.allows_namespace("a", "read-job") and a.allows_namespace("a", "submit-job")
    assert not a.allows_namespace("a", "read-logs")
    assert a.allows_namespace("b", "read-logs")
    assert a.allows("node", "write")
    assert a.allows("agent", "read")


def test_deny_wins_over_grants_of_other_policies() -> None:
    a = _acl(
        'namespace "prod" { policy = "write" }\nnode { policy = "write" }',
        'namespace "prod" { policy = "deny" }\nnode { policy = "deny" }',
    )
    assert not a.allows_namespace("prod", "read-job")
    assert not a.allows("node", "read")
    # and the order of the policies does not matter
    b = _acl(
        'namespace "prod" { policy = "deny" }\nnode { policy = "deny" }',
        'namespace "prod" { policy = "write" }\nnode { policy = "write" }',
    )
    assert not b.allows_namespace("prod", "read-job") and not b.allows("node", "read")


def test_deny_capability_in_one_policy_wins_for_that_label() -> None:
    a = _acl(
        'namespace "*" { policy = "write" }',
        'namespace "*" { capabilities = ["deny"] }\nnamespace "dev" { policy = "read" }',
    )
    assert not a.allows_namespace("prod", "read-job")
    assert a.allows_namespace("dev", "read-job")  # the exact rule is the one that applies


def test_compiled_acl_knows_its_policy_names() -> None:
    p = parse_policy('namespace "a" { policy = "read" }')
    import dataclasses

    a = compile_acl([dataclasses.replace(p, name="readers")])
    assert a.policies == {"readers"}
    assert not a.is_management


def test_management_and_deny_all() -> None:
    assert MANAGEMENT.is_management
    assert MANAGEMENT.allows_namespace("anything", "submit-job")
    assert MANAGEMENT.allows("operator", "write")
    assert not DENY_ALL.is_management
    assert not DENY_ALL.allows_namespace("default", "list-jobs")
    assert not DENY_ALL.allows("node", "read")
    assert not compile_acl([]).allows_namespace("default", "list-jobs")


def test_current_defaults_to_management_until_set() -> None:
    assert acl.CURRENT.get() is MANAGEMENT
    token = acl.CURRENT.set(DENY_ALL)
    try:
        assert acl.CURRENT.get() is DENY_ALL
    finally:
        acl.CURRENT.reset(token)


# ------------------------------------------------------------ secrets


def test_secret_hash_is_sha256_hex_and_not_the_secret() -> None:
    secret = acl.new_secret()
    digest = acl.secret_hash(secret)
    assert len(digest) == 64 and secret not in digest
    assert digest == acl.secret_hash(secret)
    assert digest != acl.secret_hash(acl.new_secret())


@pytest.mark.parametrize(
    ("metadata", "secret"),
    [
        ([], ""),
        (None, ""),
        ([("x-corral-token", "s1")], "s1"),
        ([("X-Corral-Token", b" s2 ")], "s2"),
        ([("authorization", "Bearer s3")], "s3"),
        ([("authorization", "bearer   s4")], "s4"),
        ([("authorization", "Basic abc")], ""),
        ([("authorization", "Bearer s5"), ("x-corral-token", "s6")], "s6"),
        ([("user-agent", "grpc")], ""),
    ],
)
def test_token_from_metadata(metadata: list[tuple[str, str | bytes]] | None, secret: str) -> None:
    assert acl.token_from_metadata(metadata) == secret


# ------------------------------------------------------------ node pools


def test_node_pool_shorthands_as_nomad() -> None:
    a = _acl('node_pool "gpu" { policy = "read" }\nnode_pool "batch-*" { policy = "write" }')
    assert a.allows_node_pool("gpu", "read")
    assert not a.allows_node_pool("gpu", "write") and not a.allows_node_pool("gpu", "delete")
    for cap in ("read", "write", "delete"):
        assert a.allows_node_pool("batch-1", cap)
    assert not a.allows_node_pool("default", "read")  # no rule: nothing
    assert not a.allows_namespace("default", "read-job")  # pools grant no namespace


def test_node_pool_capabilities_and_deny() -> None:
    a = _acl(
        'node_pool "*" { capabilities = ["read", "write"] }\nnode_pool "secret" { policy = "deny" }'
    )
    assert a.allows_node_pool("any", "write") and not a.allows_node_pool("any", "delete")
    assert not a.allows_node_pool("secret", "read")


def test_node_pool_deny_wins_across_policies() -> None:
    merged = compile_acl(
        [
            parse_policy('node_pool "gpu" { policy = "write" }'),
            parse_policy('node_pool "gpu" { policy = "deny" }'),
        ]
    )
    assert not merged.allows_node_pool("gpu", "read")
    assert MANAGEMENT.allows_node_pool("gpu", "delete")
    with pytest.raises(ValueError, match="capability"):
        DENY_ALL.allows_node_pool("gpu", "submit-job")
