"""Pure pieces of issue 28: `variables` ACL rules and the implicit policy of
a workload identity (Nomad's acl.go), Nomad's variable path rules, the
keyring's cryptography and the workload identity JWT."""

from __future__ import annotations

import base64
import os
import time
from pathlib import Path

import jwt
import pytest

from corral.domain import identity as task_ids
from corral.domain.variables import items_size, path_problem
from corral.security import acl
from corral.security import identity as wid
from corral.security import keyring as kr
from corral.v1 import structs_pb2 as pb

POLICY = """
namespace "default" {
  policy = "read"
  variables {
    path "project/*"      { capabilities = ["read", "write"] }
    path "project/secret" { capabilities = ["deny"] }
    path "shared"         { capabilities = ["list"] }
  }
}
namespace "prod-*" {
  variables { path "*" { capabilities = ["destroy"] } }
}
namespace "*" {
  variables { path "team/*" { capabilities = ["read"] } }
}
"""


def compiled(*texts: str, workload: acl.WorkloadClaim | None = None) -> acl.ACL:
    return acl.compile_acl([acl.parse_policy(t) for t in texts], workload=workload)


@pytest.mark.parametrize(
    ("namespace", "path", "capability", "allowed"),
    [
        ("default", "project/a", "read", True),
        ("default", "project/a", "list", True),  # read implies list
        ("default", "project/a", "write", True),
        ("default", "project/a", "destroy", False),
        ("default", "project/secret", "read", False),  # the exact rule wins over the glob
        ("default", "shared", "list", True),
        ("default", "shared", "read", False),
        ("default", "other", "read", False),
        ("prod-eu", "anything/at/all", "destroy", True),
        ("prod-eu", "anything", "read", False),
        ("staging", "team/x", "read", True),  # the "*" namespace rule
        ("default", "team/x", "read", True),
        ("staging", "project/a", "read", False),
    ],
)
def test_variables_rules(namespace: str, path: str, capability: str, allowed: bool) -> None:
    assert compiled(POLICY).allows_variable(namespace, path, capability) is allowed


def test_namespace_capabilities_say_nothing_of_variables() -> None:
    a = compiled('namespace "default" { policy = "write" }')
    assert a.allows_namespace("default", "submit-job")
    assert not a.allows_variable("default", "x", "read")
    denied = compiled(
        'namespace "default" { policy = "deny"\n'
        'variables { path "x" { capabilities = ["read"] } } }'
    )
    assert denied.allows_variable("default", "x", "read")  # as in Nomad


def test_deny_wins_when_policies_merge() -> None:
    grant = 'namespace "default" { variables { path "x" { capabilities = ["read"] } } }'
    deny = 'namespace "default" { variables { path "x" { capabilities = ["deny"] } } }'
    assert compiled(grant).allows_variable("default", "x", "read")
    assert not compiled(grant, deny).allows_variable("default", "x", "read")
    merged = compiled(
        grant, 'namespace "default" { variables { path "x" { capabilities = ["write"] } } }'
    )
    assert merged.variable_capabilities("default", "x") == {"read", "list", "write"}


def test_closest_glob_wins() -> None:
    a = compiled(
        'namespace "default" { variables {\n'
        '  path "a/*" { capabilities = ["list"] }\n'
        '  path "a/b/*" { capabilities = ["read"] }\n'
        "} }"
    )
    assert a.allows_variable("default", "a/b/c", "read")
    assert not a.allows_variable("default", "a/x", "read")


def test_a_workload_reads_its_own_job_paths() -> None:
    claim = acl.WorkloadClaim(namespace="default", job_id="web", group="g", task="t")
    a = compiled(workload=claim)
    for path in ("nomad/jobs", "nomad/jobs/web", "nomad/jobs/web/g", "nomad/jobs/web/g/t"):
        assert a.allows_variable("default", path, "read"), path
        assert a.allows_variable("default", path, "list"), path
        assert not a.allows_variable("default", path, "write"), path
        assert not a.allows_variable("prod", path, "read"), path
    for path in ("nomad/jobs/db", "nomad/jobs/web/other", "nomad/jobs/web/g/x", "nomad/jobs/webx"):
        assert not a.allows_variable("default", path, "read"), path
    assert a.allows_service_read("default") and not a.allows_service_read("prod")
    assert not a.allows_namespace("default", "read-job")


@pytest.mark.parametrize(
    ("pattern", "name", "match"),
    [
        ("*", "", True),
        ("a*", "abc", True),
        ("a*c", "abc", True),
        ("a*c", "abd", False),
        ("*b*", "abc", True),
        ("a?c", "abc", False),  # only `*` is special, as Nomad's go-glob
        ("a[b]c", "abc", False),
        ("a*a*a*a*a*a*a*a*b", "a" * 120, False),  # no backtracking blow-up
    ],
)
def test_glob_match(pattern: str, name: str, match: bool) -> None:
    assert acl.glob_match(pattern, name) is match


