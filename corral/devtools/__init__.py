"""Tools for running Corral on a developer's machine (the embedded
PostgreSQL). Not part of a production deployment."""
