"""Nomad's ACL model: policies in Nomad's HCL shape, and the ACL a token
carries once its policies are compiled. Pure: no I/O and no gRPC, so every
role (the state answering from its database, workers and agents asking the
state over `ACL.ResolveToken`) decides the same way.

A policy holds rules (docs/security.md has examples):

    namespace "prod-*" {              # a label may hold `*` globs; none means "default"
      policy       = "read"           # deny | read | write | scale (shorthands)
      capabilities = ["submit-job"]   # fine-grained, merged with the shorthand
      variables {                     # Nomad Variables, per path (globs too)
        path "project/*" { capabilities = ["read", "list"] }
      }
    }
    node_pool "gpu-*" {               # a label is required; `*` globs allowed
      policy       = "write"          # deny | read | write (write also deletes)
      capabilities = ["read"]         # read | write | delete | deny
    }
    node     { policy = "read" }      # deny | read | write
    agent    { policy = "read" }
    operator { policy = "write" }

How Nomad decides, and so do we:

* a shorthand is a set of capabilities (`_SHORTHANDS`); `write` holds all
  of `read`;
* the policies of a token are merged: per namespace label the union of the
  capabilities, unless one says `deny`, which then is all that label holds;
  for node/agent/operator the most privilege, unless one says `deny`;
* a namespace (and a node pool) is checked against exactly one rule: the
  exact label if there is one, else the matching glob closest to the name
  (fewest characters matched by `*`; ties go to the label that sorts first);
* a variable (namespace, path) against exactly one `variables` path rule
  the same way, over "<namespace label>\0<path>": the exact pair, else the
  implicit rule of a workload identity (read and list on its job's
  `nomad/jobs/...` paths), else the closest glob. `read` implies `list`;
  `deny` wins over anything merged with it. Namespace capabilities (and a
  namespace `deny`) say nothing about variables, as in Nomad.

`CURRENT` holds the ACL of the call being served. The lead's access
interceptor (`corral.security.access`) sets it per RPC from the caller's token;
until a process installs that interceptor it stays `MANAGEMENT`, so a
handler that asks `CURRENT.get().is_management` allows everything, as a
cluster with ACLs off does.
"""

from __future__ import annotations

import contextvars
import hashlib
import re
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import hcl2
from hcl2 import SerializationOptions
from lark.exceptions import LarkError, UnexpectedCharacters, UnexpectedEOF, UnexpectedInput

from corral.domain.errors import InvalidArgument

# -------------------------------------------------------------- vocabulary

DENY = "deny"
READ = "read"
WRITE = "write"
SCALE = "scale"

#: Nomad's namespace capabilities that mean something for Corral (no CSI
#: volumes, no Sentinel, no variables here)
NAMESPACE_CAPABILITIES: frozenset[str] = frozenset(
    {
        "deny",
        "list-jobs",
        "parse-job",
        "read-job",
        "submit-job",
        "dispatch-job",
        "read-logs",
        "read-fs",
        "alloc-exec",
        "alloc-node-exec",
        "alloc-lifecycle",
        "list-scaling-policies",
        "read-scaling-policy",
        "read-job-scaling",
        "scale-job",
        "tag-job-version",
        # remove a service instance by hand (submit-job also may); in no shorthand
        "delete-service-registration",
    }
)

_READ_CAPS = frozenset(
    {
        "list-jobs",
        "parse-job",
        "read-job",
        "list-scaling-policies",
        "read-scaling-policy",
        "read-job-scaling",
    }
)
_SCALE_CAPS = frozenset(
    {"list-scaling-policies", "read-scaling-policy", "read-job-scaling", "scale-job"}
)
#: what each namespace `policy = ...` stands for (Nomad's table, minus CSI)
_SHORTHANDS: dict[str, frozenset[str]] = {
    DENY: frozenset({"deny"}),
    READ: _READ_CAPS,
    WRITE: _READ_CAPS
    | _SCALE_CAPS
    | {"submit-job", "dispatch-job", "read-logs", "read-fs", "alloc-exec", "alloc-lifecycle"},
    SCALE: _SCALE_CAPS,
}
NAMESPACE_POLICIES: tuple[str, ...] = (DENY, READ, WRITE, SCALE)

