"""The state process's keyring (Nomad's Encrypter): root keys read from the
`root_keys` table, unwrapped with this process's key-encryption key and
kept in memory, to encrypt and decrypt Variables and to sign and verify
workload identities.

Every state process holds one, all reading the same table with the same
KEK file (`--keyring-kek-file`): any of them serves any read or write. A
write reads the active key's id inside its own transaction (the index
lock keeps it current) and uses the unwrapped material of that id, which
never changes; what is cached is therefore always right, except the id of
the active key used outside a transaction (for signing), which every
root-key write drops (`follow`).

Without a KEK file nothing here works: Variables, the Keyring service and
workload identities answer FAILED_PRECONDITION naming the setting.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from corral.domain import topics
from corral.domain.errors import ConfigError, FailedPrecondition
from corral.security import keyring as kr
from corral.v1 import structs_pb2 as pb
from services.state.config import KeyringSettings
from services.state.db.database import Database, WriteTx
from services.state.feed import ChangeFeed
from services.state.writes import keyring as key_writes

log = logging.getLogger(__name__)

TABLE = "root_keys"
NO_KEK = (
    "the keyring has no key-encryption key: start every state process with "
    "--keyring-kek-file (CORRAL_KEYRING_KEK_FILE), see docs/security.md"
)


@dataclass(frozen=True)
class PublicKey:
    key_id: str
    der: bytes
    key: rsa.RSAPublicKey
    create_time: int
    state: str


class Keyring:
    def __init__(self, db: Database, settings: KeyringSettings) -> None:
        self.db = db
        self.settings = settings
        self.issuer = settings.oidc_issuer
        self._kek: kr.KeyEncryptionKey | None = None
        if settings.kek_file is not None:
            try:
                self._kek = kr.load_kek(settings.kek_file)
            except kr.KeyringError as exc:
                raise ConfigError(str(exc)) from None
        self._materials: dict[str, kr.RootKeyMaterial] = {}
        self._publics: dict[str, PublicKey] = {}
        #: the active key's id as last read outside a transaction
        self._active: str | None = None

    # ------------------------------------------------------------ the KEK

    @property
    def configured(self) -> bool:
        return self._kek is not None

    @property
    def kek(self) -> kr.KeyEncryptionKey:
        if self._kek is None:
            raise FailedPrecondition(NO_KEK)
        return self._kek

    def require(self) -> None:
        """Refuse (FAILED_PRECONDITION naming the setting) without a KEK."""
        if self._kek is None:
            raise FailedPrecondition(NO_KEK)

    # ----------------------------------------------------------- material

    def remember(self, material: kr.RootKeyMaterial) -> None:
        """Keep a key this process just made (its row is not committed yet)."""
        self._materials[material.key_id] = material

    async def material(
        self, key_id: str, conn: psycopg.AsyncConnection[Any] | None = None
    ) -> kr.RootKeyMaterial:
        """The unwrapped root key `key_id` (read through `conn` inside a
        transaction, else from the pool)."""
        kek = self.kek
        cached = self._materials.get(key_id)
        if cached is not None:
            return cached
        sql = "SELECT kek_id, wrapped_key, wrapped_rsa_key FROM root_keys WHERE key_id = %s"
        rows = await self._fetch(sql, (key_id,), conn)
        if not rows:
            raise FailedPrecondition(f"root key {key_id} is not in the keyring (it was deleted)")
        kek_id, wrapped, wrapped_rsa = rows[0]
        if kek_id != kek.kek_id:
            raise FailedPrecondition(
                f"root key {key_id} was wrapped by another key-encryption key: every state "
                "process needs the same --keyring-kek-file"
            )
        try:
            # unwrapping parses an RSA key: a few ms of CPU, once per key
            material = await asyncio.to_thread(
                kr.RootKeyMaterial.unwrap, kek, key_id, bytes(wrapped), bytes(wrapped_rsa)
            )
        except kr.KeyringError as exc:
            raise FailedPrecondition(str(exc)) from None
        self._materials[key_id] = material
        return material

    async def active_key_id(self, tx: WriteTx) -> str | None:
        """The active key's id as this transaction sees it."""
        cur = await tx.conn.execute(
            "SELECT key_id FROM root_keys WHERE state = 'active' ORDER BY create_index DESC LIMIT 1"
        )
        row = await cur.fetchone()
        return str(row[0]) if row else None

    async def active_for_write(self, tx: WriteTx) -> kr.RootKeyMaterial:
        """The key a write encrypts with: the active one, read in `tx`. A
        keyring with no key at all gets its first one here, in `tx` (the
        state leader also makes it as soon as it is elected)."""
        key_id = await self.active_key_id(tx)
        if key_id is None:
            material = await key_writes.initialize(tx, self.kek)
            if material is not None:
                self.remember(material)
                return material
            raise FailedPrecondition("the keyring has no active root key: rotate it")
        return await self.material(key_id, tx.conn)

    async def signing_key(self) -> kr.RootKeyMaterial | None:
        """The active key, read outside a transaction (cached until the next
        root-key write); None when the keyring has none yet."""
        self.require()
        if self._active is None:
            rows = await self._fetch(
                "SELECT key_id FROM root_keys WHERE state = 'active' "
                "ORDER BY create_index DESC LIMIT 1",
                (),
            )
            if not rows:
                return None
            self._active = str(rows[0][0])
        return await self.material(self._active)

    # ------------------------------------------------------------ publics

    async def public_key(self, key_id: str) -> PublicKey | None:
        """The public half of `key_id` (from the table: it needs no KEK)."""
        cached = self._publics.get(key_id)
        if cached is not None:
            return cached
        rows = await self._fetch(
            "SELECT public_key, create_time, state FROM root_keys WHERE key_id = %s", (key_id,)
        )
        if not rows:
            return None
        der, created, state = bytes(rows[0][0]), int(rows[0][1]), str(rows[0][2])
        key = serialization.load_der_public_key(der)
        if not isinstance(key, rsa.RSAPublicKey):
            return None
        found = PublicKey(key_id, der, key, created, state)
        self._publics[key_id] = found
        return found

    # --------------------------------------------------------------- reads

    async def list_meta(self) -> list[pb.RootKeyMeta]:
        rows = await self._fetch(
            f"SELECT {key_writes.META_COLUMNS} FROM root_keys ORDER BY create_index, key_id", ()
        )
        return [key_writes.meta_from_row(r) for r in rows]

    async def list_public(self) -> list[pb.KeyringPublicKey]:
        """Every key but deprecated ones, as the JWKS publishes them."""
        rows = await self._fetch(
            "SELECT key_id, public_key, create_time FROM root_keys "
            "WHERE state <> 'deprecated' ORDER BY create_index, key_id",
            (),
        )
        return [
            pb.KeyringPublicKey(
                key_id=r[0],
                algorithm=kr.SIGNING_ALGORITHM,
                public_key=bytes(r[1]),
                use="sig",
                create_time=int(r[2]),
            )
            for r in rows
        ]

    async def _fetch(
        self,
        sql: str,
        params: Sequence[Any],
        conn: psycopg.AsyncConnection[Any] | None = None,
    ) -> list[tuple[Any, ...]]:
        if conn is not None:
            cur = await conn.execute(sql, params)
            return await cur.fetchall()
        async with self.db.read() as c:
            cur = await c.execute(sql, params)
            return await cur.fetchall()

    # ------------------------------------------------------- invalidation

    def changed(self, key_id: str, deleted: bool) -> None:
        """A root-key write: the active key may have moved; a deleted key's
        material is dropped."""
        self._active = None
        if deleted:
            self._materials.pop(key_id, None)
            self._publics.pop(key_id, None)
        else:
            self._publics.pop(key_id, None)  # its state changed

    def forget(self) -> None:
        """The state was replaced (a snapshot restore): every cached key
        may be gone or another."""
        self._active = None
        self._materials.clear()
        self._publics.clear()

    def written(self, tx: WriteTx) -> None:
        """After this process's own root-key write committed."""
        for batch in tx.batches:
            for ev in batch.events:
                if ev.topic == topics.ROOT_KEY.name:
                    self.changed(ev.key, ev.deleted)

    async def follow(self, feed: ChangeFeed, stop: asyncio.Event) -> None:
        """Apply every state process's root-key writes, until `stop`."""
        while not stop.is_set():
            try:
                async for batch in feed.subscribe(feed.index, stop):
                    for ev in batch.events:
                        if ev.topic == topics.ROOT_KEY.name:
                            self.changed(ev.key, ev.deleted)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # fell behind the retained log: start over
                log.warning("keyring feed follow restarted: %s", exc)
                self._active = None
                self._publics.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), 1.0)
