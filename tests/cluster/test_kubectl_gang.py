"""`kubectl gang` through the real pinned kubectl, against the real control plane.

kubectl finds the console script `kubectl-gang` on PATH (the venv's bin, as
after `pip install gang-extender`) and runs it. The extender's live state is
reached the way a user reaches it: through kube-apiserver's service proxy
to the chart's own ops Service. The chart's Service selects a Pod like the
chart's (labels, a port named `ops`) whose address lives in a network
namespace of the test's own, relaying to the test extender on loopback
(tests/cluster/netns_relay.py): the real EndpointSlice controller and the
real proxy carry the request. Gangs of every source are created waiting,
running, timed out and in a queue, and each column the plugin prints is
checked against what the API objects (and /debug/gangs) say.
"""

from __future__ import annotations

import functools
import json
import os
import re
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s

from app.core.groups import (
    KUEUE_GROUP_LABEL,
    KUEUE_TOTAL_COUNT_ANNOTATION,
    LIGHT_MIN_AVAILABLE_LABEL,
    LIGHT_NAME_LABEL,
    VOLCANO_API,
    VOLCANO_GROUP_ANNOTATIONS,
    XK8S_API,
    GroupApi,
)
from app.kubectl.args import ENV_NAMESPACE, ENV_SERVICE, ENV_URL
from hack.clusterkit import wait_for, wait_for_default_service_account
from tests.cluster.kube import HIGH, LOW, Kube
from tests.cluster.netns_relay import relay_into_netns
from tests.cluster.session import EXTENDER_PORT, PERMIT_WAIT_SECONDS, SLOT, Extender
from tests.cluster.test_chart import token_kubeconfig
from tests.packaging.helm import find, kube_bin, render

# The console script pip installed next to this interpreter.
PLUGIN_BIN = Path(sys.executable).parent
OPS_PORT = 9090


