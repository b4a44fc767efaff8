"""deploy/kubernetes: every manifest valid against the Kubernetes schemas of K8S_VERSION
(kubernetes-validate; the ServiceMonitor CRD is not among its bundled schemas and is checked
by hand), the ConfigMaps' configs pass check-config, the Role is exactly what discovery does,
the probes hit the real health routes, and the drain fits the grace period."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from heimdall_proxy.cli.check_config import check_config
from heimdall_proxy.framework.params import parse_duration
from tests.deploy.live import ROOT

#: The oldest Kubernetes minor still in upstream support when this was written (1.32 to
#: 1.34 were; kubernetes-validate bundles schemas up to 1.37).
K8S_VERSION = "1.32.0"
DEPLOY = ROOT / "deploy" / "kubernetes"
MANIFESTS = sorted(p for p in DEPLOY.rglob("*.yaml") if p.name != "kustomization.yaml")
CRDS = {("monitoring.coreos.com/v1", "ServiceMonitor")}


def documents(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def by_kind(kind: str, directory: Path = DEPLOY / "base") -> dict[str, Any]:
    found = [d for p in sorted(directory.glob("*.yaml")) for d in documents(p) if d["kind"] == kind]
    assert len(found) == 1, (kind, directory)
    return found[0]


def validate(doc: dict[str, Any]) -> None:
    if (doc["apiVersion"], doc["kind"]) in CRDS:
        with pytest.raises(kubernetes_validate.SchemaNotFoundError):
            kubernetes_validate.validate(doc, K8S_VERSION, strict=True)  # not bundled
        return
    kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: str(p.relative_to(DEPLOY)))
def test_every_manifest_is_valid(path: Path) -> None:
    docs = documents(path)
    assert docs
    for doc in docs:
        validate(doc)


def test_the_service_monitor_by_hand() -> None:
    """ServiceMonitor's schema ships with the Prometheus Operator, not kubernetes-validate."""
    sm = by_kind("ServiceMonitor")
    service = by_kind("Service")
    assert sm["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    (endpoint,) = sm["spec"]["endpoints"]
    assert set(endpoint) <= {"port", "path", "interval", "honorLabels"}
    assert endpoint["port"] in {p["name"] for p in service["spec"]["ports"]}
    assert endpoint["path"] == "/metrics" and endpoint["honorLabels"] is True
    # the rules' job name is the Service's (the Operator's default job label)
    assert 'job="heimdall-proxy"' in (ROOT / "deploy/prometheus/rules.yaml").read_text()
    assert service["metadata"]["name"] == "heimdall-proxy"


@pytest.mark.parametrize("variant", ["base", "active-active"])
def test_the_configmap_passes_check_config(
    variant: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = by_kind("ConfigMap", DEPLOY / variant)["data"]["config.yaml"]
    (tmp_path / "config.yaml").write_text(config)
    assert check_config(str(tmp_path / "config.yaml")) == 0, capsys.readouterr()
    doc = yaml.safe_load(config)
    assert doc["discovery"]["kubernetes"]["namespace"] == "llm"
    assert "endpoints" not in doc


def test_the_base_config_is_the_recommended_one_plus_discovery() -> None:
    doc = yaml.safe_load(by_kind("ConfigMap")["data"]["config.yaml"])
    del doc["discovery"]
    assert doc == yaml.safe_load((ROOT / "config" / "recommended.yaml").read_text())


def test_the_role_is_exactly_what_discovery_calls() -> None:
    """datalayer/kubernetes.py lists the pods of the namespace and watches them (a watch is a
    list with watch=true): list and watch on pods, nothing else, in that namespace."""
    source = (ROOT / "heimdall_proxy" / "datalayer" / "kubernetes.py").read_text()
    assert set(re.findall(r"_api\.(\w+)", source)) == {
        "list_namespaced_pod",
        "list_pod_for_all_namespaces",  # only with an empty namespace: not this config
    }
    role = by_kind("Role")
    assert role["rules"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["list", "watch"]}]
    kustomization = yaml.safe_load((DEPLOY / "base" / "kustomization.yaml").read_text())
    config = yaml.safe_load(by_kind("ConfigMap")["data"]["config.yaml"])
    assert config["discovery"]["kubernetes"]["namespace"] == kustomization["namespace"]
    binding = by_kind("RoleBinding")
    account = by_kind("ServiceAccount")["metadata"]["name"]
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account}]
    assert by_kind("Deployment")["spec"]["template"]["spec"]["serviceAccountName"] == account


def test_probes_and_drain() -> None:
    pod = by_kind("Deployment")["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["readinessProbe"]["httpGet"]["path"] == "/ready"
    assert container["livenessProbe"]["httpGet"]["path"] == "/health"
    flags = dict(a.removeprefix("--").split("=", 1) for a in container["args"] if "=" in a)
    drain = parse_duration(flags["drain-delay"]) + parse_duration(flags["drain-timeout"])
    # the process needs a fraction of a second after the drain to exit (docs/operations.md)
    assert drain + 1 <= pod["terminationGracePeriodSeconds"]
    # the readiness probe sees /ready's 503 well within the drain delay
    probe = container["readinessProbe"]
    assert probe["periodSeconds"] * probe["failureThreshold"] < parse_duration(flags["drain-delay"])
    assert container["resources"]["requests"]["cpu"]
    assert container["ports"][0]["containerPort"] == int(flags["port"])


@pytest.mark.slow
@pytest.mark.parametrize("variant", ["base", "active-active"])
def test_the_kustomizations_render_valid_objects(variant: str) -> None:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not installed (the files are validated one by one above)")
    out = subprocess.run(
        [kubectl, "kustomize", str(DEPLOY / variant)], capture_output=True, text=True, check=True
    )
    docs = [d for d in yaml.safe_load_all(out.stdout) if d]
    for doc in docs:
        validate(doc)
        assert doc["metadata"].get("namespace", "llm") == "llm"
    (deployment,) = [
        d for d in docs if d["metadata"]["name"] == "heimdall-proxy" and d["kind"] == "Deployment"
    ]
    assert deployment["spec"]["replicas"] == (1 if variant == "base" else 3)