#: Nomad's node_pool capabilities, and what each `policy = ...` stands for
NODE_POOL_READ, NODE_POOL_WRITE, NODE_POOL_DELETE = "read", "write", "delete"
NODE_POOL_CAPABILITIES: frozenset[str] = frozenset(
    {DENY, NODE_POOL_READ, NODE_POOL_WRITE, NODE_POOL_DELETE}
)
_NODE_POOL_SHORTHANDS: dict[str, frozenset[str]] = {
    DENY: frozenset({DENY}),
    READ: frozenset({NODE_POOL_READ}),
    WRITE: frozenset({NODE_POOL_READ, NODE_POOL_WRITE, NODE_POOL_DELETE}),
}
NODE_POOL_POLICIES: tuple[str, ...] = (DENY, READ, WRITE)

#: the rules without a label, and the dispositions they take
SCOPES: tuple[str, ...] = ("node", "agent", "operator")
SCOPE_POLICIES: tuple[str, ...] = (DENY, READ, WRITE)
_RANK = {"": 0, READ: 1, WRITE: 2}

#: Nomad's capabilities of a `variables` path rule
VARIABLE_LIST = "list"
VARIABLE_READ = "read"
VARIABLE_WRITE = "write"
VARIABLE_DESTROY = "destroy"
VARIABLE_CAPABILITIES: frozenset[str] = frozenset(
    {VARIABLE_LIST, VARIABLE_READ, VARIABLE_WRITE, VARIABLE_DESTROY, DENY}
)
#: what a workload identity may do on its own job's variables (Nomad's
#: workloadVariablesCapabilitySet)
WORKLOAD_VARIABLE_CAPABILITIES = frozenset({VARIABLE_READ, VARIABLE_LIST})

#: Nomad rule blocks Corral has nothing for: named as unsupported, not unknown
_UNSUPPORTED_BLOCKS = frozenset({"quota", "host_volume", "plugin"})

DEFAULT_NAMESPACE = "default"
MAX_POLICY_CHARS = 64 * 1024
MAX_LABEL_CHARS = 128
_LABEL = re.compile(r"^[A-Za-z0-9_*-]+$")

#: token types, and the policy every call without a token gets
TOKEN_CLIENT = "client"
TOKEN_MANAGEMENT = "management"
TOKEN_TYPES: tuple[str, ...] = (TOKEN_CLIENT, TOKEN_MANAGEMENT)
ANONYMOUS_POLICY = "anonymous"

#: where a caller puts its secret id (else `authorization: Bearer <secret>`)
TOKEN_METADATA_KEY = "x-corral-token"

_HCL = SerializationOptions(
    strip_string_quotes=True, explicit_blocks=True, with_comments=False, preserve_heredocs=False
)
_BLOCK = "__is_block__"


def glob_match(pattern: str, name: str) -> bool:
    """Whether `name` matches `pattern`, where only `*` is special and
    matches any run of characters (Nomad's go-glob). No backtracking
    regex, whatever the pattern (STYLE.md)."""
    p = n = 0
    star = -1
    mark = 0
    while n < len(name):
        if p < len(pattern) and pattern[p] == "*":
            star, mark = p, n
            p += 1
        elif p < len(pattern) and pattern[p] == name[n]:
            p += 1
            n += 1
        elif star >= 0:
            p = star + 1
            mark += 1
            n = mark
        else:
            return False
    while p < len(pattern) and pattern[p] == "*":
        p += 1
    return p == len(pattern)


# ----------------------------------------------------------------- secrets


def new_secret() -> str:
    """A fresh secret (or accessor) id: a random UUID, 122 random bits."""
    return str(uuid.uuid4())


def secret_hash(secret_id: str) -> str:
    """What the database stores instead of a secret id: its SHA-256, hex.

    A fast hash is enough here, unlike for passwords: secret ids are random
    122-bit UUIDs, not chosen by people, so there is no dictionary to try
    and 2**122 guesses is out of reach at any hash rate. What it buys is
    that a dump or a backup of the database holds no usable token.
    """
    return hashlib.sha256(secret_id.encode()).hexdigest()


