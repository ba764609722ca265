"""Offline readers of the Kubernetes manifests in deploy/k8s, for the tests:
render a kustomization, find pod templates, decide whether a NetworkPolicy
set lets a connection through, and list what the Pod Security Standards
"restricted" profile would refuse in a pod.

Each follows the Kubernetes documentation of the feature, for the subset our
manifests use; the renderer refuses any kustomization field it does not
implement rather than ignore it, and is checked against `kubectl kustomize`
where kubectl is installed."""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jsonschema  # type: ignore[import-untyped]
import yaml

Doc = dict[str, Any]

# kinds kustomize leaves without a namespace
CLUSTER_SCOPED = {"Namespace", "ClusterIssuer", "ClusterRole", "ClusterRoleBinding"}
# what render() implements; anything else in a kustomization is refused
KUSTOMIZATION_FIELDS = {"apiVersion", "kind", "namespace", "resources", "images"}
WORKLOAD_KINDS = {"Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job"}


# -- rendering ------------------------------------------------------------


def render(directory: Path) -> list[Doc]:
    """What `kubectl kustomize directory` prints, as documents."""
    kustomization = yaml.safe_load((directory / "kustomization.yaml").read_text())
    unknown = set(kustomization) - KUSTOMIZATION_FIELDS
    if unknown:
        raise NotImplementedError(f"{directory}: kustomization fields {sorted(unknown)}")
    docs: list[Doc] = []
    for entry in kustomization.get("resources", []):
        path = (directory / entry).resolve()
        if path.is_dir():
            docs.extend(render(path))
        else:
            docs.extend(copy.deepcopy(d) for d in yaml.safe_load_all(path.read_text()) if d)
    namespace = kustomization.get("namespace")
    for doc in docs:
        if namespace and doc["kind"] not in CLUSTER_SCOPED:
            doc.setdefault("metadata", {})["namespace"] = namespace
        for image in kustomization.get("images", []):
            for container in containers(doc):
                name = container.get("image", "")
                if name == image["name"] or name.startswith(image["name"] + ":"):
                    new = image.get("newName", image["name"])
                    tag = image.get("newTag")
                    container["image"] = f"{new}:{tag}" if tag else new
    return docs


def key(doc: Doc) -> tuple[str, str, str]:
    meta = doc.get("metadata", {})
    return (doc["kind"], meta.get("namespace", ""), meta["name"])


# -- pods -----------------------------------------------------------------


def pod_template(doc: Doc) -> Doc | None:
    """The pod template of a workload (its metadata and spec), else None."""
    if doc["kind"] in WORKLOAD_KINDS:
        template: Doc = doc["spec"]["template"]
        return template
    if doc["kind"] == "CronJob":
        cron_template: Doc = doc["spec"]["jobTemplate"]["spec"]["template"]
        return cron_template
    if doc["kind"] == "Pod":
        return doc
    return None


def containers(doc: Doc) -> Iterator[Doc]:
    template = pod_template(doc)
    if template is None:
        return
    spec = template["spec"]
    for group in ("initContainers", "containers", "ephemeralContainers"):
        yield from spec.get(group, [])


def env_of(container: Doc) -> dict[str, Any]:
    """name -> value (or the valueFrom mapping)."""
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container.get("env", [])}


# -- label selectors and network policies ----------------------------------


def selects(selector: Mapping[str, Any] | None, labels: Mapping[str, str]) -> bool:
    """A LabelSelector against labels (an empty selector selects everything)."""
    if selector is None:
        return False
    for k, v in selector.get("matchLabels", {}).items():
        if labels.get(k) != v:
            return False
    for expr in selector.get("matchExpressions", []):
        k, op, values = expr["key"], expr["operator"], expr.get("values", [])
        if op == "In" and labels.get(k) not in values:
            return False
        if op == "NotIn" and k in labels and labels[k] in values:
            return False
        if op == "Exists" and k not in labels:
            return False
        if op == "DoesNotExist" and k in labels:
            return False
    return True


