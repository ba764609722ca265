"""The HTTP gateway role: Nomad's `/v1` HTTP API (and the web UI at `/ui`)
served by calling Corral's public gRPC API (docs/http-api.md)."""
