"""What the alloc commands share (cli/commands/alloc.py and
alloc_access.py): an alloc by id or unique prefix."""

from __future__ import annotations

import grpc

from cli.commands import not_found
from cli.context import CliError, Context
from corral.v1 import alloc_pb2
from corral.v1 import structs_pb2 as pb


def get_alloc(ctx: Context, alloc_id: str) -> pb.Allocation:
    try:
        resp = ctx.client.allocs.Get(alloc_pb2.AllocGetRequest(alloc_id=alloc_id), timeout=30)
        return resp.alloc
    except grpc.RpcError as exc:
        if not_found(exc):
            raise CliError(f'no allocation with id or prefix "{alloc_id}"') from None
        raise
