"""ACL tokens, policies and roles: proto → Nomad's JSON (api/acl.go's
`ACLToken`, `ACLTokenListStub`, `ACLPolicy`, `ACLPolicyListStub`, `ACLRole`,
`ACLRoleListStub`) and Nomad's request bodies → our requests.

A secret id appears only where our API hands one out (bootstrap, token
create, one-time token create and exchange) and in /v1/acl/token/self,
which echoes the caller's own secret as Nomad does; everywhere else
`SecretID` is empty (the state keeps only a hash of it)."""

from __future__ import annotations

from typing import Any

from corral.domain.jobspec.duration import parse_duration
from corral.domain.nomad_json import body_field as field
from corral.domain.nomad_json import body_object as _object
from corral.domain.nomad_json import body_string as _string
from corral.domain.nomad_json import body_strings as _strings
from corral.v1 import acl_pb2
from services.gateway.mapping.common import from_rfc3339, rfc3339


def policy_stub(p: acl_pb2.ACLPolicy) -> dict[str, Any]:
    return {
        "Name": p.name,
        "Description": p.description,
        "JobACL": None,
        "CreateIndex": p.create_index,
        "ModifyIndex": p.modify_index,
    }


def policy(p: acl_pb2.ACLPolicy) -> dict[str, Any]:
    return {**policy_stub(p), "Rules": p.rules}


def token_stub(t: acl_pb2.ACLToken) -> dict[str, Any]:
    return {
        "AccessorID": t.accessor_id,
        "Name": t.name,
        "Type": t.type,
        "Policies": list(t.policies) or None,
        "Roles": [{"ID": r.id, "Name": r.name} for r in t.roles] or None,
        "Global": t.is_global,
        "CreateTime": rfc3339(t.create_time),
        "ExpirationTime": rfc3339(t.expiration_time) if t.expiration_time else None,
        "CreateIndex": t.create_index,
        "ModifyIndex": t.modify_index,
    }


def token(t: acl_pb2.ACLToken, secret_id: str | None = None) -> dict[str, Any]:
    """The full token; `secret_id` overrides the (usually empty) one in `t`."""
    ttl = t.expiration_time - t.create_time if t.expiration_time else 0
    return {
        **token_stub(t),
        "SecretID": t.secret_id if secret_id is None else secret_id,
        "ExpirationTTL": ttl,
    }


def one_time_token(t: acl_pb2.ACLOneTimeToken) -> dict[str, Any]:
    """Nomad's `OneTimeToken`, its secret included (only the create answer
    has one)."""
    return {
        "OneTimeSecretID": t.one_time_secret_id,
        "AccessorID": t.accessor_id,
        "ExpiresAt": rfc3339(t.expires_at),
        "CreateIndex": t.create_index,
        "ModifyIndex": t.modify_index,
    }


def exchange_request(body: dict[str, Any]) -> acl_pb2.ACLExchangeOneTimeTokenRequest:
    """POST /v1/acl/token/onetime/exchange's body (Nomad's
    `OneTimeTokenExchangeRequest`)."""
    secret = _string(field(body, "OneTimeSecretID"), "OneTimeSecretID")
    if not secret:
        raise ValueError("OneTimeSecretID is required")
    return acl_pb2.ACLExchangeOneTimeTokenRequest(one_time_secret_id=secret)


def policy_from_body(name: str, body: dict[str, Any]) -> acl_pb2.ACLPolicy:
    """POST /v1/acl/policy/:name's body; a `Name` in it must match the path."""
    named = _string(field(body, "Name"), "Name")
    if named and named != name:
        raise ValueError(f"policy name in the body ({named!r}) does not match the URL ({name!r})")
    return acl_pb2.ACLPolicy(
        name=name,
        description=_string(field(body, "Description"), "Description"),
        rules=_string(field(body, "Rules"), "Rules"),
    )


def _ttl(value: Any) -> int:
    """`ExpirationTTL`: nanoseconds, or a duration string ("1h"); "" is no
    TTL (what Nomad's Go client sends for a token without one)."""
    if value is None or value == "":
        return 0
    if isinstance(value, bool):
        raise ValueError("ExpirationTTL must be a duration")
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        try:
            return parse_duration(value)
        except ValueError as exc:
            raise ValueError(f"ExpirationTTL: {exc}") from None
    raise ValueError("ExpirationTTL must be a duration")


