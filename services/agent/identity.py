"""A task's workload identities on the client (Nomad's identity hook and
widmgr): before the task starts, the state signs its JWTs
(`Node.SignIdentities`, the node's secret as proof) and they reach the task
as Nomad puts them there:

* the default identity as `NOMAD_TOKEN` (`identity { env = true }`) and
  `secrets/nomad_token` (`file = true`);
* a named one as `NOMAD_TOKEN_<name>` and `secrets/nomad_<name>.jwt`;
* `filepath` puts the file elsewhere in the task directory.

Files are created mode 0600 (never chmod after writing), owned by the
user the task runs as (its `user`, or the exec driver's `nobody`) when the
agent runs as root. An identity with a TTL is
signed again when a third of it is left and its file rewritten (its
environment variable cannot change in a running process: Nomad warns the
same). Only identities a task exposes are signed; the default identity of
a task that asks for nothing stays unsigned until something needs it (the
Task API, templates).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import pwd
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path

import grpc

from corral.domain import identity as ids
from corral.v1 import node_pb2
from corral.v1 import structs_pb2 as pb

log = logging.getLogger(__name__)

ENV_DEFAULT = "NOMAD_TOKEN"
DEFAULT_FILE = "nomad_token"
#: renew when this share of the TTL is left (Nomad renews at about a third)
RENEW_AT = 1 / 3

#: signs (alloc, task, identity names) for this node: the agent's call
Signer = Callable[[str, str, Sequence[str]], Awaitable[node_pb2.NodeSignIdentitiesResponse]]


class IdentityError(Exception):
    """An identity the task needs could not be had (the task fails to
    start, naming it)."""


def exposed(task: pb.Task) -> list[pb.WorkloadIdentity]:
    """The task's identities that reach it (env or file)."""
    out = []
    default = ids.task_identity(task, ids.DEFAULT_IDENTITY)
    if default is not None and (default.env or default.file):
        out.append(default)
    out += [w for w in task.identities if w.env or w.file]
    return out


def env_name(wid: pb.WorkloadIdentity) -> str:
    return ENV_DEFAULT if wid.name == ids.DEFAULT_IDENTITY else f"{ENV_DEFAULT}_{wid.name}"


def file_path(wid: pb.WorkloadIdentity, task_dir: Path) -> Path:
    if wid.filepath:
        return task_dir / wid.filepath
    name = DEFAULT_FILE if wid.name == ids.DEFAULT_IDENTITY else f"nomad_{wid.name}.jwt"
    return task_dir / "secrets" / name


def write_secret(path: Path, content: str, user: str = "") -> None:
    """`content` into `path`, mode 0600 from its creation, replaced
    atomically (a reader never sees half a token)."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = path.with_name(f".{path.name}.tmp")
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.write(fd, content.encode())
        if user and os.geteuid() == 0:
            try:
                entry = pwd.getpwnam(user)
            except KeyError:
                raise IdentityError(f"user {user!r} does not exist on this node") from None
            os.fchown(fd, entry.pw_uid, entry.pw_gid)
    finally:
        os.close(fd)
    os.replace(tmp, path)


class TaskIdentities:
    """The identities of one task: fetched and written before each start
    (`setup`), renewed while it runs (`renew`)."""

    def __init__(
        self, sign: Signer, alloc_id: str, task: pb.Task, task_dir: Path, *, owner: str = ""
    ) -> None:
        """`owner` is the user the task runs as (its files are that user's)."""
        self._sign = sign
        self.alloc_id = alloc_id
        self.task = task
        self.task_dir = task_dir
        self.owner = owner
        self.wanted = exposed(task)
        #: identity name -> expiry (Unix s; 0 = none) of what was written
        self.expires: dict[str, float] = {}
        #: the default identity's JWT once signed (it has no TTL: valid while
        #: the alloc runs)
        self._default_token = ""

    async def _fetch(self, wanted: Sequence[pb.WorkloadIdentity]) -> dict[str, str]:
        try:
            resp = await self._sign(self.alloc_id, self.task.name, [w.name for w in wanted])
        except grpc.aio.AioRpcError as exc:
            raise IdentityError(f"the servers did not sign it: {exc.details()}") from None
        if resp.rejections:
            r = resp.rejections[0]
            raise IdentityError(f"identity {r.identity!r} was refused: {r.reason}")
        out = {}
        for signed in resp.signed:
            out[signed.identity] = signed.jwt
            self.expires[signed.identity] = signed.expiration / 1e9
        missing = [w.name for w in wanted if w.name not in out]
        if missing:
            raise IdentityError(f"identity {missing[0]!r} was not signed")
        return out

    def _write(self, wid: pb.WorkloadIdentity, token: str) -> None:
        if wid.file:
            write_secret(file_path(wid, self.task_dir), token, self.owner)

    async def setup(self) -> dict[str, str]:
        """Fetch every exposed identity, write their files; the environment
        variables to add to the task's."""
        if not self.wanted:
            return {}
        tokens = await self._fetch(self.wanted)
        self._default_token = tokens.get(ids.DEFAULT_IDENTITY, self._default_token)
        env = {}
        for wid in self.wanted:
            self._write(wid, tokens[wid.name])
            if wid.env:
                env[env_name(wid)] = tokens[wid.name]
        return env

    async def default_token(self) -> str:
        """The task's default identity, whether or not the task sees it:
        what its templates read the cluster with (Nomad's templates use the
        task's identity, never the node's). Raises IdentityError."""
        if not self._default_token:
            default = ids.task_identity(self.task, ids.DEFAULT_IDENTITY)
            assert default is not None  # every task has one
            self._default_token = (await self._fetch([default]))[ids.DEFAULT_IDENTITY]
        return self._default_token

    async def refresh(self) -> None:
        """After an agent restart, for a task adopted still running: sign its
        TTL identities again and rewrite their files (when they expire was
        not kept), so that `renew` goes on from there."""
        expiring = [w for w in self.wanted if w.ttl]
        if expiring:
            tokens = await self._fetch(expiring)
            for wid in expiring:
                self._write(wid, tokens[wid.name])

    def _next_renewal(self) -> float | None:
        """Seconds until the first identity with a TTL needs renewing."""
        due = [
            exp - w.ttl / 1e9 * RENEW_AT
            for w in self.wanted
            if w.ttl and (exp := self.expires.get(w.name, 0))
        ]
        return max(0.0, min(due) - time.time()) if due else None

    async def renew(self) -> None:
        """Sign the TTL identities again before they expire and rewrite their
        files, until cancelled; failures are retried (the old token stays
        until it expires)."""
        while True:
            wait = self._next_renewal()
            if wait is None:
                return
            await asyncio.sleep(wait)
            expiring = [w for w in self.wanted if w.ttl]
            try:
                tokens = await self._fetch(expiring)
            except Exception as exc:
                log.warning("renewing the identities of task %s failed: %s", self.task.name, exc)
                await asyncio.sleep(min(30.0, max(1.0, (self._next_renewal() or 5.0) / 4)))
                continue
            for wid in expiring:
                self._write(wid, tokens[wid.name])
