"""The `corral` CLI as a user runs it: subprocesses against a real dev
cluster started with `corral dev` (embedded PostgreSQL and every role as its
own process, on free ports).

Skipped, with the reason, only while a role's module does not exist yet."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from cli.commands.dev import RAW_EXEC_NOTICE
from tests.devprocess import start_dev, stop_dev
from tests.wait import wait_for

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
ROLES = ("state", "broker", "planner", "worker", "agent")


pytestmark = [pytest.mark.slow]


START_TIMEOUT = 180.0
WAIT = 90.0


@dataclass
class Dev:
    proc: subprocess.Popen[str]
    data_dir: Path
    address: str
    info: dict[str, Any]
    output: list[str]

    def env(self) -> dict[str, str]:
        e = dict(os.environ)
        e["CORRAL_ADDR"] = self.address
        e.pop("CORRAL_CLI_DEBUG", None)
        return e


def corral(
    dev: Dev, *args: str, timeout: float = 120, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "cli", *args],
        cwd=ROOT,
        env=dev.env(),
        capture_output=True,
        text=True,
        timeout=timeout,
        input=stdin,
        check=False,
    )


def corral_json(dev: Dev, *args: str) -> Any:
    proc = corral(dev, *args, "-json")
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


@pytest.fixture(scope="module")
def dev(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Dev]:
    started = start_dev(tmp_path_factory.mktemp("corral-dev"))
    d = Dev(started.proc, started.data_dir, started.info["address"], started.info, started.output)
    # the local client node must be up before jobs can be placed
    wait_for(
        "the dev client node",
        lambda: [n for n in corral_json(d, "node", "status") if n["status"] == "ready"],
    )
    yield d
    stop_dev(started)


def job_allocs(dev: Dev, job_id: str) -> list[dict[str, Any]]:
    data = corral_json(dev, "job", "status", job_id)
    return list(data["allocations"])


def statuses(dev: Dev, job_id: str) -> list[str]:
    return sorted(a["client_status"] for a in job_allocs(dev, job_id))


# --------------------------------------------------------------- examples


@pytest.mark.parametrize(
    ("example", "job_id", "expect"),
    [
        ("hello.nomad.hcl", "hello", ["running"]),
        ("hello.json", "hello-json", ["running"]),
        ("batch.nomad.hcl", "batch", ["complete"] * 3),
        ("system.nomad.hcl", "node-agent", ["running"]),
        ("sysbatch.nomad.hcl", "inventory", ["complete"]),
        ("disconnect.nomad.hcl", "sticky", ["running"] * 2),
        ("mock.nomad.hcl", "mock", ["running"] * 3),
        ("variables.nomad.hcl", "greeter", ["running"]),
    ],
)
def test_example_reaches_expected_state(
    dev: Dev, example: str, job_id: str, expect: list[str]
) -> None:
    run = corral(dev, "job", "run", str(EXAMPLES / example))
    assert run.returncode == 0, run.stdout + run.stderr
    assert "Monitoring evaluation" in run.stdout
    assert "Placements finished" in run.stdout
    wait_for(f"{job_id} allocs {expect}", lambda: statuses(dev, job_id) == expect)
    status = corral(dev, "job", "status", job_id)
    assert status.returncode == 0 and f"ID            = {job_id}" in status.stdout


def test_variables_from_flags_and_environment(dev: Dev, tmp_path: Path) -> None:
    var_file = tmp_path / "greeter.vars.hcl"
    var_file.write_text('greetings = ["hi", "hey"]\n')
    env = dev.env()
    env["NOMAD_VAR_env"] = "staging"
    run = subprocess.run(
        [sys.executable, "-m", "cli", "job", "run", "-var", "count=2", "-var-file", str(var_file)]
        + ["-detach", str(EXAMPLES / "variables.nomad.hcl")],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    job = corral_json(dev, "job", "inspect", "greeter")["job"]
    assert job["task_groups"][0]["count"] == 2
    assert job["meta"] == {"team": "platform", "env": "staging", "greetings": "2"}
    wait_for("two greeters", lambda: statuses(dev, "greeter") == ["running"] * 2)
    bad = corral(dev, "job", "run", "-var", "env=qa", str(EXAMPLES / "variables.nomad.hcl"))
    assert bad.returncode != 0 and "The env must be dev, staging or prod" in bad.stderr

    # the file and its values are kept with the version (Nomad's job submission)
    source = corral(dev, "job", "inspect", "-hcl", "-with-vars", "greeter")
    assert source.returncode == 0, source.stderr
    assert source.stdout == (EXAMPLES / "variables.nomad.hcl").read_text()
    assert "corral job run -var count=2 -var env=staging" in source.stderr
    assert '-var \'greetings=["hi", "hey"]\' -' in source.stderr
    url = f"{dev.info['http_addr']}/v1/job/greeter/submission?version={job['version']}"
    with urllib.request.urlopen(url, timeout=30) as answer:
        sub = json.load(answer)
    assert sub["Format"] == "hcl2" and sub["Source"] == source.stdout
    assert sub["VariableFlags"] == {"count": "2", "env": "staging"}
    assert sub["Variables"] == 'greetings = ["hi", "hey"]'


def test_alloc_logs_show_raw_exec_output(dev: Dev) -> None:
    """raw_exec is off on agents unless configured (issue 26, finding 7);
    `corral dev` turns it on for its agent and says so, as nomad -dev."""
    assert f"==> {RAW_EXEC_NOTICE}\n" in dev.output
    if not statuses(dev, "hello"):
        corral(dev, "job", "run", "-detach", str(EXAMPLES / "hello.nomad.hcl"))
    alloc = wait_for(
        "a running hello alloc",
        lambda: [a for a in job_allocs(dev, "hello") if a["client_status"] == "running"],
    )[0]

    def logs() -> bool:
        out = corral(dev, "alloc", "logs", alloc["id"])
        return out.returncode == 0 and "hello from" in out.stdout

    wait_for("hello's output in alloc logs", logs)
    status = corral(dev, "alloc", "status", alloc["id"][:8])
    assert status.returncode == 0 and 'Task "hello" is "running"' in status.stdout


# --------------------------------------------------------------- plan


def test_plan_annotations_and_exit_codes(dev: Dev, tmp_path: Path) -> None:
    spec = (EXAMPLES / "mock.nomad.hcl").read_text().replace('job "mock"', 'job "planned"')
    f = tmp_path / "planned.nomad.hcl"
    f.write_text(spec)
    new = corral(dev, "job", "plan", str(f))
    assert new.returncode == 1, new.stdout + new.stderr
    assert '+ Job: "planned"' in new.stdout
    assert '+ Task Group: "web" (3 create)' in new.stdout
    assert "corral job run -check-index 0" in new.stdout

    assert corral(dev, "job", "run", str(f)).returncode == 0
    same = corral(dev, "job", "plan", str(f))
    assert same.returncode == 0, same.stdout + same.stderr
    assert "(3 ignore)" in same.stdout

    f.write_text(spec.replace("count = 3", "count = 5"))
    more = corral(dev, "job", "plan", str(f))
    assert more.returncode == 1
    # the existing allocs move to the new job version in place, as in Nomad
    assert "2 create" in more.stdout and "3 in-place update" in more.stdout
    assert 'Count: "3" => "5"' in more.stdout

    # a stale check-index is refused and nothing changes
    stale = corral(dev, "job", "run", "-check-index", "1", str(f))
    assert stale.returncode == 1 and stale.stderr.startswith("Error: ")
    pj = corral(dev, "job", "plan", "-json", str(f))
    assert pj.returncode == 1
    assert json.loads(pj.stdout)["annotations"]["desired_tg_updates"]["web"]["place"] == 2


# --------------------------------------------------------------- errors


def test_malformed_jobspec_registers_nothing(dev: Dev, tmp_path: Path) -> None:
    bad = tmp_path / "broken.nomad.hcl"
    bad.write_text(
        'job "broken" {\n  group "g" {\n    count = "lots"\n'
        '    task "t" {\n      driver = "mock"\n    }\n  }\n}\n'
    )
    run = corral(dev, "job", "run", str(bad))
    assert run.returncode == 1
    assert run.stderr == (
        f'Error: {bad}:3: job "broken" > group "g" > count: expected a whole number, got \'lots\'\n'
    )
    assert "Traceback" not in run.stdout + run.stderr
    jobs = corral_json(dev, "job", "status")
    assert "broken" not in [j["id"] for j in jobs]
    missing = corral(dev, "job", "status", "broken")
    assert missing.returncode == 1 and missing.stderr.startswith("Error: ")


def test_unknown_ids_are_clear_errors(dev: Dev) -> None:
    for args in (
        ("alloc", "status", "ffffffff"),
        ("eval", "status", "ffffffff"),
        ("node", "status", "ffffffff"),
    ):
        out = corral(dev, *args)
        assert out.returncode == 1, args
        assert out.stderr.startswith("Error: ") and out.stderr.count("\n") == 1, out.stderr


# --------------------------------------------------------------- -json and listings


def test_json_outputs_parse(dev: Dev) -> None:
    if not statuses(dev, "hello"):
        corral(dev, "job", "run", str(EXAMPLES / "hello.nomad.hcl"))
    jobs = corral_json(dev, "job", "status")
    assert "hello" in [j["id"] for j in jobs]
    status = corral_json(dev, "job", "status", "hello")
    assert status["job"]["id"] == "hello" and status["summary"]["summary"]["hello"]
    nodes = corral_json(dev, "node", "status")
    assert nodes and "secret_id" not in json.dumps(nodes)
    node = corral_json(dev, "node", "status", nodes[0]["id"])
    assert node["node"]["id"] == nodes[0]["id"]
    evals = corral_json(dev, "eval", "list", "-job", "hello")
    assert evals and all(e["job_id"] == "hello" for e in evals)
    ev = corral_json(dev, "eval", "status", evals[0]["id"])
    assert ev["eval"]["id"] == evals[0]["id"]
    alloc_id = status["allocations"][0]["id"]
    assert corral_json(dev, "alloc", "status", alloc_id)["id"] == alloc_id
    cfg = corral_json(dev, "operator", "scheduler", "get-config")
    assert cfg["config"]["scheduler_algorithm"] in ("binpack", "spread", "")
    history = corral_json(dev, "job", "history", "hello")
    assert history[0]["id"] == "hello"
    inspect = corral(dev, "job", "inspect", "hello")
    assert json.loads(inspect.stdout)["job"]["id"] == "hello"


def test_eval_list_paginates(dev: Dev) -> None:
    first = corral(dev, "eval", "list", "-per-page", "1")
    assert first.returncode == 0
    if "Results have been paginated" in first.stdout:
        token = first.stdout.split("-page-token ")[1].split()[0]
        second = corral(dev, "eval", "list", "-per-page", "1", "-page-token", token)
        assert second.returncode == 0 and second.stdout != first.stdout


def test_operator_set_config_round_trip(dev: Dev) -> None:
    assert (
        corral(
            dev, "operator", "scheduler", "set-config", "-scheduler-algorithm", "spread"
        ).returncode
        == 0
    )
    assert (
        corral_json(dev, "operator", "scheduler", "get-config")["config"]["scheduler_algorithm"]
        == "spread"
    )
    assert (
        corral(
            dev, "operator", "scheduler", "set-config", "-scheduler-algorithm", "binpack"
        ).returncode
        == 0
    )


def test_worker_status_lists_the_pool(dev: Dev) -> None:
    out = corral_json(dev, "operator", "worker", "status")
    assert out and out[0]["workers"]


# --------------------------------------------------------------- events


def test_event_stream_in_index_order(dev: Dev, tmp_path: Path) -> None:
    spec = (EXAMPLES / "batch.nomad.hcl").read_text().replace('job "batch"', 'job "evjob"')
    f = tmp_path / "evjob.nomad.hcl"
    f.write_text(spec)
    stream = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "cli",
            "event",
            "stream",
            "-json",
            "-topic",
            "Job:evjob",
            "-topic",
            "Evaluation:evjob",
            "-topic",
            "Allocation:evjob",
            "-index",
            "1",
        ],
        cwd=ROOT,
        env=dev.env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert corral(dev, "job", "run", "-detach", str(f)).returncode == 0
        events: list[dict[str, Any]] = []
        done = threading.Event()

        def read() -> None:
            assert stream.stdout is not None
            for line in stream.stdout:
                events.append(json.loads(line))
                topics = {e["topic"] for e in events}
                if {"Job", "Evaluation", "Allocation"} <= topics and any(
                    e["topic"] == "Evaluation" and e["evaluation"]["status"] == "complete"
                    for e in events
                ):
                    done.set()

        threading.Thread(target=read, daemon=True).start()
        assert done.wait(WAIT), (
            f"events seen: {[(e['index'], e['topic'], e['type']) for e in events]}"
        )
    finally:
        stream.send_signal(signal.SIGINT)
        stream.wait(30)
    assert stream.returncode == 130
    indexes = [e["index"] for e in events]
    assert indexes == sorted(indexes)
    assert all(
        (e.get("job") or e.get("evaluation") or e.get("allocation") or {}).get("job_id", e["key"])
        == "evjob"
        or e["key"] == "evjob"
        for e in events
    )
    first_eval = next(i for i, e in enumerate(events) if e["topic"] == "Evaluation")
    first_alloc = next(i for i, e in enumerate(events) if e["topic"] == "Allocation")
    assert first_eval < first_alloc


# --------------------------------------------------------------- stop, scale, node


def test_scale_and_stop(dev: Dev) -> None:
    if not statuses(dev, "mock"):
        corral(dev, "job", "run", str(EXAMPLES / "mock.nomad.hcl"))
    scaled = corral(dev, "job", "scale", "mock", "web", "1")
    assert scaled.returncode == 0, scaled.stdout + scaled.stderr
    wait_for(
        "mock scaled to 1",
        lambda: (
            [a for a in job_allocs(dev, "mock") if a["desired_status"] == "run"]
            and len([a for a in job_allocs(dev, "mock") if a["desired_status"] == "run"]) == 1
        ),
    )
    stop = corral(dev, "job", "stop", "mock")
    assert stop.returncode == 0, stop.stdout + stop.stderr
    wait_for(
        "mock dead", lambda: corral_json(dev, "job", "status", "mock")["job"]["status"] == "dead"
    )
    purge = corral(dev, "job", "stop", "-purge", "mock")
    assert purge.returncode == 0
    assert corral(dev, "job", "status", "mock").returncode == 1


def test_node_eligibility_toggle(dev: Dev) -> None:
    node = corral_json(dev, "node", "status")[0]
    assert corral(dev, "node", "eligibility", "-disable", node["id"]).returncode == 0
    assert (
        corral_json(dev, "node", "status", node["id"])["node"]["scheduling_eligibility"]
        == "ineligible"
    )
    assert corral(dev, "node", "eligibility", "-enable", node["id"][:8]).returncode == 0
    assert (
        corral_json(dev, "node", "status", node["id"])["node"]["scheduling_eligibility"]
        == "eligible"
    )
    both = corral(dev, "node", "eligibility", "-enable", "-disable", node["id"])
    assert both.returncode == 1


def test_every_role_serves_its_metrics_and_a_scrape_config_names_them(dev: Dev) -> None:
    roles = dev.info["roles"]
    config = (dev.data_dir / "prometheus.yml").read_text()
    for role, info in roles.items():
        assert f'targets: ["{info["metrics"]}"]' in config, role
        text = _scrape(info["metrics"])
        assert 'corral_build_info{python="' in text and f'role="{role}"' in text, role
        if role != "state":  # the state dials nobody
            assert "grpc_client_handled_total{" in text, role
    # the state leader's cluster gauges; the agent's own; per-RPC server metrics
    wait_for(
        "the state leader's node gauge",
        lambda: (
            'corral_nodes{datacenter="dc1",status="ready"} 1.0'
            in _scrape(roles["state"]["metrics"])
        ),
    )
    state = _scrape(roles["state"]["metrics"])
    assert 'corral_leader{role="state"} 1.0' in state
    assert "corral_heartbeat_active 1.0" in state
    assert 'grpc_server_handled_total{grpc_code="OK",grpc_method="Register",' in state
    assert 'corral_leader{role="broker"} 1.0' in _scrape(roles["broker"]["metrics"])
    assert 'corral_client_allocs{status="running"}' in _scrape(roles["agent"]["metrics"])


def _scrape(address: str) -> str:
    import urllib.request

    with urllib.request.urlopen(f"http://{address}/metrics", timeout=5) as resp:
        return str(resp.read().decode())


def test_node_status_lists_completed_allocs_and_the_status_change(dev: Dev) -> None:
    """`node status ID` lists every alloc the node ran (completed ones too,
    as Nomad's) and labels the time of the last status change as such (it
    is not a heartbeat)."""
    spec = (EXAMPLES / "batch.nomad.hcl").read_text().replace('job "batch"', 'job "done-batch"')
    run = corral(dev, "job", "run", "-detach", "-", stdin=spec)
    assert run.returncode == 0, run.stderr
    wait_for("done-batch complete", lambda: statuses(dev, "done-batch") == ["complete"] * 3)
    alloc = job_allocs(dev, "done-batch")[0]
    out = corral(dev, "node", "status", alloc["node_id"])
    assert out.returncode == 0, out.stderr
    assert alloc["id"][:8] in out.stdout
    assert "Status Changed" in out.stdout and "Last Heartbeat" not in out.stdout


def test_operator_members_names_the_state_leader(dev: Dev) -> None:
    """The state process holding the leader lock says so, as the
    corral_leader{role="state"} gauge does."""

    def state_leaders() -> list[bool]:
        members = corral_json(dev, "operator", "members")
        return [bool(m.get("leader")) for m in members if m["role"] == "state"]

    wait_for("the state member marked leader", lambda: state_leaders() == [True])


# --------------------------------------------------------------- node meta and client GC


def _http(dev: Dev, method: str, path: str, body: Any = None) -> tuple[int, str]:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(f"{dev.info['http_addr']}{path}", data=data, method=method)
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def _node_meta(dev: Dev) -> dict[str, Any] | None:
    proc = corral(dev, "node", "meta", "read", "-json")
    return json.loads(proc.stdout) if proc.returncode == 0 else None


def _eval_statuses(dev: Dev, job_id: str) -> list[str]:
    return [e.get("status", "") for e in corral_json(dev, "job", "status", job_id)["evaluations"]]


def _agent_pid(dev: Dev) -> int:
    import psutil

    for child in psutil.Process(dev.proc.pid).children():
        with contextlib.suppress(psutil.Error):
            if "services.agent" in child.cmdline():
                return int(child.pid)
    return 0


RACK_CONSTRAINT = 'constraint {\n  attribute = "${meta.rack}"\n  value = "r7"\n}\n'


def test_node_meta_applied_places_a_constrained_job_unsets_and_survives_a_restart(
    dev: Dev,
) -> None:
    """`node meta apply` sets dynamic metadata on the node's agent, which
    registers the node again: a job blocked on `${meta.rack}` is placed,
    the node read shows the key, `-unset` removes it, and a killed agent
    (restarted by dev) comes back with it."""
    spec = (
        (EXAMPLES / "batch.nomad.hcl")
        .read_text()
        .replace('job "batch" {', 'job "on-rack" {\n' + RACK_CONSTRAINT)
        .replace("count = 3", "count = 1")
    )
    run = corral(dev, "job", "run", "-detach", "-", stdin=spec)
    assert run.returncode == 0, run.stderr
    wait_for("on-rack blocked", lambda: "blocked" in _eval_statuses(dev, "on-rack"))
    assert job_allocs(dev, "on-rack") == []

    apply = corral(dev, "node", "meta", "apply", "rack=r7", "team=core")
    assert apply.returncode == 0, apply.stderr
    meta = _node_meta(dev)
    assert meta is not None
    assert meta["Dynamic"] == {"rack": "r7", "team": "core"}
    assert meta["Meta"]["rack"] == "r7" and meta["Static"].get("rack") is None
    node_id = corral_json(dev, "node", "status")[0]["id"]
    status, body = _http(dev, "GET", f"/v1/node/{node_id}")
    assert status == 200 and json.loads(body)["Meta"]["rack"] == "r7"
    status, body = _http(dev, "GET", f"/v1/client/metadata?node_id={node_id}")
    assert status == 200 and json.loads(body)["Dynamic"]["team"] == "core", body
    wait_for("on-rack placed and complete", lambda: statuses(dev, "on-rack") == ["complete"])

    # Nomad's JSON: null unsets; a bad key is refused with its reason
    status, body = _http(
        dev, "POST", "/v1/client/metadata", {"NodeID": node_id, "Meta": {"team": None}}
    )
    assert status == 200, body
    assert "team" not in json.loads(body)["Meta"] and "team" not in json.loads(body)["Dynamic"]
    status, body = _http(
        dev, "POST", "/v1/client/metadata", {"NodeID": node_id, "Meta": {"1x": "v"}}
    )
    assert status == 400 and "dotted hcl identifiers" in body, body
    # past the state's bounds on a node's meta: refused, nothing kept
    big = {"NodeID": node_id, "Meta": {"big": "x" * 20_000}}
    status, body = _http(dev, "POST", "/v1/client/metadata", big)
    assert status == 400 and "longer than" in body, body
    meta = _node_meta(dev)
    assert meta is not None and "big" not in meta["Meta"] and "big" not in meta["Dynamic"]
    status, body = _http(dev, "GET", "/v1/client/metadata")
    assert status == 400 and "node_id" in body
    unset = corral(dev, "node", "meta", "apply", "-unset", "rack", "zone=z1")
    assert unset.returncode == 0, unset.stderr
    meta = _node_meta(dev)
    assert meta is not None and "rack" not in meta["Meta"] and meta["Dynamic"] == {"zone": "z1"}
    bad_key = corral(dev, "node", "meta", "apply", "1x=v")
    assert bad_key.returncode != 0 and "dotted hcl identifiers" in bad_key.stderr
    assert "Traceback" not in bad_key.stderr
    nothing = corral(dev, "node", "meta", "apply")
    assert nothing.returncode != 0 and "Must specify -unset" in nothing.stderr
    read = corral(dev, "node", "meta", "read")
    assert read.returncode == 0, read.stderr
    assert read.stdout.startswith("All Meta") and "Dynamic Meta" in read.stdout
    assert "Static Meta" in read.stdout and "zone" in read.stdout

    pid = _agent_pid(dev)
    assert pid
    os.kill(pid, signal.SIGKILL)
    wait_for("a new agent", lambda: _agent_pid(dev) not in (0, pid))

    def back() -> bool:
        m = _node_meta(dev)
        return m is not None and m["Dynamic"] == {"zone": "z1"} and m["Meta"].get("zone") == "z1"

    wait_for("the restarted agent's meta", back, timeout=WAIT)
    status, body = _http(dev, "GET", f"/v1/node/{node_id}")
    assert json.loads(body)["Meta"].get("zone") == "z1" and "rack" not in json.loads(body)["Meta"]


def test_client_gc_removes_finished_alloc_dirs_and_refuses_running_ones(dev: Dev) -> None:
    """Nomad's /v1/client/allocation/:id/gc and /v1/client/gc through
    python-nomad: a finished alloc's directory is removed (the servers
    still hold the alloc); a running alloc is refused."""
    import nomad

    url = urllib.parse.urlparse(dev.info["http_addr"])
    api = nomad.Nomad(host=url.hostname, port=url.port, timeout=60)
    spec = (EXAMPLES / "batch.nomad.hcl").read_text().replace('job "batch"', 'job "gc-batch"')
    assert corral(dev, "job", "run", "-detach", "-", stdin=spec).returncode == 0
    svc = (EXAMPLES / "mock.nomad.hcl").read_text().replace('job "mock"', 'job "gc-svc"')
    svc = svc.replace("count = 3", "count = 1")
    assert corral(dev, "job", "run", "-detach", "-", stdin=svc).returncode == 0
    wait_for("gc-batch complete", lambda: statuses(dev, "gc-batch") == ["complete"] * 3)
    wait_for("gc-svc running", lambda: statuses(dev, "gc-svc") == ["running"])
    allocs_dir = dev.data_dir / "agent" / "allocs"
    done = [a["id"] for a in job_allocs(dev, "gc-batch")]
    (running,) = [a["id"] for a in job_allocs(dev, "gc-svc")]
    assert all((allocs_dir / a).is_dir() for a in [*done, running])

    api.client.gc_allocation.garbage_collect(done[0])
    assert not (allocs_dir / done[0]).exists()
    assert api.allocation.get_allocation(done[0])["ClientStatus"] == "complete"
    with pytest.raises(nomad.api.exceptions.BaseNomadException) as err:
        api.client.gc_allocation.garbage_collect(running)
    assert err.value.nomad_resp.status_code == 400
    assert "not eligible for garbage collection" in err.value.nomad_resp.text
    node_id = corral_json(dev, "node", "status")[0]["id"]
    api.client.gc_all_allocations.garbage_collect(node_id)
    assert not any((allocs_dir / a).exists() for a in done)
    assert (allocs_dir / running).is_dir()
    status, _ = _http(dev, "PUT", f"/v1/client/gc?node_id={node_id}")
    assert status == 200


# --------------------------------------------------------------- shutdown (last)


def test_zz_ctrl_c_stops_everything(dev: Dev) -> None:
    pids = [r["pid"] for r in dev.info["roles"].values()]
    dev.proc.send_signal(signal.SIGINT)
    assert dev.proc.wait(90) == 0, "".join(dev.output)
    for pid in pids:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            continue
        pytest.fail(f"process {pid} still running after corral dev stopped")
    assert not (dev.data_dir / "dev.json").exists()
    assert (dev.data_dir / "logs" / "state.log").exists()
