"""The batch checks namespace and node pool upserts share
(services/state/writes/named.py): each refusal names the field and the
object in its own noun, in the order the checks run."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import pytest

from corral.domain.errors import InvalidArgument
from corral.v1 import structs_pb2 as pb
from services.state.writes.namespaces import validate_namespaces
from services.state.writes.node_pools import validate_node_pools


def _refusal(check: Callable[[], None]) -> str:
    with pytest.raises(InvalidArgument) as caught:
        check()
    return str(caught.value)


def test_namespace_batches() -> None:
    def check(items: Sequence[pb.Namespace]) -> str:
        return _refusal(lambda: validate_namespaces(items))

    assert check([]) == "namespaces: must specify at least one namespace"
    many = [pb.Namespace(name=f"n{i}") for i in range(101)]
    assert check(many) == "namespaces: has 101 namespaces, more than 100"
    assert check([pb.Namespace(name="ok"), pb.Namespace(name="a\x00b")]) == (
        "namespaces[1].name: must not contain NUL characters"
    )
    assert check([pb.Namespace(name="bad name")]).startswith(
        "namespaces[0].name: invalid namespace 'bad name': "
    )
    assert check([pb.Namespace(name="team", meta={"": "x"})]).startswith("namespaces[0].meta")
    assert check([pb.Namespace(name="team"), pb.Namespace(name="team")]) == (
        "namespaces[1].name: 'team' is given twice"
    )
    validate_namespaces([pb.Namespace(name="default"), pb.Namespace(name="team")])


def test_node_pool_batches() -> None:
    def check(items: Sequence[pb.NodePool]) -> str:
        return _refusal(lambda: validate_node_pools(items))

    assert check([]) == "node_pools: must specify at least one node pool"
    many = [pb.NodePool(name=f"p{i}") for i in range(101)]
    assert check(many) == "node_pools: has 101 node pools, more than 100"
    assert check([pb.NodePool(name="bad name")]).startswith(
        "node_pools[0].name: invalid node pool 'bad name': "
    )
    # a built-in pool is refused before its meta is looked at
    assert check([pb.NodePool(name="default", meta={"": "x"})]) == (
        "node_pools[0].name: modifying node pool 'default' is not allowed"
    )
    assert check([pb.NodePool(name="gpu", meta={"": "x"})]).startswith("node_pools[0].meta")
    assert check([pb.NodePool(name="gpu"), pb.NodePool(name="gpu")]) == (
        "node_pools[1].name: 'gpu' is given twice"
    )
    validate_node_pools([pb.NodePool(name="gpu"), pb.NodePool(name="batch")])