# ------------------------------------------------------------------- paths


@pytest.mark.parametrize(
    ("path", "ok"),
    [
        ("a", True),
        ("a/b-c_d~e", True),
        ("nomad/jobs", True),
        ("nomad/jobs/web/group/task", True),
        ("nomad/sentinel/x", True),
        ("nomad/job-templates/t", True),
        ("nomad", False),
        ("nomad/job-templates", False),
        ("nomad/job-templates/a/b", False),
        ("nomad/other", False),
        ("", False),
        ("a.b", False),
        ("a b", False),
        ("x" * 128, True),
        ("x" * 129, False),
    ],
)
def test_variable_paths(path: str, ok: bool) -> None:
    assert (path_problem(path) is None) is ok


def test_items_size_counts_bytes() -> None:
    assert items_size({"é": "ü"}) == 4


# ----------------------------------------------------------------- keyring


def test_kek_file(tmp_path: Path) -> None:
    path = tmp_path / "dir" / "kek"
    kr.write_kek_file(path)
    assert path.stat().st_mode & 0o777 == 0o600
    kek = kr.load_kek(path)
    kr.write_kek_file(path)  # kept
    assert kr.load_kek(path).kek_id == kek.kek_id
    os.chmod(path, 0o644)
    with pytest.raises(kr.KeyringError, match="readable by others"):
        kr.load_kek(path)
    os.chmod(path, 0o600)
    path.write_text(base64.b64encode(b"short").decode())
    with pytest.raises(kr.KeyringError, match="holds 5 bytes"):
        kr.load_kek(path)
    path.write_text("not base64!!")
    with pytest.raises(kr.KeyringError, match="base64"):
        kr.load_kek(path)


def test_root_keys_wrap_and_encrypt() -> None:
    kek = kr.KeyEncryptionKey(os.urandom(32))
    material = kr.RootKeyMaterial.generate("key-1")
    wrapped, wrapped_rsa = material.wrapped(kek)
    assert material.data_key not in wrapped
    again = kr.RootKeyMaterial.unwrap(kek, "key-1", wrapped, wrapped_rsa)
    context = kr.variable_context("default", "a/b")
    blob = material.encrypt(b'{"k":"v"}', context)
    assert again.decrypt(blob, context) == b'{"k":"v"}'
    assert material.encrypt(b'{"k":"v"}', context) != blob  # a fresh nonce each time
    with pytest.raises(kr.KeyringError):
        again.decrypt(blob, kr.variable_context("default", "a/c"))  # moved
    with pytest.raises(kr.KeyringError):
        again.decrypt(blob[:-1] + bytes([blob[-1] ^ 1]), context)  # tampered
    with pytest.raises(kr.KeyringError, match="does not unwrap"):
        kr.RootKeyMaterial.unwrap(
            kr.KeyEncryptionKey(os.urandom(32)), "key-1", *material.wrapped(kek)
        )
    with pytest.raises(kr.KeyringError, match="does not unwrap"):
        kr.RootKeyMaterial.unwrap(kek, "key-2", wrapped, wrapped_rsa)  # another key's row


def test_jwk_is_nomads_shape() -> None:
    material = kr.RootKeyMaterial.generate("kid-1")
    jwk = kr.public_jwk("kid-1", material.public_key_der())
    assert jwk["kty"] == "RSA" and jwk["kid"] == "kid-1"
    assert jwk["alg"] == "RS256" and jwk["use"] == "sig"
    assert set(jwk) == {"kty", "kid", "alg", "use", "n", "e"}


# ---------------------------------------------------------------- identity


def test_a_signed_identity_verifies_and_expires() -> None:
    material = kr.RootKeyMaterial.generate("kid-1")
    now = int(time.time())
    claims = wid.WorkloadClaims(
        namespace="default",
        job_id="web",
        alloc_id="a1",
        task="t",
        group="g",
        identity="vault",
        audience=("vault.io",),
        issued_at=now,
        expires_at=now + 60,
        issuer="https://nomad.example",
    )
    token = wid.sign(material, claims)
    assert wid.looks_like_jwt(token) and not wid.looks_like_jwt(
        "b6f0b1f0-1f8b-4a5e-9c2a-0f0e8f1a2b3c"
    )
    assert wid.key_id_of(token) == "kid-1"
    verified = wid.verify(token, material.rsa_key.public_key(), now=now + 1)
    assert (verified.job_id, verified.alloc_id, verified.identity) == ("web", "a1", "vault")
    with pytest.raises(wid.IdentityError, match="expired"):
        wid.verify(token, material.rsa_key.public_key(), now=now + 60)
    other = kr.RootKeyMaterial.generate("kid-1")
    with pytest.raises(wid.IdentityError, match="does not verify"):
        wid.verify(token, other.rsa_key.public_key(), now=now)
    raw = jwt.decode(token, options={"verify_signature": False})
    assert raw["iss"] == "https://nomad.example" and raw["aud"] == ["vault.io"]
    assert raw["sub"] == "global:default:web:g:t:vault"
    hs = jwt.encode(raw, "s" * 32, algorithm="HS256", headers={"kid": "kid-1"})
    with pytest.raises(wid.IdentityError):
        wid.key_id_of(hs)  # only RS256 is ours


