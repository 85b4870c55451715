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
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml

from app.core.marking import is_marked
from app.core.resources import PREEMPTOR_RESOURCE
from hack.clusterkit import stop_process, wait_for, wait_ready
from tests.cluster.chart_pod import free_port
from tests.cluster.kube import HIGH, Kube
from tests.cluster.session import EXTENDER_URL, GANG_ONLY, Extender
from tests.cluster.test_chart import NOT_SERVED_GROUPS, api_group, kubectl
from tests.cluster.test_gang_only import verb_calls
from tests.cluster.test_preemption import assert_stays, fill_node3_and_start_low_gang
from tests.packaging.helm import kube_bin, render, scheduler_config

MODES = {
    "self-made-certs": ("--set", "mode=gang-only"),
    "cert-manager": (
        "--set",
        "mode=gang-only,serveDefaultScheduler=true,tls.enabled=true,replicaCount=2,"
        "webhook.certManager.enabled=true,webhook.certManager.issuerRef.name=ca",
    ),
    "preempt-entry-for-all": ("--set", "mode=gang-only,markPreemptors=false"),
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


@contextmanager
def chart_scheduler(
    kubeconfig: str, tmp_path: Path, docs: list[dict[str, Any]], names: Callable[[int], str]
) -> Iterator[Path]:
    """The chart's kube-scheduler configuration run by the real kube-scheduler,
    its profiles renamed by `names` (so that they compete with the session's
    schedulers for no pod) and its extender entries calling the session
    extender. Yields its log (V(2): each extender logged as it is created)."""
    config = scheduler_config(docs)
    config["clientConnection"] = {"kubeconfig": kubeconfig}
    config["leaderElection"] = {"leaderElect": False}
    config["profiles"] = [
        dict(profile, schedulerName=names(i)) for i, profile in enumerate(config["profiles"])
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
        yield log
    finally:
        stop_process(process)


def test_kube_scheduler_loads_the_gang_only_configuration(
    kubeconfig: str, tmp_path: Path, extender: Extender
) -> None:
    docs = render("--set", "mode=gang-only,serveDefaultScheduler=true", namespace="gx")
    with chart_scheduler(kubeconfig, tmp_path, docs, lambda i: f"chart-gang-only-{i}") as log:
        text = log.read_text()
    assert text.count('"Creating extender"') == 2, text[-3000:]
    assert '"ManagedResources":[{"Name":"gang-extender.dev/member","IgnoredByScheduler":true}]' in (
        text
    )


PREEMPTORS = "chart-preemptors"


def as_dict(kube: Kube, obj: Any) -> dict[str, Any]:
    """A client model as the API's JSON (camelCase), as the webhook saw it."""
    api: Any = kube.client
    body: dict[str, Any] = api.sanitize_for_serialization(obj)
    return body


def pod_dict(kube: Kube, namespace: str, name: str) -> dict[str, Any]:
    return as_dict(kube, kube.core.read_namespaced_pod(name, namespace))


def preemptor_marked(kube: Kube, namespace: str, name: str) -> bool:
    return is_marked(pod_dict(kube, namespace, name), PREEMPTOR_RESOURCE)


@contextmanager
def preemptor_policy(kubeconfig: str, kube: Kube, namespace: str) -> Iterator[None]:
    """The chart's preemptor-mark MutatingAdmissionPolicy and its binding, for the
    pods of the PREEMPTORS scheduler, loaded by the API server (a dry-run
    probe comes back marked) before the body runs."""
    docs = render("--set", f"schedulerName={PREEMPTORS}", release=f"{namespace}-p")
    objects = [d for d in docs if d["kind"].startswith("MutatingAdmissionPolicy")]
    assert [d["kind"] for d in objects] == [
        "MutatingAdmissionPolicy",
        "MutatingAdmissionPolicyBinding",
    ]
    kubectl(kubeconfig, "apply", "--server-side", objects=objects)
    try:
        probe = kube.pod_body("probe", cpu="1m", scheduler=PREEMPTORS, priority_class=HIGH)

        def marks_the_probe() -> bool:
            pod = kube.core.create_namespaced_pod(namespace, probe, dry_run="All")
            return is_marked(as_dict(kube, pod), PREEMPTOR_RESOURCE)

        wait_for(marks_the_probe, 30, "the preemptor-mark policy to mark a high-priority pod")
        yield
    finally:
        kubectl(kubeconfig, "delete", "--ignore-not-found", objects=objects)


@pytest.mark.skipif(not GANG_ONLY, reason="the session extender serves no webhook")
@pytest.mark.usefixtures("priorities")
def test_a_plain_pod_is_marked_only_if_it_may_preempt_and_gangs_hold(
    kubeconfig: str, kube: Kube, namespace: str, extender: Extender, tmp_path: Path
) -> None:
    """The chart's default end to end: the real API server's policy marks a
    plain pod that may preempt (its priority resolved by then), the chart's
    kube-scheduler configuration sends only such pods to the preempt-only
    entry, and a running gang still loses no member below minMember to them;
    a plain pod of priority 0 is left alone and bound without any call to
    the extender."""
    docs = render("--set", f"schedulerName={PREEMPTORS}")
    with (
        preemptor_policy(kubeconfig, kube, namespace),
        chart_scheduler(kubeconfig, tmp_path, docs, lambda i: PREEMPTORS) as log,
    ):
        text = log.read_text()
        assert (
            '"ManagedResources":[{"Name":"gang-extender.dev/preemptor","IgnoredByScheduler":true}]'
            in text
        ), text[-3000:]
        fill_node3_and_start_low_gang(kube, namespace, "batch")
        members = {n for n in kube.bound(namespace) if n.startswith("batch-")}

        before = verb_calls(extender)
        kube.create_pod(namespace, "plain", cpu="100m", scheduler=PREEMPTORS)
        wait_for(lambda: kube.bound(namespace).get("plain"), 30, "the plain pod bound")
        assert not preemptor_marked(kube, namespace, "plain")
        time.sleep(1)
        assert verb_calls(extender) == before

        kube.create_pod(namespace, "vip-1", cpu="2", scheduler=PREEMPTORS, priority_class=HIGH)
        assert preemptor_marked(kube, namespace, "vip-1")
        wait_for(lambda: kube.bound(namespace).get("vip-1"), 60, "vip-1 bound by preemption")
        assert verb_calls(extender)["preempt"] > before["preempt"]
        left = {n for n in kube.bound(namespace) if n.startswith("batch-")}
        assert len(left) == 3 and left < members
        kube.create_pod(namespace, "vip-2", cpu="2", scheduler=PREEMPTORS, priority_class=HIGH)
        # A second eviction would leave the gang below minMember: it must not happen.
        assert_stays(kube, namespace, left, 15)
        assert "vip-2" not in kube.bound(namespace)


@pytest.mark.skipif(not GANG_ONLY, reason="the session extender serves no webhook")
@pytest.mark.usefixtures("priorities")
def test_preemptors_are_marked_with_the_extender_down_and_one_from_before_the_policy_is_reported(
    kubeconfig: str, kube: Kube, namespace: str, extender: Extender
) -> None:
    """The mark is the API server's own work: nothing of ours needs to run. A
    pod that may preempt and was created before the policy existed has no
    mark; the extender's watch is the alarm (Event and counter)."""
    extender.stop()
    try:
        # No kube-scheduler serves PREEMPTORS here: they all stay pending.
        kube.create_pod(namespace, "early", cpu="100m", scheduler=PREEMPTORS, priority_class=HIGH)
        assert not preemptor_marked(kube, namespace, "early")
        with preemptor_policy(kubeconfig, kube, namespace):
            kube.create_pod(namespace, "vip", cpu="100m", scheduler=PREEMPTORS, priority_class=HIGH)
            kube.create_pod(namespace, "plain", cpu="100m", scheduler=PREEMPTORS)
            assert preemptor_marked(kube, namespace, "vip")
            assert not preemptor_marked(kube, namespace, "plain")
    finally:
        extender.start(*extender.extra_args)
    kube.wait_for_event(
        namespace,
        "early",
        "PreemptorNotMarked:",
        "delete it",
        what="the extender's Warning Event on the unmarked preemptor",
    )
    assert extender.sample("gang_extender_unmarked_preemptors_total") == 1
    assert kube.events(namespace, "vip") == kube.events(namespace, "plain") == []
