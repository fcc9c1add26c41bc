"""deploy/k8s: every manifest parses, kustomizations list existing files, and the pods agree with
the application (probe paths are its routes, ports match CONTEXT_PROXY_PORT, every setting
variable is a real setting)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deploy.conftest import (
    DEFAULT_PORT,
    HEALTH_PATHS,
    REPO_DIR,
    check_settings_values,
    unknown_settings,
)

K8S_DIR = REPO_DIR / "deploy" / "k8s"
SHAPES = ("gateway", "sidecar")


def _docs(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d is not None]


def _shape(shape: str) -> list[dict[str, Any]]:
    kustomization = _docs(K8S_DIR / shape / "kustomization.yaml")[0]
    return [doc for name in kustomization["resources"] for doc in _docs(K8S_DIR / shape / name)]


def _one(docs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = [d for d in docs if d["kind"] == kind]
    assert len(found) == 1, f"expected one {kind}, found {len(found)}"
    return found[0]


def _proxy_container(deployment: dict[str, Any]) -> dict[str, Any]:
    spec = deployment["spec"]["template"]["spec"]
    containers = spec["containers"] + spec.get("initContainers", [])
    found = [c for c in containers if c["image"].split(":")[0].endswith("context-proxy")]
    assert len(found) == 1
    return found[0]


def _env_of(container: dict[str, Any], docs: list[dict[str, Any]]) -> dict[str, str]:
    """The container's environment: ``env`` values plus the ConfigMaps/Secrets of ``envFrom``."""
    by_name = {(d["kind"], d["metadata"]["name"]): d for d in docs}
    env: dict[str, str] = {}
    for source in container.get("envFrom", []):
        if "configMapRef" in source:
            env |= by_name[("ConfigMap", source["configMapRef"]["name"])]["data"]
        if "secretRef" in source:
            env |= by_name[("Secret", source["secretRef"]["name"])]["stringData"]
    env |= {e["name"]: e.get("value", "") for e in container.get("env", [])}
    return env


def test_every_manifest_parses_and_is_named() -> None:
    files = sorted(K8S_DIR.rglob("*.yaml"))
    assert len(files) >= 8
    for path in files:
        for doc in _docs(path):
            assert doc.get("apiVersion") and doc.get("kind"), path
            if doc["kind"] != "Kustomization":
                assert doc["metadata"]["name"], path


@pytest.mark.parametrize("shape", SHAPES)
def test_kustomization_lists_every_manifest_of_its_directory(shape: str) -> None:
    listed = set(_docs(K8S_DIR / shape / "kustomization.yaml")[0]["resources"])
    present = {p.name for p in (K8S_DIR / shape).glob("*.yaml")} - {"kustomization.yaml"}
    assert listed == present


@pytest.mark.parametrize("shape", SHAPES)
def test_proxy_container_agrees_with_the_application(shape: str) -> None:
    docs = _shape(shape)
    container = _proxy_container(_one(docs, "Deployment"))
    env = _env_of(container, docs)
    assert unknown_settings(env) == []
    check_settings_values(env)
    port = int(env.get("CONTEXT_PROXY_PORT", DEFAULT_PORT))
    assert env.get("CONTEXT_PROXY_HOST") == "0.0.0.0", "the kubelet probes the pod IP, not localhost"
    named = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert list(named.values()) == [port]
    probes = {kind: container[kind]["httpGet"] for kind in ("readinessProbe", "livenessProbe")}
    assert probes["readinessProbe"]["path"] == "/readyz"
    assert probes["livenessProbe"]["path"] == "/healthz"
    for get in [*probes.values(), container.get("startupProbe", {}).get("httpGet")]:
        if get is None:
            continue
        assert get["path"] in HEALTH_PATHS
        assert named.get(get["port"], get["port"]) == port
    assert container["resources"]["requests"]["cpu"] and container["resources"]["requests"]["memory"]
    assert container["args"] == ["serve"]


def test_gateway_is_replicated_stateless_and_protected() -> None:
    docs = _shape("gateway")
    deployment = _one(docs, "Deployment")
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert deployment["spec"]["replicas"] >= 2
    assert deployment["spec"]["selector"]["matchLabels"].items() <= labels.items()
    container = _proxy_container(deployment)
    env = _env_of(container, docs)
    # All state in the external PostgreSQL, given as a Secret (never in the ConfigMap).
    secret = _one(docs, "Secret")
    assert secret["stringData"]["CONTEXT_PROXY_DATABASE_URL"].startswith("postgresql://")
    assert "CONTEXT_PROXY_DATABASE_URL" not in _one(docs, "ConfigMap")["data"]
    assert not container.get("volumeMounts") or all(m["mountPath"] == "/tmp" for m in container["volumeMounts"])
    # Service -> the container's named port.
    service = _one(docs, "Service")
    assert service["spec"]["selector"].items() <= labels.items()
    target = service["spec"]["ports"][0]["targetPort"]
    assert target in {p["name"] for p in container["ports"]}
    # PDB and HPA point at this Deployment.
    pdb = _one(docs, "PodDisruptionBudget")
    assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert pdb["spec"]["minAvailable"] < deployment["spec"]["replicas"]
    hpa = _one(docs, "HorizontalPodAutoscaler")
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": deployment["metadata"]["name"]}
    assert hpa["spec"]["minReplicas"] >= 2 and hpa["spec"]["maxReplicas"] > hpa["spec"]["minReplicas"]
    # The kubelet waits longer than the proxy's own grace period for streams to finish.
    pod = deployment["spec"]["template"]
    assert pod["spec"]["terminationGracePeriodSeconds"] > float(env["CONTEXT_PROXY_SHUTDOWN_GRACE_S"]) + 5
    assert pod["metadata"]["annotations"]["prometheus.io/path"] == "/metrics"
    assert int(pod["metadata"]["annotations"]["prometheus.io/port"]) == int(env["CONTEXT_PROXY_PORT"])


def test_sidecar_agent_reaches_the_proxy_over_localhost() -> None:
    docs = _shape("sidecar")
    deployment = _one(docs, "Deployment")
    container = _proxy_container(deployment)
    env = _env_of(container, docs)
    pod = deployment["spec"]["template"]["spec"]
    agent = next(c for c in pod["containers"] if c is not container)
    base_url = {e["name"]: e.get("value") for e in agent["env"]}["OPENAI_BASE_URL"]
    assert base_url == f"http://127.0.0.1:{env['CONTEXT_PROXY_PORT']}/v1"
    # SQLite on a pod volume that the proxy container mounts.
    db_path = env["CONTEXT_PROXY_DATABASE_URL"].removeprefix("sqlite:///")
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    mount = next(p for p in mounts if db_path.startswith(p.rstrip("/") + "/"))
    volume = next(v for v in pod["volumes"] if v["name"] == mounts[mount])
    assert "emptyDir" in volume
    # A native sidecar: started before the agent, kept running beside it.
    assert container in pod.get("initContainers", []) and container["restartPolicy"] == "Always"
    assert pod["terminationGracePeriodSeconds"] > float(env["CONTEXT_PROXY_SHUTDOWN_GRACE_S"])