# ------------------------------------------------------- identity blocks


def test_task_identities_are_checked() -> None:
    task = pb.Task(name="t")
    assert task_ids.task_identity(task, "default") is not None
    assert task_ids.task_identity(task, "x") is None
    task.identity.env = True
    task_ids.canonicalize(task)
    assert list(task.identity.audience) == ["nomadproject.io"]
    assert task_ids.problems(task) is None
    cases = [
        (pb.WorkloadIdentity(name="default"), "identities[0].name"),
        (pb.WorkloadIdentity(name="a b"), "identities[0].name"),
        (pb.WorkloadIdentity(name="x", audience=[""]), "identities[0].aud[0]"),
        (pb.WorkloadIdentity(name="x", change_mode="restart"), "identities[0].change_mode"),
        (pb.WorkloadIdentity(name="x", filepath="a"), "identities[0].filepath"),
        (pb.WorkloadIdentity(name="x", file=True, filepath="../a"), "identities[0].filepath"),
        (pb.WorkloadIdentity(name="x", ttl=-1), "identities[0].ttl"),
    ]
    for spec, where in cases:
        bad = pb.Task(name="t", identities=[spec])
        found = task_ids.problems(bad)
        assert found is not None and found[0] == where, (spec, found)
    default_ttl = pb.Task(name="t", identity=pb.WorkloadIdentity(name="default", ttl=10))
    assert task_ids.problems(default_ttl) == (
        "identity.ttl",
        "ttl for the default identity is not supported (as in Nomad)",
    )
    twice = pb.Task(name="t", identities=[pb.WorkloadIdentity(name="x")] * 2)
    assert task_ids.problems(twice) is not None


IDENTITY_JOB = """
job "web" {
  group "g" {
    task "t" {
      driver = "raw_exec"
      config { command = "/bin/true" }
      identity {
        env  = true
        file = true
      }
      identity {
        name = "vault"
        aud  = ["vault.io"]
        ttl  = "1h"
        file = true
        %s
      }
    }
  }
}
"""


def test_identity_blocks_in_hcl() -> None:
    from corral.domain.jobspec import hcl
    from corral.domain.jobspec.errors import JobspecError

    task = hcl.parse(IDENTITY_JOB % "", "web.nomad.hcl").task_groups[0].tasks[0]
    assert task.identity.env and task.identity.file
    assert list(task.identity.audience) == ["nomadproject.io"]
    (named,) = task.identities
    assert (named.name, list(named.audience), named.ttl, named.file) == (
        "vault",
        ["vault.io"],
        3600 * 10**9,
        True,
    )
    for extra, message in (
        ('change_mode = "restart"', "is not supported by Corral"),
        ('extra_claims = ["x"]', "identity extra_claims is not supported by Corral"),
        ('filepath = "/etc/passwd"', "relative path inside the task directory"),
        ("bogus = 1", "unknown argument 'bogus'"),
    ):
        with pytest.raises(JobspecError) as err:
            hcl.parse(IDENTITY_JOB % extra, "web.nomad.hcl")
        assert message in str(err.value), extra
        assert "web.nomad.hcl:" in str(err.value)


def test_identity_blocks_in_nomads_json() -> None:
    from corral.domain.jobspec.errors import JobspecError
    from corral.domain.jobspec.json import from_nomad

    job = {
        "ID": "web",
        "TaskGroups": [
            {
                "Name": "g",
                "Tasks": [
                    {
                        "Name": "t",
                        "Driver": "raw_exec",
                        "Config": {"command": "/bin/true"},
                        "Identity": {"Env": True, "File": False, "Name": "default"},
                        "Identities": [{"Name": "aws", "Audience": ["sts"], "TTL": 60 * 10**9}],
                    }
                ],
            }
        ],
    }
    task = from_nomad(job).task_groups[0].tasks[0]
    assert task.identity.env and list(task.identity.audience) == ["nomadproject.io"]
    assert task.identities[0].name == "aws" and task.identities[0].ttl == 60 * 10**9
    job["TaskGroups"][0]["Tasks"][0]["Identities"][0]["ExtraClaims"] = ["x"]  # type: ignore[index]
    with pytest.raises(JobspecError, match="not supported by Corral"):
        from_nomad(job)
