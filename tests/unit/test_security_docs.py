"""docs/security.md is a contract: each boundary of its threat model names
the test that holds it, and what it says about client certificates agrees
with docs/http-api.md and the gateway's settings (issue 26, finding 6: the
threat model said every server requires a client certificate while the
HTTPS gateway accepted callers with none)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from services.gateway.config import GatewaySettings

ROOT = Path(__file__).resolve().parents[2]
SECURITY = (ROOT / "docs" / "security.md").read_text()
HTTP_API = (ROOT / "docs" / "http-api.md").read_text()
_CITED = re.compile(r"`(tests/[\w/]+\.py)(?:::(\w+))?`")


def test_every_test_the_threat_model_cites_exists() -> None:
    cited = _CITED.findall(SECURITY)
    assert cited, "docs/security.md cites no test"
    for path, name in cited:
        file = ROOT / path
        assert file.is_file(), f"docs/security.md cites {path}, which does not exist"
        if name:
            tree = ast.parse(file.read_text())
            defined = {
                n.name
                for n in tree.body
                if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
            }
            assert name in defined, f"docs/security.md cites {path}::{name}, not defined there"


def test_both_pages_say_how_to_require_https_client_certificates() -> None:
    field = GatewaySettings.model_fields["http_verify_clients"]
    assert field.default is False  # optional by default, as Nomad's verify_https_client
    for page, text in (("security.md", SECURITY), ("http-api.md", HTTP_API)):
        assert "--http-verify-clients" in text, page
        assert "CORRAL_GATEWAY_HTTP_VERIFY_CLIENTS=true" in text, page
        assert "verify_https_client" in text, page
    assert "every server requires a client certificate" not in SECURITY
