"""The keyring's cryptography, pure: root keys, the key-encryption key that
wraps them at rest, AES-256-GCM for Variables, and the public half of a key
as a JWK. No I/O but reading and writing the key-encryption key's file.

A **root key** (Nomad's) is two keys under one id: a 256-bit data key that
encrypts Variables' items, and a 2048-bit RSA key that signs workload
identities (RS256, what Nomad 1.7+ signs with). Both are stored in the
state's `root_keys` table only **wrapped**: AES-256-GCM under the state
role's **key-encryption key** (KEK), 32 random bytes read from a file only
the state processes can read (docs/security.md). A database dump therefore
holds no usable key and no readable variable; the KEK alone decrypts
nothing either.

Every ciphertext carries its context as GCM associated data, so a blob
copied to another row (another key id, another variable's namespace or
path) fails to decrypt instead of decrypting to the wrong place.
"""

from __future__ import annotations

import base64
import hashlib
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from jwt.algorithms import RSAAlgorithm

ALGORITHM_AES256_GCM = "aes256-gcm"
ALGORITHMS: tuple[str, ...] = (ALGORITHM_AES256_GCM,)
#: the JWS algorithm of workload identities (Nomad 1.7+ prefers RSA)
SIGNING_ALGORITHM = "RS256"
RSA_BITS = 2048

STATE_ACTIVE = "active"
STATE_INACTIVE = "inactive"
STATE_REKEYING = "rekeying"
STATE_PREPUBLISHED = "prepublished"
STATE_DEPRECATED = "deprecated"
KEY_STATES: tuple[str, ...] = (
    STATE_ACTIVE,
    STATE_INACTIVE,
    STATE_REKEYING,
    STATE_PREPUBLISHED,
    STATE_DEPRECATED,
)

KEK_BYTES = 32
_NONCE_BYTES = 12


class KeyringError(Exception):
    """A key or ciphertext that cannot be used (wrong KEK, tampered blob,
    unreadable KEK file); the message says which and never holds key
    material."""


# ------------------------------------------------------------------- KEK


@dataclass(frozen=True)
class KeyEncryptionKey:
    """The key that wraps root keys at rest. `kek_id` is a fingerprint (not
    the key): stored beside each wrapped key, it tells a state started with
    another KEK file what is wrong instead of failing to decrypt."""

    key: bytes = field(repr=False)

    def __post_init__(self) -> None:
        if len(self.key) != KEK_BYTES:
            raise KeyringError(f"a key-encryption key is {KEK_BYTES} bytes, not {len(self.key)}")

    @property
    def kek_id(self) -> str:
        return hashlib.sha256(b"corral-kek-id\x00" + self.key).hexdigest()[:32]

    def wrap(self, key_id: str, purpose: str, material: bytes) -> bytes:
        return seal(self.key, material, _wrap_aad(key_id, purpose))

    def unwrap(self, key_id: str, purpose: str, blob: bytes) -> bytes:
        try:
            return unseal(self.key, blob, _wrap_aad(key_id, purpose))
        except KeyringError:
            raise KeyringError(
                f"root key {key_id}: its {purpose} does not unwrap with this key-encryption key"
            ) from None


def _wrap_aad(key_id: str, purpose: str) -> bytes:
    return f"corral-root-key\x00{purpose}\x00{key_id}".encode()


def new_kek_text() -> str:
    """A fresh key-encryption key as its file holds it (base64, one line)."""
    return base64.b64encode(os.urandom(KEK_BYTES)).decode() + "\n"


