"""What the node commands share (cli/commands/node.py and node_pool.py):
Nomad's node list table."""

from __future__ import annotations

from cli.context import Context
from cli.output import short, table
from corral.v1 import node_pb2


def write_node_list(
    ctx: Context, nodes: list[node_pb2.NodeListStub], *, verbose: bool, allocs: bool = False
) -> None:
    """Nomad's node list table."""
    headers = ["ID", "Node Pool", "DC", "Name", "Class", "Drain", "Eligibility", "Status"]
    if allocs:
        headers.append("Running Allocs")
    rows = []
    for n in nodes:
        row = [
            short(n.id, verbose),
            n.node_pool,
            n.datacenter,
            n.name,
            n.node_class or "<none>",
            str(n.drain).lower(),
            n.scheduling_eligibility,
            n.status,
        ]
        if allocs:
            row.append(str(n.running_allocs))
        rows.append(row)
    table(headers, rows, ctx.out)
