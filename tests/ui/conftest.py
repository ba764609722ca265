"""What every UI test module shares: one headless Chromium per module."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.ui.browser import new_driver


@pytest.fixture(scope="module")
def driver() -> Iterator[Any]:
    d = new_driver()
    try:
        yield d
    finally:
        d.quit()