def kubectl_gang(
    kubeconfig: str, *args: str, check: bool = True
) -> subprocess.CompletedProcess[str]:
    """`kubectl gang ARGS` with the pinned kubectl, the plugin found on PATH."""
    assert (PLUGIN_BIN / "kubectl-gang").exists(), "pip install -e . installs kubectl-gang"
    env = {k: v for k, v in os.environ.items() if k not in (ENV_NAMESPACE, ENV_SERVICE, ENV_URL)}
    env |= {"PATH": f"{PLUGIN_BIN}:{env.get('PATH', '')}", "KUBECONFIG": kubeconfig}
    result = subprocess.run(
        [str(kube_bin() / "kubectl"), "gang", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if check:
        assert result.returncode == 0, f"kubectl gang {' '.join(args)}: {result.stderr}"
    return result


@dataclass(frozen=True)
class Ops:
    """The chart's ops Service (of release `release`, in `namespace`) before the extender."""

    namespace: str
    release: str
    service: str

    @property
    def flags(self) -> tuple[str, ...]:
        return ("--extender-namespace", self.namespace)


def ops_pod(service: dict[str, Any], address: str) -> dict[str, Any]:
    """A pod like the chart's as far as the Service sees it: its labels, a port named `ops`."""
    return {
        "metadata": {"name": "gang-extender-ops-0", "labels": dict(service["spec"]["selector"])},
        "spec": {
            "nodeName": f"kgang-ops-{SLOT}",
            "tolerations": [{"operator": "Exists"}],
            "containers": [
                {
                    "name": "gang-extender",
                    "image": "gang-extender:test",
                    "ports": [{"name": "ops", "containerPort": OPS_PORT}],
                }
            ],
        },
    }


@pytest.fixture(scope="module")
def ops(kube: Kube, extender: Extender) -> Iterator[Ops]:
    """The chart's ops Service, its EndpointSlice made by the real controller, and the relay.

    The pod's node is a cordoned Node of no kubelet (the pod simulator leaves
    it alone); its status carries the address inside the test's network
    namespace, as a kubelet would report it.
    """
    release = f"kg{uuid.uuid4().hex[:6]}"
    namespace = f"{release}-ops"
    service = find(render(release=release, namespace=namespace), "Service", "-metrics")
    node = f"kgang-ops-{SLOT}"
    kube.core.create_namespace({"metadata": {"name": namespace}})
    kube.core.create_node(
        {
            "metadata": {"name": node},
            "spec": {
                "unschedulable": True,
                "taints": [{"key": "kgang-ops", "effect": "NoSchedule"}],
            },
        }
    )
    try:
        with relay_into_netns(SLOT, EXTENDER_PORT, port=OPS_PORT) as where:
            wait_for_default_service_account(kube.core, namespace, 30)
            kube.core.create_namespaced_service(namespace, service)
            pod = ops_pod(service, where.address)
            kube.core.create_namespaced_pod(namespace, pod)
            ready = {"type": "Ready", "status": "True"}
            kube.core.patch_namespaced_pod_status(
                pod["metadata"]["name"],
                namespace,
                {
                    "status": {
                        "phase": "Running",
                        "podIP": where.address,
                        "podIPs": [{"ip": where.address}],
                        "conditions": [ready, {"type": "ContainersReady", "status": "True"}],
                    }
                },
            )
            discovery: Any = k8s.DiscoveryV1Api(kube.client)
            name = service["metadata"]["name"]
            wait_for(
                lambda: any(
                    e.addresses == [where.address] and e.conditions.ready
                    for s in discovery.list_namespaced_endpoint_slice(
                        namespace, label_selector=f"kubernetes.io/service-name={name}"
                    ).items
                    for e in s.endpoints or ()
                ),
                30,
                "the EndpointSlice controller to add the ops pod",
            )
            yield Ops(namespace, release, name)
    finally:
        kube.core.delete_collection_namespaced_pod(namespace, grace_period_seconds=0)
        kube.core.delete_namespace(namespace)
        kube.delete_node(node)


def create_gangs(kube: Kube, ns: str, queue: str) -> None:
    """A gang of every source, and the waiting, running, timed-out and queued cases."""
    kube.create_podgroup(ns, "short", 3)  # waits: only 2 of its 3 pods exist
    kube.create_podgroup(ns, "run", 2)
    kube.create_podgroup(ns, "stuck", 3)  # its third pod is never placed: the gate times out
    kube.create_volcano_podgroup(ns, "tf", 2, queue=queue)
    kube.create_native_podgroup(ns, "svc", 2)
    for i in range(2):
        kube.create_pod(ns, f"short-{i}", group="short")
        kube.create_pod(ns, f"run-{i}", group="run")
        kube.create_pod(ns, f"stuck-{i}", group="stuck")
        kube.create_pod(
            ns, f"ring-{i}", labels={LIGHT_NAME_LABEL: "ring", LIGHT_MIN_AVAILABLE_LABEL: "2"}
        )
        kube.create_pod(ns, f"tf-{i}", annotations={VOLCANO_GROUP_ANNOTATIONS[0]: "tf"})
        kube.create_pod(ns, f"svc-{i}", scheduling_group="svc")
        kube.create_pod(
            ns,
            f"kg-{i}",
            labels={KUEUE_GROUP_LABEL: "kg"},
            annotations={KUEUE_TOTAL_COUNT_ANNOTATION: "2"},
        )
    kube.create_pod(ns, "stuck-2", group="stuck", scheduler="no-such-scheduler")


RUNNING = {"run": "x-k8s", "ring": "labels", "tf": "volcano", "svc": "native", "kg": "kueue"}


def gangs_of(kubeconfig: str, namespace: str, *flags: str) -> dict[str, dict[str, Any]]:
    doc = json.loads(kubectl_gang(kubeconfig, "get", "-A", "-o", "json", *flags).stdout)
    assert doc["kind"] == "List"
    return {
        g["name"]: g | {"live": doc["live"]} for g in doc["items"] if g["namespace"] == namespace
    }


def debug_gangs(extender: Extender) -> dict[str, Any]:
    with urllib.request.urlopen(f"{extender.url}/debug/gangs", timeout=5) as response:
        doc: dict[str, Any] = json.loads(response.read())
        return doc


def phase_is(kube: Kube, api: GroupApi, namespace: str, name: str, phase: str) -> bool:
    return (kube.group_object(api, namespace, name).get("status") or {}).get("phase") == phase


def scheduled_message(pod: Any) -> str:
    for condition in pod.status.conditions or ():
        if condition.type == "PodScheduled" and condition.status == "False":
            return str(condition.message)
    return ""


@pytest.fixture
def queue(kube: Kube, namespace: str) -> Iterator[str]:
    name = f"q-{namespace[-5:]}"
    kube.create_queue(name, 2)
    try:
        yield name
    finally:
        kube.delete_pods_now(namespace)
        kube.delete_queue(name)


def test_get_shows_every_source_as_the_objects_and_the_leader_say(
    kube: Kube, kubeconfig: str, namespace: str, extender: Extender, ops: Ops, queue: str
) -> None:
    create_gangs(kube, namespace, queue)
    bound = wait_for(
        lambda: (b := kube.bound(namespace)) and len(b) == 2 * len(RUNNING) and b,
        60,
        "every member of the five complete gangs bound",
    )
    for api, name in ((XK8S_API, "run"), (VOLCANO_API, "tf")):
        wait_for(functools.partial(phase_is, kube, api, namespace, name, "Running"), 30, name)

    gangs = gangs_of(kubeconfig, namespace, *ops.flags)
    assert set(gangs) == {*RUNNING, "short", "stuck"}
    live = gangs["run"]["live"]
    assert live["reachable"] is True, live
    assert live["via"] == f"service {ops.namespace}/{ops.service}:metrics"
    pods = {p.metadata.name: p for p in kube.pods(namespace)}
    for name, source in RUNNING.items():
        gang = gangs[name]
        assert gang["source"] == source
        assert (gang["bound"], gang["reserved"], gang["pending"], gang["minMember"]) == (2, 0, 0, 2)
        assert gang["reason"] == "<none>"
        assert {m["name"]: m["node"] for m in gang["members"]} == {
            f"{name}-{i}": bound[f"{name}-{i}"] for i in range(2)
        }
    assert gangs["run"]["phase"] == kube.group_object(XK8S_API, namespace, "run")["status"]["phase"]
    assert gangs["tf"]["phase"] == "Running" and gangs["tf"]["queue"] == queue
    assert gangs["kg"]["key"] == f"kueue:{namespace}/kg"
    assert gangs["svc"]["key"] == f"native:{namespace}/svc"

    short = gangs["short"]
    assert (short["bound"], short["pending"], short["minMember"]) == (0, 2, 3)
    assert short["phase"] == kube.group_object(XK8S_API, namespace, "short")["status"]["phase"]
    said = {scheduled_message(pods[f"short-{i}"]) for i in range(2)}
    denied = {d["message"] for d in debug_gangs(extender)["denied"] if d["group"] == short["key"]}
    assert short["reason"] in {" ".join(m.split()) for m in said | denied}
    assert "cannot find enough sibling pods, current pods number: 2" in short["reason"]
    assert short["queue"] == "default"  # a Queue exists; the gang names none

    table = kubectl_gang(kubeconfig, "get", "-n", namespace, *ops.flags)
    header, *rows = table.stdout.splitlines()
    assert header.split() == [
        *("NAME", "SOURCE", "PHASE", "BOUND", "RESERVED", "PENDING", "MIN", "QUEUE"),
        *("DOMAIN", "AGE", "REASON"),
    ]
    cells = {r.split()[0]: re.split(r"\s{3,}", r) for r in rows}
    assert cells["tf"][:8] == ["tf", "volcano", "Running", "2", "0", "0", "2", queue]
    assert cells["short"][3:7] == ["0", "0", "2", "3"]
    assert table.stderr == ""  # the leader answered, every list was readable


def test_a_stuck_gang_is_reserved_in_the_gate_then_times_out(
    kube: Kube, kubeconfig: str, namespace: str, extender: Extender, ops: Ops
) -> None:
    kube.create_podgroup(namespace, "stuck", 3)
    for i in range(2):
        kube.create_pod(namespace, f"stuck-{i}", group="stuck")
    kube.create_pod(namespace, "stuck-2", group="stuck", scheduler="no-such-scheduler")
    key = f"{namespace}/stuck"

    def reserved() -> dict[str, Any] | None:
        gang = gangs_of(kubeconfig, namespace, *ops.flags).get("stuck")
        return gang if gang and gang["reserved"] == 2 else None

    gang = wait_for(reserved, 40, "kubectl gang to show 2 members reserved in the gate")
    assert (gang["bound"], gang["pending"], gang["minMember"]) == (0, 1, 3)
    assert gang["reason"].startswith("2 member(s) reserved in the permit gate")
    states = {m["name"]: m["state"] for m in gang["members"]}
    assert states == {"stuck-0": "Reserved", "stuck-1": "Reserved", "stuck-2": "Pending"}

    def timed_out() -> dict[str, Any] | None:
        gang = gangs_of(kubeconfig, namespace, *ops.flags)["stuck"]
        return gang if "timed out after waiting" in gang["reason"] else None

    gang = wait_for(timed_out, PERMIT_WAIT_SECONDS + 30, "the timeout as the gang's reason")
    assert f"gang {key} timed out after waiting {PERMIT_WAIT_SECONDS}s" in gang["reason"]

    described = kubectl_gang(kubeconfig, "describe", key, *ops.flags).stdout
    lines = described.splitlines()
    assert "Source:      x-k8s (PodGroup scheduling.x-k8s.io/v1alpha1)" in lines
    assert "MinMember:   3" in lines
    assert any(line.split()[:2] == ["stuck-2", "Pending"] for line in lines)
    assert any("GangTimedOut" in line and "PodGroup/stuck" in line for line in lines)
    assert f"Live State:  from service {ops.namespace}/{ops.service}:metrics" in lines


def test_queues_show_weight_share_and_gangs(
    kube: Kube, kubeconfig: str, namespace: str, ops: Ops, queue: str
) -> None:
    for name in ("qa", "qb"):
        kube.create_volcano_podgroup(namespace, name, 2, queue=queue)
        for i in range(2):
            kube.create_pod(
                namespace, f"{name}-{i}", annotations={VOLCANO_GROUP_ANNOTATIONS[0]: name}
            )
    kube.create_volcano_podgroup(namespace, "qc", 3, queue=queue)  # waits: one pod of three
    kube.create_pod(namespace, "qc-0", annotations={VOLCANO_GROUP_ANNOTATIONS[0]: "qc"})
    wait_for(lambda: len(kube.bound(namespace)) == 4, 60, "gangs qa and qb bound")

    def listed() -> dict[str, Any] | None:
        doc = json.loads(kubectl_gang(kubeconfig, "queues", "-o", "json", *ops.flags).stdout)
        row = next((q for q in doc["items"] if q["name"] == queue), None)
        return row if row and row["deserved"] not in (None, "<none>") else None

    row = wait_for(listed, 30, f"queue {queue} with its deserved share from the leader")
    assert (row["weight"], row["reclaimable"]) == ("2", "true")
    assert (row["waitingGangs"], row["runningGangs"]) == (1, 2)
    table = kubectl_gang(kubeconfig, "queues", *ops.flags).stdout
    assert table.splitlines()[0].split() == [
        *("NAME", "WEIGHT", "STATE", "RECLAIMABLE", "DESERVED", "ALLOCATED", "WAITING", "RUNNING")
    ]
    assert any(line.startswith(queue) and "[" in line for line in table.splitlines())


def test_unreachable_extender_is_said_and_the_objects_still_shown(
    kube: Kube, kubeconfig: str, namespace: str, ops: Ops
) -> None:
    kube.create_podgroup(namespace, "lone", 2)
    kube.create_pod(namespace, "lone-0", group="lone")
    # A Service of the chart's name whose port nothing listens behind.
    dead = {
        "metadata": {"name": "dead-ops", "labels": {"app.kubernetes.io/component": "other"}},
        "spec": {"ports": [{"name": "metrics", "port": 9, "targetPort": 9}]},
    }
    kube.core.create_namespaced_service(namespace, dead)
    for flags in (
        ("--extender-namespace", f"{namespace}-nowhere"),
        ("--extender-namespace", namespace, "--extender-service", "dead-ops"),
    ):
        result = kubectl_gang(kubeconfig, "get", "-n", namespace, *flags)
        assert result.stderr.startswith("note: extender unreachable"), result.stderr
        assert result.stderr.count("\n") == 1
        (row,) = result.stdout.splitlines()[1:]
        assert re.split(r"\s{3,}", row)[:7] == ["lone", "x-k8s", "Pending", "0", "-", "1", "2"]


def test_errors_are_one_line_and_a_non_zero_exit(
    kube: Kube, kubeconfig: str, namespace: str, tmp_path: Path
) -> None:
    missing = kubectl_gang(kubeconfig, "describe", f"{namespace}/nope", check=False)
    assert missing.returncode == 1
    assert missing.stderr == f"error: gang '{namespace}/nope' not found (namespace {namespace})\n"
    malformed = kubectl_gang(kubeconfig, "describe", "a/b/c", check=False)
    assert malformed.returncode == 2 and malformed.stderr.startswith("error: malformed gang")

    kube.core.create_namespaced_service_account(namespace, {"metadata": {"name": "nobody"}})
    token = kube.core.create_namespaced_service_account_token(
        "nobody", namespace, {"spec": {"expirationSeconds": 600}}
    ).status.token
    as_nobody = token_kubeconfig(kubeconfig, token, tmp_path / "nobody.kubeconfig")
    forbidden = kubectl_gang(as_nobody, "get", "-n", namespace, check=False)
    assert forbidden.returncode == 1
    assert forbidden.stderr.startswith(f"error: GET /api/v1/namespaces/{namespace}/pods: 403")
    assert "Traceback" not in forbidden.stderr and forbidden.stderr.count("\n") == 1


def test_the_charts_role_is_enough_for_every_command(
    kube: Kube, kubeconfig: str, namespace: str, ops: Ops, tmp_path: Path
) -> None:
    """A user bound to the chart's kubectl-gang ClusterRole reads everything, live state too."""
    docs = render(release=ops.release, namespace=ops.namespace)
    role = find(docs, "ClusterRole", "-kubectl-gang")
    rbac: Any = k8s.RbacAuthorizationV1Api(kube.client)
    rbac.create_cluster_role(role)
    binding = f"{role['metadata']['name']}-{namespace[-5:]}"
    kube.core.create_namespaced_service_account(namespace, {"metadata": {"name": "viewer"}})
    rbac.create_cluster_role_binding(
        {
            "metadata": {"name": binding},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": role["metadata"]["name"],
            },
            "subjects": [{"kind": "ServiceAccount", "name": "viewer", "namespace": namespace}],
        }
    )
    try:
        kube.create_podgroup(namespace, "seen", 1)
        kube.create_pod(namespace, "seen-0", group="seen")
        wait_for(lambda: kube.bound(namespace), 30, "seen-0 bound")
        token = kube.core.create_namespaced_service_account_token(
            "viewer", namespace, {"spec": {"expirationSeconds": 600}}
        ).status.token
        as_viewer = token_kubeconfig(kubeconfig, token, tmp_path / "viewer.kubeconfig")
        deadline = time.monotonic() + 30
        while True:  # RBAC caches in the API server catch up within moments
            result = kubectl_gang(as_viewer, "get", "-A", *ops.flags, check=False)
            if (result.returncode == 0 and result.stderr == "") or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        assert result.returncode == 0 and result.stderr == "", result.stderr
        assert any(
            line.split()[:3] == [namespace, "seen", "x-k8s"] for line in result.stdout.splitlines()
        )
        described = kubectl_gang(as_viewer, "describe", f"{namespace}/seen", *ops.flags).stdout
        assert f"Live State:  from service {ops.namespace}/{ops.service}:metrics" in described
        kubectl_gang(as_viewer, "queues", *ops.flags)
    finally:
        rbac.delete_cluster_role_binding(binding)
        rbac.delete_cluster_role(role["metadata"]["name"])


HOLD = "kubectl-gang.test/hold"


@pytest.mark.usefixtures("priorities")
def test_a_preempting_gang_shows_its_live_plan(
    kube: Kube, kubeconfig: str, namespace: str, extender: Extender, ops: Ops
) -> None:
    """Victims that take their time to go (a finalizer holds them) keep the plan evicting."""
    for i in range(3):
        body = kube.pod_body(f"low-{i}", cpu="3", priority_class=LOW)
        body["metadata"]["finalizers"] = [HOLD]
        kube.core.create_namespaced_pod(namespace, body)
    try:
        wait_for(lambda: len(kube.bound(namespace)) == 3, 30, "the low-priority pods bound")
        kube.create_podgroup(namespace, "urgent", 3, timeout=40)
        for i in range(3):
            kube.create_pod(namespace, f"urgent-{i}", group="urgent", cpu="2", priority_class=HIGH)
        key = f"{namespace}/urgent"

        def planned() -> dict[str, Any] | None:
            plans = [
                p for p in debug_gangs(extender).get("preemptionPlans", ()) if p["group"] == key
            ]
            return plans[0] if plans and plans[0]["phase"] == "evicting" else None

        plan = wait_for(planned, 60, "the gang's preemption plan evicting")
        gang = gangs_of(kubeconfig, namespace, *ops.flags)["urgent"]
        assert gang["reason"] == (
            f"preemption plan evicting: {plan['evictions']} eviction(s) for 3 member(s)"
        )
        described = kubectl_gang(kubeconfig, "describe", key, *ops.flags).stdout
        assert "Preemption:" in described.splitlines()
        assert f"preemption plan, phase evicting, {plan['evictions']} eviction(s)" in described
        victims = {v for slot in plan["slots"] for v in slot["victims"]}
        assert victims and all(v.split("/", 1)[1] in described for v in victims)
        nodes = {slot["node"] for slot in plan["slots"]}
        assert all(node in described for node in nodes)
    finally:
        for i in range(3):
            kube.core.patch_namespaced_pod(
                f"low-{i}", namespace, {"metadata": {"finalizers": None}}
            )


def test_watch_prints_the_rows_that_change(
    kube: Kube, kubeconfig: str, namespace: str, ops: Ops
) -> None:
    env = {k: v for k, v in os.environ.items() if k not in (ENV_NAMESPACE, ENV_SERVICE, ENV_URL)}
    env |= {"PATH": f"{PLUGIN_BIN}:{env.get('PATH', '')}", "KUBECONFIG": kubeconfig}
    command = [str(kube_bin() / "kubectl"), "gang", "get", "-n", namespace, "-w"]
    watcher = subprocess.Popen(
        [*command, "--watch-interval", "0.5", *ops.flags],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert watcher.stdout is not None
        assert watcher.stdout.readline() == "No gangs found in this namespace.\n"
        kube.create_podgroup(namespace, "late", 2)
        first = re.split(r"\s{3,}", watcher.stdout.readline().strip())
        assert first[:3] == ["late", "x-k8s", "Pending"] and first[6] == "2"
        for i in range(2):
            kube.create_pod(namespace, f"late-{i}", group="late")
        rows: list[list[str]] = []
        while not rows or rows[-1][2] != "Running":
            rows.append(re.split(r"\s{3,}", watcher.stdout.readline().strip()))
        assert rows[-1][:7] == ["late", "x-k8s", "Running", "2", "0", "0", "2"]
    finally:
        watcher.terminate()
        watcher.wait(10)