@dataclass(frozen=True)
class Pod:
    """A pod as network policies see it."""

    name: str
    labels: Mapping[str, str]
    namespace: str
    ports: Mapping[str, int] = field(default_factory=dict)  # named container ports

    @property
    def namespace_labels(self) -> dict[str, str]:
        return {"kubernetes.io/metadata.name": self.namespace}


def _peer_admits(peer: Doc, source: Pod | None, policy_namespace: str) -> bool:
    if "ipBlock" in peer:
        return source is None  # our reading: an ipBlock names addresses outside the cluster
    if source is None:
        return False
    pod_sel = peer.get("podSelector")
    ns_sel = peer.get("namespaceSelector")
    if ns_sel is None:
        in_namespace = source.namespace == policy_namespace
    else:
        in_namespace = selects(ns_sel, source.namespace_labels)
    return in_namespace and (pod_sel is None or selects(pod_sel, source.labels))


def _port_admits(rule_ports: list[Doc] | None, dest: Pod, port: int) -> bool:
    if not rule_ports:
        return True
    for p in rule_ports:
        if p.get("protocol", "TCP") != "TCP":
            continue
        wanted = p.get("port")
        if wanted is None:
            return True
        number = dest.ports.get(wanted) if isinstance(wanted, str) else int(wanted)
        if number is None:
            continue
        if number <= port <= int(p.get("endPort", number)):
            return True
    return False


def ingress_allowed(policies: list[Doc], source: Pod | None, dest: Pod, port: int) -> bool:
    """Whether a TCP connection from `source` (None: from outside the
    cluster) to `dest:port` is let in: allowed when no policy isolates the
    pod for ingress, otherwise when some rule of a policy selecting it admits
    both the source and the port."""
    isolating = [
        p
        for p in policies
        if p["metadata"].get("namespace") == dest.namespace
        and "Ingress" in p["spec"].get("policyTypes", ["Ingress"])
        and selects(p["spec"]["podSelector"], dest.labels)
    ]
    if not isolating:
        return True
    for policy in isolating:
        for rule in policy["spec"].get("ingress", []) or []:
            peers = rule.get("from") or []
            from_ok = not peers or any(_peer_admits(peer, source, dest.namespace) for peer in peers)
            if from_ok and _port_admits(rule.get("ports"), dest, port):
                return True
    return False


# -- Pod Security Standards ---------------------------------------------------

RESTRICTED_VOLUME_TYPES = {
    "configMap",
    "csi",
    "downwardAPI",
    "emptyDir",
    "ephemeral",
    "persistentVolumeClaim",
    "projected",
    "secret",
}
# what "baseline" lets a container add
BASELINE_CAPABILITIES = {
    "AUDIT_WRITE",
    "CHOWN",
    "DAC_OVERRIDE",
    "FOWNER",
    "FSETID",
    "KILL",
    "MKNOD",
    "NET_BIND_SERVICE",
    "SETFCAP",
    "SETGID",
    "SETPCAP",
    "SETUID",
    "SYS_CHROOT",
}
LEVELS = ("privileged", "baseline", "restricted")


def _all_containers(spec: Doc) -> Iterator[Doc]:
    for group in ("initContainers", "containers", "ephemeralContainers"):
        yield from spec.get(group, [])


def baseline_violations(template: Doc) -> list[str]:
    """What the "baseline" profile refuses in a pod template, one line each."""
    spec = template["spec"]
    pod_sc = spec.get("securityContext", {})
    problems: list[str] = []
    for flag in ("hostNetwork", "hostPID", "hostIPC"):
        if spec.get(flag):
            problems.append(f"{flag} is true")
    if pod_sc.get("sysctls"):
        problems.append("sysctls are set")
    for volume in spec.get("volumes", []):
        if "hostPath" in volume:
            problems.append(f"volume {volume['name']} is a hostPath")
    if pod_sc.get("seccompProfile", {}).get("type") == "Unconfined":
        problems.append("the pod's seccompProfile is Unconfined")
    for container in _all_containers(spec):
        name = container["name"]
        sc = container.get("securityContext", {})
        if sc.get("privileged"):
            problems.append(f"{name}: privileged")
        added = set(sc.get("capabilities", {}).get("add", [])) - BASELINE_CAPABILITIES
        if added:
            problems.append(f"{name}: adds capabilities {sorted(added)}")
        for port in container.get("ports", []):
            if port.get("hostPort"):
                problems.append(f"{name}: hostPort {port['hostPort']}")
        if sc.get("procMount", "Default") != "Default":
            problems.append(f"{name}: procMount {sc['procMount']}")
        if sc.get("seccompProfile", {}).get("type") == "Unconfined":
            problems.append(f"{name}: seccompProfile is Unconfined")
    return problems