def token_from_metadata(metadata: Iterable[tuple[str, str | bytes]] | None) -> str:
    """The secret id a call carries: `x-corral-token`, else an
    `authorization: Bearer <secret>` header; '' for an anonymous call."""
    bearer = ""
    for key, raw in metadata or ():
        value = raw.decode(errors="replace") if isinstance(raw, bytes) else raw
        name = key.lower()
        if name == TOKEN_METADATA_KEY:
            return value.strip()
        if name == "authorization" and not bearer:
            scheme, _, rest = value.strip().partition(" ")
            if scheme.lower() == "bearer":
                bearer = rest.strip()
    return bearer


# ----------------------------------------------------------------- policies


#: a variables rule's key: (namespace label, path spec)
VariableKey = tuple[str, str]


@dataclass(frozen=True)
class PolicyRules:
    """One parsed policy: capabilities per namespace label (shorthands
    already expanded), per node pool label, per (namespace label, variables
    path), and the node/agent/operator dispositions ('' where the policy
    has no such rule). `name` is the stored policy's name when a resolver
    knows it (parsing alone does not)."""

    namespaces: Mapping[str, frozenset[str]] = field(default_factory=dict)
    node_pools: Mapping[str, frozenset[str]] = field(default_factory=dict)
    node: str = ""
    agent: str = ""
    operator: str = ""
    name: str = ""
    variables: Mapping[VariableKey, frozenset[str]] = field(default_factory=dict)

    def scope(self, scope: str) -> str:
        return str(getattr(self, scope))


@dataclass(frozen=True)
class WorkloadClaim:
    """Who a workload identity speaks for (Nomad's ACLClaim): the implicit
    policy of a task's JWT."""

    namespace: str
    job_id: str
    group: str
    task: str
    alloc_id: str = ""
    identity: str = "default"

    def variable_paths(self) -> frozenset[str]:
        """The paths it may read and list (Nomad's nomad/acl.go)."""
        base = f"nomad/jobs/{self.job_id}"
        return frozenset(
            {"nomad/jobs", base, f"{base}/{self.group}", f"{base}/{self.group}/{self.task}"}
        )


def _syntax_error(exc: LarkError, field_: str) -> InvalidArgument:
    line = getattr(exc, "line", None)
    if isinstance(exc, UnexpectedEOF) or (isinstance(line, int) and line < 0):
        return InvalidArgument(field_, "not valid HCL: unexpected end (a missing '}'?)")
    where = f" at line {line}" if isinstance(line, int) else ""
    if isinstance(exc, UnexpectedCharacters):
        char = getattr(exc, "char", "")
        return InvalidArgument(field_, f"not valid HCL: unexpected character {char!r}{where}")
    if isinstance(exc, UnexpectedInput):
        token = getattr(exc, "token", None)
        if token is not None and getattr(token, "type", "") == "$END":
            return InvalidArgument(field_, "not valid HCL: unexpected end (a missing '}'?)")
        shown = str(token).strip() if token is not None else ""
        what = f"unexpected {shown!r}" if shown else "unexpected end of line"
        return InvalidArgument(field_, f"not valid HCL: {what}{where}")
    return InvalidArgument(field_, "not valid HCL")


def _blocks(value: Any, where: str) -> list[dict[str, Any]]:
    """The blocks under one top-level name (`node { ... }` parses as a list
    of dicts marked as blocks; `node = "x"` is an attribute)."""
    if not isinstance(value, list) or not all(isinstance(b, dict) for b in value):
        raise InvalidArgument(where, "must be a block, not an attribute")
    return value


def _string(body: dict[str, Any], key: str, where: str) -> str | None:
    if key not in body:
        return None
    value = body[key]
    if not isinstance(value, str):
        raise InvalidArgument(f"{where}.{key}", "must be a string")
    return value


def _check_keys(body: dict[str, Any], allowed: tuple[str, ...], where: str) -> None:
    for key in body:
        if key == _BLOCK or key in allowed:
            continue
        if key in _UNSUPPORTED_BLOCKS:
            raise InvalidArgument(f"{where}.{key}", "Nomad's rule is not supported by Corral")
        raise InvalidArgument(f"{where}.{key}", f"unknown field (expected {' or '.join(allowed)})")


