"""Templates and the Task API with the real agent (issue 28), on `corral dev
-acl`: a "database" job (raw_exec, Python's http.server) registers its
service; a web job's task (a small Python HTTP server from its task
directory, delivered by a template itself) renders the database's address
from `nomadService` and its password from `nomadVar` before it starts, and
an `env = true` template puts the password in its environment. Changing
the variable renders again and restarts the raw_exec task (change_mode
restart), or signals an exec task that reads the file again (change_mode
signal). Stopping the database removes its registration and the templates
render without it. Through the Task API socket the task reads its own
job's variable with its identity, not another job's, and nothing without
a token. A template reading another job's variable fails its task with
Nomad's "Template failed", and one waiting for a variable that does not
exist yet holds the task with Nomad's "Missing" event until it does.

Variables in PostgreSQL as ciphertext, a rotation keeping them readable
and a token without variable rights refused are tests/e2e/test_variables.py."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from tests.devprocess import DevClient, start_dev, stop_dev
from tests.wait import wait_for

ROOT = Path(__file__).resolve().parents[2]
SERVER = Path(__file__).with_name("template_server.py")

pytestmark = [pytest.mark.slow]

DB = """
job "db" {
  datacenters = ["dc1"]

  group "db" {
    network {
      port "db" {}
    }

    service {
      name     = "db"
      port     = "db"
      provider = "nomad"
    }

    task "db" {
      driver = "raw_exec"

      config {
        command = "/usr/bin/python3"
        args    = ["-m", "http.server", "${NOMAD_PORT_db}"]
      }

      resources {
        cpu    = 50
        memory = 64
      }
    }
  }
}
"""

WEB = """
job "%(name)s" {
  datacenters = ["dc1"]

  group "web" {
    network {
      port "http" {}
    }

    restart {
      attempts = 5
      interval = "10m"
      delay    = "1s"
      mode     = "fail"
    }

    service {
      name     = "%(name)s"
      port     = "http"
      provider = "nomad"
    }

    task "server" {
      driver = "%(driver)s"

      config {
        command = "/usr/bin/python3"
        args    = ["${NOMAD_TASK_DIR}/server.py"]
      }

      identity {
        env = true
      }

      template {
        data        = file("server.py")
        destination = "local/server.py"
        change_mode = "noop"
      }

      template {
        data        = <<EOT
{{ range nomadService "db" }}DB_ADDR={{ .Address }}:{{ .Port }}
{{ end }}DB_PASSWORD={{ with nomadVar "nomad/jobs/%(name)s" }}{{ .password }}{{ end }}
EOT
        destination = "local/db.conf"
        splay       = "0s"
        %(change)s
      }

      template {
        data        = <<EOT
DB_PASSWORD_ENV={{ with nomadVar "nomad/jobs/%(name)s" }}{{ .password }}{{ end }}
EOT
        destination = "secrets/db.env"
        env         = true
        splay       = "0s"
        change_mode = "%(env_change)s"
      }

      resources {
        cpu    = 50
        memory = 64
      }
    }
  }
}
"""

ONE_SHOT = """
job "%(name)s" {
  type        = "batch"
  datacenters = ["dc1"]

  group "g" {
    restart {
      attempts = 0
      mode     = "fail"
    }

    reschedule {
      attempts  = 0
      unlimited = false
    }

    task "t" {
      driver = "raw_exec"

      config {
        command = "/bin/cat"
        args    = ["${NOMAD_TASK_DIR}/out"]
      }

      template {
        data        = "{{ with nomadVar \\"%(path)s\\" }}{{ .password }}{{ end }}"
        destination = "local/out"
      }

      resources {
        cpu    = 50
        memory = 32
      }
    }
  }
}
"""


class Dev(DevClient):
    def put_var(self, path: str, **items: str) -> None:
        resp = self.request("PUT", f"/v1/var/{path}", json={"Items": items})
        assert resp.status_code == 200, resp.text

    def allocs(self, job: str) -> list[dict[str, Any]]:
        return [self.ok(f"/v1/allocation/{a['ID']}") for a in self.ok(f"/v1/job/{job}/allocations")]

    def task_state(self, job: str, task: str) -> dict[str, Any]:
        (alloc,) = self.allocs(job)
        state: dict[str, Any] = (alloc.get("TaskStates") or {}).get(task) or {}
        return state

    def events(self, job: str, task: str) -> list[tuple[str, str]]:
        state = self.task_state(job, task)
        return [(e["Type"], e["DisplayMessage"]) for e in state.get("Events") or []]

    def web(self, name: str, page: str, **params: Any) -> Any:
        (instance,) = self.ok(f"/v1/service/{name}")
        url = f"http://{instance['Address']}:{instance['Port']}{page}"
        try:
            resp = requests.get(url, params=params, timeout=30)
        except requests.RequestException as exc:
            raise AssertionError(f"{name}: {exc}\n{self.stderr(instance['AllocID'])}") from None
        assert resp.status_code == 200, resp.text
        return resp.json()

    def stderr(self, alloc_id: str) -> str:
        """The end of the web task's stderr (what it said before it failed)."""
        logs = Path(self.dev.info["data_dir"]) / "agent" / "allocs" / alloc_id / "alloc" / "logs"
        path = logs / "server.stderr.0"
        return path.read_text()[-3000:] if path.exists() else "(no stderr)"

    def config(self, name: str) -> Any:
        """What the web task named `name` serves at /config, None while it
        does not answer."""
        try:
            return self.web(name, "/config")
        except (ValueError, AssertionError):
            return None

    def serving(self, name: str, *, has: str = "", lacks: str = "") -> Any:
        """Wait until `name` serves a config holding `has` and not `lacks`."""

        def check() -> Any:
            got = self.config(name)
            if got is None or has not in got["config"]:
                return None
            return None if lacks and lacks in got["config"] else got

        return wait_for(f"{name} serving {has or 'its config'}", check, timeout=120)


