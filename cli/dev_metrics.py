"""`corral dev`'s metrics ports and the Prometheus scrape configuration it
writes for them.

Each role serves /metrics on a fixed port, so a Prometheus (or a browser)
pointed at them keeps working across restarts: from `-metrics-port`
(default 9646) upwards, in the order of `ROLES`. `-port 0` (any free port,
as the tests use) makes them any free port too, unless `-metrics-port` is
given. `<data-dir>/prometheus.yml` scrapes the ports the roles really bound
and loads the rules shipped in deploy/observability/ when they are there:

    prometheus --config.file=.corral/dev/prometheus.yml
"""

from __future__ import annotations

import socket
from pathlib import Path

#: the roles in the order of their metrics ports
ROLES = ("state", "broker", "planner", "worker", "agent", "gateway")
DEFAULT_METRICS_PORT = 9646
SCRAPE_FILE = "prometheus.yml"
RULES_DIR = Path(__file__).resolve().parents[1] / "deploy" / "observability" / "rules"


def metrics_ports(base: int) -> dict[str, int]:
    """Each role's metrics port: `base` + its place in ROLES (0: any)."""
    return {role: (base + i if base else 0) for i, role in enumerate(ROLES)}


def base_port(flag: int | None, api_port: int) -> int:
    """The first metrics port: the flag's, else the default, else 0 when
    the API port is 0."""
    if flag is not None:
        return flag
    return 0 if api_port == 0 else DEFAULT_METRICS_PORT


def ports_in_use(host: str, ports: dict[str, int]) -> list[str]:
    """`role port` for every fixed port that cannot be bound."""
    busy = []
    for role, port in ports.items():
        if not port:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind((host, port))
            except OSError:
                busy.append(f"{role} {port}")
    return busy


def scrape_config(targets: dict[str, str], rules_dir: Path = RULES_DIR) -> str:
    """A Prometheus configuration scraping `targets` (role -> host:port);
    every target carries its `role` label."""
    lines = [
        "# Written by `corral dev` for the metrics ports of this run",
        "# (docs/operations.md). Use: prometheus --config.file=<this file>",
        "global:",
        "  scrape_interval: 5s",
        "  evaluation_interval: 5s",
    ]
    if rules_dir.is_dir():
        lines += ["rule_files:", f'  - "{rules_dir}/*.yml"']
    lines += ["scrape_configs:", "  - job_name: corral", "    static_configs:"]
    for role, address in targets.items():
        if address:
            lines += [
                f'      - targets: ["{address}"]',
                "        labels:",
                f"          role: {role}",
            ]
    return "\n".join(lines) + "\n"


def write_scrape_config(data_dir: Path, targets: dict[str, str]) -> Path:
    path = data_dir / SCRAPE_FILE
    path.write_text(scrape_config(targets))
    return path
