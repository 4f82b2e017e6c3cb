"""The Kubernetes manifests as they are applied: the base (``kubectl apply -k daemonset/``), every overlay and the
components together, each rendered by ``kubectl kustomize`` and validated strictly against the API's schemas
(``kubernetes-validate``, offline), then held to what docs/kubernetes.md promises: host mounts read-only all the way
down, one capability added back, RBAC exactly as listed, who may connect."""

from __future__ import annotations

import copy
import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from kubernetes_validate.utils import SchemaNotFoundError

from storwatch.registry import parse_config
from tests.docs_text import section

REPO_ROOT = Path(__file__).resolve().parents[1]
DAEMONSET = REPO_ROOT / "daemonset"
KUBERNETES_DOC = REPO_ROOT / "docs" / "kubernetes.md"

KUBERNETES_VERSIONS = ("1.31.0", "1.37.0")
"""The oldest release whose kubelet honours recursiveReadOnly by default (beta in 1.31), and the newest schema
kubernetes-validate ships: a field either lacks fails strict validation."""

TARGETS = {
    "base": DAEMONSET,
    "together": DAEMONSET / "overlays" / "together",
    "sync": DAEMONSET / "overlays" / "sync",
    "monitoring": DAEMONSET / "overlays" / "monitoring",
}
CUSTOM_KINDS = {"ServiceMonitor", "PrometheusRule"}
"""The Prometheus Operator's kinds: no schema of theirs ships with kubernetes-validate; checked by hand below."""

HOST_ROOTS = {"/proc": "/host/proc", "/sys": "/host/sys", "/": "/host/root"}
"""The host trees the agent reads, and where the pod sees them (the ConfigMap's paths)."""

ADDED_CAPABILITIES = {
    "base": {"DAC_READ_SEARCH"},
    "together": {"DAC_READ_SEARCH"},
    "monitoring": {"DAC_READ_SEARCH"},
    "sync": {"DAC_READ_SEARCH", "DAC_OVERRIDE", "KILL"},
    "all": {"DAC_READ_SEARCH", "DAC_OVERRIDE", "KILL"},
}

pytestmark = pytest.mark.realpart