def _variables_rule(value: Any, where: str) -> dict[str, frozenset[str]]:
    """`variables { path "<spec>" { capabilities = [...] } }` of one
    namespace rule: capabilities per path spec (Nomad's
    VariablesPolicy; `read` adds `list`, `deny` is all a path keeps)."""
    blocks = _blocks(value, where)
    if len(blocks) > 1:
        raise InvalidArgument(where, "only one variables block is allowed per namespace rule")
    body = blocks[0]
    if not body.get(_BLOCK):
        raise InvalidArgument(where, "takes no label")
    _check_keys(body, ("path",), where)
    if "path" not in body:
        raise InvalidArgument(where, "needs at least one path rule")
    out: dict[str, frozenset[str]] = {}
    for block in _blocks(body["path"], f"{where}.path"):
        if block.get(_BLOCK) or len(block) != 1:
            raise InvalidArgument(f"{where}.path", "needs exactly one label: the path")
        ((spec, rule),) = block.items()
        at = f'{where}.path "{spec}"'
        if not spec:
            raise InvalidArgument(at, "the path must not be empty")
        if spec.startswith("/"):
            raise InvalidArgument(at, "the path cannot start with a leading '/'")
        if len(spec) > MAX_LABEL_CHARS:
            raise InvalidArgument(at, f"the path is longer than {MAX_LABEL_CHARS} characters")
        if spec in out:
            raise InvalidArgument(at, "is defined twice")
        if not isinstance(rule, dict) or not rule.get(_BLOCK):
            raise InvalidArgument(at, "must be a block")
        _check_keys(rule, ("capabilities",), at)
        listed = rule.get("capabilities")
        if not isinstance(listed, list):
            raise InvalidArgument(f"{at}.capabilities", "is required: a list of strings")
        caps: set[str] = set()
        for i, cap in enumerate(listed):
            if not isinstance(cap, str) or cap not in VARIABLE_CAPABILITIES:
                raise InvalidArgument(
                    f"{at}.capabilities[{i}]",
                    f"unknown variables capability {cap!r} "
                    f"(expected one of {', '.join(sorted(VARIABLE_CAPABILITIES))})",
                )
            caps.add(cap)
        out[spec] = _expand_variable_capabilities(caps)
    return out


def _expand_variable_capabilities(caps: set[str] | frozenset[str]) -> frozenset[str]:
    if DENY in caps:
        return frozenset({DENY})
    if VARIABLE_READ in caps:
        return frozenset(caps | {VARIABLE_LIST})
    return frozenset(caps)


def _namespace_rule(body: Any, where: str) -> tuple[frozenset[str], dict[str, frozenset[str]]]:
    """A namespace rule's capabilities and its variables path rules."""
    if not isinstance(body, dict) or not body.get(_BLOCK):
        raise InvalidArgument(where, "must be a block with at most one label")
    if "variables" not in body:
        if "policy" not in body and "capabilities" not in body:
            _check_keys(body, ("policy", "capabilities", "variables"), where)
            raise InvalidArgument(where, "needs a policy, capabilities or variables")
        return _labeled_rule(body, where, _SHORTHANDS, NAMESPACE_CAPABILITIES), {}
    variables = _variables_rule(body["variables"], f"{where}.variables")
    rest = {k: v for k, v in body.items() if k != "variables"}
    if "policy" not in rest and "capabilities" not in rest:
        _check_keys(rest, ("policy", "capabilities", "variables"), where)
        return frozenset(), variables
    return _labeled_rule(rest, where, _SHORTHANDS, NAMESPACE_CAPABILITIES), variables


def _labeled_rule(
    body: Any, where: str, shorthands: Mapping[str, frozenset[str]], known: frozenset[str]
) -> frozenset[str]:
    """The capabilities of one `namespace "x"` or `node_pool "x"` rule."""
    if not isinstance(body, dict) or not body.get(_BLOCK):
        raise InvalidArgument(where, "must be a block with at most one label")
    _check_keys(body, ("policy", "capabilities"), where)
    policy = _string(body, "policy", where)
    caps: set[str] = set()
    if policy is not None:
        if policy not in shorthands:
            raise InvalidArgument(
                f"{where}.policy",
                f"unknown policy {policy!r} (expected one of {', '.join(shorthands)})",
            )
        caps |= shorthands[policy]
    if "capabilities" in body:
        listed = body["capabilities"]
        if not isinstance(listed, list):
            raise InvalidArgument(f"{where}.capabilities", "must be a list of strings")
        for i, cap in enumerate(listed):
            if not isinstance(cap, str):
                raise InvalidArgument(f"{where}.capabilities[{i}]", "must be a string")
            if cap not in known:
                raise InvalidArgument(
                    f"{where}.capabilities[{i}]",
                    f"unknown capability {cap!r} (expected one of {', '.join(sorted(known))})",
                )
            caps.add(cap)
    if policy is None and "capabilities" not in body:
        raise InvalidArgument(where, "needs a policy or capabilities")
    return frozenset({DENY}) if DENY in caps else frozenset(caps)


