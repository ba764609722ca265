"""Nomad's order and paging tokens of the lists kept in creation order
(evaluations, allocations, deployments).

Nomad walks those tables by their `create` index, (CreateIndex, ID), so a
list reads oldest first (`reverse=true`: newest first), and a page's
`NextToken` is `"<CreateIndex>.<ID>"` of the first object of the next page.
With a `prefix` Nomad walks the id index instead: ID order, the token an ID.
The state pages the unfiltered lists and the gateway the filtered ones
(it filters before it pages, as Nomad), both with this one function, so a
token from either is understood by the other.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from itertools import dropwhile
from typing import TypeVar

T = TypeVar("T")


def _by_creation(target: str) -> Callable[[int, str, str], int]:
    """Nomad's comparison of an object against the token sought: the
    create index as a number, then the ID; a token that is not
    `<number>.<id>` is compared as text, as Nomad does."""
    head, dot, rest = target.partition(".")
    if dot and head.isdigit():
        wanted = (int(head), rest)

        def compare(index: int, ident: str, token: str) -> int:
            mine = (index, ident)
            return (mine > wanted) - (mine < wanted)

        return compare

    def compare_text(index: int, ident: str, token: str) -> int:
        return (token > target) - (token < target)

    return compare_text


def creation_page(
    items: Sequence[T],
    *,
    create_index: Callable[[T], int],
    ident: Callable[[T], str],
    by_id: bool,
    next_token: str,
    per_page: int,
    reverse: bool,
) -> tuple[list[T], str]:
    """One page of `items` in Nomad's order and the token of the next page
    ("" on the last one). `by_id` is Nomad's order when a prefix is given."""
    if by_id:
        ordered = sorted(items, key=ident, reverse=reverse)

        def token_of(item: T) -> str:
            return ident(item)

        def compare(item: T) -> int:
            mine = ident(item)
            return (mine > next_token) - (mine < next_token)
    else:
        ordered = sorted(items, key=lambda i: (create_index(i), ident(i)), reverse=reverse)
        against = _by_creation(next_token)

        def token_of(item: T) -> str:
            return f"{create_index(item)}.{ident(item)}"

        def compare(item: T) -> int:
            return against(create_index(item), ident(item), token_of(item))

    if next_token:
        # the objects before the token (after it when reversed) were on the
        # pages already read: the page starts at the first one that is not
        passed = 1 if reverse else -1
        ordered = list(dropwhile(lambda i: compare(i) == passed, ordered))
    if per_page and len(ordered) > per_page:
        return list(ordered[:per_page]), token_of(ordered[per_page])
    return list(ordered), ""
