"""Bounds on the calls that wait: blocking queries and streams.

A blocking query (`QueryOptions.min_index`), an `Event.Stream` and a
`State.Subscribe` each hold a coroutine on the state for as long as they
wait (up to 10 minutes; a stream, for ever). One client connection may hold
at most `per_connection` of them at once, Nomad's `rpc_max_conns_per_client`
/ `http_max_conns_per_client` idea applied where a gRPC client multiplexes
its calls: one more is refused with RESOURCE_EXHAUSTED naming the bound,
and the others go on. A connection is what gRPC calls the peer
(`ipv4:10.0.0.7:51234`); the HTTP gateway is one connection for all of its
users, so size the bound for its users' concurrency.

`Node.GetClientAllocs` is counted per node instead: a node has one such
query open, and the node simulator carries thousands of nodes on one
connection.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from corral.domain.errors import ResourceExhausted
from corral.runtime.server import current_peer
from services.state import metrics

#: default of `--max-waiting-per-connection`
PER_CONNECTION = 1024
#: client-alloc blocking queries one node may hold at once (an agent has
#: one; a few more cover a reconnect overlapping the old call)
PER_NODE = 4


class CallLimits:
    def __init__(self, per_connection: int = PER_CONNECTION, per_node: int = PER_NODE) -> None:
        self.per_connection = per_connection
        self.per_node = per_node
        self._by_peer: dict[str, int] = {}
        self._by_node: dict[str, int] = {}

    @contextlib.contextmanager
    def waiting(self, what: str) -> Iterator[None]:
        """Hold one of this connection's waiting calls while the block runs."""
        with _held(self._by_peer, current_peer(), self.per_connection, what, "connection"):
            yield

    @contextlib.contextmanager
    def node_waiting(self, node_id: str) -> Iterator[None]:
        with _held(self._by_node, node_id, self.per_node, "client alloc queries", "node"):
            yield

    def held(self) -> int:
        """Waiting calls held now, all connections and nodes together."""
        return sum(self._by_peer.values()) + sum(self._by_node.values())


@contextlib.contextmanager
def _held(counts: dict[str, int], key: str, limit: int, what: str, per: str) -> Iterator[None]:
    n = counts.get(key, 0)
    if n >= limit:
        metrics.WAITING_REFUSED.inc()
        raise ResourceExhausted(
            f"this {per} already holds {n} waiting calls (blocking queries and streams); "
            f"at most {limit} at once: {what} refused"
        )
    counts[key] = n + 1
    metrics.WAITING_CALLS.inc()
    try:
        yield
    finally:
        metrics.WAITING_CALLS.dec()
        left = counts[key] - 1
        if left:
            counts[key] = left
        else:
            del counts[key]