def _label(label: str, where: str) -> str:
    if len(label) > MAX_LABEL_CHARS:
        raise InvalidArgument(where, f"label is longer than {MAX_LABEL_CHARS} characters")
    if not _LABEL.match(label):
        raise InvalidArgument(
            where, "label may contain only letters, digits, '-', '_' and '*' globs"
        )
    return label


def parse_policy(text: str, *, field: str = "rules") -> PolicyRules:
    """Parse one policy in Nomad's HCL shape. Raises InvalidArgument naming
    `field` and the problem: bad HCL, an unknown rule, policy or
    capability, a Nomad rule Corral does not have, a repeated rule."""
    if len(text) > MAX_POLICY_CHARS:
        raise InvalidArgument(field, f"is longer than {MAX_POLICY_CHARS} characters")
    if "\x00" in text:
        raise InvalidArgument(field, "must not contain NUL characters")
    try:
        data = hcl2.loads(text, serialization_options=_HCL)
    except LarkError as exc:
        raise _syntax_error(exc, field) from None
    except RecursionError:
        raise InvalidArgument(field, "not valid HCL: nested too deeply") from None
    except (ValueError, TypeError, KeyError, IndexError, AttributeError) as exc:
        raise InvalidArgument(field, f"not valid HCL: {exc}") from None
    if not isinstance(data, dict) or not data:
        raise InvalidArgument(field, "the policy has no rules")

    namespaces: dict[str, frozenset[str]] = {}
    pools: dict[str, frozenset[str]] = {}
    variables: dict[VariableKey, frozenset[str]] = {}
    scopes: dict[str, str] = {}
    for key, value in data.items():
        where = f"{field}: {key}"
        if key == "namespace":
            for block in _blocks(value, where):
                if block.get(_BLOCK):
                    label, body = DEFAULT_NAMESPACE, block
                elif len(block) == 1:
                    ((label, body),) = block.items()
                else:
                    raise InvalidArgument(where, "must be a block with at most one label")
                at = f'{field}: namespace "{label}"'
                _label(label, at)
                if label in namespaces:
                    raise InvalidArgument(at, "is defined twice")
                namespaces[label], paths = _namespace_rule(body, at)
                for spec, caps in paths.items():
                    variables[(label, spec)] = caps
        elif key == "node_pool":
            for block in _blocks(value, where):
                if block.get(_BLOCK) or len(block) != 1:
                    raise InvalidArgument(
                        where, 'needs exactly one label: node_pool "name" { ... }'
                    )
                ((label, body),) = block.items()
                at = f'{field}: node_pool "{label}"'
                _label(label, at)
                if label in pools:
                    raise InvalidArgument(at, "is defined twice")
                pools[label] = _labeled_rule(
                    body, at, _NODE_POOL_SHORTHANDS, NODE_POOL_CAPABILITIES
                )
        elif key in SCOPES:
            blocks = _blocks(value, where)
            if len(blocks) > 1:
                raise InvalidArgument(where, f"only one {key} rule is allowed per policy")
            body = blocks[0]
            if not body.get(_BLOCK):
                raise InvalidArgument(where, "takes no label")
            _check_keys(body, ("policy",), where)
            policy = _string(body, "policy", where)
            if policy is None:
                raise InvalidArgument(where, "needs a policy")
            if policy not in SCOPE_POLICIES:
                raise InvalidArgument(
                    f"{where}.policy",
                    f"unknown policy {policy!r} (expected one of {', '.join(SCOPE_POLICIES)})",
                )
            scopes[key] = policy
        elif key in _UNSUPPORTED_BLOCKS:
            raise InvalidArgument(where, "Nomad's rule is not supported by Corral")
        else:
            raise InvalidArgument(
                where, "unknown rule (expected namespace, node_pool, node, agent or operator)"
            )
    return PolicyRules(
        namespaces=namespaces,
        node_pools=pools,
        node=scopes.get("node", ""),
        agent=scopes.get("agent", ""),
        operator=scopes.get("operator", ""),
        variables=variables,
    )