def write_kek_file(path: Path) -> None:
    """Create a KEK file with a fresh key, mode 0600 from the start (never
    chmod after writing); an existing file is kept."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return
    with os.fdopen(fd, "w") as f:
        f.write(new_kek_text())


def load_kek(path: Path) -> KeyEncryptionKey:
    """The KEK in `path`: base64 of 32 bytes. Refused when anyone but the
    owner and its group may read it, as ssh refuses a readable key."""
    try:
        mode = path.stat().st_mode
        text = path.read_text()
    except OSError as exc:
        raise KeyringError(
            f"cannot read the key-encryption key file {path}: {exc.strerror}"
        ) from None
    if mode & (stat.S_IROTH | stat.S_IWOTH):
        raise KeyringError(
            f"the key-encryption key file {path} is readable by others "
            f"(mode {stat.S_IMODE(mode):04o}); make it 0600"
        )
    try:
        key = base64.b64decode(text.strip(), validate=True)
    except ValueError:
        raise KeyringError(f"the key-encryption key file {path} does not hold base64") from None
    if len(key) != KEK_BYTES:
        raise KeyringError(
            f"the key-encryption key file {path} holds {len(key)} bytes, not {KEK_BYTES} "
            "(make one with `head -c 32 /dev/urandom | base64`)"
        )
    return KeyEncryptionKey(key)


# ------------------------------------------------------------- root keys


@dataclass(frozen=True)
class RootKeyMaterial:
    """An unwrapped root key: never stored, never logged, never sent."""

    key_id: str
    data_key: bytes = field(repr=False)
    rsa_key: rsa.RSAPrivateKey = field(repr=False)

    @classmethod
    def generate(cls, key_id: str) -> RootKeyMaterial:
        return cls(
            key_id=key_id,
            data_key=AESGCM.generate_key(bit_length=256),
            rsa_key=rsa.generate_private_key(public_exponent=65537, key_size=RSA_BITS),
        )

    def public_key_der(self) -> bytes:
        return self.rsa_key.public_key().public_bytes(
            serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
        )

    def wrapped(self, kek: KeyEncryptionKey) -> tuple[bytes, bytes]:
        """(wrapped data key, wrapped RSA key) for the `root_keys` row."""
        rsa_der = self.rsa_key.private_bytes(
            serialization.Encoding.DER,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
        return (
            kek.wrap(self.key_id, "data key", self.data_key),
            kek.wrap(self.key_id, "rsa key", rsa_der),
        )

    def exported(self) -> dict[str, str]:
        """The key in clear (base64), for an operator snapshot: a file that
        is a secret as a whole (0600, docs/operations.md), so a restore into
        another cluster can wrap the key with that cluster's KEK."""
        rsa_der = self.rsa_key.private_bytes(
            serialization.Encoding.DER,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
        return {
            "data_key": base64.b64encode(self.data_key).decode(),
            "rsa_key": base64.b64encode(rsa_der).decode(),
        }

    @classmethod
    def imported(cls, key_id: str, exported: dict[str, str]) -> RootKeyMaterial:
        """A key `exported` wrote; KeyringError when it is not one."""
        try:
            data_key = base64.b64decode(exported["data_key"], validate=True)
            private = serialization.load_der_private_key(
                base64.b64decode(exported["rsa_key"], validate=True), password=None
            )
        except (KeyError, TypeError, ValueError):
            raise KeyringError(f"root key {key_id}: its material is unreadable") from None
        if not isinstance(private, rsa.RSAPrivateKey) or len(data_key) != 32:
            raise KeyringError(f"root key {key_id}: its material is not what a root key holds")
        return cls(key_id=key_id, data_key=data_key, rsa_key=private)

    @classmethod
    def unwrap(
        cls, kek: KeyEncryptionKey, key_id: str, wrapped_key: bytes, wrapped_rsa_key: bytes
    ) -> RootKeyMaterial:
        data_key = kek.unwrap(key_id, "data key", wrapped_key)
        rsa_der = kek.unwrap(key_id, "rsa key", wrapped_rsa_key)
        private = serialization.load_der_private_key(rsa_der, password=None)
        if not isinstance(private, rsa.RSAPrivateKey) or len(data_key) != 32:
            raise KeyringError(f"root key {key_id}: its material is not what a root key holds")
        return cls(key_id=key_id, data_key=data_key, rsa_key=private)

    # ---------------------------------------------------------- variables

    def encrypt(self, plaintext: bytes, context: bytes) -> bytes:
        """Nonce and ciphertext (with its tag) of `plaintext`, bound to this
        key id and `context`."""
        return seal(self.data_key, plaintext, self._aad(context))

    def decrypt(self, blob: bytes, context: bytes) -> bytes:
        try:
            return unseal(self.data_key, blob, self._aad(context))
        except KeyringError:
            raise KeyringError(
                f"a ciphertext under root key {self.key_id} does not decrypt (tampered, or "
                "moved from another row)"
            ) from None

    def _aad(self, context: bytes) -> bytes:
        return b"corral-data\x00" + self.key_id.encode() + b"\x00" + context


def variable_context(namespace: str, path: str) -> bytes:
    """What a variable's ciphertext is bound to besides its key id."""
    return f"variable\x00{namespace}\x00{path}".encode()


def seal(key: bytes, plaintext: bytes, aad: bytes) -> bytes:
    """AES-256-GCM under `key`, bound to `aad`: a fresh nonce + ciphertext."""
    nonce = os.urandom(_NONCE_BYTES)
    return nonce + AESGCM(key).encrypt(nonce, plaintext, aad)


def unseal(key: bytes, blob: bytes, aad: bytes) -> bytes:
    """What `seal` sealed; KeyringError when the key or `aad` differ or the
    blob was changed."""
    if len(blob) < _NONCE_BYTES + 16:
        raise KeyringError("ciphertext too short")
    try:
        return AESGCM(key).decrypt(blob[:_NONCE_BYTES], blob[_NONCE_BYTES:], aad)
    except InvalidTag:
        raise KeyringError("ciphertext does not authenticate") from None


# ------------------------------------------------------------------- JWK


def public_jwk(
    key_id: str, public_key_der: bytes, *, algorithm: str = SIGNING_ALGORITHM
) -> dict[str, Any]:
    """The JSON Web Key of a root key's public half, as Nomad's JWKS
    publishes it (`kid`, `alg`, `use` = "sig", and the RSA `n`, `e`)."""
    public = serialization.load_der_public_key(public_key_der)
    if not isinstance(public, rsa.RSAPublicKey):
        raise KeyringError(f"root key {key_id}: its public key is not an RSA key")
    jwk: dict[str, Any] = RSAAlgorithm.to_jwk(public, as_dict=True)
    jwk.pop("key_ops", None)  # Nomad's JWKS does not say it
    jwk.update({"kid": key_id, "alg": algorithm, "use": "sig"})
    return jwk
