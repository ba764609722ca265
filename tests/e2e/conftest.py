"""Fixtures for end-to-end tests: clusters of real processes, each over a
freshly migrated database of its own."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from corral.pgserver import with_database
from tests.conftest import drop_database, new_database
from tests.e2e.cluster import Cluster


@pytest.fixture
def make_cluster(
    request: pytest.FixtureRequest, pg_admin_dsn: str, pg_template: str, tmp_path: Path
) -> Iterator[Callable[..., Cluster]]:
    """Call it to get an empty Cluster (start roles yourself); every cluster
    is stopped and its database dropped when the test ends."""
    made: list[tuple[Cluster, str]] = []

    def make(**env: str) -> Cluster:
        name = new_database(pg_admin_dsn, pg_template, f"{request.node.name}_{len(made)}")
        cluster = Cluster(
            with_database(pg_admin_dsn, name), tmp_path / f"cluster{len(made)}", env=env
        )
        made.append((cluster, name))
        return cluster

    try:
        yield make
    finally:
        for cluster, name in made:
            cluster.stop_all()
            drop_database(pg_admin_dsn, name)
