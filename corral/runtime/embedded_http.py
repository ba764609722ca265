"""An HTTP server (uvicorn) inside a role's own event loop: the role's
runner owns the process's signals, so uvicorn must not install its own
handlers (it would take SIGTERM from the runner and exit on its own). The
gateway serves Nomad's API with it, the client agent each task's Task API."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import uvicorn


class EmbeddedServer(uvicorn.Server):
    """uvicorn.Server without signal handling (stop it with `should_exit`)."""

    def install_signal_handlers(self) -> None:  # uvicorn < 0.29
        return None

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:  # uvicorn >= 0.29
        yield
