"""Workload identities: the JWT the servers sign for each (alloc, task,
identity), with Nomad's claims, and its verification.

The claims are Nomad's (nomad/structs/workload_id.go): `nomad_namespace`,
`nomad_job_id`, `nomad_allocation_id`, `nomad_task`, `sub`
("<region>:<namespace>:<job>:<group>:<task>:<identity>"), `aud`, `iat`,
`nbf`, `exp` (only with a TTL; a default identity lives as long as its
alloc), `jti`, and `iss` when the state has an OIDC issuer. The header
names the root key that signed it (`kid`), so anyone can verify it with
the JWKS the gateway publishes.

Signing and verifying use PyJWT; this module only says what goes in and
what must come out. Keys come from `corral.security.keyring`.
"""

from __future__ import annotations

import re
import time
import uuid
from dataclasses import dataclass
from typing import Any

import jwt
from cryptography.hazmat.primitives.asymmetric import rsa

from corral.security.keyring import SIGNING_ALGORITHM, RootKeyMaterial

#: the audience of every task's default identity (Nomad's IdentityDefaultAud)
DEFAULT_AUDIENCE = "nomadproject.io"
DEFAULT_IDENTITY = "default"

_JWT_SHAPE = re.compile(r"^[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+$")
#: a token longer than this is not one we signed (bounds parsing cost)
MAX_JWT_CHARS = 16 * 1024


class IdentityError(Exception):
    """A token that is not a valid workload identity; the message is safe
    to show (it never holds the token)."""


@dataclass(frozen=True)
class WorkloadClaims:
    """What a workload identity says, before and after signing."""

    namespace: str
    job_id: str
    alloc_id: str
    task: str
    group: str
    identity: str
    audience: tuple[str, ...]
    issued_at: int  # Unix seconds
    expires_at: int = 0  # Unix seconds; 0 = no `exp`
    region: str = "global"
    issuer: str = ""
    jwt_id: str = ""

    @property
    def subject(self) -> str:
        return ":".join(
            (self.region, self.namespace, self.job_id, self.group, self.task, self.identity)
        )

    def to_jwt_claims(self) -> dict[str, Any]:
        claims: dict[str, Any] = {
            "nomad_namespace": self.namespace,
            "nomad_job_id": self.job_id,
            "nomad_allocation_id": self.alloc_id,
            "sub": self.subject,
            "aud": list(self.audience),
            "iat": self.issued_at,
            "nbf": self.issued_at,
            "jti": self.jwt_id or str(uuid.uuid4()),
        }
        if self.task:
            claims["nomad_task"] = self.task
        if self.expires_at:
            claims["exp"] = self.expires_at
        if self.issuer:
            claims["iss"] = self.issuer
        return claims


def sign(material: RootKeyMaterial, claims: WorkloadClaims) -> str:
    """The compact JWS of `claims`, RS256 under the root key's RSA key."""
    return jwt.encode(
        claims.to_jwt_claims(),
        material.rsa_key,
        algorithm=SIGNING_ALGORITHM,
        headers={"kid": material.key_id, "typ": "JWT"},
    )


def looks_like_jwt(secret: str) -> bool:
    """Whether a token is shaped as a JWT (an ACL secret is a UUID)."""
    return len(secret) <= MAX_JWT_CHARS and bool(_JWT_SHAPE.match(secret))


def key_id_of(token: str) -> str:
    """The `kid` of a JWT's header, unverified (to find the key)."""
    if not looks_like_jwt(token):
        raise IdentityError("not a workload identity")
    try:
        header = jwt.get_unverified_header(token)
    except jwt.PyJWTError:
        raise IdentityError("not a workload identity") from None
    kid = header.get("kid")
    if not isinstance(kid, str) or not kid or header.get("alg") != SIGNING_ALGORITHM:
        raise IdentityError("not a workload identity signed by this cluster")
    return kid


@dataclass(frozen=True)
class VerifiedIdentity:
    """A workload identity whose signature and times held."""

    namespace: str
    job_id: str
    alloc_id: str
    task: str
    identity: str
    expires_at: int  # Unix seconds; 0 = none


def verify(
    token: str, public_key: rsa.RSAPublicKey, *, now: float | None = None
) -> VerifiedIdentity:
    """Check a workload identity's signature, `nbf` and `exp` (no leeway:
    an expired identity is refused) and read who it speaks for. The
    audience is not checked: any identity the cluster signed authenticates
    its task to the cluster, as in Nomad."""
    at = time.time() if now is None else now
    try:
        claims: dict[str, Any] = jwt.decode(
            token,
            public_key,
            algorithms=[SIGNING_ALGORITHM],
            options={
                "verify_aud": False,
                "verify_exp": False,  # checked below, against `at`
                "verify_nbf": False,
                "verify_iat": False,
                "require": ["iat", "sub"],
            },
        )
    except jwt.PyJWTError:
        raise IdentityError("workload identity signature does not verify") from None
    exp = claims.get("exp", 0)
    if not isinstance(exp, int | float) or isinstance(exp, bool):
        raise IdentityError("workload identity has a malformed exp")
    if exp and exp <= at:
        raise IdentityError("workload identity expired")
    nbf = claims.get("nbf", 0)
    if isinstance(nbf, int | float) and nbf > at + 1:  # one second of clock skew
        raise IdentityError("workload identity not valid yet")
    fields = ("nomad_namespace", "nomad_job_id", "nomad_allocation_id")
    if not all(isinstance(claims.get(f), str) and claims.get(f) for f in fields):
        raise IdentityError("not a workload identity (its claims name no allocation)")
    sub = str(claims.get("sub", ""))
    return VerifiedIdentity(
        namespace=claims["nomad_namespace"],
        job_id=claims["nomad_job_id"],
        alloc_id=claims["nomad_allocation_id"],
        task=str(claims.get("nomad_task", "")),
        identity=sub.rsplit(":", 1)[-1] if ":" in sub else DEFAULT_IDENTITY,
        expires_at=int(exp),
    )
