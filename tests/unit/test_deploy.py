"""The Kubernetes manifests in deploy/k8s: valid against the Kubernetes
schemas (offline), one Deployment with gRPC probes per role, and commands
that name modules that exist."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

K8S = Path(__file__).resolve().parents[2] / "deploy" / "k8s"
ROLES = ("state", "broker", "planner", "worker")
# custom resources of operators we depend on; their schemas are not core
CUSTOM_KINDS = {"Cluster", "Kustomization"}


def _documents() -> list[tuple[str, dict[str, Any]]]:
    docs = []
    for path in sorted(K8S.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc:
                docs.append((path.name, doc))
    return docs


@pytest.mark.parametrize(
    ("name", "doc"), _documents(), ids=lambda v: v if isinstance(v, str) else ""
)
def test_manifest_is_valid(name: str, doc: dict[str, Any]) -> None:
    if doc["kind"] in CUSTOM_KINDS:
        pytest.skip(f"{doc['kind']} is a custom resource (schema owned by its operator)")
    kubernetes_validate.validate(doc, "1.31", strict=True)


def test_every_role_has_a_deployment_with_grpc_probes_and_a_real_module() -> None:
    deployments = {d["metadata"]["name"]: d for _, d in _documents() if d["kind"] == "Deployment"}
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    listed = set(kustomization["resources"])
    assert {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml"} == listed
    for role in ROLES:
        dep = deployments[f"corral-{role}"]
        container = dep["spec"]["template"]["spec"]["containers"][0]
        module = container["args"][0]
        assert module == f"services.{role}"
        assert importlib.util.find_spec(f"{module}.__main__") is not None
        port = container["ports"][0]["containerPort"]
        assert container["readinessProbe"]["grpc"]["port"] == port
        assert isinstance(port, int)
