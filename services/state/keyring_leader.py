"""What the state leader does for the keyring and Variables (Nomad's
leader: initializeKeyring, the core scheduler's root-key rotation and
variables rekey, and the variable lock TTL timers):

* a prepublished key becomes active at its publish time;
* the active key is replaced when it is `rotation_threshold` old: its
  successor is prepublished at half that age, so verifiers fetch its public
  key before the first identity signed with it (Nomad 1.9's rotation);
* after a full rotation, every variable of a `rekeying` key is re-encrypted
  with the active key, a batch per write, then the key becomes inactive;
* a variable lock not renewed within twice its TTL, then held through its
  lock delay, is removed.

Everything is decided in write transactions on rows read in them, so a
deposed leader running one more pass does no harm, and a new leader picks
up where the old one stopped (lock leases are on the database's clock).

The keyring's first key is made when it is first needed (a variable
write, a workload identity, a rotation), not when a leader is elected as
Nomad's: a cluster that never uses Variables never writes one, and a
state's start moves no index.
"""

from __future__ import annotations

import asyncio
import logging

from corral.security import keyring as kr
from services.state.app_context import StateContext
from services.state.writes import keyring as key_writes
from services.state.writes import variables as var_writes

log = logging.getLogger(__name__)

NS_PER_S = 1_000_000_000
#: how often (s) the leader looks for locks whose lease and delay ran out
LOCK_REAP_INTERVAL = 1.0


class KeyringLeader:
    def __init__(self, ctx: StateContext) -> None:
        self.ctx = ctx
        self.settings = ctx.keyring.settings

    async def rotate_if_due(self) -> None:
        """Activate a prepublished key whose time came; prepublish the active
        key's successor at half the rotation threshold."""
        async with self.ctx.write() as tx:
            activated = await key_writes.activate_due(tx)
        self.ctx.keyring.written(tx)
        if activated is not None:
            log.info("root key %s is now active", activated.key_id)
            return
        threshold = int(self.settings.rotation_threshold * NS_PER_S)
        keys = await self.ctx.keyring.list_meta()
        active = next((k for k in keys if k.state == kr.STATE_ACTIVE), None)
        if active is None or any(k.state == kr.STATE_PREPUBLISHED for k in keys):
            return
        async with self.ctx.write() as tx:
            if active.create_time + threshold // 2 > tx.now:
                return
            material = key_writes.new_material()
            publish = max(active.create_time + threshold, tx.now + 1)
            meta = await key_writes.rotate(
                tx, material, self.ctx.keyring.kek, full=False, publish_time=publish
            )
        self.ctx.keyring.remember(material)
        self.ctx.keyring.written(tx)
        log.info("root key %s prepublished, active from %d", meta.key_id, meta.publish_time)

    async def rekey(self) -> int:
        """Re-encrypt the variables of every rekeying key; how many."""
        done = 0
        for key in await self.ctx.keyring.list_meta():
            if key.state != kr.STATE_REKEYING:
                continue
            while not self.ctx.shutting_down.is_set():
                async with self.ctx.write() as tx:
                    n = await var_writes.rekey_batch(tx, self.ctx.keyring, key.key_id)
                self.ctx.keyring.written(tx)
                done += n
                if n == 0:
                    log.info("variables of root key %s re-encrypted; key inactive", key.key_id)
                    break
        return done

    async def reap_locks(self) -> int:
        """Remove the locks whose lease and lock delay ran out; how many."""
        released = 0
        for namespace, path, lock_id in await var_writes.due_locks(self.ctx.db):
            async with self.ctx.write() as tx:
                if await var_writes.release_expired(tx, namespace, path, lock_id):
                    released += 1
                    log.info("variable lock on %s/%s expired and was released", namespace, path)
        return released

    async def run_keyring(self) -> None:
        if not self.ctx.keyring.configured:
            log.warning("no --keyring-kek-file: Variables and workload identities are off")
            return
        while True:
            try:
                await self.rotate_if_due()
                await self.rekey()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("keyring maintenance failed")
            await self._sleep(self.settings.check_interval)

    async def run_locks(self) -> None:
        while True:
            try:
                await self.reap_locks()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("variable lock expiry failed")
            await asyncio.sleep(LOCK_REAP_INTERVAL)

    async def _sleep(self, seconds: float) -> None:
        """Sleep, waking early for a root-key write (a full rotation's
        rekey should not wait a whole check interval)."""
        start = self.ctx.feed.snapshot().table_index("root_keys")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + seconds
        while loop.time() < deadline:
            await self.ctx.feed.wait_advance(deadline - loop.time())
            if self.ctx.feed.snapshot().table_index("root_keys") != start:
                return
