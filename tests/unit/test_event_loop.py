"""corral/runtime/event_loop.py: the setting picks the loop every role runs on."""

from __future__ import annotations

import asyncio

import uvloop

from corral.runtime import event_loop
from corral.runtime.settings import ProcessSettings


async def _loop_type() -> type:
    return type(asyncio.get_running_loop())


def test_uvloop_by_default_and_asyncio_on_request() -> None:
    assert ProcessSettings.model_fields["event_loop"].default == "uvloop"
    assert issubclass(event_loop.run(_loop_type(), "uvloop"), uvloop.Loop)
    plain = event_loop.run(_loop_type(), "asyncio")
    assert not issubclass(plain, uvloop.Loop)
    assert issubclass(plain, asyncio.BaseEventLoop)