# ---------------------------------------------------------------------- ACL


class _LabeledRules:
    """Capabilities by label (namespace or node pool names, variables'
    "<namespace>\0<path>", `*` globs), and the one rule that applies to a
    name: its exact label, else the matching glob closest to it."""

    def __init__(self, rules: Mapping[str, frozenset[str]]) -> None:
        self._exact: dict[str, frozenset[str]] = {}
        self._globs: list[tuple[str, int, frozenset[str]]] = []
        for label, caps in sorted(rules.items()):
            if "*" in label:
                self._globs.append((label, len(label.replace("*", "")), caps))
            else:
                self._exact[label] = caps

    def exact(self, name: str) -> frozenset[str] | None:
        return self._exact.get(name)

    def closest(self, name: str) -> frozenset[str]:
        """The matching glob closest to `name` (only `*` is special)."""
        best: tuple[int, str, frozenset[str]] | None = None
        for label, literal, caps in self._globs:
            if glob_match(label, name):
                candidate = (len(name) - literal, label, caps)
                if best is None or candidate[:2] < best[:2]:
                    best = candidate
        return best[2] if best is not None else frozenset()

    def of(self, name: str) -> frozenset[str]:
        exact = self._exact.get(name)
        return exact if exact is not None else self.closest(name)


class ACL:
    """What a token may do: compiled from its policies by `compile_acl`, or
    `MANAGEMENT` for a management token."""

    def __init__(
        self,
        *,
        management: bool = False,
        namespaces: Mapping[str, frozenset[str]] | None = None,
        node_pools: Mapping[str, frozenset[str]] | None = None,
        node: str = "",
        agent: str = "",
        operator: str = "",
        policies: Iterable[str] = (),
        variables: Mapping[VariableKey, frozenset[str]] | None = None,
        workload: WorkloadClaim | None = None,
    ) -> None:
        self.is_management = management
        self._namespaces = _LabeledRules(namespaces or {})
        self._node_pools = _LabeledRules(node_pools or {})
        self._variables = _LabeledRules(
            {f"{label}\x00{spec}": caps for (label, spec), caps in (variables or {}).items()}
        )
        self._scopes = {"node": node, "agent": agent, "operator": operator}
        #: names of the policies this ACL was compiled from
        self.policies = frozenset(policies)
        #: set when the caller is a task's workload identity
        self.workload = workload

    def __repr__(self) -> str:
        if self.is_management:
            return "ACL(management)"
        if self.workload is not None:
            return f"ACL(workload={self.workload.namespace}/{self.workload.job_id})"
        return f"ACL(policies={sorted(self.policies)})"

    def variable_capabilities(self, namespace: str, path: str) -> frozenset[str]:
        """The capabilities of the one variables rule that applies to the
        variable at `path` in `namespace` (see the module doc)."""
        namespace = namespace or DEFAULT_NAMESPACE
        key = f"{namespace}\x00{path}"
        exact = self._variables.exact(key)
        if exact is not None:
            return exact
        claim = self.workload
        if claim is not None and namespace == claim.namespace and path in claim.variable_paths():
            return WORKLOAD_VARIABLE_CAPABILITIES
        return self._variables.closest(key)

    def allows_variable(self, namespace: str, path: str, capability: str) -> bool:
        """Whether `capability` (read, write, list, destroy) is granted on
        the variable at `path` in `namespace` ('' = default)."""
        if capability not in VARIABLE_CAPABILITIES or capability == DENY:
            raise ValueError(f"unknown variables capability {capability!r}")
        if self.is_management:
            return True
        caps = self.variable_capabilities(namespace, path)
        return DENY not in caps and capability in caps

    def allows_service_read(self, namespace: str) -> bool:
        """Whether services of `namespace` may be read: `read-job` there, or
        a workload identity of that namespace (Nomad lets every workload
        identity read services; Corral keeps it to its own namespace)."""
        if self.is_management:
            return True
        workload = self.workload
        if workload is not None and (namespace or DEFAULT_NAMESPACE) == workload.namespace:
            return True
        return self.allows_namespace(namespace, "read-job")

    def namespace_capabilities(self, namespace: str) -> frozenset[str]:
        """The capabilities of the one rule that applies to `namespace`."""
        return self._namespaces.of(namespace or DEFAULT_NAMESPACE)

    def allows_node_pool(self, pool: str, capability: str) -> bool:
        """Whether the node_pool rules grant `capability` (read, write or
        delete) on `pool` (Nomad's AllowNodePoolOperation)."""
        if capability not in NODE_POOL_CAPABILITIES or capability == DENY:
            raise ValueError(f"unknown node pool capability {capability!r}")
        if self.is_management:
            return True
        caps = self._node_pools.of(pool)
        return DENY not in caps and capability in caps

    def allows_namespace(self, namespace: str, capability: str) -> bool:
        """Whether `capability` is granted in `namespace` ('' = default)."""
        if capability not in NAMESPACE_CAPABILITIES or capability == DENY:
            raise ValueError(f"unknown namespace capability {capability!r}")
        if self.is_management:
            return True
        caps = self.namespace_capabilities(namespace)
        return DENY not in caps and capability in caps

    def allows_any_in_namespace(self, namespace: str) -> bool:
        """Whether any capability is granted in `namespace` (Nomad's
        AllowNamespace: may the namespace be seen at all)."""
        if self.is_management:
            return True
        caps = self.namespace_capabilities(namespace)
        return bool(caps) and DENY not in caps

    def allows(self, scope: str, level: str) -> bool:
        """Whether the node, agent or operator rule grants `level` (read or
        write; write implies read)."""
        if scope not in SCOPES:
            raise ValueError(f"unknown ACL scope {scope!r}")
        if level not in (READ, WRITE):
            raise ValueError(f"unknown ACL level {level!r}")
        if self.is_management:
            return True
        have = self._scopes[scope]
        return have != DENY and _RANK.get(have, 0) >= _RANK[level]


