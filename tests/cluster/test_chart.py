"""The Helm chart against the real control plane.

The API server accepts everything the chart renders; the chart's RBAC,
used for real through a ServiceAccount token, is enough for its
kube-scheduler (with the chart's configuration) and its extender to
gang-schedule, and refuses what they must not do.
"""

from __future__ import annotations

import contextlib
import re
import socket
import subprocess
import textwrap
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s

from app.core.groups import POD_GROUP_LABEL, XK8S_API
from app.core.resources import MEMBER_RESOURCE
from hack.clusterkit import api_client, marked_by_webhook, stop_process, wait_for
from tests.cluster.chart_pod import (
    SCHEDULER_NAME,
    free_port,
    lease_holder,
    local_webhook,
    run_chart_pod,
    schedule_gang,
)
from tests.cluster.kube import Kube
from tests.cluster.session import Extender
from tests.packaging.helm import (
    CHART,
    FULL_SET,
    PROMETHEUS_API,
    container,
    find,
    kube_bin,
    render,
    run_helm,
)
from tests.packaging.test_chart import flags

# Objects whose API the local cluster does not serve (no Prometheus Operator,
# no cert-manager): the API server can only reject them, so they are left
# out of the dry-run; tests/packaging/test_chart.py checks how they render.
NOT_SERVED_GROUPS = {"monitoring.coreos.com", "cert-manager.io"}
RBAC_KINDS = {"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"}


def kubectl(kubeconfig: str, *args: str, objects: Sequence[dict[str, Any]]) -> str:
    result = subprocess.run(
        [str(kube_bin() / "kubectl"), "--kubeconfig", kubeconfig, *args, "-f", "-"],
        input=yaml.safe_dump_all(objects),
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, f"kubectl {' '.join(args)} failed:\n{result.stderr}"
    return result.stdout


def api_group(obj: dict[str, Any]) -> str:
    version: str = obj["apiVersion"]
    return version.split("/", maxsplit=1)[0] if "/" in version else ""


@pytest.mark.parametrize("values", [(), (*FULL_SET, *PROMETHEUS_API)], ids=["default", "full"])
def test_api_server_accepts_everything_the_chart_renders(
    kubeconfig: str, namespace: str, values: tuple[str, ...]
) -> None:
    docs = render(*values, "--include-crds", release="accept", namespace=namespace)
    crds = [d for d in docs if d["kind"] == "CustomResourceDefinition"]
    not_served = [d for d in docs if api_group(d) in NOT_SERVED_GROUPS]
    rest = [d for d in docs if d not in crds and d not in not_served]
    assert crds and rest
    if values:
        assert sorted(d["kind"] for d in not_served) == ["Certificate", "ServiceMonitor"]

    # The CRD is the cluster's own (hack/local-cluster installs deploy/crds/): applied for real.
    applied = kubectl(kubeconfig, "apply", "--server-side", objects=crds)
    assert applied.count("serverside-applied") == len(crds), applied
    out = kubectl(kubeconfig, "apply", "--server-side", "--dry-run=server", objects=rest)
    lines = [line for line in out.splitlines() if line.strip()]
    assert len(lines) == len(rest), out
    assert all(line.endswith("serverside-applied (server dry run)") for line in lines), out


def test_notes_show_a_working_podgroup_and_the_scheduler_name(
    kubeconfig: str, namespace: str
) -> None:
    out = run_helm(
        "install", "notes", str(CHART), "--dry-run=client", "--kubeconfig", kubeconfig,
        "--namespace", namespace, "--set", "schedulerName=batch-gang",
    ).stdout  # fmt: skip
    notes = out.split("\nNOTES:\n", 1)[1]
    assert "schedulerName: batch-gang" in notes
    assert f"{POD_GROUP_LABEL}: trainer" in notes
    heredoc = re.search(r"<<'YAML'[^\n]*\n(.*?)\n\s*YAML\n", notes, re.S)
    assert heredoc, notes
    podgroup = yaml.safe_load(textwrap.dedent(heredoc.group(1)))
    podgroup["metadata"]["namespace"] = namespace
    out = kubectl(kubeconfig, "apply", "--server-side", "--dry-run=server", objects=[podgroup])
    assert f"podgroup.{XK8S_API.group}/trainer serverside-applied" in out, out


def token_kubeconfig(admin_kubeconfig: str, token: str, path: Path) -> str:
    """A kubeconfig for the same API server and CA, authenticating with a bearer token."""
    admin = yaml.safe_load(Path(admin_kubeconfig).read_text())
    cluster = admin["clusters"][0]["cluster"]
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [
                    {
                        "name": "local",
                        "cluster": {
                            "server": cluster["server"],
                            "certificate-authority-data": cluster["certificate-authority-data"],
                        },
                    }
                ],
                "users": [{"name": "chart-sa", "user": {"token": token}}],
                "contexts": [
                    {"name": "local", "context": {"cluster": "local", "user": "chart-sa"}}
                ],
                "current-context": "local",
            }
        )
    )
    path.chmod(0o600)
    return str(path)


