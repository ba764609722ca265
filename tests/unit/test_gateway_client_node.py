"""`/v1/client/metadata`'s body and answer in Nomad's JSON: `Meta` is an
object of strings or nulls (null unsets), anything else a 400 naming it;
`Dynamic` answers null for a static key unset."""

from __future__ import annotations

import pytest

from corral.domain import node_meta
from corral.v1 import node_pb2
from services.gateway import http
from services.gateway.routes.client_node import _changes


def test_meta_sets_and_unsets() -> None:
    assert _changes({"Meta": {"rack": "r1", "zone": None, "e": ""}}) == (
        {"rack": "r1", "e": ""},
        ["zone"],
    )


@pytest.mark.parametrize(
    ("body", "says"),
    [
        ({}, "missing required Meta object"),
        ({"Meta": None}, "missing required Meta object"),
        ({"Meta": ["rack"]}, "Meta must be an object"),
        ({"Meta": {"rack": 7}}, "Meta['rack'] must be a string or null"),
        ({"Meta": {"rack": {"a": "b"}}}, "Meta['rack'] must be a string or null"),
    ],
)
def test_a_bad_meta_is_a_400_naming_it(body: dict[str, object], says: str) -> None:
    with pytest.raises(http.NomadError) as err:
        _changes(body)
    assert err.value.status == 400 and says in err.value.message


def test_the_answer_is_nomads_node_meta_response() -> None:
    resp = node_pb2.NodeMetaResponse(
        meta={"rack": "r2"}, dynamic={"rack": "r2"}, dynamic_unset=["zone"], static={"zone": "z"}
    )
    assert node_meta.nomad_json(resp) == {
        "Meta": {"rack": "r2"},
        "Dynamic": {"rack": "r2", "zone": None},
        "Static": {"zone": "z"},
    }
