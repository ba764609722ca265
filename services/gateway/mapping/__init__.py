"""Our protos ↔ Nomad's HTTP API JSON (its `api` package's structs:
PascalCase field names, nanosecond durations, Nomad's status strings).
One module per object; `common` holds the generic conversion they share."""