def client_for(kubeconfig: str) -> Kube:
    return Kube(api_client(kubeconfig))


def podgroup_phase(kube: Kube, namespace: str, name: str) -> str | None:
    podgroup = kube.group_object(XK8S_API, namespace, name)
    phase: str | None = (podgroup.get("status") or {}).get("phase")
    return phase


def refused(call: Any, *args: Any, **kwargs: Any) -> int:
    with pytest.raises(k8s.ApiException) as err:
        call(*args, **kwargs)
    status: int = err.value.status
    return status


def test_chart_rbac_is_enough_to_gang_schedule_and_no_more(
    kube: Kube, kubeconfig: str, namespace: str, tmp_path: Path
) -> None:
    """The default values (gang-only mode), run with the chart's own ServiceAccount.

    Its extender makes its webhook certificate, keeps it in its Secret and
    registers its CA in the chart's MutatingWebhookConfiguration (here
    pointed at the extender on loopback: no Service routing without
    kube-proxy); kube-apiserver then has it mark the gang's members, and the
    chart's two extender entries place them.
    """
    release = f"rbac-{uuid.uuid4().hex[:5]}"
    docs = render(release=release, namespace=namespace)
    rbac = [d for d in docs if d["kind"] in RBAC_KINDS]
    webhook_port = free_port()
    webhook = local_webhook(docs, webhook_port)
    kubectl(kubeconfig, "apply", "--server-side", objects=[*rbac, webhook])
    try:
        account = find(docs, "ServiceAccount")["metadata"]["name"]
        token = kube.core.create_namespaced_service_account_token(
            account, namespace, {"spec": {"expirationSeconds": 3600}}
        ).status.token
        as_chart = token_kubeconfig(kubeconfig, token, tmp_path / "chart-sa.kubeconfig")

        chart_client = client_for(as_chart)
        node = kube.node_names()[0]
        assert refused(chart_client.core.delete_node, node, dry_run="All") == 403
        assert refused(chart_client.core.list_namespaced_secret, namespace) == 403

        with run_chart_pod(
            docs, kubeconfig=as_chart, workdir=tmp_path, webhook_port=webhook_port
        ) as pod:
            holder = wait_for(
                lambda: lease_holder(kube, namespace, pod.lease),
                30,
                f"kube-scheduler to take Lease {namespace}/{pod.lease}\n{pod.tail()}",
            )
            assert holder.startswith(socket.gethostname() + "_")
            wait_for(
                lambda: marked_by_webhook(kube.core, namespace, scheduler=SCHEDULER_NAME),
                30,
                f"the chart's webhook to mark a gang member\n{pod.tail()}",
            )
            secret = webhook_secret(docs)
            assert kube.core.read_namespaced_secret(secret, namespace).data, secret
            schedule_gang(kube, namespace, pod)
            for member in kube.core.list_namespaced_pod(namespace).items:
                assert MEMBER_RESOURCE in member.spec.containers[0].resources.requests
            assert pod.metric("gang_extender_gang_admissions_total", result="admitted") >= 1
            # The extender writes PodGroup status (podgroups/status patch) with the same token.
            wait_for(
                lambda: podgroup_phase(kube, namespace, "gang") in {"Scheduling", "Running"},
                30,
                f"the extender to write the PodGroup's phase\n{pod.tail()}",
            )
            denied = [
                f"{name}: {line}"
                for name, log in pod.logs.items()
                for line in log.read_text(errors="replace").splitlines()
                if "forbidden" in line.lower()
            ]
            assert not denied, "\n".join(denied[:20])
    finally:
        # Cluster-scoped objects and the kube-system binding outlive the test namespace.
        subprocess.run(
            [
                str(kube_bin() / "kubectl"),
                "--kubeconfig",
                kubeconfig,
                "delete",
                "--ignore-not-found",
                "--wait=false",
                "-f",
                "-",
            ],
            input=yaml.safe_dump_all([*rbac, webhook]),
            capture_output=True,
            text=True,
            check=False,
        )


def webhook_secret(docs: Sequence[dict[str, Any]]) -> str:
    """The name of the Secret the chart's extender keeps its webhook certificate in."""
    namespaced = flags(container(docs, "gang-extender")["args"])["webhook-cert-secret"]
    return namespaced.split("/", 1)[1]


