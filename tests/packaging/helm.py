"""Render the Helm chart with the pinned helm (hack/build-helm) and read the result.

Shared by the render-only tests here and the tests in tests/cluster/ that
run what the chart renders against the local control plane.
"""

from __future__ import annotations

import functools
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "gang-extender"
BUILD_HELM = REPO / "hack" / "build-helm"
BUILD_KUBE = REPO / "hack" / "build-kube"

# The non-default values the tests render besides the defaults: every
# optional object on, TLS, two replicas, and both profiles.
FULL_SET = (
    "--set",
    "replicaCount=2,tls.enabled=true,podDisruptionBudget.enabled=true,"
    "metrics.serviceMonitor.enabled=true,serveDefaultScheduler=true,"
    "tls.certManager.enabled=true,tls.certManager.issuerRef.name=gang-ca,"
    "tls.certManager.issuerRef.kind=ClusterIssuer",
)
# What a cluster with the Prometheus Operator advertises (the ServiceMonitor
# is rendered only then). `helm lint` has no such flag.
PROMETHEUS_API = ("--api-versions", "monitoring.coreos.com/v1")


@functools.cache
def helm() -> str:
    """Path of the pinned helm; builds it on first use if `make helm` has not."""
    out = subprocess.run([str(BUILD_HELM)], capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"hack/build-helm failed:\n{out.stderr[-3000:]}")
    return str(Path(out.stdout.strip()) / "helm")


@functools.cache
def kube_bin() -> Path:
    """The directory hack/build-kube built kubectl and kube-scheduler into."""
    out = subprocess.run([str(BUILD_KUBE)], capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"hack/build-kube failed:\n{out.stderr[-3000:]}")
    return Path(out.stdout.strip())


def run_helm(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run([helm(), *args], capture_output=True, text=True, check=False)
    if check and result.returncode != 0:
        raise AssertionError(f"helm {' '.join(args)} failed:\n{result.stderr}{result.stdout}")
    return result


def template(*args: str, release: str = "gang-extender", namespace: str = "gang-extender") -> str:
    return run_helm("template", release, str(CHART), "--namespace", namespace, *args).stdout


def documents(text: str) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(text) if doc]


def render(
    *args: str, release: str = "gang-extender", namespace: str = "gang-extender"
) -> list[dict[str, Any]]:
    return documents(template(*args, release=release, namespace=namespace))


def find(docs: Sequence[dict[str, Any]], kind: str, name_suffix: str = "") -> dict[str, Any]:
    """The one object of this kind (whose name ends with name_suffix)."""
    found = [d for d in docs if d["kind"] == kind and d["metadata"]["name"].endswith(name_suffix)]
    assert len(found) == 1, f"expected one {kind} *{name_suffix}, got {len(found)}"
    return found[0]


def container(docs: Sequence[dict[str, Any]], name: str) -> dict[str, Any]:
    pod = find(docs, "Deployment")["spec"]["template"]["spec"]
    (match,) = [c for c in pod["containers"] if c["name"] == name]
    return dict(match)


def scheduler_config(docs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The KubeSchedulerConfiguration inside the chart's ConfigMap."""
    config: dict[str, Any] = yaml.safe_load(
        find(docs, "ConfigMap", "-scheduler")["data"]["config.yaml"]
    )
    return config
