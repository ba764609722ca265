"""The regions this region joined (or that joined it), as stored in
`federation_regions`: membership outside the indexed state, like the
`members` table (services/state/db/models.py says why)."""

from __future__ import annotations

from collections.abc import Sequence

from services.state.db.database import Database


async def load(db: Database) -> dict[str, list[str]]:
    """Every stored region and its state servers' addresses."""
    rows = await db.bookkeeping("SELECT region, addresses FROM federation_regions ORDER BY region")
    return {str(r[0]): [str(a) for a in r[1] or ()] for r in rows}


async def save(db: Database, region: str, addresses: Sequence[str]) -> None:
    """Keep `region` with `addresses` (replacing what was kept)."""
    await db.bookkeeping(
        "INSERT INTO federation_regions (region, addresses) VALUES (%s, %s) "
        "ON CONFLICT (region) DO UPDATE SET addresses = excluded.addresses, updated_at = now()",
        (region, list(addresses)),
    )


async def forget(db: Database, region: str) -> bool:
    """Drop `region`; whether it was kept."""
    rows = await db.bookkeeping(
        "DELETE FROM federation_regions WHERE region = %s RETURNING region", (region,)
    )
    return bool(rows)
