"""`corral dev -region/-join/-authoritative-region/-tls-ca`: the flags are
checked before anything starts, every role gets the region, and with
-tls-ca a second region's certificates come from the first's CA and name
their own region (the two-regions-on-one-machine recipe in
docs/operations.md; tests/e2e/test_federation.py runs two regions of real
processes)."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
from cryptography import x509

from cli import dev_trust
from cli.commands.dev import _check_federation_flags
from cli.context import CliError
from corral.security import certs


def _args(**given: object) -> argparse.Namespace:
    base: dict[str, object] = {
        "region": "global",
        "authoritative_region": "",
        "join": [],
        "tls_ca": None,
        "tls": False,
    }
    return argparse.Namespace(**{**base, **given})


@pytest.mark.parametrize(
    ("given", "needle"),
    [
        ({"region": "eu west"}, "-region: 'eu west' is not a region name"),
        ({"authoritative_region": "a.b"}, "-authoritative-region: 'a.b' is not a region name"),
        ({"join": ["127.0.0.1"]}, "-join: '127.0.0.1' is not host:port"),
        ({"tls_ca": "/x"}, "-tls-ca needs -tls"),
    ],
)
def test_bad_federation_flags_are_refused_naming_the_flag(
    given: dict[str, object], needle: str
) -> None:
    with pytest.raises(CliError) as err:
        _check_federation_flags(_args(**given))
    assert needle in str(err.value)


def test_good_federation_flags_pass() -> None:
    _check_federation_flags(
        _args(region="east", authoritative_region="west", join=["127.0.0.1:4646"], tls=True)
    )


def test_two_regions_share_the_first_regions_ca(tmp_path: Path) -> None:
    west = dev_trust.prepare(tmp_path / "west", tls=True, acl=True, region="west")
    east = dev_trust.prepare(
        tmp_path / "east", tls=True, acl=True, region="east", ca_dir=tmp_path / "west" / "tls"
    )
    assert west.tls is not None and east.tls is not None
    for trust, region in ((west, "west"), (east, "east")):
        assert trust.env["CORRAL_REGION"] == region
        assert trust.env["CORRAL_ACL_ENABLED"] == "true"
        for role in certs.ROLES:
            pem = trust.tls.cert_file(role).read_bytes()  # type: ignore[union-attr]
            assert certs.cert_identity(pem) == (role, region)
    # one CA: east's server certificate is signed by west's CA
    assert east.tls.ca_file.read_bytes() == west.tls.ca_file.read_bytes()
    ca = x509.load_pem_x509_certificate(west.tls.ca_file.read_bytes())
    server = x509.load_pem_x509_certificate(east.tls.cert_file("server").read_bytes())
    server.verify_directly_issued_by(ca)


def test_a_tls_ca_directory_without_a_ca_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError) as err:
        dev_trust.prepare(tmp_path / "east", tls=True, acl=False, region="east", ca_dir=tmp_path)
    assert f"-tls-ca {tmp_path}: cannot read the CA there" in str(err.value)
