"""Process plumbing the role runner (corral/runtime/runner.py) uses: GC tuning, the
ready file that tells `corral dev` and the tests where a process listens,
and member registration with the state service."""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import os
import socket
import uuid
from pathlib import Path
from typing import Any

import grpc

from corral.security import transport
from corral.v1 import state_pb2, state_pb2_grpc

log = logging.getLogger(__name__)


def tune_gc() -> None:
    """Collect the young generation every 50,000 allocations instead of 700.

    A role holds its whole state as long-lived immutable maps and protobuf
    messages, and every request allocates thousands of short-lived objects:
    with the default threshold the collector runs hundreds of times a second
    and keeps re-walking the survivors. The oldest generation is left to run
    rarely; nothing here creates reference cycles on purpose."""
    gc.set_threshold(50_000, 20, 100)


def write_ready_file(path: str | None, **info: Any) -> None:
    """Atomically write {"role", "address", "pid", ...} once listening."""
    if not path:
        return
    info.setdefault("pid", os.getpid())
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_suffix(target.suffix + ".tmp")
    tmp.write_text(json.dumps(info))
    tmp.replace(target)


def new_member_id(role: str) -> str:
    return f"{role}-{socket.gethostname()}-{uuid.uuid4().hex[:8]}"


async def register_member_loop(
    state_addr: str,
    member: state_pb2.Member,
    stop: asyncio.Event,
    *,
    is_leader: Any = None,
) -> None:
    """Keep this process registered with the state service until `stop`.

    `is_leader` is an optional zero-argument callable reported as the
    member's leader flag on every refresh."""
    interval = 5.0
    async with transport.dial(state_addr) as channel:
        stub = state_pb2_grpc.StateStub(channel)
        while not stop.is_set():
            if is_leader is not None:
                member.leader = bool(is_leader())
            try:
                resp = await stub.RegisterMember(
                    state_pb2.RegisterMemberRequest(member=member), timeout=5
                )
                interval = max(1.0, resp.ttl_ms / 2000)
            except grpc.aio.AioRpcError as exc:
                log.debug("member registration failed: %s", exc.details())
                interval = 1.0
            try:
                await asyncio.wait_for(stop.wait(), interval)
            except TimeoutError:
                pass
