"""The web task of tests/e2e/test_templates.py: a small HTTP server run
from its task directory (the job delivers this file with a template).

It reads the rendered `db.conf` once when it starts (so a restart is what
shows a new value) and again on SIGHUP, and answers:

    GET /config       what it read, its DB_PASSWORD_ENV and its pid
    GET /taskapi?path=/v1/...&token=0|1
                      that path of Nomad's API through the Task API socket
                      ($NOMAD_UNIX_ADDR), with its NOMAD_TOKEN or without
"""

import http.client
import http.server
import json
import os
import signal
import socket
import urllib.parse

CONF = os.path.join(os.environ["NOMAD_TASK_DIR"], "db.conf")
STATE = {"config": ""}


def load(*_: object) -> None:
    with open(CONF) as f:
        STATE["config"] = f.read()


class UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str) -> None:
        super().__init__("localhost", timeout=30)
        self.unix_path = path

    def connect(self) -> None:
        # through the directory's descriptor: a raw_exec task's host path
        # can be longer than a socket address may be (108 bytes)
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(30)
        fd = os.open(os.path.dirname(self.unix_path), os.O_RDONLY)
        try:
            self.sock.connect(f"/proc/self/fd/{fd}/{os.path.basename(self.unix_path)}")
        finally:
            os.close(fd)


def task_api(path: str, with_token: bool) -> dict[str, object]:
    conn = UnixConnection(os.environ["NOMAD_UNIX_ADDR"].removeprefix("unix://"))
    headers = {"X-Nomad-Token": os.environ["NOMAD_TOKEN"]} if with_token else {}
    conn.request("GET", path, headers=headers)
    resp = conn.getresponse()
    body = resp.read().decode()
    parsed: object = body
    try:
        parsed = json.loads(body)
    except ValueError:
        pass
    return {"status": resp.status, "body": parsed}


class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        url = urllib.parse.urlsplit(self.path)
        query = dict(urllib.parse.parse_qsl(url.query))
        out: dict[str, object]
        if url.path == "/config":
            out = {
                "config": STATE["config"],
                "env": os.environ.get("DB_PASSWORD_ENV", ""),
                "pid": os.getpid(),
            }
        elif url.path == "/taskapi":
            out = task_api(query["path"], query.get("token") == "1")
        else:
            self.send_error(404)
            return
        data = json.dumps(out).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: object) -> None:
        pass


load()
signal.signal(signal.SIGHUP, load)
PORT = int(os.environ["NOMAD_PORT_http"])  # noqa: SIM112 (Nomad's name)
http.server.ThreadingHTTPServer(("", PORT), Handler).serve_forever()
