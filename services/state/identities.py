"""Workload identities in the state: signing them for a node's tasks, and
resolving one presented as a token to its implicit policy.

Where we sign differs from Nomad, on purpose. Nomad signs each task's
default identity when the plan is applied and stores the JWT in the alloc
(then sent to the client with it); named identities are signed on the
client's request (Alloc.SignIdentities). Corral signs every identity on the
client's request (`Node.SignIdentities`, from any state process, with the
keyring's active key) when a task starts, and again before a TTL runs out:
no JWT is ever stored, so none is in the database, the change log, the
replicas or the event stream, and the plan write (serialized on the index)
pays no RSA signature per alloc. A default identity has no `exp`, as in
Nomad: it is valid while its alloc is not terminal, which is checked every
time it is used.

Resolving (`resolve`) is Nomad's VerifyClaim + verifyWorkloadIdentityClaim
+ IdentityToACLClaim: the signature by the key its header names, its times,
then the alloc: it must exist, belong to the claimed job and namespace,
and not be terminal on its client.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from contextlib import AbstractAsyncContextManager

from corral.domain import identity as task_ids
from corral.domain import structs
from corral.domain.errors import PermissionDenied
from corral.domain.store import StateSnapshot
from corral.security import identity
from corral.v1 import acl_pb2, node_pb2
from corral.v1 import structs_pb2 as pb
from services.state.db.database import WriteTx
from services.state.feed import ChangeFeed
from services.state.keyring import Keyring

MISSING_ALLOC = "allocation not found"
MISSING_TASK = "task not found"
MISSING_IDENTITY = "identity not found"
MAX_REQUESTS = 1000

WriteFactory = Callable[[], AbstractAsyncContextManager[WriteTx]]


def workload_job_id(job: pb.Job) -> str:
    """The job a workload speaks for: a dispatched or periodic child's
    parent (Nomad's GetIDforWorkloadIdentity), so its variables are the
    parent's."""
    return job.parent_id or job.id


def _alloc_and_job(
    snap: StateSnapshot, alloc_id: str
) -> tuple[pb.Allocation | None, pb.Job | None]:
    """An alloc and the job version it runs, if both are in the state."""
    alloc: pb.Allocation | None = snap.allocs.get(alloc_id)
    if alloc is None:
        return None, None
    return alloc, snap.job_by_version(alloc.namespace, alloc.job_id, alloc.job_version)


class Identities:
    def __init__(
        self,
        keyring: Keyring,
        feed: ChangeFeed,
        write: WriteFactory,
        *,
        region: str = "global",
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.keyring = keyring
        self.feed = feed
        self._write = write
        self.region = region
        self._clock = clock

    # ---------------------------------------------------------------- sign

    async def sign(
        self, node_id: str, requests: Sequence[node_pb2.WorkloadIdentityRequest]
    ) -> node_pb2.NodeSignIdentitiesResponse:
        """JWTs for the requested (alloc, task, identity) of `node_id`'s
        allocs; what cannot be signed is rejected with Nomad's reason."""
        material = await self.keyring.signing_key()
        if material is None:  # a keyring with no key yet: make its first one
            async with self._write() as tx:
                material = await self.keyring.active_for_write(tx)
            self.keyring.written(tx)
        snap = self.feed.snapshot()
        now = int(self._clock())
        out = node_pb2.NodeSignIdentitiesResponse()
        for r in requests:
            alloc, job = _alloc_and_job(snap, r.alloc_id)
            if (
                alloc is None
                or job is None
                or alloc.node_id != node_id
                or structs.alloc_client_terminal(alloc)
            ):
                out.rejections.add(
                    alloc_id=r.alloc_id, task=r.task, identity=r.identity, reason=MISSING_ALLOC
                )
                continue
            tg = structs.task_group(job, alloc.task_group)
            task = next((t for t in tg.tasks if t.name == r.task), None) if tg else None
            if task is None:
                out.rejections.add(
                    alloc_id=r.alloc_id, task=r.task, identity=r.identity, reason=MISSING_TASK
                )
                continue
            name = r.identity or task_ids.DEFAULT_IDENTITY
            wid = task_ids.task_identity(task, name)
            if wid is None:
                out.rejections.add(
                    alloc_id=r.alloc_id, task=r.task, identity=r.identity, reason=MISSING_IDENTITY
                )
                continue
            default = name == task_ids.DEFAULT_IDENTITY
            expires = now + wid.ttl // 1_000_000_000 if wid.ttl and not default else 0
            claims = identity.WorkloadClaims(
                namespace=alloc.namespace or "default",
                job_id=workload_job_id(job),
                alloc_id=alloc.id,
                task=task.name,
                group=alloc.task_group,
                identity=name,
                audience=((task_ids.DEFAULT_AUDIENCE,) if default else tuple(wid.audience)),
                issued_at=now,
                expires_at=expires,
                region=self.region,
                issuer=self.keyring.issuer,
            )
            out.signed.add(
                alloc_id=alloc.id,
                task=task.name,
                identity=name,
                jwt=identity.sign(material, claims),
                expiration=expires * 1_000_000_000,
            )
        return out

    # ------------------------------------------------------------- resolve

    async def resolve(self, token: str) -> acl_pb2.ACLResolveTokenResponse:
        """What a workload identity may do, as ACL.ResolveToken answers it;
        PERMISSION_DENIED naming why it is refused."""
        try:
            kid = identity.key_id_of(token)
        except identity.IdentityError as exc:
            raise PermissionDenied(str(exc)) from None
        public = await self.keyring.public_key(kid)
        if public is None:
            raise PermissionDenied("workload identity signed by a key this cluster does not have")
        try:
            verified = identity.verify(token, public.key, now=self._clock())
        except identity.IdentityError as exc:
            raise PermissionDenied(str(exc)) from None
        claim = acl_pb2.WorkloadClaim(
            namespace=verified.namespace,
            job_id=verified.job_id,
            task=verified.task,
            alloc_id=verified.alloc_id,
            identity=verified.identity,
        )
        claim.group = self.check(claim)
        return acl_pb2.ACLResolveTokenResponse(
            accessor_id="",
            type="client",
            expiration_time=verified.expires_at * 1_000_000_000,
            workload=claim,
        )

    def check(self, claim: acl_pb2.WorkloadClaim) -> str:
        """Refuse a workload whose alloc is gone, terminal on its client, or
        not the claimed job's; its task group otherwise. Run on every use:
        a default identity never expires, its alloc ending is what ends it."""
        alloc, job = _alloc_and_job(self.feed.snapshot(), claim.alloc_id)
        if (
            alloc is None
            or job is None
            or (alloc.namespace or "default") != claim.namespace
            or workload_job_id(job) != claim.job_id
        ):
            raise PermissionDenied("workload identity: allocation does not exist")
        if structs.alloc_client_terminal(alloc):
            raise PermissionDenied("workload identity: allocation is terminal")
        return alloc.task_group
