"""The Kubernetes manifests in deploy/k8s, rendered (the base, and the
cert-manager overlay): valid against the Kubernetes schemas (offline), one
Deployment per role with probes and a real module, every pod admitted by the
Pod Security Standards "restricted" profile, TLS material mounted read-only
from Secrets that the overlay's Certificates issue with the role's names,
ACLs on, and NetworkPolicies that let exactly the intended callers reach
each port. The image runs as the pods' non-root user."""

from __future__ import annotations

import copy
import importlib.util
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from corral import certs
from tests.k8s import (
    Doc,
    Pod,
    containers,
    env_of,
    ingress_allowed,
    key,
    pod_template,
    render,
    restricted_violations,
)

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "k8s"
BASE, OVERLAY = K8S / "base", K8S / "cert-manager"
NAMESPACE = "corral"
SERVER_ROLES = ("state", "broker", "planner", "worker")
ROLES = (*SERVER_ROLES, "agent")
PORTS = {"state": 4646, "broker": 4647, "planner": 4648, "worker": 4649, "agent": 4650}
# roles that must check ACL tokens (they serve users: the public API, the
# worker admin API, task logs)
ACL_ROLES = ("state", "broker", "planner", "worker", "agent")
TLS_ENV = {"CORRAL_CA_FILE": "ca.crt", "CORRAL_CERT_FILE": "tls.crt", "CORRAL_KEY_FILE": "tls.key"}
TLS_SECRET = {**dict.fromkeys(SERVER_ROLES, "corral-server-tls"), "agent": "corral-client-tls"}
# custom resources of operators we depend on; their schemas are not core
CUSTOM_KINDS = {"Cluster", "Certificate", "Issuer", "ClusterIssuer"}

BASE_DOCS = render(BASE)
OVERLAY_DOCS = render(OVERLAY)


def _by_kind(docs: list[Doc], kind: str) -> dict[str, Doc]:
    return {d["metadata"]["name"]: d for d in docs if d["kind"] == kind}


DEPLOYMENTS = _by_kind(BASE_DOCS, "Deployment")


def _container(role: str) -> Doc:
    container: Doc = DEPLOYMENTS[f"corral-{role}"]["spec"]["template"]["spec"]["containers"][0]
    return container


def _all_docs() -> list[tuple[str, Doc]]:
    base_keys = {key(d) for d in BASE_DOCS}
    docs = [("base", d) for d in BASE_DOCS]
    docs += [("cert-manager", d) for d in OVERLAY_DOCS if key(d) not in base_keys]
    return docs


@pytest.mark.parametrize(
    ("where", "doc"),
    _all_docs(),
    ids=[f"{w}:{d['kind']}/{d['metadata']['name']}" for w, d in _all_docs()],
)
def test_manifest_is_valid(where: str, doc: Doc) -> None:
    if doc["kind"] in CUSTOM_KINDS:
        pytest.skip(f"{doc['kind']} is a custom resource (schema owned by its operator)")
    kubernetes_validate.validate(doc, "1.31", strict=True)


