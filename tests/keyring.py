"""The key-encryption key every state the tests start uses (one file per
test process, mode 0600), as `corral dev` makes one per data dir."""

from __future__ import annotations

import atexit
import functools
import shutil
import tempfile
from pathlib import Path

from corral.security.keyring import write_kek_file


@functools.cache
def session_kek_file() -> Path:
    root = Path(tempfile.mkdtemp(prefix="corral-kek-"))
    atexit.register(shutil.rmtree, root, ignore_errors=True)
    path = root / "keyring.kek"
    write_kek_file(path)
    return path
