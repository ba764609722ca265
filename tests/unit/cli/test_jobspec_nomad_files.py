"""Nomad's own job files (its e2e inputs and the `nomad job init` examples),
read from the local mirror of Nomad's repository (never copied into ours):
how many the parser accepts, and that every file whose only blockers are
blocks owned by other issues is accepted once those are set aside.

The counts are recorded so a regression fails; raise them as blocks land.
Without the mirror (`CORRAL_NOMAD_MIRROR`, default the workplace's bare
clone) the test is skipped."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from corral.domain.jobspec import body as body_module
from corral.domain.jobspec.errors import JobspecError
from corral.domain.jobspec.language.variables import VarInputs
from corral.domain.jobspec.load import parse_job

MIRROR = Path(os.environ.get("CORRAL_NOMAD_MIRROR", "/work/.mirror/hashicorp+nomad/repo"))
INIT_EXAMPLES = {
    "command/asset/example.nomad.hcl",
    "command/asset/example-short.nomad.hcl",
    "command/asset/connect.nomad.hcl",
    "command/asset/connect-short.nomad.hcl",
}
#: blocks and arguments other issues own (templates, volumes, the client's
#: task features, ...): set aside to find the files only this parser's
#: language would still refuse
OTHER_ISSUES = frozenset(
    {
        "lifecycle",
        "logs",
        "vault",
        "consul",
        "csi_plugin",
        "secret",
        "schedule",
    }
)
#: accepted as they are (55 before HCL2 evaluation and issue 27's arguments,
#: 66 before the scaling block, 78 with identities, 79 with Nomad-provider
#: services alone, 87 before host volumes and artifacts, 91 with them, 93
#: with templates alone, 99 with the three, 95 with templates, lifecycle and
#: logs, 103 with all five, 104 with actions)
EXPECTED_ACCEPTED = 104
#: files in the mirror's e2e tree that hold a volume specification, not a job
NOT_JOBS = 2
#: files whose services are Consul's (no provider, Nomad's default, or
#: provider "consul"): refused for good with "Consul is not available in
#: Corral" (docs/services.md); Nomad's e2e suite tests Consul a lot
CONSUL_REFUSED = 34
#: files whose templates call a function that reads Consul or Vault (`key`,
#: `secret`): refused for good too (docs/templates.md)
TEMPLATE_FUNCTION_REFUSED = 3
TEMPLATE_FUNCTION = re.compile(r"reads (Consul|Vault), which Corral does not have")
#: the final refusals: a feature Corral lacks, or a Consul (or Vault) one
REFUSAL = re.compile(
    r"the (\w+) (block|argument) is not supported by Corral|Consul is not available in Corral"
    # a getter, CSI or sticky (dynamic host) volumes: issue 29's refusals
    r"|(getter|volumes|\(dynamic host volumes\)) (is|are) not supported by Corral"
    r"|reads (Consul|Vault), which Corral does not have"
)


#: files Nomad's own e2e suite registers to see them refused (a group count
#: outside its scaling policy's min..max), refused here too, with Nomad's reason
NOMAD_REFUSES = {
    "e2e/scaling/input/namespace_default_2.nomad.hcl": "must not be less than the group's count",
    "e2e/scaling/input/namespace_default_3.nomad.hcl": "must not be greater than the group's count",
}


#: files using what issue 29's host volumes and artifacts refuse on purpose:
#: go-getter's git getter, CSI volumes and sticky (dynamic) host volumes
CORRAL_LACKS = {
    "e2e/artifact/input/artifact_darwin.nomad": "the git getter is not supported",
    "e2e/artifact/input/artifact_linux.nomad": "the git getter is not supported",
    "e2e/csi/input/use-ebs-volume.nomad": "CSI volumes are not supported",
    "e2e/csi/input/use-efs-volume-read.nomad": "CSI volumes are not supported",
    "e2e/csi/input/use-efs-volume-write.nomad": "CSI volumes are not supported",
    "e2e/dynamic_host_volumes/input/sticky.nomad.hcl": "sticky volumes",
}


def _git(*args: str) -> str:
    return subprocess.run(
        ["git", f"--git-dir={MIRROR}", *args], capture_output=True, text=True, check=True
    ).stdout


@pytest.fixture(scope="module")
def nomad_files() -> dict[str, str]:
    if not MIRROR.is_dir():
        pytest.skip(f"no mirror of Nomad's repository at {MIRROR}")
    names = _git("ls-tree", "-r", "--name-only", "HEAD", "e2e", "command/asset").split("\n")
    chosen = [
        n
        for n in names
        if (n.startswith("e2e/") and re.search(r"\.nomad(\.hcl)?$", n)) or n in INIT_EXAMPLES
    ]
    return {n: _git("show", f"HEAD:{n}") for n in chosen}


def _parse(name: str, text: str) -> None:
    """Parse as the e2e suite runs them: a declared variable without a
    default gets a value (`-var name=1`, fit for strings and numbers)."""
    args: list[str] = []
    for _ in range(10):
        try:
            parse_job(text, name, VarInputs(args=args))
            return
        except JobspecError as exc:
            m = re.match(r'variable "([^"]+)" has no value', exc.problem)
            if not m:
                raise
            args.append(f"{m.group(1)}=1")


def _outcomes(files: dict[str, str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for name, text in sorted(files.items()):
        try:
            _parse(name, text)
            out[name] = "ok"
        except JobspecError as exc:
            out[name] = exc.problem
    return out


def test_nomad_job_files_accepted(nomad_files: dict[str, str]) -> None:
    outcomes = _outcomes(nomad_files)
    not_jobs = [n for n, why in outcomes.items() if "unexpected argument at the top level" in why]
    assert len(not_jobs) == NOT_JOBS, not_jobs
    accepted = [n for n, why in outcomes.items() if why == "ok"]
    assert len(nomad_files) - NOT_JOBS == 153
    assert len(accepted) == EXPECTED_ACCEPTED, {n: w for n, w in outcomes.items() if w != "ok"}
    # no file fails on the language itself: every refusal is a block owned elsewhere
    for name, why in outcomes.items():
        if why == "ok" or name in not_jobs:
            continue
        if name in NOMAD_REFUSES:
            assert NOMAD_REFUSES[name] in why, (name, why)
            continue
        assert REFUSAL.search(why), (name, why)


def test_files_blocked_only_by_other_issues_are_accepted_without_them(
    nomad_files: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    done = body_module.Body.done

    def tolerant(self: body_module.Body) -> None:
        for name in list(self.data):
            if name in OTHER_ISSUES and name not in self.used:
                self.used.add(name)
        done(self)

    monkeypatch.setattr(body_module.Body, "done", tolerant)
    outcomes = _outcomes(nomad_files)
    refused = {
        n: why
        for n, why in outcomes.items()
        if why != "ok" and "unexpected argument at the top level" not in why
    }
    consul = {n for n, why in refused.items() if "Consul is not available in Corral" in why}
    functions = {n for n, why in refused.items() if TEMPLATE_FUNCTION.search(why)}
    assert set(refused) == consul | functions | set(NOMAD_REFUSES) | set(CORRAL_LACKS), "\n".join(
        f"{n}: {w}" for n, w in refused.items()
    )
    assert len(consul) == CONSUL_REFUSED
    assert len(functions) == TEMPLATE_FUNCTION_REFUSED
    for name, why in CORRAL_LACKS.items():
        assert why in refused[name], (name, refused[name])