def acquired(log: Path) -> bool:
    return "Successfully acquired lease" in log.read_text(errors="replace")


def test_two_replicas_one_schedules_the_other_takes_over(
    kube: Kube, kubeconfig: str, namespace: str, tmp_path: Path
) -> None:
    # every-verb: leader election is the same in both modes, and no webhook is needed.
    docs = render("--set", "replicaCount=2,mode=every-verb", release="ha", namespace=namespace)
    assert find(docs, "Deployment")["spec"]["replicas"] == 2
    (tmp_path / "leader").mkdir()
    (tmp_path / "standby").mkdir()
    with contextlib.ExitStack() as first:
        leader = first.enter_context(
            run_chart_pod(docs, kubeconfig=kubeconfig, workdir=tmp_path / "leader")
        )
        wait_for(lambda: acquired(leader.logs["kube-scheduler"]), 30, "the first replica to lead")
        held_by = lease_holder(kube, namespace, leader.lease)
        with run_chart_pod(docs, kubeconfig=kubeconfig, workdir=tmp_path / "standby") as standby:
            # Several retry periods (2s): the second replica waits, it does not lead too.
            time.sleep(6)
            assert not acquired(standby.logs["kube-scheduler"]), "both replicas lead"
            assert lease_holder(kube, namespace, leader.lease) == held_by
            first.close()  # the leader goes away (and releases the Lease)
            wait_for(
                lambda: acquired(standby.logs["kube-scheduler"]),
                60,
                f"the standby to take the Lease\n{standby.tail()}",
            )
            assert lease_holder(kube, namespace, leader.lease) not in (None, held_by)
            schedule_gang(kube, namespace, standby)


def test_only_the_replica_holding_the_lease_writes(
    kube: Kube, kubeconfig: str, namespace: str, tmp_path: Path, extender: Extender
) -> None:
    """Two replicas, each a "pod" with its own hostname. The standby's sidecar sees the
    same cluster but writes no PodGroup status (nor events, wake-ups, evictions); once its
    kube-scheduler takes the Lease, it writes."""
    docs = render("--set", "replicaCount=2,mode=every-verb", release="leader", namespace=namespace)
    # The session's own extender writes every PodGroup's status: out of the way meanwhile.
    extender.stop()
    try:
        _two_replicas(kube, kubeconfig, namespace, tmp_path, docs)
    finally:
        extender.start(*extender.extra_args)


def _two_replicas(
    kube: Kube, kubeconfig: str, namespace: str, tmp_path: Path, docs: list[dict[str, Any]]
) -> None:
    extender_args = container(docs, "gang-extender")["args"]
    lease_flag = f"--leader-election-lease={namespace}/"
    assert any(a.startswith(lease_flag) for a in extender_args), extender_args
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    with contextlib.ExitStack() as first:
        a = first.enter_context(
            run_chart_pod(docs, kubeconfig=kubeconfig, workdir=tmp_path / "a", pod_name="pod-a")
        )
        wait_for(lambda: acquired(a.logs["kube-scheduler"]), 30, "pod-a's scheduler to lead")
        assert (lease_holder(kube, namespace, a.lease) or "").startswith("pod-a_")
        with run_chart_pod(
            docs, kubeconfig=kubeconfig, workdir=tmp_path / "b", pod_name="pod-b"
        ) as b:
            # The leader's sidecar goes away, its kube-scheduler keeps the Lease: nobody
            # may write now, and the standby (which watches everything) must not.
            stop_process(a.processes["extender"])
            kube.create_podgroup(namespace, "quiet", 2)
            # Longer than the status resync (10s) and the write interval (1s).
            time.sleep(14)
            assert podgroup_phase(kube, namespace, "quiet") is None, "the standby wrote status"
            assert b.metric("gang_extender_podgroup_status_writes_total", result="written") == 0
            assert "is now the leader" not in b.logs["extender"].read_text(errors="replace")

            first.close()  # pod-a's kube-scheduler stops and releases the Lease
            wait_for(
                lambda: acquired(b.logs["kube-scheduler"]),
                60,
                f"pod-b's scheduler to take the Lease\n{b.tail()}",
            )
            assert (lease_holder(kube, namespace, b.lease) or "").startswith("pod-b_")
            wait_for(
                lambda: podgroup_phase(kube, namespace, "quiet") == "Pending",
                30,
                f"the new leader's sidecar to write the status\n{b.tail()}",
            )
            schedule_gang(kube, namespace, b)
            wait_for(
                lambda: podgroup_phase(kube, namespace, "gang") in {"Scheduling", "Running"},
                30,
                f"the leader to write the gang's phase\n{b.tail()}",
            )
