"""A node's dynamic metadata (Nomad's NodeMeta endpoint, `nomad node meta
apply`): keys set or unset through the API on top of the static ones of
the agent's configuration (`--meta`).

The agent keeps the dynamic part in its client state (a restarted agent
registers with it) and merges it into the node it registers, so the
servers, and the scheduler's `${meta.k}` constraints, see the merged map.
As Nomad: unsetting a key that is only dynamic forgets it, unsetting a
static key is remembered (a None value) so that it stays unset after a
restart.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from corral.domain.errors import InvalidArgument

#: an HCL identifier (a letter or `_`, then letters, digits, `_` or `-`):
#: metadata keys are interpolated in constraints, so each dotted part must be one
_IDENTIFIER = re.compile(r"[^\W\d][\w-]*")
#: keys one request may name
MAX_KEYS = 1000


def validate(changes: Mapping[str, str | None]) -> None:
    """Nomad's NodeMetaApplyRequest.Validate, and a bound on one request.
    The merged meta is bounded where every node's is, by the state (entries,
    key and value lengths, no NUL): a refused registration changes nothing."""
    if not changes:
        raise InvalidArgument("", "missing required Meta object")
    if len(changes) > MAX_KEYS:
        raise InvalidArgument("", f"Meta has {len(changes)} keys, more than {MAX_KEYS}")
    for key in changes:
        if not key:
            raise InvalidArgument("", "metadata keys must not be empty")
        if not all(_IDENTIFIER.fullmatch(part) for part in key.split(".")):
            raise InvalidArgument(
                "", f"{key!r} is invalid; metadata keys must be valid dotted hcl identifiers"
            )


@dataclass
class NodeMeta:
    """The static and dynamic metadata of this node, and their merge."""

    static: dict[str, str]
    dynamic: dict[str, str | None] = field(default_factory=dict)

    def merged(self) -> dict[str, str]:
        """The node's meta: static, overridden and unset by the dynamic."""
        out = dict(self.static)
        for key, value in self.dynamic.items():
            if value is None:
                out.pop(key, None)
            else:
                out[key] = value
        return out

    def applied(self, changes: Mapping[str, str | None]) -> dict[str, str | None]:
        """The dynamic metadata after `changes` (None unsets): a dynamic-only
        key unset is forgotten, a static one is kept as unset."""
        dynamic = dict(self.dynamic)
        for key, value in changes.items():
            if value is None and key not in self.static:
                dynamic.pop(key, None)
            else:
                dynamic[key] = value
        return dynamic