def restricted_violations(template: Doc) -> list[str]:
    """What the "restricted" profile (baseline included) refuses in a pod
    template, one line each; empty when the pod would be admitted."""
    spec = template["spec"]
    pod_sc = spec.get("securityContext", {})
    problems = baseline_violations(template)
    for volume in spec.get("volumes", []):
        kinds = set(volume) - {"name"}
        if not kinds <= RESTRICTED_VOLUME_TYPES:
            problems.append(f"volume {volume['name']} is of type {sorted(kinds)}")
    if pod_sc.get("runAsUser") == 0:
        problems.append("the pod runs as uid 0")
    pod_seccomp = pod_sc.get("seccompProfile", {}).get("type")
    for container in _all_containers(spec):
        name = container["name"]
        sc = container.get("securityContext", {})
        if sc.get("allowPrivilegeEscalation") is not False:
            problems.append(f"{name}: allowPrivilegeEscalation is not false")
        caps = sc.get("capabilities", {})
        if "ALL" not in caps.get("drop", []):
            problems.append(f"{name}: capabilities do not drop ALL")
        added = set(caps.get("add", [])) - {"NET_BIND_SERVICE"}
        if added:
            problems.append(f"{name}: adds capabilities {sorted(added)} (restricted)")
        non_root = sc.get("runAsNonRoot", pod_sc.get("runAsNonRoot"))
        if non_root is not True:
            problems.append(f"{name}: runAsNonRoot is not true")
        if sc.get("runAsUser") == 0:
            problems.append(f"{name}: runs as uid 0")
        seccomp = sc.get("seccompProfile", {}).get("type", pod_seccomp)
        if seccomp not in ("RuntimeDefault", "Localhost"):
            problems.append(f"{name}: seccompProfile is {seccomp}, not RuntimeDefault")
    return problems


def profile_violations(template: Doc, level: str) -> list[str]:
    """What the Pod Security Standards `level` refuses in a pod template."""
    if level == "privileged":
        return []
    if level == "baseline":
        return baseline_violations(template)
    if level == "restricted":
        return restricted_violations(template)
    raise ValueError(f"unknown Pod Security level {level!r}")


# -- custom resources -------------------------------------------------------

SCHEMAS = Path(__file__).resolve().parents[1] / "deploy" / "k8s" / "schemas"


def _strict(schema: Any) -> Any:
    """The CRD schema with unknown fields refused, as the API server's strict
    field validation does (a structural schema prunes them silently)."""
    if isinstance(schema, list):
        return [_strict(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: _strict(v) for k, v in schema.items()}
    if (
        "properties" in out
        and "additionalProperties" not in out
        and not out.get("x-kubernetes-preserve-unknown-fields")
    ):
        out["additionalProperties"] = False
    return out


def custom_schema(doc: Doc) -> Path:
    api_version: str = doc["apiVersion"]
    group, _, version = api_version.rpartition("/")
    kind: str = doc["kind"]
    return SCHEMAS / group / f"{kind}_{version}.json"


def custom_violations(doc: Doc) -> list[str]:
    """What the shipped schema of a custom resource's kind refuses in it
    (deploy/k8s/schemas); FileNotFoundError when no schema is shipped."""
    schema = _strict(json.loads(custom_schema(doc).read_text()))
    # the CRD schemas say only "type: object" for metadata
    schema.setdefault("properties", {})["metadata"] = {"type": "object"}
    validator = jsonschema.Draft7Validator(schema)
    return [
        f"{'.'.join(str(p) for p in e.absolute_path) or '(top)'}: {e.message}"
        for e in validator.iter_errors(doc)
    ]
