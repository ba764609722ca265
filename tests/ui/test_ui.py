"""The web UI in real headless Chromium against a `corral dev` cluster: every
page loads, a job registered through the UI's form turns running on its job
page without a reload, its allocation shows task events and live logs, its
eval shows the journey, a node drains from its button, and with `-acl` the
token box decides what is shown and a refused action shows the 403.
A screenshot of each page lands in test-artifacts/ui/."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.devprocess import DevProcess, start_dev, stop_dev
from tests.e2e.test_services import WEB
from tests.ui.browser import MISSING, browser_available, screenshot, wait_until
from tests.wait import wait_for

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not browser_available(), reason=MISSING),
]

ROOT = Path(__file__).resolve().parents[2]
# Nomad's JSON job format, as the form's JSON mode posts it to /v1/jobs
HELLO_JSON = (ROOT / "examples" / "hello.json").read_text().replace('"hello-json"', '"ui-hello"')


def http_base(dev: DevProcess) -> str:
    return str(dev.info["http_addr"]).rstrip("/")


def get_json(url: str, token: str = "") -> Any:
    req = urllib.request.Request(url, headers={"X-Nomad-Token": token} if token else {})
    with urllib.request.urlopen(req, timeout=10) as resp:
        return json.loads(resp.read())


def ready_nodes(dev: DevProcess, token: str = "") -> list[Any]:
    nodes = get_json(http_base(dev) + "/v1/nodes", token)
    return [n for n in nodes if n["Status"] == "ready"]


@pytest.fixture(scope="module")
def dev(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevProcess]:
    started = start_dev(tmp_path_factory.mktemp("corral-ui"))
    try:
        wait_for("the dev client node over HTTP", lambda: ready_nodes(started))
        yield started
    finally:
        stop_dev(started)


def open_page(driver: Any, url: str) -> None:
    """Load a page and wait until its script has filled it."""
    driver.get(url)
    wait_until(
        driver,
        f"{url} to finish loading",
        lambda d: d.execute_script("return document.body.dataset.ready") in ("true", "error"),
    )
    assert driver.execute_script("return document.body.dataset.ready") == "true", (
        driver.execute_script("return document.getElementById('flash').textContent")
    )


def mark_no_reload(driver: Any) -> None:
    driver.execute_script("window.__corralNoReload = true")


def assert_not_reloaded(driver: Any) -> None:
    assert driver.execute_script("return window.__corralNoReload === true"), "the page reloaded"


def present(css: str) -> Callable[[Any], list[Any]]:
    """A WebDriverWait check: the elements matching `css`, once there are any."""
    from selenium.webdriver.common.by import By

    return lambda d: list(d.find_elements(By.CSS_SELECTOR, css))


def click(driver: Any, css: str, what: str) -> None:
    """Click what `css` names, again if the live page re-rendered it just
    before (a stale element)."""
    from selenium.webdriver.common.by import By

    def attempt(d: Any) -> bool:
        d.find_element(By.CSS_SELECTOR, css).click()
        return True

    wait_until(driver, f"a click on {what}", attempt)


def rows(driver: Any, table: str) -> list[Any]:
    from selenium.webdriver.common.by import By

    return list(driver.find_elements(By.CSS_SELECTOR, f"#{table} tbody tr:not(.empty)"))


# ---------------------------------------------------------------- the tour


def test_pages_load(dev: DevProcess, driver: Any) -> None:
    from selenium.webdriver.common.by import By

    ui = http_base(dev) + "/ui"
    open_page(driver, ui + "/")
    wait_until(driver, "broker stats", lambda d: "ready" in d.find_element(By.ID, "broker").text)
    wait_until(
        driver, "plan stats", lambda d: "queue depth" in d.find_element(By.ID, "planner").text
    )
    wait_until(
        driver, "cluster counts", lambda d: "nodes ready" in d.find_element(By.ID, "cluster").text
    )
    screenshot(driver, "overview")

    # the favicon the pages name is served
    icon = driver.find_element(By.CSS_SELECTOR, "link[rel=icon]").get_attribute("href")
    with urllib.request.urlopen(icon, timeout=10) as resp:
        assert resp.headers["Content-Type"].startswith("image/svg+xml")
        assert b"<svg" in resp.read()

    open_page(driver, ui + "/nodes")
    wait_until(driver, "the dev node listed", lambda d: rows(d, "nodes"))
    screenshot(driver, "nodes")

    # the clients page is the nodes list under Nomad's name, paged by the gateway
    open_page(driver, ui + "/clients")
    wait_until(driver, "the dev node listed", lambda d: rows(d, "nodes"))
    assert "answered in" in driver.find_element(By.ID, "nodes-timing").text

    # the servers page: every role's processes, one leader per singleton role
    open_page(driver, ui + "/servers")
    wait_until(
        driver, "the state's leader", present("#servers tr[data-role='state'][data-leader='true']")
    )
    roles = {r.get_attribute("data-role") for r in rows(driver, "servers")}
    assert {"state", "broker", "planner", "worker"} <= roles, roles
    screenshot(driver, "servers")

    open_page(driver, ui + "/topology")
    wait_until(driver, "the dev node drawn", present("#topology .tnode"))
    screenshot(driver, "topology")

    open_page(driver, ui + "/evaluations")
    screenshot(driver, "evaluations")

    open_page(driver, ui + "/jobs")
    screenshot(driver, "jobs")

    driver.get(ui + "/no/such/page")
    assert "No page at this address" in driver.find_element(By.TAG_NAME, "main").text


def test_register_job_and_watch_it_run(dev: DevProcess, driver: Any) -> None:
    from selenium.webdriver.common.by import By

    ui = http_base(dev) + "/ui"
    open_page(driver, ui + "/jobs")
    mark_no_reload(driver)
    driver.find_element(By.CSS_SELECTOR, "#register summary").click()
    driver.find_element(By.CSS_SELECTOR, "input[name=format][value=json]").click()
    # set, not typed: send_keys would go through the textarea key by key
    driver.execute_script("document.getElementById('jobspec').value = arguments[0]", HELLO_JSON)
    driver.find_element(By.ID, "register-submit").click()
    wait_until(
        driver,
        "the registration's job link",
        lambda d: d.find_elements(By.CSS_SELECTOR, "#register-result a"),
    )
    # the jobs table picks the job up from the event stream, no reload
    wait_until(
        driver,
        "ui-hello in the jobs table",
        lambda d: d.find_elements(By.CSS_SELECTOR, "tr[data-job='ui-hello']"),
    )
    assert_not_reloaded(driver)
    screenshot(driver, "jobs-registered")

    driver.find_element(By.CSS_SELECTOR, "#register-result a").click()
    open_page(driver, ui + "/jobs/ui-hello")
    mark_no_reload(driver)
    wait_until(
        driver,
        "ui-hello's allocation running on the job page",
        lambda d: d.find_elements(By.CSS_SELECTOR, "#allocs tr[data-status='running']"),
        timeout=90,
    )
    wait_until(
        driver,
        "the group's running count",
        lambda d: (
            d.find_element(
                By.CSS_SELECTOR, "#groups tr[data-group='hello'] td[data-count='running']"
            ).text
            == "1"
        ),
    )
    assert_not_reloaded(driver)
    assert rows(driver, "evals"), "the job's registration eval is listed"
    assert driver.find_elements(By.CSS_SELECTOR, "#versions .version[data-version='0']")
    screenshot(driver, "job")


def serves(dev: DevProcess, method: str, path: str) -> bool:
    """Whether the gateway serves a /v1 endpoint (not Nomad's 501)."""
    req = urllib.request.Request(http_base(dev) + path, method=method, data=b"{}")
    try:
        with urllib.request.urlopen(req, timeout=10):
            return True
    except urllib.error.HTTPError as exc:
        return exc.code != 501


def test_run_a_job_from_hcl(dev: DevProcess, driver: Any) -> None:
    from selenium.webdriver.common.by import By

    if not serves(dev, "POST", "/v1/jobs/parse"):
        pytest.skip("this gateway does not serve /v1/jobs/parse yet")
    hcl = (ROOT / "examples" / "batch.nomad.hcl").read_text().replace('job "batch"', 'job "ui-hcl"')
    open_page(driver, http_base(dev) + "/ui/jobs")
    mark_no_reload(driver)
    driver.find_element(By.CSS_SELECTOR, "#register summary").click()
    driver.find_element(By.CSS_SELECTOR, "input[name=format][value=hcl]").click()
    driver.execute_script("document.getElementById('jobspec').value = arguments[0]", hcl)
    driver.find_element(By.ID, "register-submit").click()
    wait_until(driver, "ui-hcl in the jobs table", present("tr[data-job='ui-hcl']"))
    assert driver.find_element(By.ID, "flash").text == "Run job: done"
    # a bad jobspec is refused with the gateway's 400, in place
    driver.execute_script("document.getElementById('jobspec').value = 'job \"x\" {'")
    driver.find_element(By.ID, "register-submit").click()
    wait_until(
        driver,
        "the parse error",
        lambda d: d.find_element(By.ID, "flash").text.startswith("Run job refused (400)"),
    )
    assert_not_reloaded(driver)
    screenshot(driver, "jobs-hcl")


def test_allocation_page_shows_events_and_live_logs(dev: DevProcess, driver: Any) -> None:
    from selenium.webdriver.common.by import By

    ui = http_base(dev) + "/ui"
    open_page(driver, ui + "/jobs/ui-hello")
    link = wait_until(
        driver,
        "a running alloc's link",
        lambda d: d.find_elements(By.CSS_SELECTOR, "#allocs tr[data-status='running'] a"),
    )[0]
    link.click()
    wait_until(
        driver,
        "the alloc page",
        lambda d: d.execute_script("return document.body.dataset.page") == "alloc",
    )
    wait_until(
        driver,
        "the alloc page to load",
        lambda d: d.execute_script("return document.body.dataset.ready") == "true",
    )
    wait_until(
        driver,
        "the task's Started event",
        lambda d: "Started" in d.find_element(By.CSS_SELECTOR, ".task[data-task='hello']").text,
    )
    mark_no_reload(driver)
    wait_until(
        driver,
        "hello's output in the live logs",
        lambda d: "hello from" in d.find_element(By.ID, "logs").text,
    )
    first = driver.find_element(By.ID, "logs").text.count("hello from")
    # the task prints every 2 s: a following stream shows more without a reload
    wait_until(
        driver,
        "a further log line while following",
        lambda d: d.find_element(By.ID, "logs").text.count("hello from") > first,
    )
    assert_not_reloaded(driver)
    # the client reports the alloc's usage: both charts draw its samples
    wait_until(
        driver,
        "CPU and memory charted",
        lambda d: all(
            int(d.find_element(By.ID, chart).get_attribute("data-samples") or 0) >= 2
            for chart in ("chart-cpu", "chart-mem")
        ),
    )
    assert "MiB" in driver.find_element(By.CSS_SELECTOR, "#chart-mem .now").text
    screenshot(driver, "allocation")


def test_eval_page_shows_the_journey(dev: DevProcess, driver: Any) -> None:
    from selenium.webdriver.common.by import By

    ui = http_base(dev) + "/ui"
    open_page(driver, ui + "/jobs/ui-hello")
    evals = driver.find_elements(By.CSS_SELECTOR, "#evals tr[data-eval]")
    eval_id = evals[-1].get_attribute("data-eval")  # the oldest: the registration's
    driver.find_element(By.CSS_SELECTOR, f"#evals tr[data-eval='{eval_id}'] a").click()
    wait_until(
        driver,
        "the eval page",
        lambda d: d.execute_script("return document.body.dataset.page") == "eval",
    )
    wait_until(
        driver,
        "the eval page to load",
        lambda d: d.execute_script("return document.body.dataset.ready") == "true",
    )
    stages = [
        li.get_attribute("data-stage")
        for li in driver.find_elements(By.CSS_SELECTOR, "#timeline li")
    ]
    assert stages == [
        "created",
        "enqueued",
        "dequeued",
        "plan submitted",
        "committed",
        "allocs running",
    ]
    # every stage has a time: enqueued, dequeued and plan submitted from the
    # times the worker wrote on the eval when its run ended
    for stage in stages:
        wait_until(
            driver,
            f"the {stage} stage to have a time",
            present(f"#timeline li.done[data-stage='{stage}']"),
        )
    notes = {
        li.get_attribute("data-stage"): li.text
        for li in driver.find_elements(By.CSS_SELECTOR, "#timeline li")
    }
    assert "broker's clock" in notes["enqueued"], notes
    assert "worker's clock" in notes["dequeued"], notes
    assert "worker's clock" in notes["plan submitted"], notes
    assert rows(driver, "allocs"), "the allocs the eval placed"
    screenshot(driver, "evaluation")

    open_page(driver, ui + "/evaluations")
    wait_until(
        driver,
        "the eval listed",
        lambda d: d.find_elements(By.CSS_SELECTOR, f"tr[data-eval='{eval_id}']"),
    )
    screenshot(driver, "evaluations")


def test_overview_counts_placements(dev: DevProcess, driver: Any) -> None:
    from selenium.webdriver.common.by import By

    open_page(driver, http_base(dev) + "/ui/")
    mark_no_reload(driver)
    job = json.loads(HELLO_JSON)["Job"]
    job["ID"] = job["Name"] = "ui-burst"
    job["Type"] = "batch"
    group = job["TaskGroups"][0]
    group["Count"] = 3
    group["Tasks"][0].update(Driver="mock", Config={"run_for": "2s"})
    group["Tasks"][0]["Resources"] = {"CPU": 10, "MemoryMB": 16}
    body = json.dumps({"Job": job}).encode()
    req = urllib.request.Request(http_base(dev) + "/v1/jobs", data=body, method="POST")
    with urllib.request.urlopen(req, timeout=10):
        pass
    # three placements inside the 10 s window: 0.3 per second
    wait_until(
        driver,
        "the burst's placements counted",
        lambda d: float(d.find_element(By.ID, "placements-rate").text) >= 0.3,
    )
    assert_not_reloaded(driver)
    wait_until(
        driver,
        "the live connection",
        lambda d: d.find_element(By.ID, "live").get_attribute("data-live") in ("stream", "poll"),
    )
    wait_until(
        driver,
        "running allocations counted",
        lambda d: "allocations running" in d.find_element(By.ID, "cluster").text,
    )
    screenshot(driver, "overview")


CANARY_JOB = """
job "ui-canary" {
  datacenters = ["dc1"]
  type = "service"

  group "web" {
    count = 2

    update {
      max_parallel      = 1
      health_check      = "task_states"
      min_healthy_time  = "1s"
      healthy_deadline  = "10s"
      progress_deadline = "30s"
      canary            = 1
    }

    task "main" {
      driver = "mock"
      config {
        run_for = "0"
      }
      env {
        VERSION = "%s"
      }
      resources {
        cpu    = 20
        memory = 16
      }
    }
  }
}
"""


def run_job(dev: DevProcess, tmp_path: Path, name: str, spec: str) -> None:
    path = tmp_path / name
    path.write_text(spec)
    env = {k: v for k, v in os.environ.items() if k != "CORRAL_TOKEN"}
    env["CORRAL_ADDR"] = dev.info["address"]
    proc = subprocess.run(
        [sys.executable, "-m", "cli", "job", "run", "-detach", str(path)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_promote_a_canary_deployment(dev: DevProcess, driver: Any, tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By

    try:
        get_json(http_base(dev) + "/v1/deployments")
    except urllib.error.HTTPError as exc:
        if exc.code == 501:
            pytest.skip("this gateway does not serve /v1/deployments yet")
        raise
    run_job(dev, tmp_path, "v0.hcl", CANARY_JOB % "0")
    wait_for(
        "ui-canary v0 running",
        lambda: [
            a
            for a in get_json(http_base(dev) + "/v1/job/ui-canary/allocations")
            if a["ClientStatus"] == "running"
        ],
    )
    open_page(driver, http_base(dev) + "/ui/jobs/ui-canary")
    mark_no_reload(driver)
    run_job(dev, tmp_path, "v1.hcl", CANARY_JOB % "1")
    # the new version's deployment places one canary and waits: the button shows
    wait_until(driver, "the Promote button", present("#deployments button.promote"))
    wait_until(
        driver,
        "version 1's diff",
        lambda d: "VERSION" in d.find_element(By.CSS_SELECTOR, ".version[data-version='1']").text,
    )
    screenshot(driver, "job-canary")
    click(driver, "#deployments button.promote", "Promote")
    wait_until(
        driver,
        "the promotion accepted",
        lambda d: d.find_element(By.ID, "flash").text == "Promote: done",
    )
    wait_until(
        driver,
        "the deployment successful",
        present("#deployments tr[data-deployment] .s-successful"),
        timeout=90,
    )
    assert_not_reloaded(driver)
    screenshot(driver, "job-promoted")

    # the deployments page lists both of the job's deployments, the search
    # narrowing to them
    open_page(driver, http_base(dev) + "/ui/deployments")
    driver.find_element(By.ID, "deployments-search").send_keys("ui-canary")
    wait_until(
        driver,
        "ui-canary's two deployments",
        lambda d: (
            len(rows(d, "deployments")) == 2
            and all("ui-canary" in r.text for r in rows(d, "deployments"))
        ),
    )
    assert driver.find_elements(By.CSS_SELECTOR, "#deployments .s-successful")
    screenshot(driver, "deployments")


def test_drain_a_node_from_its_page(dev: DevProcess, driver: Any) -> None:
    from selenium.webdriver.common.by import By

    node = ready_nodes(dev)[0]
    ui = http_base(dev) + "/ui"
    open_page(driver, ui + "/nodes")
    driver.find_element(By.CSS_SELECTOR, f"tr[data-node='{node['ID']}'] a").click()
    wait_until(
        driver,
        "the node page to load",
        lambda d: d.execute_script("return document.body.dataset.ready") == "true",
    )
    wait_until(driver, "resources", lambda d: len(rows(d, "resources")) == 3)
    wait_until(
        driver,
        "used CPU from ui-hello's allocation",
        lambda d: (
            d.find_element(By.CSS_SELECTOR, "#resources tr[data-resource='cpu'] td.used").text
            != "0 MHz"
        ),
    )
    screenshot(driver, "node")
    mark_no_reload(driver)
    button = driver.find_element(By.ID, "drain-toggle")
    assert button.text == "Drain"
    button.click()
    wait_until(
        driver, "the drain accepted", lambda d: d.find_element(By.ID, "flash").text == "Drain: done"
    )
    # the drain migrates ui-hello's allocation away and, on this one-node
    # cluster, completes as soon as it stopped: the node stays ineligible
    wait_until(
        driver,
        "ui-hello's allocation migrated off the node",
        lambda d: [
            r for r in rows(d, "allocs") if r.find_elements(By.XPATH, "./td[4][text()='stop']")
        ],
    )
    wait_until(
        driver,
        "the node ineligible after its drain",
        lambda d: d.find_element(By.ID, "eligibility").text == "ineligible",
    )
    assert get_json(http_base(dev) + f"/v1/node/{node['ID']}")["SchedulingEligibility"] == (
        "ineligible"
    )
    screenshot(driver, "node-draining")
    # the drain ends once the migrated allocation has stopped; the page
    # follows it live
    wait_until(
        driver,
        "the drain complete",
        lambda d: (
            d.find_element(By.ID, "drain").text == "no"
            and d.find_element(By.ID, "drain-toggle").text == "Drain"
        ),
        timeout=90,
    )
    wait_until(
        driver,
        "the mark-eligible button",
        lambda d: d.find_element(By.ID, "eligibility-toggle").text == "Mark eligible",
    )
    driver.find_element(By.ID, "eligibility-toggle").click()
    wait_until(
        driver, "eligible again", lambda d: d.find_element(By.ID, "eligibility").text == "eligible"
    )
    driver.find_element(By.ID, "eligibility-toggle").click()
    wait_until(
        driver,
        "marked ineligible",
        lambda d: d.find_element(By.ID, "eligibility").text == "ineligible",
    )
    driver.find_element(By.ID, "eligibility-toggle").click()
    wait_until(
        driver,
        "eligible once more",
        lambda d: d.find_element(By.ID, "eligibility").text == "eligible",
    )
    assert_not_reloaded(driver)


#: the services e2e's job, renamed (a python http.server with an http check)
SERVICE_JOB = WEB.replace("CHECK_PATH", "/").replace('"web"', '"ui-web"')


def test_services_show_with_their_checks(dev: DevProcess, driver: Any, tmp_path: Path) -> None:
    run_job(dev, tmp_path, "ui-web.nomad.hcl", SERVICE_JOB)
    ui = http_base(dev) + "/ui"
    open_page(driver, ui + "/jobs/ui-web")
    mark_no_reload(driver)

    def texts(css: str) -> Callable[[Any], list[str]]:
        # read in the page: the tables are re-rendered every few seconds,
        # so an element found here could be stale by the time it is read
        script = "return [...document.querySelectorAll(arguments[0])].map(e => e.textContent)"
        return lambda d: list(d.execute_script(script, css))

    checks = texts("#services tr[data-service='ui-web'] td.checks")
    wait_until(
        driver,
        "the service's check passing on the job page",
        lambda d: "1 passing" in checks(d),
        timeout=90,
    )
    assert_not_reloaded(driver)
    screenshot(driver, "job-services")
    click(driver, "#services tr[data-service='ui-web'] a", "the instance's alloc")
    wait_until(driver, "the alloc page's check", present("#checks tr[data-status='success']"))
    assert any("ui-web" in t for t in texts("#services")(driver))
    screenshot(driver, "alloc-checks")
    open_page(driver, ui + "/services")
    wait_until(driver, "ui-web listed", present("#services tr[data-service='ui-web'] a"))
    screenshot(driver, "services")


def test_the_region_switcher(dev: DevProcess, driver: Any) -> None:
    """One region: the switcher lists it as here and cannot change. A
    region chosen (as the switcher keeps it, in localStorage) goes with
    every request as ?region=, and the page says the gateway's answer for
    a region nobody knows (two real regions: tests/e2e/test_federation.py)."""
    ui = http_base(dev) + "/ui"
    open_page(driver, ui + "/jobs")
    options = driver.execute_script(
        "return [...document.getElementById('region-select').options].map(o => o.textContent)"
    )
    assert options == ["global (here)"]
    assert driver.execute_script("return document.getElementById('region-select').disabled")
    driver.execute_script("localStorage.setItem('corral.region', 'mars')")
    try:
        driver.get(ui + "/jobs")
        wait_until(
            driver,
            "the jobs page for region mars to fail",
            lambda d: d.execute_script("return document.body.dataset.ready") == "error",
        )
        flash = driver.execute_script("return document.getElementById('flash').textContent")
        assert flash.startswith("400: No path to region 'mars'"), flash
        chosen = driver.execute_script("return document.getElementById('region-select').value")
        assert chosen == "mars"
    finally:
        driver.execute_script("localStorage.removeItem('corral.region')")
    open_page(driver, ui + "/jobs")  # back to the gateway's own region