def _merge_scope(a: str, b: str) -> str:
    if DENY in (a, b):
        return DENY
    return a if _RANK.get(a, 0) >= _RANK.get(b, 0) else b


def compile_acl(policies: Iterable[PolicyRules], *, workload: WorkloadClaim | None = None) -> ACL:
    """One ACL from a token's policies: their union, where `deny` wins;
    with `workload`, the implicit policy of a workload identity too."""
    namespaces: dict[str, frozenset[str]] = {}
    pools: dict[str, frozenset[str]] = {}
    variables: dict[VariableKey, frozenset[str]] = {}
    scopes = dict.fromkeys(SCOPES, "")
    names: list[str] = []
    for p in policies:
        if p.name:
            names.append(p.name)
        for rules, merged_into in ((p.namespaces, namespaces), (p.node_pools, pools)):
            for label, caps in rules.items():
                merged = merged_into.get(label, frozenset()) | caps
                merged_into[label] = frozenset({DENY}) if DENY in merged else merged
        for key, caps in p.variables.items():
            variables[key] = _expand_variable_capabilities(variables.get(key, frozenset()) | caps)
        for scope in SCOPES:
            scopes[scope] = _merge_scope(scopes[scope], p.scope(scope))
    return ACL(
        namespaces=namespaces,
        node_pools=pools,
        node=scopes["node"],
        agent=scopes["agent"],
        operator=scopes["operator"],
        policies=names,
        variables=variables,
        workload=workload,
    )


MANAGEMENT = ACL(management=True)
DENY_ALL = ACL()

#: the ACL of the call being served (see the module docstring)
CURRENT: contextvars.ContextVar[ACL] = contextvars.ContextVar("corral_acl", default=MANAGEMENT)
#: the secret `CURRENT` was resolved from; None when it was not resolved from
#: a token (ACLs off, a server caller, an anonymous rule). A call that lasts
#: (Event.Stream) resolves it again, to notice a token deleted, expired or
#: given other policies while it runs.
CURRENT_TOKEN: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "corral_acl_token", default=None
)