@pytest.fixture(scope="module")
def dev() -> Iterator[Dev]:
    # not under pytest's own temp root: concurrent pytest runs on this machine
    # reset its mode to 0700, and the embedded PostgreSQL's user must pass
    tmp = Path(tempfile.mkdtemp(prefix="corral-templates-"))
    shutil.copy(SERVER, tmp / "server.py")
    env = {k: v for k, v in os.environ.items() if k != "CORRAL_SERVER_TOKEN"}
    # a query the servers refuse fails its template after two quick retries
    env.update(
        CORRAL_AGENT_TEMPLATE_RETRY_ATTEMPTS="2",
        CORRAL_AGENT_TEMPLATE_RETRY_BACKOFF="0.2",
        CORRAL_AGENT_TEMPLATE_RETRY_MAX_BACKOFF="0.5",
    )
    started = start_dev(tmp / "dev", "-acl", env=env)
    try:
        d = Dev(started, tmp)
        node = wait_for(
            "the dev client node",
            lambda: next((n for n in d.ok("/v1/nodes") if n["Status"] == "ready"), None),
            timeout=60,
        )
        drivers = d.ok(f"/v1/node/{node['ID']}")["Drivers"]
        assert drivers["exec"]["Healthy"], drivers["exec"]
        yield d
    finally:
        stop_dev(started)
        shutil.rmtree(tmp, ignore_errors=True)


@pytest.fixture(scope="module")
def running(dev: Dev) -> Dev:
    """The database, and two web jobs rendering its address and their
    passwords: `web` (raw_exec, restart) and `websig` (exec, SIGHUP)."""
    dev.put_var("nomad/jobs/web", password="first-pw")
    dev.put_var("nomad/jobs/websig", password="first-pw")
    dev.put_var("nomad/jobs/db", password="the database's own")
    dev.run("db", DB)
    wait_for("the db service", lambda: dev.ok("/v1/service/db"), timeout=90)
    dev.run(
        "web",
        WEB % {"name": "web", "driver": "raw_exec", "change": "", "env_change": "restart"},
    )
    signal = 'change_mode   = "signal"\n        change_signal = "SIGHUP"'
    dev.run(
        "websig",
        WEB % {"name": "websig", "driver": "exec", "change": signal, "env_change": "noop"},
    )
    return dev


def test_the_first_render_has_the_database_and_the_password(running: Dev) -> None:
    (db,) = running.ok("/v1/service/db")
    for name in ("web", "websig"):
        got = running.serving(name)
        assert got["config"] == f"DB_ADDR={db['Address']}:{db['Port']}\nDB_PASSWORD=first-pw\n"
        assert got["env"] == "first-pw"
    (alloc,) = running.allocs("web")
    task_dir = Path(running.dev.info["data_dir"]) / "agent" / "allocs" / alloc["ID"] / "server"
    assert (task_dir / "local" / "db.conf").stat().st_mode & 0o777 == 0o644
    # the secret is in the file the template wrote, never in the job
    job = running.ok("/v1/job/web")
    assert "first-pw" not in str(job)


