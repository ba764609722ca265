"""Eval tokens the planner can check without asking the broker (issue 30).

The broker leader hands every dequeue a token; Nomad's planner checks a
plan's token against the broker (`PauseNackTimeout`) in the middle of
`Plan.Submit`. Here the broker and the planner are separate processes, so
that check was two calls per plan. Instead the broker signs each token
with a key of its term (HMAC-SHA256 of the eval id and a random nonce) and
gives the key to the planner leader over `Eval.PlanFence`; the planner
verifies a token on its own and learns the tokens the broker revokes
(services/planner/fence.py, services/broker/plan_fence.py).

A token is `<term>.<nonce>.<mac>`: the term names the key (a new broker
leader, a new key: the old leader's tokens mean nothing to the new one).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets

#: hex digits of the MAC kept in a token (128 bits)
MAC_HEX = 32


def new_key() -> tuple[str, bytes]:
    """A fresh term name and signing key."""
    return secrets.token_hex(4), secrets.token_bytes(32)


def _mac(key: bytes, term: str, eval_id: str, nonce: str) -> str:
    msg = f"{eval_id}.{term}.{nonce}".encode()
    return hmac.new(key, msg, hashlib.sha256).hexdigest()[:MAC_HEX]


def sign(key: bytes, term: str, eval_id: str) -> str:
    """A new token for a delivery of `eval_id`."""
    nonce = secrets.token_hex(12)
    return f"{term}.{nonce}.{_mac(key, term, eval_id, nonce)}"


def term_of(token: str) -> str:
    """The term a token claims ("" when it is not a token at all)."""
    parts = token.split(".")
    return parts[0] if len(parts) == 3 else ""


def verify(key: bytes, term: str, eval_id: str, token: str) -> bool:
    """Whether `token` was signed with (`term`, `key`) for `eval_id`."""
    parts = token.split(".")
    if len(parts) != 3 or parts[0] != term:
        return False
    return hmac.compare_digest(parts[2], _mac(key, term, eval_id, parts[1]))
