"""The pinned Kubernetes binaries: which version, where hack/build-kube put them, kubectl."""

from __future__ import annotations

import subprocess
from pathlib import Path

from .components import COMPONENT_BINARY
from .layout import BUILD_KUBE, CRD_DIR, REPO_ROOT, VERSIONS_ENV, Layout
from .report import ClusterError, info


def read_versions() -> dict[str, str]:
    """Parse hack/kube/versions.env (KEY=VALUE lines) - the single version pin."""
    versions: dict[str, str] = {}
    for raw in VERSIONS_ENV.read_text().splitlines():
        line = raw.strip()
        if line and not line.startswith("#") and "=" in line:
            key, _, value = line.partition("=")
            versions[key.strip()] = value.strip().strip("\"'")
    return versions


def build_kube() -> Path:
    """Get the bin dir from hack/build-kube (instant when already cached)."""
    proc = subprocess.run(
        [str(BUILD_KUBE)], stdout=subprocess.PIPE, stderr=None, text=True, check=False
    )
    if proc.returncode != 0:
        raise ClusterError(
            f"hack/build-kube failed with exit code {proc.returncode} (see its output above)"
        )
    lines = proc.stdout.strip().splitlines()
    if not lines:
        raise ClusterError("hack/build-kube printed no bin directory")
    bin_dir = Path(lines[-1]).resolve()
    missing = [
        b
        for b in [*sorted(set(COMPONENT_BINARY.values())), "kubectl"]
        if not (bin_dir / b).is_file()
    ]
    if missing:
        raise ClusterError(f"hack/build-kube returned {bin_dir}, but it lacks {', '.join(missing)}")
    return bin_dir


def kubectl(layout: Layout, bin_dir: Path, *args: str, timeout: float = 120.0) -> str:
    """Run the built kubectl (never the system one) with the admin kubeconfig."""
    argv = [
        str(bin_dir / "kubectl"),
        f"--kubeconfig={layout.admin_kubeconfig}",
        f"--cache-dir={layout.kubectl_cache}",
        *args,
    ]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    if proc.returncode != 0:
        raise ClusterError(
            f"kubectl {' '.join(args)} failed: {(proc.stderr or proc.stdout).strip()}"
        )
    return proc.stdout


def apply_text(layout: Layout, bin_dir: Path, text: str, timeout: float = 120.0) -> str:
    """kubectl apply --server-side of YAML text (rendered, so not a file in the repository)."""
    argv = [
        str(bin_dir / "kubectl"),
        f"--kubeconfig={layout.admin_kubeconfig}",
        f"--cache-dir={layout.kubectl_cache}",
        "apply",
        "--server-side",
        "--force-conflicts",
        "--field-manager=local-cluster",
        "-f",
        "-",
    ]
    proc = subprocess.run(
        argv, input=text, capture_output=True, text=True, timeout=timeout, check=False
    )
    if proc.returncode != 0:
        raise ClusterError(f"kubectl apply failed: {(proc.stderr or proc.stdout).strip()}")
    return proc.stdout


def install_crds(layout: Layout, bin_dir: Path) -> None:
    """kubectl apply deploy/crds/ and wait until the API serves them."""
    if not any(CRD_DIR.glob("*.yaml")):
        return
    kubectl(layout, bin_dir, "apply", "--server-side", "--force-conflicts", "-f", str(CRD_DIR))
    kubectl(
        layout, bin_dir, "wait", "--for=condition=Established", "--timeout=60s", "-f", str(CRD_DIR)
    )
    info(f"CRDs from {CRD_DIR.relative_to(REPO_ROOT)} applied and Established")
