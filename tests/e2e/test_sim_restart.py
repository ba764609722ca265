"""The node simulator stands in for restarting agents (issue 19): with a
data dir it keeps its nodes' secrets, so after kill -9 it re-registers the
same nodes (the state refuses a known node id with another secret) and they
keep heartbeating; without one, a second simulator's registrations are
refused."""

from __future__ import annotations

import json
import stat
from collections.abc import Callable
from pathlib import Path

from corral.security import transport
from corral.v1 import node_pb2, node_pb2_grpc
from tests.cluster import Cluster
from tests.wait import until

SIM = ["--count", "5", "--register-rate", "100", "--stats-interval", "1"]


async def ready_nodes(c: Cluster) -> dict[str, str]:
    async with transport.dial(c.state_addr) as ch:
        resp = await node_pb2_grpc.NodeStub(ch).List(node_pb2.NodeListRequest())
    return {n.id: n.status for n in resp.nodes}


async def test_restarted_simulator_reregisters_its_nodes(
    make_cluster: Callable[..., Cluster], tmp_path: Path
) -> None:
    c = make_cluster()
    c.start("state")
    data = tmp_path / "sim"
    await c.start_async("sim", *SIM, "--data-dir", str(data), module="services.agent.sim")
    first = await until(lambda: _all_ready(c), what="5 simulated nodes ready", timeout=30)
    path = data / "sim-nodes.json"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert sorted(json.loads(path.read_text())["secrets"]) == sorted(first)

    c.kill("sim")
    # ready means every node's Register was accepted: same ids, same secrets
    await c.start_async("sim", *SIM, "--data-dir", str(data), module="services.agent.sim")
    assert sorted(await until(lambda: _all_ready(c), what="nodes ready again")) == sorted(first)
    assert "PERMISSION_DENIED" not in c.log("sim")

    # a simulator without the kept secrets is refused for the same node ids
    c.kill("sim")
    proc = c._prepare("sim", tuple(SIM), "sim2", "services.agent.sim", None)
    c._launch(proc)
    await until(
        lambda: "registration refused (PERMISSION_DENIED" in c.log("sim2"),
        what="a simulator without the secrets refused",
        timeout=30,
    )
    assert not proc.ready_file.exists()
    c.kill("sim2")


async def _all_ready(c: Cluster) -> dict[str, str] | None:
    nodes = await ready_nodes(c)
    if len(nodes) == 5 and all(s == "ready" for s in nodes.values()):
        return nodes
    return None
