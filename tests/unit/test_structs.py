"""Predicates over the domain messages."""

from __future__ import annotations

from corral.domain import structs
from corral.v1 import structs_pb2 as pb


def test_reconnect_only_when_last_client_state_is_unknown() -> None:
    a = pb.Allocation(client_status="running")
    assert not structs.needs_reconnect(a)
    a.alloc_states.add(field="client_status", value="unknown", time=1)
    assert structs.needs_reconnect(a)
    a.alloc_states.add(field="client_status", value="running", time=2)
    assert not structs.needs_reconnect(a)


def test_legacy_disconnect_fields_map_onto_disconnect_block() -> None:
    tg = pb.TaskGroup(max_client_disconnect=60 * structs.SECOND)
    assert structs.lost_after(tg) == 60 * structs.SECOND
    assert structs.replace_on_disconnect(tg)
    tg2 = pb.TaskGroup(disconnect=pb.DisconnectStrategy(lost_after=5, replace=False))
    assert structs.lost_after(tg2) == 5
    assert not structs.replace_on_disconnect(tg2)
    tg3 = pb.TaskGroup(stop_after_client_disconnect=7)
    assert structs.stop_on_client_after(tg3) == 7


def test_computed_class_ignores_unique_attributes_but_not_resources() -> None:
    n1 = pb.Node(datacenter="dc1", attributes={"kernel.name": "linux", "unique.hostname": "a"})
    n2 = pb.Node(datacenter="dc1", attributes={"kernel.name": "linux", "unique.hostname": "b"})
    assert structs.computed_class(n1) == structs.computed_class(n2)
    n2.node_resources.cpu = 1000
    assert structs.computed_class(n1) != structs.computed_class(n2)


def test_alloc_names() -> None:
    assert structs.alloc_name("web", "app", 3) == "web.app[3]"
    assert structs.alloc_name_index("web.app[12]") == 12
    assert structs.alloc_name_index("bogus") == -1
