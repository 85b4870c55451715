"""The chart's gang-only mode against the real control plane.

The API server accepts everything it renders (server-side dry-run: the
webhook configuration and the policy's CEL are compiled and checked by
kube-apiserver itself), and the real kube-scheduler loads its configuration
(two extender entries, managedResources with ignoredByScheduler and the
NodeResourcesFit args it needs).
"""

from __future__ import annotations

import ssl
import subprocess
from pathlib import Path

import pytest
import yaml

from hack.clusterkit import stop_process, wait_ready
from tests.cluster.chart_pod import free_port
from tests.cluster.session import EXTENDER_URL, Extender
from tests.cluster.test_chart import NOT_SERVED_GROUPS, api_group, kubectl
from tests.packaging.helm import kube_bin, render, scheduler_config

MODES = {
    "self-made-certs": ("--set", "mode=gang-only"),
    "cert-manager": (
        "--set",
        "mode=gang-only,serveDefaultScheduler=true,tls.enabled=true,replicaCount=2,"
        "webhook.certManager.enabled=true,webhook.certManager.issuerRef.name=ca",
    ),
}


@pytest.mark.parametrize("values", list(MODES.values()), ids=list(MODES))
def test_api_server_accepts_the_gang_only_chart(
    kubeconfig: str, namespace: str, values: tuple[str, ...]
) -> None:
    docs = render(*values, release="gang-only", namespace=namespace)
    rest = [d for d in docs if api_group(d) not in NOT_SERVED_GROUPS]
    kinds = {d["kind"] for d in rest}
    assert {"MutatingWebhookConfiguration", "ValidatingAdmissionPolicy"} <= kinds
    out = kubectl(kubeconfig, "apply", "--server-side", "--dry-run=server", objects=rest)
    lines = [line for line in out.splitlines() if line.strip()]
    assert len(lines) == len(rest), out
    assert all(line.endswith("serverside-applied (server dry run)") for line in lines), out


def test_kube_scheduler_loads_the_gang_only_configuration(
    kubeconfig: str, tmp_path: Path, extender: Extender
) -> None:
    docs = render("--set", "mode=gang-only,serveDefaultScheduler=true", namespace="gx")
    config = scheduler_config(docs)
    config["clientConnection"] = {"kubeconfig": kubeconfig}
    # Its own profiles must not compete with the session's schedulers for pods.
    config["leaderElection"] = {"leaderElect": False}
    config["profiles"] = [
        dict(profile, schedulerName=f"chart-gang-only-{i}")
        for i, profile in enumerate(config["profiles"])
    ]
    for entry in config["extenders"]:
        entry["urlPrefix"] = f"{EXTENDER_URL}/scheduler"
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    port = free_port()
    log = tmp_path / "kube-scheduler.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [
                str(kube_bin() / "kube-scheduler"),
                f"--config={path}",
                f"--secure-port={port}",
                "--bind-address=127.0.0.1",
                f"--authentication-kubeconfig={kubeconfig}",
                f"--authorization-kubeconfig={kubeconfig}",
                # V(2) logs each extender as it is created.
                "--v=2",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        wait_ready(
            f"https://127.0.0.1:{port}/healthz",
            process,
            log,
            "kube-scheduler with the chart's gang-only configuration",
            60,
            ssl._create_unverified_context(),
        )
        text = log.read_text()
        assert text.count('"Creating extender"') == 2, text[-3000:]
        assert (
            '"ManagedResources":[{"Name":"gang-extender.dev/member","IgnoredByScheduler":true}]'
            in text
        )
    finally:
        stop_process(process)
