"""Headless Chromium for the UI tests: Debian's `chromium` driven through
its `chromedriver` by Selenium, with Selenium Manager kept offline (it must
never download a browser or a driver), and one screenshot per page saved
under test-artifacts/ui/."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "test-artifacts" / "ui"
CHROMEDRIVER = os.environ.get("CORRAL_CHROMEDRIVER", "/usr/bin/chromedriver")
MISSING = (
    "Debian's chromium and chromium-driver are not installed: `make chromium` installs "
    "them with apt-get (or set CORRAL_CHROMIUM / CORRAL_CHROMEDRIVER)"
)
WAIT_S = 45.0


def chromium_binary() -> str | None:
    explicit = os.environ.get("CORRAL_CHROMIUM")
    if explicit:
        return explicit if os.path.exists(explicit) else None
    return shutil.which("chromium") or shutil.which("chromium-browser")


def browser_available() -> bool:
    return chromium_binary() is not None and os.path.exists(CHROMEDRIVER)


def new_driver() -> Any:
    """A headless Chromium session, or a skip naming how to install it."""
    binary = chromium_binary()
    if binary is None or not os.path.exists(CHROMEDRIVER):
        pytest.skip(MISSING)
    # Selenium Manager would otherwise look for (and fetch) a driver itself
    os.environ["SE_OFFLINE"] = "true"
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    options = Options()
    options.binary_location = binary
    for arg in (
        "--headless=new",
        "--no-sandbox",  # root in containers
        "--disable-dev-shm-usage",
        "--disable-gpu",
        "--window-size=1280,1000",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-extensions",
    ):
        options.add_argument(arg)
    return webdriver.Chrome(options=options, service=Service(executable_path=CHROMEDRIVER))


def wait_until(driver: Any, what: str, check: Callable[[Any], Any], timeout: float = WAIT_S) -> Any:
    """WebDriverWait on the state meant, failing with what was awaited, the
    page's flash message and its live-status line."""
    from selenium.common.exceptions import (
        NoSuchElementException,
        StaleElementReferenceException,
        TimeoutException,
    )
    from selenium.webdriver.support.ui import WebDriverWait

    # the pages re-render tables as events arrive: an element read mid-render
    # is looked up again on the next poll
    ignored = (NoSuchElementException, StaleElementReferenceException)
    try:
        return WebDriverWait(driver, timeout, poll_frequency=0.2, ignored_exceptions=ignored).until(
            check
        )
    except TimeoutException:
        flash = driver.execute_script(
            "const f = document.getElementById('flash'); return f && !f.hidden ? f.textContent : ''"
        )
        live = driver.execute_script(
            "const l = document.getElementById('live'); return l ? l.textContent : ''"
        )
        raise AssertionError(
            f"timed out after {timeout:g} s waiting for {what} on {driver.current_url}; "
            f"flash={flash!r} live={live!r}"
        ) from None


def screenshot(driver: Any, name: str) -> Path:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / f"{name}.png"
    # the whole page, not just the window
    height = driver.execute_script("return document.documentElement.scrollHeight")
    driver.set_window_size(1280, max(1000, min(int(height) + 40, 4000)))
    driver.save_screenshot(str(path))
    driver.set_window_size(1280, 1000)
    return path
