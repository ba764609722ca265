"""`python -m services.state` — run a state service process.

    python -m services.state --dsn DSN [--listen 127.0.0.1:0] [--ready-file F]
    python -m services.state migrate --dsn DSN

Migrations are applied on start-up (and by `migrate`, which `corral state
migrate` runs); several state processes may share one database.
"""

from __future__ import annotations

import logging
import sys

from corral.runtime import runner
from services.state.app import StateApp
from services.state.config import StateSettings
from services.state.db.migrate import upgrade

log = logging.getLogger("services.state")


class StateProcess:
    """Migrations, then the state app (it registers itself as a member in
    its own database and runs its own leader election for the timers)."""

    def __init__(self, settings: StateSettings) -> None:
        self.settings = settings
        self.app: StateApp | None = None

    async def start(self) -> runner.Ready:
        upgrade(self.settings.dsn)
        self.app = StateApp(self.settings)
        address = await self.app.start()
        log.info("state service ready", extra={"index": self.app.feed.index})
        return runner.Ready(self.settings.advertise or address)

    async def stop(self) -> None:
        if self.app is not None:
            await self.app.stop()


def main(argv: list[str] | None = None) -> int:
    settings, command = runner.settings_from_argv(
        StateSettings, argv, __doc__, commands=("serve", "migrate")
    )
    runner.setup(settings)
    if command == "migrate":
        revision = upgrade(settings.dsn)
        print(f"database migrated to revision {revision}")
        return 0
    return runner.run(settings, StateProcess)


if __name__ == "__main__":
    sys.exit(main())