def create_token_request(body: dict[str, Any]) -> acl_pb2.ACLCreateTokenRequest:
    """POST /v1/acl/token's body (Nomad's `ACLToken` without ids)."""
    if _string(field(body, "AccessorID"), "AccessorID"):
        raise ValueError("AccessorID must be empty when creating a token")
    global_ = field(body, "Global", False)
    if not isinstance(global_, bool):
        raise ValueError("Global must be true or false")
    return acl_pb2.ACLCreateTokenRequest(
        name=_string(field(body, "Name"), "Name"),
        type=_string(field(body, "Type"), "Type") or "client",
        policies=_strings(field(body, "Policies"), "Policies"),
        roles=role_links(field(body, "Roles")),
        is_global=global_,
        expiration_ttl=_ttl(field(body, "ExpirationTTL")),
    )


def update_token_request(accessor_id: str, body: dict[str, Any]) -> acl_pb2.ACLUpdateTokenRequest:
    """PUT /v1/acl/token/:accessor_id's body: the token as read, changed
    (Nomad's `ACLToken`; its `AccessorID` must be the path's)."""
    if _string(field(body, "AccessorID"), "AccessorID") != accessor_id:
        raise ValueError("ACL token accessor does not match request path")
    global_ = field(body, "Global", False)
    if not isinstance(global_, bool):
        raise ValueError("Global must be true or false")
    expires = field(body, "ExpirationTime")
    if expires is not None and not isinstance(expires, str):
        raise ValueError("ExpirationTime must be an RFC 3339 time")
    return acl_pb2.ACLUpdateTokenRequest(
        accessor_id=accessor_id,
        name=_string(field(body, "Name"), "Name"),
        type=_string(field(body, "Type"), "Type") or "client",
        policies=_strings(field(body, "Policies"), "Policies"),
        roles=role_links(field(body, "Roles")),
        is_global=global_,
        expiration_ttl=_ttl(field(body, "ExpirationTTL")),
        expiration_time=from_rfc3339(expires) if expires else 0,
    )


def bootstrap_request(body: dict[str, Any] | None) -> acl_pb2.ACLBootstrapRequest:
    """`{"BootstrapSecret": "<uuid>"}` chooses the management secret."""
    secret = _string(field(body or {}, "BootstrapSecret"), "BootstrapSecret")
    return acl_pb2.ACLBootstrapRequest(secret_id=secret)


def role_links(value: Any) -> list[acl_pb2.ACLTokenRoleLink]:
    """A token body's `Roles`: `[{"ID": ...} | {"Name": ...}]` (null: none)."""
    if value is None:
        return []
    if not isinstance(value, list):
        raise ValueError("Roles must be a list of {ID} or {Name} objects")
    links = []
    for i, item in enumerate(value):
        link = _object(item, f"Roles[{i}]") or {}
        links.append(
            acl_pb2.ACLTokenRoleLink(
                id=_string(field(link, "ID"), f"Roles[{i}].ID"),
                name=_string(field(link, "Name"), f"Roles[{i}].Name"),
            )
        )
    return links


def role(r: acl_pb2.ACLRole) -> dict[str, Any]:
    """Nomad's `ACLRole` (its `ACLRoleListStub` has the same fields)."""
    return {
        "ID": r.id,
        "Name": r.name,
        "Description": r.description,
        "Policies": [{"Name": p} for p in r.policies],
        "CreateIndex": r.create_index,
        "ModifyIndex": r.modify_index,
    }


def role_from_body(body: dict[str, Any], path_id: str = "") -> acl_pb2.ACLRole:
    """PUT/POST /v1/acl/role(/:id)'s body (Nomad's `ACLRole`): with a path
    id, the body's `ID` must be it (Nomad's check)."""
    role_id = _string(field(body, "ID"), "ID")
    if path_id and role_id != path_id:
        raise ValueError("ACL role ID does not match request path")
    policies = field(body, "Policies")
    if policies is not None and not isinstance(policies, list):
        raise ValueError("Policies must be a list of {Name} objects")
    names = []
    for i, item in enumerate(policies or ()):
        link = _object(item, f"Policies[{i}]") or {}
        names.append(_string(field(link, "Name"), f"Policies[{i}].Name"))
    return acl_pb2.ACLRole(
        id=role_id,
        name=_string(field(body, "Name"), "Name"),
        description=_string(field(body, "Description"), "Description"),
        policies=names,
    )
