"""The shell scripts and kind files this machine cannot run end to end (no Docker engine).

They are checked as far as possible without Docker: bash syntax, shellcheck,
the parts that run without it (hack/build-helm, up.sh's prerequisite
check), and the files up.sh feeds to kind and kubectl.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.packaging.helm import CHART, REPO, helm, kube_bin

SCRIPTS = [REPO / "hack" / "build-helm", REPO / "deploy" / "kind" / "up.sh", REPO / ".ci" / "run"]
KIND = REPO / "deploy" / "kind"


def test_shellcheck_is_installed() -> None:
    assert shutil.which("shellcheck"), (
        "shellcheck is missing, so the shell scripts cannot be checked: "
        "apt-get install -y shellcheck (.ci/run installs it)"
    )


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_script_is_executable_valid_bash_and_shellcheck_clean(script: Path) -> None:
    assert os.access(script, os.X_OK), f"chmod +x {script.relative_to(REPO)}"
    syntax = subprocess.run(
        ["bash", "-n", str(script)], capture_output=True, text=True, check=False
    )
    assert syntax.returncode == 0, syntax.stderr
    shellcheck = shutil.which("shellcheck")
    if shellcheck is None:
        pytest.fail("shellcheck is missing: apt-get install -y shellcheck (.ci/run installs it)")
    # -x with SCRIPTDIR: follow `source` of hack/kube/versions.env as the script sees it.
    lint = subprocess.run(
        [shellcheck, "-x", "-P", "SCRIPTDIR", str(script)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert lint.returncode == 0, lint.stdout + lint.stderr


def test_build_helm_caches_the_pinned_version() -> None:
    pin = re.search(
        r"^HELM_VERSION=(\S+)$", (REPO / "hack" / "kube" / "versions.env").read_text(), re.M
    )
    assert pin
    binary = Path(helm())
    assert binary.parent.parent.name == pin.group(1) and binary.parent.parent.parent.name == "helm"
    version = subprocess.run(
        [binary, "version", "--short"], capture_output=True, text=True, check=True
    )
    assert version.stdout.strip().split("+")[0] == pin.group(1), version.stdout


def test_up_sh_names_what_is_missing_before_doing_anything(tmp_path: Path) -> None:
    # A PATH with only what up.sh needs before its checks: whatever this
    # machine has installed, the script must stop at once and say what is missing.
    tools = tmp_path / "bin"
    tools.mkdir()
    for tool in ("bash", "dirname"):
        found = shutil.which(tool)
        assert found, tool
        (tools / tool).symlink_to(found)
    result = subprocess.run(
        [str(tools / "bash"), str(KIND / "up.sh")],
        env={"PATH": str(tools), "HOME": str(tmp_path)},
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 1, result.stderr
    assert result.stderr.startswith("up.sh: docker is required"), result.stderr


def test_kind_config_is_a_kind_cluster_with_workers() -> None:
    config = yaml.safe_load((KIND / "kind-config.yaml").read_text())
    assert config["kind"] == "Cluster" and config["apiVersion"] == "kind.x-k8s.io/v1alpha4"
    roles = [n["role"] for n in config["nodes"]]
    assert roles.count("control-plane") == 1 and roles.count("worker") >= 1
    assert "deploy/kind/kind-config.yaml" in (KIND / "up.sh").read_text()


def test_kind_examples_are_deploy_examples_for_the_chart_scheduler() -> None:
    kustomization = yaml.safe_load((KIND / "examples" / "kustomization.yaml").read_text())
    examples = sorted(p.name for p in (REPO / "deploy" / "examples").glob("*.yaml"))
    assert sorted(Path(r).name for r in kustomization["resources"]) == examples, (
        "deploy/kind/examples/kustomization.yaml must list every file of deploy/examples"
    )
    rendered = subprocess.run(
        [
            str(kube_bin() / "kubectl"),
            "kustomize",
            "--load-restrictor",
            "LoadRestrictionsNone",
            str(KIND / "examples"),
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    objects = [d for d in yaml.safe_load_all(rendered) if d]
    originals = [
        d
        for name in examples
        for d in yaml.safe_load_all((REPO / "deploy" / "examples" / name).read_text())
        if d
    ]

    def ident(obj: dict[str, Any]) -> tuple[str, str]:
        return obj["kind"], obj["metadata"]["name"]

    assert sorted(map(ident, objects)) == sorted(map(ident, originals))
    scheduler = yaml.safe_load((CHART / "values.yaml").read_text())["schedulerName"]
    templates = [o["spec"]["template"] for o in objects if "template" in o.get("spec", {})]
    assert templates, "the examples have workloads"
    for template in templates:
        assert template["spec"]["schedulerName"] == scheduler
