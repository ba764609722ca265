"""Nomad's order and paging tokens of the lists kept in creation order
(corral/domain/paging.py): by (create index, ID), `reverse` turning it
round, ID order with a prefix; every page read by the previous page's
token, the tokens Nomad's (`<index>.<id>`, compared as a number then an ID)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from corral.domain.paging import creation_page


@dataclass(frozen=True)
class Obj:
    id: str
    create_index: int


#: creation order differs from ID order; 9 and 12 and 102 (a text
#: comparison of indexes would put 102 before 12); two at index 12
OBJS = [
    Obj("d", 9),
    Obj("c", 12),
    Obj("a", 12),
    Obj("b", 102),
    Obj("e", 3),
]


def _page(
    token: str, per_page: int, *, reverse: bool = False, by_id: bool = False
) -> tuple[list[str], str]:
    page, nxt = creation_page(
        OBJS,
        create_index=lambda o: o.create_index,
        ident=lambda o: o.id,
        by_id=by_id,
        next_token=token,
        per_page=per_page,
        reverse=reverse,
    )
    return [o.id for o in page], nxt


def _walk(per_page: int, **kw: bool) -> tuple[list[str], list[str]]:
    """Every page from the first, by each page's token: the ids in order
    and the tokens given."""
    seen: list[str] = []
    tokens: list[str] = []
    token = ""
    while True:
        ids, token = _page(token, per_page, **kw)
        seen.extend(ids)
        if not token:
            return seen, tokens
        tokens.append(token)


def test_whole_list_is_in_creation_order_then_id() -> None:
    assert _page("", 0) == (["e", "d", "a", "c", "b"], "")


@pytest.mark.parametrize("per_page", [1, 2, 3, 4, 5])
def test_pages_by_token_cover_the_list_once_in_order(per_page: int) -> None:
    seen, _ = _walk(per_page)
    assert seen == ["e", "d", "a", "c", "b"]


def test_tokens_are_nomads_index_dot_id() -> None:
    _, tokens = _walk(2)
    assert tokens == ["12.a", "102.b"]
    # a number, not text: "102.b" sorts after "12.c"
    assert _page("102.b", 10) == (["b"], "")
    assert _page("12.c", 1) == (["c"], "102.b")


def test_reverse_is_newest_first_and_its_tokens_count_down() -> None:
    seen, tokens = _walk(2, reverse=True)
    assert seen == ["b", "c", "a", "d", "e"]
    assert tokens == ["12.a", "3.e"]


def test_prefix_lists_are_in_id_order_with_id_tokens() -> None:
    seen, tokens = _walk(2, by_id=True)
    assert seen == ["a", "b", "c", "d", "e"] and tokens == ["c", "e"]
    seen, tokens = _walk(2, by_id=True, reverse=True)
    assert seen == ["e", "d", "c", "b", "a"] and tokens == ["c", "a"]


def test_a_token_of_an_object_gone_since_starts_after_it() -> None:
    # "12.b" names no object: the page starts at the next one, "12.c"
    assert _page("12.b", 0) == (["c", "b"], "")
    # a token that is not <index>.<id> is compared as text, as Nomad does
    assert _page("5", 0)[0] == ["d", "a", "c", "b"]
