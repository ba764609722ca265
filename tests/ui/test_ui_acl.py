"""The web UI with ACLs on (`corral dev -acl`), in headless Chromium: without
a token the pages show the gateway's 403; the token box keeps a token in
localStorage and every request carries it; a read-only token sees the data
but not the actions it may not take, and an action forced anyway shows the
403 message."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.devprocess import DevProcess, start_dev, stop_dev
from tests.ui.browser import MISSING, browser_available, screenshot, wait_until
from tests.ui.test_ui import ROOT, get_json, http_base, open_page, present
from tests.wait import wait_for

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not browser_available(), reason=MISSING),
]

READER_POLICY = 'namespace "default" {\n  policy = "read"\n}\nnode {\n  policy = "read"\n}\n'


def management_token(dev: DevProcess) -> str:
    for line in dev.info["exports"]:
        if line.startswith("export CORRAL_TOKEN="):
            return str(line.split("=", 1)[1])
    raise AssertionError(f"no bootstrap token in dev.json: {dev.info['exports']}")


def corral(dev: DevProcess, *args: str, token: str, stdin: str = "") -> str:
    env = {k: v for k, v in os.environ.items() if k != "CORRAL_TOKEN"}
    env["CORRAL_ADDR"] = dev.info["address"]
    env["CORRAL_TOKEN"] = token
    proc = subprocess.run(
        [sys.executable, "-m", "cli", *args], cwd=ROOT, env=env, input=stdin,
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


@pytest.fixture(scope="module")
def acl_dev(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevProcess]:
    started = start_dev(tmp_path_factory.mktemp("corral-ui-acl"), "-acl")
    try:
        mgmt = management_token(started)
        wait_for(
            "the dev client node over HTTP",
            lambda: [
                n
                for n in get_json(http_base(started) + "/v1/nodes", mgmt)
                if n["Status"] == "ready"
            ],
        )
        yield started
    finally:
        stop_dev(started)


@pytest.fixture(scope="module")
def reader_token(acl_dev: DevProcess) -> str:
    mgmt = management_token(acl_dev)
    corral(acl_dev, "acl", "policy", "apply", "readers", "-", token=mgmt, stdin=READER_POLICY)
    created = json.loads(
        corral(
            acl_dev, "acl", "token", "create", "-name", "ui-reader", "-policy", "readers",
            "-json", token=mgmt,
        )
    )  # fmt: skip
    return str(created["secret_id"])


def use_token(driver: Any, token: str) -> None:
    """Type the token into the box and save it, as a person would."""
    from selenium.webdriver.common.by import By

    box = driver.find_element(By.ID, "token-input")
    box.clear()
    if token:
        box.send_keys(token)
        driver.find_element(By.ID, "token-save").click()
    else:
        driver.find_element(By.ID, "token-clear").click()


def test_token_box_decides_what_is_shown(acl_dev: DevProcess, reader_token: str, driver: Any):
    from selenium.webdriver.common.by import By

    ui = http_base(acl_dev) + "/ui"
    node_id = get_json(http_base(acl_dev) + "/v1/nodes", management_token(acl_dev))[0]["ID"]

    # no token: the gateway refuses, and the page says so
    driver.get(ui + "/nodes")
    wait_until(
        driver,
        "the 403 shown",
        lambda d: "Permission denied" in d.find_element(By.ID, "flash").text,
    )
    assert "403" in driver.find_element(By.ID, "flash").text
    assert driver.find_element(By.ID, "token-status").text == "anonymous"
    assert "Sign in to see this page" in driver.find_element(By.ID, "signin").text
    screenshot(driver, "acl-anonymous")

    # the management token, entered in the box, is kept across pages
    use_token(driver, management_token(acl_dev))
    wait_until(driver, "the node listed", present(f"tr[data-node='{node_id}']"))
    assert driver.find_element(By.ID, "token-status").text == "management token"
    open_page(driver, ui + f"/nodes/{node_id}")
    assert driver.find_element(By.ID, "drain-toggle").is_displayed()
    open_page(driver, ui + "/jobs")
    assert driver.find_element(By.ID, "register").is_displayed()

    # a read-only token: data yes, actions hidden
    use_token(driver, reader_token)
    wait_until(
        driver,
        "the reader token's status",
        lambda d: d.find_element(By.ID, "token-status").text == "token: readers",
    )
    wait_until(
        driver,
        "the jobs page loaded",
        lambda d: d.execute_script("return document.body.dataset.ready") == "true",
    )
    assert not driver.find_element(By.ID, "register").is_displayed()
    open_page(driver, ui + f"/nodes/{node_id}")
    assert not driver.find_element(By.ID, "drain-toggle").is_displayed()
    assert not driver.find_element(By.ID, "eligibility-toggle").is_displayed()
    screenshot(driver, "acl-reader-node")

    # forced anyway, the action is refused with the gateway's 403
    driver.execute_script("document.querySelector('[data-needs=node-write]').hidden = false")
    driver.find_element(By.ID, "drain-toggle").click()
    wait_until(
        driver,
        "the refused drain's 403",
        lambda d: "refused (403)" in d.find_element(By.ID, "flash").text,
    )
    assert "Permission denied" in driver.find_element(By.ID, "flash").text
    assert get_json(http_base(acl_dev) + f"/v1/node/{node_id}", reader_token)["Drain"] is False
    screenshot(driver, "acl-refused")

    use_token(driver, "")
    wait_until(
        driver,
        "the token cleared",
        lambda d: d.execute_script("return localStorage.getItem('corral.token')") is None,
    )


def test_signed_out_jobs_page_asks_for_a_token(
    acl_dev: DevProcess, driver: Any, tmp_path: Path
) -> None:
    """With ACLs on and no token, the jobs list says to sign in (not "no
    jobs yet" under a green live dot) while jobs exist; with the token
    they show."""
    from selenium.webdriver.common.by import By

    mgmt = management_token(acl_dev)
    spec = tmp_path / "ui-secret.nomad.hcl"
    spec.write_text(
        (ROOT / "examples" / "batch.nomad.hcl")
        .read_text()
        .replace('job "batch"', 'job "ui-secret"')
    )
    corral(acl_dev, "job", "run", "-detach", str(spec), token=mgmt)
    ui = http_base(acl_dev) + "/ui"
    driver.get(ui + "/jobs")
    driver.execute_script("localStorage.removeItem('corral.token')")
    open_page(driver, ui + "/jobs")
    wait_until(
        driver, "the sign-in notice", lambda d: d.find_element(By.ID, "signin").is_displayed()
    )
    assert "Sign in to see jobs" in driver.find_element(By.ID, "signin").text
    assert driver.find_element(By.ID, "live").get_attribute("data-live") == "signin"
    table = driver.find_element(By.ID, "jobs").text
    assert "Sign in to see jobs" in table and "no jobs yet" not in table
    screenshot(driver, "acl-signin")
    # the overview cannot count what the anonymous token may not read
    open_page(driver, ui + "/")
    wait_until(
        driver,
        "the overview's sign-in notice",
        lambda d: d.find_element(By.ID, "signin").is_displayed(),
    )
    assert "not readable" in driver.find_element(By.ID, "cluster").text

    open_page(driver, ui + "/jobs")

    use_token(driver, mgmt)
    wait_until(driver, "the job listed", present("tr[data-job='ui-secret']"))
    assert not driver.find_element(By.ID, "signin").is_displayed()
    wait_until(
        driver,
        "the live stream",
        lambda d: d.find_element(By.ID, "live").get_attribute("data-live") == "stream",
    )
    use_token(driver, "")


def test_corral_ui_authenticate_signs_the_ui_in(
    acl_dev: DevProcess, reader_token: str, driver: Any
) -> None:
    """`corral ui -authenticate` (Nomad's `nomad ui -authenticate`): the
    address carries a one-time token, which the page exchanges for the
    reader's token, keeps as the token box keeps one, and takes out of the
    address; the same address again is refused and changes nothing."""
    from selenium.webdriver.common.by import By

    base = http_base(acl_dev)
    out = corral(
        acl_dev, "ui", "-authenticate", "-show-url", "-http-addr", base, token=reader_token
    )
    assert out.startswith(f"URL for web UI: {base}/ui/?ott=")
    url = out.strip().split(": ", 1)[1]
    driver.get(base + "/ui/jobs")
    driver.execute_script("localStorage.removeItem('corral.token')")

    driver.get(url)
    wait_until(
        driver,
        "the one-time token exchanged",
        lambda d: d.execute_script("return document.body.dataset.ott") == "exchanged",
    )
    assert driver.execute_script("return localStorage.getItem('corral.token')") == reader_token
    assert "ott=" not in driver.current_url
    wait_until(
        driver,
        "the reader token's status",
        lambda d: d.find_element(By.ID, "token-status").text == "token: readers",
    )
    screenshot(driver, "acl-one-time-token")

    # spent: refused, said so, and the kept token stays
    driver.get(url)
    wait_until(
        driver,
        "the spent one-time token refused",
        lambda d: d.execute_script("return document.body.dataset.ott") == "refused",
    )
    assert "one-time token refused (403)" in driver.find_element(By.ID, "flash").text
    assert "ott=" not in driver.current_url
    assert driver.execute_script("return localStorage.getItem('corral.token')") == reader_token
    driver.execute_script("localStorage.removeItem('corral.token')")