def test_the_overlay_is_the_base_plus_issuers_and_certificates() -> None:
    base = {key(d): d for d in BASE_DOCS}
    overlay = {key(d): d for d in OVERLAY_DOCS}
    assert {k: overlay[k] for k in base} == base  # nothing in the base is changed
    added = {k[0] for k in set(overlay) - set(base)}
    assert added == {"Issuer", "Certificate"}
    for path in (BASE, OVERLAY):
        listed = set(yaml.safe_load((path / "kustomization.yaml").read_text())["resources"])
        files = {p.name for p in path.glob("*.yaml")} - {"kustomization.yaml"}
        assert files <= listed, f"{path.name}: files not in the kustomization"


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed")
@pytest.mark.parametrize("path", [BASE, OVERLAY], ids=["base", "cert-manager"])
def test_the_offline_renderer_agrees_with_kubectl_kustomize(path: Path) -> None:
    done = subprocess.run(
        ["kubectl", "kustomize", str(path)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    theirs = sorted((d for d in yaml.safe_load_all(done.stdout) if d), key=key)
    ours = sorted(render(path), key=key)
    assert theirs == ours


def test_every_role_has_a_deployment_with_probes_and_a_real_module() -> None:
    for role in ROLES:
        container = _container(role)
        module = container["args"][0]
        assert module == f"services.{role}"
        assert importlib.util.find_spec(f"{module}.__main__") is not None
        port = container["ports"][0]["containerPort"]
        assert port == PORTS[role] and container["ports"][0]["name"] == "grpc"
        assert env_of(container)[f"CORRAL_{role.upper()}_LISTEN"] == f"0.0.0.0:{port}"
        # the kubelet's gRPC probe cannot speak TLS: the probes only connect
        for probe in ("readinessProbe", "livenessProbe"):
            assert container[probe]["tcpSocket"]["port"] == port
            assert isinstance(port, int)


def test_the_namespace_enforces_the_restricted_profile() -> None:
    namespace = _by_kind(BASE_DOCS, "Namespace")[NAMESPACE]
    labels = namespace["metadata"]["labels"]
    assert labels["pod-security.kubernetes.io/enforce"] == "restricted"
    assert labels["pod-security.kubernetes.io/enforce-version"] == "latest"
    assert all(d["metadata"].get("namespace") == NAMESPACE for d in BASE_DOCS if d is not namespace)


def _pod_docs(docs: list[Doc]) -> list[Doc]:
    return [d for d in docs if pod_template(d) is not None]


@pytest.mark.parametrize("doc", _pod_docs(BASE_DOCS), ids=lambda d: d["metadata"]["name"])
def test_every_pod_passes_the_restricted_profile_and_more(doc: Doc) -> None:
    template = pod_template(doc)
    assert template is not None
    assert restricted_violations(template) == []
    spec = template["spec"]
    pod_sc = spec["securityContext"]
    assert pod_sc["runAsNonRoot"] is True and pod_sc["runAsUser"] != 0
    assert pod_sc["seccompProfile"]["type"] == "RuntimeDefault"
    # no pod of ours talks to the Kubernetes API
    assert spec["automountServiceAccountToken"] is False
    volumes = {v["name"]: v for v in spec.get("volumes", [])}
    for container in spec["containers"]:
        sc = container["securityContext"]
        assert sc["allowPrivilegeEscalation"] is False
        assert sc["capabilities"]["drop"] == ["ALL"] and "add" not in sc["capabilities"]
        assert sc["readOnlyRootFilesystem"] is True
        # a read-only root: /tmp is an emptyDir
        mounts = {m["mountPath"]: m for m in container.get("volumeMounts", [])}
        assert "emptyDir" in volumes[mounts["/tmp"]["name"]]


def test_the_restricted_check_catches_what_it_must() -> None:
    """The checker above is not vacuous: each change to a good pod that the
    profile forbids is reported."""
    good = pod_template(DEPLOYMENTS["corral-state"])
    assert good is not None and restricted_violations(good) == []

    def broken(change: Any) -> list[str]:
        pod = copy.deepcopy(good)
        change(pod["spec"], pod["spec"]["containers"][0])
        return restricted_violations(pod)

    assert broken(lambda s, c: c["securityContext"].pop("allowPrivilegeEscalation"))
    assert broken(lambda s, c: c["securityContext"]["capabilities"].update(drop=[]))
    assert broken(lambda s, c: c["securityContext"]["capabilities"].update(add=["NET_ADMIN"]))
    assert broken(lambda s, c: c["securityContext"].update(runAsNonRoot=False))
    assert broken(
        lambda s, c: (s["securityContext"].pop("runAsNonRoot"), c["securityContext"].clear())
    )
    assert broken(lambda s, c: c["securityContext"].update(runAsUser=0))
    assert broken(lambda s, c: s["securityContext"].pop("seccompProfile"))
    assert broken(lambda s, c: c["securityContext"].update(privileged=True))
    assert broken(lambda s, c: s.update(hostNetwork=True))
    assert broken(lambda s, c: s["volumes"].append({"name": "h", "hostPath": {"path": "/"}}))
    assert broken(lambda s, c: c["ports"][0].update(hostPort=4646))


@pytest.mark.parametrize("role", ROLES)
def test_tls_material_is_mounted_read_only_from_the_roles_secret(role: str) -> None:
    spec = DEPLOYMENTS[f"corral-{role}"]["spec"]["template"]["spec"]
    container = _container(role)
    env = env_of(container)
    volumes = {v["name"]: v for v in spec["volumes"]}
    for variable, secret_key in TLS_ENV.items():
        path = env[variable]
        mount = next(
            m
            for m in container["volumeMounts"]
            if path.startswith(m["mountPath"].rstrip("/") + "/")
        )
        assert mount["readOnly"] is True
        # a directory mount, never subPath: a renewed Secret appears in place
        assert "subPath" not in mount
        assert path == f"{mount['mountPath']}/{secret_key}"
        secret = volumes[mount["name"]]["secret"]
        assert secret["secretName"] == TLS_SECRET[role]
        assert "items" not in secret
        # readable by the process (through its group), by nobody else
        assert secret["defaultMode"] == 0o440
        assert spec["securityContext"]["fsGroup"] == spec["securityContext"]["runAsGroup"]


def test_acls_are_on_in_every_role() -> None:
    for role in ACL_ROLES:
        assert env_of(_container(role))["CORRAL_ACL_ENABLED"] == "true"


def test_pods_carry_their_identity_label() -> None:
    for role in ROLES:
        labels = DEPLOYMENTS[f"corral-{role}"]["spec"]["template"]["metadata"]["labels"]
        assert labels["corral.io/role"] == ("client" if role == "agent" else "server")


def test_the_overlay_issues_every_mounted_secret_with_the_role_names() -> None:
    issuers = _by_kind(OVERLAY_DOCS, "Issuer")
    certificates = {
        c["spec"]["secretName"]: c for c in _by_kind(OVERLAY_DOCS, "Certificate").values()
    }
    # the chain: a self-signed issuer makes the CA certificate, the CA issuer signs the roles
    ca_issuer = issuers["corral-ca"]["spec"]["ca"]["secretName"]
    ca_cert = certificates[ca_issuer]["spec"]
    assert ca_cert["isCA"] is True
    assert "selfSigned" in issuers[ca_cert["issuerRef"]["name"]]["spec"]

    mounted = set(TLS_SECRET.values())
    issued = {name for name, c in certificates.items() if not c["spec"].get("isCA")}
    assert issued == mounted | {"corral-cli-tls"}
    config = _by_kind(BASE_DOCS, "ConfigMap")["corral-config"]["data"]
    dialled = {config[k].rsplit(":", 1)[0] for k in config if k.endswith("_ADDR")}
    for role in certs.ROLES:
        spec = certificates[f"corral-{role}-tls"]["spec"]
        assert spec["issuerRef"] == {"kind": "Issuer", "name": "corral-ca"}
        assert spec["commonName"] == certs.role_name(role)
        assert spec["dnsNames"][: len(certs.role_names(role))] == list(certs.role_names(role))
        assert set(spec.get("ipAddresses", [])) <= set(certs.default_ips(role))
        assert spec["privateKey"] == {
            "algorithm": "ECDSA",
            "size": 256,
            "encoding": "PKCS8",
            "rotationPolicy": "Always",
        }
        usages = set(spec["usages"])
        assert "client auth" in usages and ("server auth" in usages) == (role != "cli")
        if role == "server":
            # every address a role dials verifies against the server certificate
            assert dialled and dialled <= set(spec["dnsNames"])


# -- network policies -------------------------------------------------------

POLICIES = list(_by_kind(BASE_DOCS, "NetworkPolicy").values())


def _pods() -> dict[str, Pod]:
    pods = {}
    for name, dep in DEPLOYMENTS.items():
        template = dep["spec"]["template"]
        ports = {p["name"]: p["containerPort"] for c in containers(dep) for p in c.get("ports", [])}
        labels = template["metadata"]["labels"]
        pods[name.removeprefix("corral-")] = Pod(name, labels, NAMESPACE, ports)
    # pods that other software makes: CloudNativePG's instances and operator
    cluster = _by_kind(BASE_DOCS, "Cluster")["corral-db"]
    pods["db"] = Pod(
        "corral-db-1",
        {"cnpg.io/cluster": cluster["metadata"]["name"], "cnpg.io/podRole": "instance"},
        NAMESPACE,
        {"postgresql": 5432, "status": 8000, "metrics": 9187},
    )
    pods["cnpg-operator"] = Pod(
        "cnpg-controller-manager", {"app.kubernetes.io/name": "cloudnative-pg"}, "cnpg-system"
    )
    # strangers: a pod in the namespace that is none of ours, pods elsewhere
    pods["stranger"] = Pod("debug", {"run": "debug"}, NAMESPACE)
    pods["prometheus"] = Pod("prometheus-0", {"app": "prometheus"}, "monitoring")
    pods["elsewhere"] = Pod("web", {"app.kubernetes.io/name": "corral-state"}, "apps")
    return pods


PODS = _pods()
SERVERS = set(SERVER_ROLES)
CORRAL = SERVERS | {"agent"}
IN_CLUSTER = set(PODS)
ANYONE = IN_CLUSTER | {"outside"}
# (pod, port) -> who may connect; every port of every pod is listed
EXPECTED: dict[tuple[str, int], set[str]] = {
    ("state", 4646): ANYONE,  # public API: agents, users, servers
    ("broker", 4647): SERVERS,
    ("planner", 4648): SERVERS,
    ("worker", 4649): SERVERS,  # admin API and the state's Job.Plan
    ("agent", 4650): ANYONE,  # task logs, read by users
    **{(role, 9100): IN_CLUSTER for role in ROLES},  # metrics scrapes
    ("db", 5432): {"state", "broker", "planner", "db", "cnpg-operator"},
    ("db", 8000): {"db", "cnpg-operator"},
    ("db", 9187): {"db"},
    ("otel-collector", 4317): CORRAL,
    ("jaeger", 4317): {"otel-collector"},
    ("jaeger", 16686): set(),  # the UI: kubectl port-forward only
}


def test_every_port_of_every_pod_has_an_intended_audience() -> None:
    declared = {(name, port) for name, pod in PODS.items() for port in pod.ports.values()}
    assert declared == set(EXPECTED)


@pytest.mark.parametrize(("dest", "port"), sorted(EXPECTED), ids=lambda v: str(v))
def test_network_policies_let_exactly_the_intended_callers_in(dest: str, port: int) -> None:
    sources: dict[str, Pod | None] = {**PODS, "outside": None}
    allowed = {
        name for name, pod in sources.items() if ingress_allowed(POLICIES, pod, PODS[dest], port)
    }
    assert allowed == EXPECTED[(dest, port)]
    # and only the database's own instances reach a port nobody declared
    # (they replicate among themselves on whatever ports CloudNativePG uses)
    stray = {n for n, pod in sources.items() if ingress_allowed(POLICIES, pod, PODS[dest], 1)}
    assert stray == ({"db"} if dest == "db" else set())


def test_ingress_is_denied_by_default_in_the_namespace() -> None:
    default = [
        p for p in POLICIES if p["spec"]["podSelector"] == {} and not p["spec"].get("ingress")
    ]
    assert [p["spec"]["policyTypes"] for p in default] == [["Ingress"]]
    # a pod nobody wrote a policy for is isolated all the same
    assert not ingress_allowed(POLICIES, PODS["state"], PODS["stranger"], 8080)


def test_postgres_is_reachable_from_exactly_the_roles_that_hold_the_dsn() -> None:
    holders = {role for role in ROLES if "CORRAL_DSN" in env_of(_container(role))}
    reach = {role for role in ROLES if ingress_allowed(POLICIES, PODS[role], PODS["db"], 5432)}
    assert holders == reach == {"state", "broker", "planner"}


# -- the image ----------------------------------------------------------------


def test_the_image_runs_as_the_pods_non_root_user() -> None:
    dockerfile = (ROOT / "deploy" / "Dockerfile").read_text()
    final_stage = dockerfile.rsplit("\nFROM ", 1)[1]
    users = re.findall(r"^USER\s+(\S+)", final_stage, flags=re.M)
    assert users, "the final stage sets no USER"
    uid, _, gid = users[-1].partition(":")
    assert uid.isdigit() and int(uid) != 0  # numeric, so runAsNonRoot can check it
    for name in ROLES:
        pod_sc = DEPLOYMENTS[f"corral-{name}"]["spec"]["template"]["spec"]["securityContext"]
        assert pod_sc["runAsUser"] == int(uid)
        assert not gid or pod_sc["runAsGroup"] == int(gid)
