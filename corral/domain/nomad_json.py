"""Reading Nomad's JSON request bodies (the HTTP API's, and the `-json`
specs of `namespace apply` and `node pool apply`): Go's decoder matches
keys without regard to case, takes null for "unset", and Nomad's JSON lists
every field whether used or not. A problem is a ValueError naming the field.
"""

from __future__ import annotations

from typing import Any


def body_field(body: dict[str, Any], name: str, default: Any = None) -> Any:
    """`body[name]`, matching the key without regard to case as Go's JSON
    decoding does (clients send `Unhealthyallocationids`, `secretid`...)."""
    if name in body:
        return body[name]
    lowered = name.lower()
    for key, value in body.items():
        if isinstance(key, str) and key.lower() == lowered:
            return value
    return default


def body_strings(value: Any, name: str) -> list[str]:
    """A request body's list of strings (null: none); ValueError otherwise."""
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ValueError(f"{name} must be a list of strings")
    return value


def body_string(value: Any, name: str) -> str:
    if value is None:
        return ""
    if not isinstance(value, str):
        raise ValueError(f"{name} must be a string")
    return value


def body_meta(value: Any) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise ValueError("Meta must be an object of strings")
    return value


def body_object(value: Any, name: str) -> dict[str, Any] | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise ValueError(f"{name} must be an object")
    return value


def refuse_unsupported(body: dict[str, Any], name: str, what: str) -> None:
    """A field Corral has no counterpart for: refused when it carries a
    value (Nomad's JSON lists every field, so empty ones pass)."""
    value = body_field(body, name)
    if value not in (None, "", 0, {}, []):
        raise ValueError(f"{name}: {what} are not supported by Corral")