def _kustomize(path: Path) -> list[dict[str, Any]]:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl (its built-in kustomize) is needed to render the manifests")
    done = subprocess.run([kubectl, "kustomize", str(path)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return [d for d in yaml.safe_load_all(done.stdout) if d]


@pytest.fixture(scope="module")
def rendered(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[dict[str, Any]]]:
    out = {name: _kustomize(path) for name, path in TARGETS.items()}
    # An overlay of one's own, as daemonset/kustomization.yaml says: the base with every component at once.
    mine = tmp_path_factory.mktemp("overlay")
    components = sorted(p for p in (DAEMONSET / "components").iterdir() if p.is_dir())
    (mine / "kustomization.yaml").write_text(
        yaml.safe_dump(
            {
                "apiVersion": "kustomize.config.k8s.io/v1beta1",
                "kind": "Kustomization",
                # kustomize takes only relative paths to other kustomizations
                "resources": [os.path.relpath(DAEMONSET / "base", mine)],
                "components": [os.path.relpath(p, mine) for p in components],
            }
        )
    )
    out["all"] = _kustomize(mine)
    return out


def _one(docs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = [d for d in docs if d["kind"] == kind]
    assert len(found) == 1, f"{len(found)} {kind}s"
    return found[0]


def _container(docs: list[dict[str, Any]]) -> dict[str, Any]:
    (container,) = _one(docs, "DaemonSet")["spec"]["template"]["spec"]["containers"]
    return dict(container)


def _host_mounts(docs: list[dict[str, Any]]) -> Iterator[tuple[str, dict[str, Any]]]:
    """(host path, volume mount) of every hostPath volume the agent's container mounts."""
    pod = _one(docs, "DaemonSet")["spec"]["template"]["spec"]
    host = {v["name"]: v["hostPath"]["path"] for v in pod["volumes"] if "hostPath" in v}
    for mount in _container(docs)["volumeMounts"]:
        if mount["name"] in host:
            yield host[mount["name"]], mount


TARGET_NAMES = [*TARGETS, "all"]


def test_the_base_is_what_kubectl_apply_k_daemonset_applies(rendered: dict[str, list[dict[str, Any]]]) -> None:
    assert rendered["base"] == _kustomize(DAEMONSET / "base")
    assert {d["kind"] for d in rendered["base"]} == {
        "Namespace",
        "PriorityClass",
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
        "ConfigMap",
        "DaemonSet",
        "Service",
        "NetworkPolicy",
    }
    assert {d["kind"] for d in rendered["monitoring"]} - {d["kind"] for d in rendered["base"]} == CUSTOM_KINDS
    assert {d["kind"] for d in rendered["sync"]} - {d["kind"] for d in rendered["base"]} == {"PersistentVolumeClaim"}


@pytest.mark.parametrize("target", TARGET_NAMES)
@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_every_manifest_validates_strictly(
    rendered: dict[str, list[dict[str, Any]]], target: str, version: str
) -> None:
    for doc in rendered[target]:
        if doc["kind"] in CUSTOM_KINDS:
            with pytest.raises(SchemaNotFoundError):  # so that a kind kubernetes-validate learns is validated here
                kubernetes_validate.validate(doc, version, strict=True)
            continue
        kubernetes_validate.validate(doc, version, strict=True)
        namespaced = doc["kind"] not in {"Namespace", "PriorityClass", "ClusterRole", "ClusterRoleBinding"}
        assert doc["metadata"].get("namespace") == ("storwatch" if namespaced else None), doc["metadata"]


def test_strict_validation_works_offline_and_refuses_what_the_api_would() -> None:
    """The validator is not a rubber stamp: a misspelt field, or recursiveReadOnly on a version without it, fails."""
    docs = _kustomize(DAEMONSET)
    daemonset = copy.deepcopy(_one(docs, "DaemonSet"))
    kubernetes_validate.validate(daemonset, KUBERNETES_VERSIONS[0], strict=True)
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(daemonset, "1.29.0", strict=True)  # before recursiveReadOnly existed
    daemonset["spec"]["template"]["spec"]["containers"][0]["securityContext"]["readOnlyRootFileSystem"] = True
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(daemonset, KUBERNETES_VERSIONS[-1], strict=True)


@pytest.mark.parametrize("target", TARGET_NAMES)
def test_host_trees_are_read_only_with_their_submounts(rendered: dict[str, list[dict[str, Any]]], target: str) -> None:
    docs = rendered[target]
    mounts = dict(_host_mounts(docs))
    for host_path, where in HOST_ROOTS.items():
        mount = mounts[host_path]
        assert mount["mountPath"] == where
        # readOnly alone leaves submounts (/sys/fs/cgroup, every filesystem under /) writable.
        assert mount.get("readOnly") is True and mount.get("recursiveReadOnly") == "IfPossible", mount
    for mount in _container(docs)["volumeMounts"]:
        # The API refuses recursiveReadOnly with any propagation but None; the schema does not say so.
        if mount.get("recursiveReadOnly") not in (None, "Disabled"):
            assert mount.get("mountPropagation", "None") == "None", mount
    # The one host tree mounted with propagation: the kubelet's, where pod volumes appear after the agent started.
    kubelet = mounts["/var/lib/kubelet"]
    assert kubelet["mountPath"] == "/host/root/var/lib/kubelet" and kubelet["mountPropagation"] == "HostToContainer"
    assert set(mounts) == {*HOST_ROOTS, "/var/lib/kubelet"}
    # Writable only where acting needs it (request files in run directories): the sync component.
    assert kubelet.get("readOnly") is (target not in ("sync", "all"))
    writable = [m for m in _container(docs)["volumeMounts"] if not m.get("readOnly")]
    if target in ("sync", "all"):
        assert {m["name"] for m in writable} == {"kubelet", "sync-destination"}
        claim = _one(docs, "PersistentVolumeClaim")
        assert claim["spec"]["accessModes"] == ["ReadWriteMany"]  # every node's agent writes to it
    else:
        assert writable == []


@pytest.mark.parametrize("target", TARGET_NAMES)
def test_least_privilege(rendered: dict[str, list[dict[str, Any]]], target: str) -> None:
    docs = rendered[target]
    pod = _one(docs, "DaemonSet")["spec"]["template"]["spec"]
    security = _container(docs)["securityContext"]
    assert security["capabilities"]["drop"] == ["ALL"]
    assert set(security["capabilities"]["add"]) == ADDED_CAPABILITIES[target]
    assert security["allowPrivilegeEscalation"] is False and security["privileged"] is False
    assert security["readOnlyRootFilesystem"] is True
    assert security["seccompProfile"] == {"type": "RuntimeDefault"}
    assert pod.get("hostNetwork") is False and pod.get("hostIPC") is None
    assert pod["hostPID"] is (target in ("sync", "all"))  # signals only where the agent may act


def test_each_added_capability_says_why_in_the_manifest() -> None:
    """A capability is added with a comment naming it and its reason; a reader of the YAML needs nothing else."""
    for path in (DAEMONSET / "base" / "daemonset.yaml", DAEMONSET / "components" / "sync" / "acting.yaml"):
        text = path.read_text(encoding="utf-8")
        (added,) = re.findall(r"^\s*add: \[(.*)\]", text, re.M)
        for cap in re.findall(r'"(\w+)"', added):
            if path.name == "acting.yaml" and cap == "DAC_READ_SEARCH":
                continue  # the base's, restated because a patch replaces the list
            assert re.search(rf"#.*\b{cap}: \w+", text), f"{path.name}: no comment gives the reason for {cap}"


@pytest.mark.parametrize("target", TARGET_NAMES)
def test_pod_scheduling_and_resources(rendered: dict[str, list[dict[str, Any]]], target: str) -> None:
    docs = rendered[target]
    pod = _one(docs, "DaemonSet")["spec"]["template"]["spec"]
    priority = _one(docs, "PriorityClass")
    assert pod["priorityClassName"] == priority["metadata"]["name"]
    assert 0 < priority["value"] <= 1_000_000_000 and priority["globalDefault"] is False  # the user-defined range

    def tolerated(key: str, effect: str) -> bool:
        return any(
            (t.get("operator") == "Exists" and t.get("key") in (None, key) and t.get("effect") in (None, effect))
            for t in pod["tolerations"]
        )

    for key in ("nvidia.com/gpu", "amd.com/gpu", "node.kubernetes.io/unschedulable"):
        for effect in ("NoSchedule", "NoExecute"):
            assert tolerated(key, effect), (key, effect)
    resources = _container(docs)["resources"]
    assert set(resources["requests"]) == {"cpu", "memory"} and set(resources["limits"]) == {"memory"}
    # Pod Security Admission: hostPath volumes are allowed only at the privileged level.
    namespace = _one(docs, "Namespace")
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "privileged"
    if target in ("together", "all"):
        assert pod["runtimeClassName"] == "nvidia"
        env = {e["name"]: e.get("value") for e in _container(docs)["env"]}
        assert env["NVIDIA_VISIBLE_DEVICES"] == "all" and env["NVIDIA_DRIVER_CAPABILITIES"] == "utility"


@pytest.mark.parametrize("target", TARGET_NAMES)
def test_the_agent_configuration_loads(rendered: dict[str, list[dict[str, Any]]], target: str) -> None:
    """Each ConfigMap's file is one the agent takes, pointing at the host trees where the pod mounts them."""
    text = _one(rendered[target], "ConfigMap")["data"]["config.yaml"]
    config = parse_config(text, f"{target}: config.yaml")
    assert (config.paths.procfs, config.paths.sysfs, config.paths.rootfs) == tuple(HOST_ROOTS.values())
    assert config.platform == ("together-k8s" if target in ("together", "all") else "generic")
    args = _container(rendered[target])["args"]
    assert "--config=/etc/storwatch/config.yaml" in args


@pytest.mark.parametrize("target", TARGET_NAMES)
def test_the_liveness_probe_restarts_a_stuck_agent(rendered: dict[str, list[dict[str, Any]]], target: str) -> None:
    """The probe asks /healthz on the agent's own port (503 once the tick has stopped: tests/test_agent_liveness.py);
    one failed or slow answer never restarts the agent, and a stuck one is restarted within a minute of failing."""
    container = _container(rendered[target])
    probe = container["livenessProbe"]
    assert probe["httpGet"]["path"] == "/healthz"
    (port,) = [p for p in container["ports"] if p["name"] == probe["httpGet"]["port"]]
    assert f"--listen=:{port['containerPort']}" in container["args"]
    period, threshold = probe.get("periodSeconds", 10), probe.get("failureThreshold", 3)
    assert threshold >= 2 and probe.get("timeoutSeconds", 1) >= 2, probe
    assert period * threshold <= 60, probe


def _documented_rbac() -> set[tuple[str, str, str]]:
    """(API group, resource, verb) from docs/kubernetes.md's table of what the ClusterRole grants."""
    text = section(KUBERNETES_DOC, "## The ClusterRole")
    granted: set[tuple[str, str, str]] = set()
    for row in re.findall(r"^\| `([^`]*)` \| ([^|]+) \| ([^|]+) \|", text, re.M):
        group = "" if row[0] == "core" else row[0]
        resources = re.findall(r"`(\w+)`", row[1])
        verbs = re.findall(r"`(\w+)`", row[2])
        granted |= {(group, r, v) for r in resources for v in verbs}
    assert granted, "docs/kubernetes.md's ClusterRole section should list the ClusterRole's grants in a table"
    return granted


@pytest.mark.parametrize("target", TARGET_NAMES)
def test_the_cluster_role_grants_exactly_what_the_docs_list(
    rendered: dict[str, list[dict[str, Any]]], target: str
) -> None:
    docs = rendered[target]
    assert [d["kind"] for d in docs].count("Role") == 0
    role = _one(docs, "ClusterRole")
    granted = set()
    for rule in role["rules"]:
        assert set(rule) == {"apiGroups", "resources", "verbs"}, rule  # no resourceNames, nonResourceURLs
        granted |= {(g, r, v) for g in rule["apiGroups"] for r in rule["resources"] for v in rule["verbs"]}
    assert "*" not in {x for triple in granted for x in triple}
    assert granted == _documented_rbac()
    binding = _one(docs, "ClusterRoleBinding")
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "storwatch", "namespace": "storwatch"}]


def _selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    assert set(selector) == {"matchLabels"}
    return all(labels.get(k) == v for k, v in selector["matchLabels"].items())


@pytest.mark.parametrize("target", TARGET_NAMES)
def test_only_prometheus_and_alertmanager_may_connect(rendered: dict[str, list[dict[str, Any]]], target: str) -> None:
    docs = rendered[target]
    policy = _one(docs, "NetworkPolicy")["spec"]
    agent_labels = _one(docs, "DaemonSet")["spec"]["template"]["metadata"]["labels"]
    assert _selects(policy["podSelector"], agent_labels)
    assert policy["policyTypes"] == ["Ingress"]
    peers = set()
    for rule in policy["ingress"]:
        assert rule["ports"] == [{"protocol": "TCP", "port": "metrics"}]
        for peer in rule["from"]:
            assert peer["namespaceSelector"] == {}
            (name,) = peer["podSelector"]["matchLabels"].values()
            peers.add(name)
    # kustomize's includeSelectors would have rewritten both to the agent's own label: only agents could connect.
    assert peers == {"prometheus", "alertmanager"}
    ports = {p["name"]: p["containerPort"] for p in _container(docs)["ports"]}
    assert ports == {"metrics": 9477}
    service = _one(docs, "Service")
    assert _selects({"matchLabels": service["spec"]["selector"]}, agent_labels)
    assert _selects(_one(docs, "DaemonSet")["spec"]["selector"], agent_labels)


def test_the_monitoring_component_scrapes_the_agents_and_loads_the_rules(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    docs = rendered["monitoring"]
    monitor = _one(docs, "ServiceMonitor")
    service = _one(docs, "Service")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert _selects(monitor["spec"]["selector"], service["metadata"]["labels"])
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": [service["metadata"]["namespace"]]}
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["port"] in {p["name"] for p in service["spec"]["ports"]}
    # The alerts' up{job="storwatch"}: the operator names the job after the Service. node: the rules' label.
    assert service["metadata"]["name"] == "storwatch"
    assert {"sourceLabels": ["__meta_kubernetes_pod_node_name"], "targetLabel": "node", "action": "replace"} in (
        endpoint["relabelings"]
    )
    shipped = yaml.safe_load((REPO_ROOT / "alerts" / "prometheusrule.yaml").read_text(encoding="utf-8"))
    rule = _one(docs, "PrometheusRule")
    assert rule["spec"] == shipped["spec"] and rule["metadata"]["namespace"] == "storwatch"


def test_the_image_is_the_one_the_manifests_run() -> None:
    """Read, as nothing here can build it: a pinned base, root as runAsUser 0, the tag the DaemonSet names, no torch."""
    dockerfile = (REPO_ROOT / "Dockerfile").read_text(encoding="utf-8")
    (base,) = re.findall(r"^FROM (\S+)$", dockerfile, re.M)
    assert re.fullmatch(r"python:\d+\.\d+\.\d+-slim-\w+(@sha256:[0-9a-f]{64})?", base), base
    (user,) = re.findall(r"^USER (\S+)$", dockerfile, re.M)
    with open(DAEMONSET / "base" / "daemonset.yaml", encoding="utf-8") as f:
        (container,) = yaml.safe_load(f)["spec"]["template"]["spec"]["containers"]
    security = container["securityContext"]
    assert user == f"{security['runAsUser']}:{security['runAsGroup']}"
    version = re.search(r'^version = "(.+)"$', (REPO_ROOT / "pyproject.toml").read_text(encoding="utf-8"), re.M)
    assert version is not None and container["image"] == f"storwatch:{version.group(1)}"
    assert f"docker build -t {container['image']} ." in KUBERNETES_DOC.read_text(encoding="utf-8")
    installs = [line for line in dockerfile.splitlines() if "pip install" in line]
    assert installs and not any("torch" in line or "[" in line for line in installs), installs  # no extras