def test_the_task_api_answers_with_the_tasks_identity(running: Dev) -> None:
    running.serving("web")
    running.serving("websig")
    for name in ("web", "websig"):  # raw_exec (host paths) and exec (/secrets/api.sock)
        own = running.web(name, "/taskapi", path=f"/v1/var/nomad/jobs/{name}", token="1")
        assert own["status"] == 200, own
        assert own["body"]["Items"] == {"password": own["body"]["Items"]["password"]}
        other = running.web(name, "/taskapi", path="/v1/var/nomad/jobs/db", token="1")
        assert other == {"status": 403, "body": "Permission denied"}
        anonymous = running.web(name, "/taskapi", path=f"/v1/var/nomad/jobs/{name}", token="0")
        assert anonymous == {"status": 401, "body": "Unauthorized"}


def test_a_changed_variable_restarts_or_signals(running: Dev) -> None:
    first = {name: running.serving(name) for name in ("web", "websig")}
    running.put_var("nomad/jobs/web", password="second-pw")
    running.put_var("nomad/jobs/websig", password="second-pw")

    restarted = running.serving("web", has="DB_PASSWORD=second-pw")
    assert restarted["env"] == "second-pw" and restarted["pid"] != first["web"]["pid"]
    # the agent batches its task state updates: wait for the event to arrive
    restart_event = ("Restart Signaled", "Template with change_mode restart re-rendered")
    wait_for("web's restart event", lambda: restart_event in running.events("web", "server"))
    assert running.task_state("web", "server")["Restarts"] >= 1

    signaled = running.serving("websig", has="DB_PASSWORD=second-pw")
    # the same process: signalled, not restarted (its env template is noop)
    assert signaled["pid"] == first["websig"]["pid"] and signaled["env"] == "first-pw"
    signal_event = ("Signaling", "Template re-rendered")
    wait_for("websig's signal event", lambda: signal_event in running.events("websig", "server"))
    assert running.task_state("websig", "server")["Restarts"] == 0


def test_stopping_the_database_renders_without_it(running: Dev) -> None:
    running.serving("web")
    stopped = running.corral("job", "stop", "-detach", "db")
    assert stopped.returncode == 0, stopped.stderr
    wait_for("db deregistered", lambda: running.ok("/v1/service/db") == [], timeout=60)
    for name in ("web", "websig"):
        got = running.serving(name, lacks="DB_ADDR")
        assert got["config"].startswith("DB_PASSWORD=")


def test_another_jobs_variable_fails_the_task(dev: Dev) -> None:
    dev.put_var("nomad/jobs/db", password="the database's own")
    dev.run("snoop", ONE_SHOT % {"name": "snoop", "path": "nomad/jobs/db"})

    def failed() -> Any:
        allocs = dev.allocs("snoop")
        return allocs and allocs[0]["ClientStatus"] == "failed" and allocs[0]

    alloc = wait_for("snoop failed", failed, timeout=90)
    events = alloc["TaskStates"]["t"]["Events"]
    killing = [e for e in events if e["Type"] == "Killing"]
    assert killing and killing[0]["DisplayMessage"].startswith(
        "Template failed: nomad.var.get(nomad/jobs/db@default.global): "
        "Unexpected response code: 403"
    ), events
    assert "Started" not in [e["Type"] for e in events]


def test_a_missing_variable_holds_the_task_until_it_exists(dev: Dev) -> None:
    dev.run("waits", ONE_SHOT % {"name": "waits", "path": "nomad/jobs/waits"})
    missing = ("Template", "Missing: nomad.var.block(nomad/jobs/waits@default.global)")
    wait_for("the Missing event", lambda: missing in dev.events("waits", "t"), timeout=60)
    assert dev.allocs("waits")[0]["ClientStatus"] == "pending"
    dev.put_var("nomad/jobs/waits", password="at last")
    done = wait_for(
        "waits complete",
        lambda: (a := dev.allocs("waits")) and a[0]["ClientStatus"] == "complete" and a[0],
        timeout=60,
    )
    logs = Path(dev.dev.info["data_dir"]) / "agent" / "allocs" / done["ID"] / "alloc" / "logs"
    assert (logs / "t.stdout.0").read_text() == "at last"
