"""`corral ui`'s address of the web UI: -http-addr, then CORRAL_HTTP_ADDR,
then `corral dev`'s gateway."""

from __future__ import annotations

import pytest

from cli.commands.ui import ui_address
from cli.context import CliError


def test_the_flag_then_the_environment_then_the_dev_gateway(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("CORRAL_HTTP_ADDR", raising=False)
    assert ui_address(None) == "http://127.0.0.1:4647"
    monkeypatch.setenv("CORRAL_HTTP_ADDR", "https://nomad.example:443/")
    assert ui_address(None) == "https://nomad.example:443"
    assert ui_address("10.0.0.5:8080") == "http://10.0.0.5:8080"  # a bare host:port


def test_an_address_that_is_not_http_is_refused() -> None:
    with pytest.raises(CliError, match="is not an http"):
        ui_address("grpc://127.0.0.1:4646")
